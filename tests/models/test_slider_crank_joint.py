"""R3 (Aghili Sec. 8): the slider-crank in joint coordinates, through its singular
configurations.

Independent references: the Lagrangian of the two point masses (autodiff of T and
V), the paper's printed M, h, A, P and M_c'' (eqs. 66-69), the 1-DOF Lagrange
equation on the branch (`reference`, Dopri8 at 1e-12) and energy conservation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import max_abs

import cdiff
from cdiff import kinematics

# private on purpose: eqs. 68-69 concern P and M_c; no public call gives them
from cdiff._formulation.projection import constraint_inertia, projector
from cdiff._linalg import PseudoInverse
from cdiff.models import SliderCrankJoint

T1 = 24.0  # ten passages of q1 = -pi/2 from the default start (every 2.33 s)
TS = jnp.linspace(0.0, T1, 2401)
PROJECTED = cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection(iterations=3))
# Eq. 68's rank-one projector for A = l c1 [2, 1] (printed under the wrong case).
P_RANK_ONE = np.array([[1 / 5, -2 / 5], [-2 / 5, 4 / 5]])


@functools.cache
def _run(formulation, projected, w1=0.0, dt=1e-3):
    model = SliderCrankJoint()
    q0, v0 = model.initial_state(w1=w1)
    return cdiff.simulate(model, formulation, q0, v0, t1=T1, dt=dt,
                          solver=PROJECTED if projected else None,
                          saveat=cdiff.SaveAt(ts=TS), throw=False)


@functools.cache
def _reference(w1=0.0):
    return SliderCrankJoint().reference(TS[1:], w1=w1)


def _crossings(q1):
    """Passages of cos(q1) through zero, split into q1 = pi/2 and -pi/2 (mod 2 pi)."""
    c, s = np.cos(np.asarray(q1)), np.sin(np.asarray(q1))
    change = np.sign(c[1:]) != np.sign(c[:-1])
    return int(np.sum(change & (s[1:] > 0))), int(np.sum(change & (s[1:] < 0)))


def _point_mass_lagrangian(model, q, v):
    """M and h of the open chain from T = m/2 (|p1'|^2 + |p2'|^2), V = mg(y1 + y2),
    with p1 = l(c1, s1), p2 = p1 + l(c12, s12): independent of eq. 66."""
    m, l, g = model.m, model.l, model.g

    def points(q):
        p1 = l * jnp.stack([jnp.cos(q[0]), jnp.sin(q[0])])
        return p1, p1 + l * jnp.stack([jnp.cos(q[0] + q[1]), jnp.sin(q[0] + q[1])])

    def kinetic(q, v):
        velocities = jax.jvp(points, (q,), (v,))[1]
        return 0.5 * m * sum(jnp.sum(p_dot**2) for p_dot in velocities)

    def potential(q):
        p1, p2 = points(q)
        return m * g * (p1[1] + p2[1])

    M = jax.hessian(kinetic, argnums=1)(q, v)
    momentum_rate = jax.jacfwd(jax.grad(kinetic, argnums=1), argnums=0)(q, v) @ v
    h = momentum_rate - jax.grad(kinetic, argnums=0)(q, v) + jax.grad(potential)(q)
    return M, h


def test_m_h_a_are_eqs_66_67():
    """The model, the printed eqs. 66-67 and the point-mass Lagrangian agree."""
    model = SliderCrankJoint(m=1.3, l=0.7)
    m, l, g = model.m, model.l, model.g
    rng = np.random.default_rng(1)
    q, v = rng.uniform(-4, 4, (6, 2)), rng.uniform(-3, 3, (6, 2))
    c1, c2, s2 = np.cos(q[:, 0]), np.cos(q[:, 1]), np.sin(q[:, 1])
    c12 = np.cos(q[:, 0] + q[:, 1])
    M_66 = m * l**2 * np.stack([np.stack([3 + 2 * c2, 1 + c2], -1),
                                np.stack([1 + c2, np.ones_like(c2)], -1)], -2)
    h_66 = np.stack([
        -m * l**2 * s2 * (v[:, 1] ** 2 + 2 * v[:, 0] * v[:, 1])
        + m * l * g * (c12 + 2 * c1),
        m * l**2 * s2 * v[:, 0] ** 2 + m * l * g * c12,
    ], -1)
    A_67 = l * np.stack([c1 + c12, c12], -1)[:, None, :]

    @jax.jit
    @jax.vmap
    def evaluate(q, v):
        M_lag, h_lag = _point_mass_lagrangian(model, q, v)
        return (model.mass_matrix(0.0, q), -model.forces(0.0, q, v),
                jax.jacfwd(model.holonomic, argnums=1)(0.0, q), M_lag, h_lag)

    M, h, A, M_lag, h_lag = evaluate(jnp.asarray(q), jnp.asarray(v))
    # M and A: measured 0, the printed formulas themselves (but for XLA's cosine
    # against NumPy's): a few ulps of entries up to 3.2 and 1.4.
    np.testing.assert_allclose(M, M_66, rtol=0, atol=1e-15)
    np.testing.assert_allclose(M_lag, M_66, rtol=0, atol=2e-15)  # measured 4.4e-16
    np.testing.assert_allclose(h, h_66, rtol=0, atol=6e-15)  # measured 1.8e-15
    np.testing.assert_allclose(h_lag, h_66, rtol=0, atol=1.5e-14)  # measured 3.6e-15
    np.testing.assert_allclose(A, A_67, rtol=0, atol=5e-16)


def test_reference_conserves_energy_and_c_vanishes_on_the_branch():
    """Along the exact solution: energy conserved (measured 8.8e-10 J of E = 6.94 J
    over 24 s), Phi = A qdot = 0, and the paper's remark "C = 0 for this example"
    (A' qdot = 0 on the branch q2 = 2 pi - 2 q1)."""
    model = SliderCrankJoint()
    ref = _reference()
    q0, v0 = model.initial_state()
    e0 = model.energy(0.0, q0, v0)
    energy = jax.vmap(lambda q, v: model.energy(0.0, q, v))(ref.q, ref.v)
    assert max_abs(energy - e0) < 2e-9
    kin = jax.vmap(lambda q, v: kinematics(model, 0.0, q, v))(ref.q[::10], ref.v[::10])
    assert max_abs(kin.phi_q) < 1e-14  # measured 1.1e-15
    assert max_abs(kin.dphi_q) < 1.5e-14  # measured 3.4e-15
    assert max_abs(kin.b_v) < 6e-14  # measured 1.7e-14
    assert max_abs(ref.v) > 3.0  # a real motion, not rest


def test_udwadia_kalaba_agrees_with_the_reference():
    """Consistent start, dt = 1e-3 over 24 s (measured: slider 2.5e-10, q 5.0e-10)."""
    model = SliderCrankJoint()
    sol = _run(cdiff.UdwadiaKalaba(), False)
    ref = _reference()
    assert sol.message == ""
    assert max_abs(model.slider(sol.q[1:]) - model.slider(ref.q)) < 1e-9
    assert max_abs(sol.q[1:] - ref.q) < 2e-9
    assert _crossings(sol.q[:, 0]) == _crossings(ref.q[:, 0]) == (0, 10)


@pytest.mark.parametrize(
    "formulation, projected, w1, tol, round_off",
    [
        # Measured max |q - q_exact| over 24 s at dt = 1e-3: 1.0e-9, 5.0e-10, 8.7e-8
        # (the rotating start moves four times faster); the projected runs' largest
        # constraint and velocity residuals: 7.7e-15 and 1.4e-14, 9.2e-14 and
        # 3.4e-13.
        (cdiff.Projection(), True, 0.0, 3e-9, (3e-14, 5e-14)),
        (cdiff.UdwadiaKalaba(), False, 0.0, 2e-9, None),
        (cdiff.Projection(), True, 4.0, 3e-7, (3e-13, 1e-12)),
    ],
    ids=["Projection+Newton", "UdwadiaKalaba", "Projection+Newton-rotating"],
)
def test_crosses_the_singular_configurations(formulation, projected, w1, tol,
                                             round_off):
    """Issue acceptance: at least ten passages of q1 = +-pi/2, all finite, tracking
    the exact solution. From rest at q1 = pi/4 the crank swings through -pi/2
    (ten times in 24 s); from q1' = 4 rad/s it turns over, through both."""
    sol = _run(formulation, projected, w1)
    ref = _reference(w1)
    assert sol.message == ""
    assert bool(jnp.all(jnp.isfinite(sol.q)))
    top, bottom = _crossings(sol.q[:, 0])
    assert top + bottom >= 10
    assert (top, bottom) == _crossings(ref.q[:, 0])
    if w1:
        assert top >= 5 and bottom >= 5
    assert max_abs(sol.q[1:] - ref.q) < tol
    if projected:  # the Newton projection keeps both levels at round-off
        assert float(sol.max_constraint_error) < round_off[0]
        assert max_abs(sol.velocity_residual) < round_off[1]


def _branch_jacobian(model, s):
    """A at q1 = -pi/2 + s on the branch q2 = 2 pi - 2 q1 (|c1| = |sin s|)."""
    q1 = -jnp.pi / 2 + s
    q = jnp.stack([q1, 2 * jnp.pi - 2 * q1])
    return q, jax.jacfwd(model.holonomic, argnums=1)(0.0, q)


# max |P - P_RANK_ONE| per s: round-off in A's direction (the branch's q2 is
# rounded), amplified by 1/|s|. Measured 5.6e-17, 1.1e-13, 3.7e-12, 7.5e-11,
# 3.2e-14, 1.1e-16.
RANK_ONE_BOUNDS = {-0.5: 5e-16, -1e-3: 4e-13, -1e-6: 1.5e-11, 1e-6: 3e-10,
                   1e-3: 1.5e-13, 0.5: 5e-16}


@pytest.mark.parametrize("s", sorted(RANK_ONE_BOUNDS))
def test_projector_is_rank_one_off_the_singular_configuration(s):
    """Near but off q1 = -pi/2, P = I - A^+A (cdiff's pseudoinverse) is the rank-one
    projector that eq. 68 prints, [[1/5, -2/5], [-2/5, 4/5]], on both sides (the
    paper prints it for |c1| < eps and I otherwise: its two cases are swapped)."""
    model = SliderCrankJoint()
    _, A = _branch_jacobian(model, s)
    P = projector(PseudoInverse(A))
    # measured 1.7e-16 at most (0 to one ulp of 1)
    np.testing.assert_allclose(jnp.linalg.eigvalsh(P), [0.0, 1.0], rtol=0, atol=5e-16)
    np.testing.assert_allclose(P, P_RANK_ONE, rtol=0, atol=RANK_ONE_BOUNDS[s])


def test_projector_jumps_to_the_identity_at_the_singular_configuration():
    """Eq. 68 with Aghili's SVD threshold eps: singular values below eps are dropped,
    so P = I ("the constraint is virtually removed") for |c1| < eps/(l sqrt 5) and
    the rank-one projector above. cdiff's pseudoinverse takes an absolute threshold
    as `damping` = eps^2 (its relative `rtol` does nothing for a single row);
    without it the threshold is at round-off: P = I where A vanishes exactly."""
    model = SliderCrankJoint()
    eps = 1e-8
    threshold = eps / (model.l * np.sqrt(5.0))  # in |c1|
    # |P - I| ~ |A|^2 / eps^2 (measured 8.0e-8, 7.5e-12, 2.7e-15, 8.1e-12, 8.0e-8).
    for s, bound in ((-1e-12, 3e-7), (-1e-14, 3e-11), (0.0, 1e-14), (1e-14, 3e-11),
                     (1e-12, 3e-7)):
        _, A = _branch_jacobian(model, s)
        # |c1| far below the threshold (measured |A| up to 2.2e-12)
        assert float(jnp.linalg.norm(A)) < 1e-2 * eps  # not a tolerance: a premise
        P = projector(PseudoInverse(A, damping=eps**2))
        np.testing.assert_allclose(P, np.eye(2), rtol=0, atol=bound)
    # |P - P_RANK_ONE| ~ eps^2 / |A|^2 (measured 3.2e-10, 4.0e-10, 1.7e-16).
    for s, bound in ((-1e-6, 1.5e-9), (1e-6, 1.5e-9), (0.3, 5e-16)):
        assert abs(np.sin(s)) > 100 * threshold
        _, A = _branch_jacobian(model, s)
        P = projector(PseudoInverse(A, damping=eps**2))
        np.testing.assert_allclose(P, P_RANK_ONE, rtol=0, atol=bound)
    # The jump: the whole constraint direction [2, 1]/sqrt 5 is released (measured
    # 5.6e-17: the fifths' rounding).
    np.testing.assert_allclose(np.eye(2) - P_RANK_ONE,
                               np.outer([2, 1], [2, 1]) / 5, rtol=0, atol=2.2e-16)
    # Default threshold: the identity exactly where A = 0, finite throughout.
    np.testing.assert_array_equal(projector(PseudoInverse(jnp.zeros((1, 2)))),
                                  np.eye(2))


@pytest.mark.parametrize("s", [1e-3, 0.0])
def test_constraint_inertia_is_eq_69(s):
    """Eq. 69 with gamma = m l^2: M_c'' = PM + gamma(I - P) equals
    m l^2 [[1, (1 + c2)/5], [0, (3 - 2 c2)/5]] with the rank-one P (printed under
    |c1| < eps, swapped like eq. 68), and M where P = I (singular)."""
    model = SliderCrankJoint(m=2.0, l=0.5)
    ml2 = model.m * model.l**2
    q, A = _branch_jacobian(model, s)
    M = model.mass_matrix(0.0, q)
    P = np.eye(2) if s == 0.0 else projector(PseudoInverse(A))
    Mc, _ = constraint_inertia(M, jnp.asarray(P), "Mc_gamma", gamma=ml2)
    if s == 0.0:  # exact: P = I, so PM = M and I - P = 0
        np.testing.assert_array_equal(Mc, M)
    else:
        c2 = np.cos(q[1])
        printed = ml2 * np.array([[1, (1 + c2) / 5], [0, (3 - 2 * c2) / 5]])
        # measured 0 (not by construction): a few ulps of entries up to 0.5
        np.testing.assert_allclose(Mc, printed, rtol=0, atol=5e-16)
    assert abs(float(jnp.linalg.det(Mc))) > 0.1 * ml2**2


def test_float32_methods():
    model = SliderCrankJoint()
    q, v = (x.astype(jnp.float32) for x in model.initial_state(w1=1.0))
    for out in (model.mass_matrix(0.0, q), model.forces(0.0, q, v),
                model.holonomic(0.0, q), model.energy(0.0, q, v)):
        assert out.dtype == jnp.float32


@pytest.mark.parametrize("kwargs, word", [({"l": -1.0}, "`l`"), ({"m": 0.0}, "`m`"),
                                          ({"l": float("inf")}, "`l`")])
def test_bad_parameters(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SliderCrankJoint(**kwargs)
