"""R8 (Costa-Castelló Secs. 4.2, 5.2): the planar 2-DOF arm with its end effector
on a curve (x = 1, x = 0, the unit circle), held until t = 0.5 s, then free.

Independent references: an autodiff Lagrangian of the two links (for M and the
forces), the closed-form singular configurations of Proposition 1 / Table 1 and a
numerical search for them, and the minimal-coordinate ODE of each curve
(`reference`, Dopri8 at 1e-13): a compound pendulum on the circle, the symmetric
family on x = 0, a polar chart of the closed configuration curve on x = 1."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EPS, max_abs, stack_curves

import cdiff
from cdiff.models import PlanarArmOnCurve

CURVES = ("line_x1", "line_x0", "circle")
T_RELEASE = 0.5
TS = jnp.linspace(T_RELEASE, 3.0, 251)  # every 0.01 s after the release


@functools.cache
def _reference(curve):
    return PlanarArmOnCurve(curve).reference(TS)


@functools.cache
def _runs():
    """UdwadiaKalaba, RK4 at dt = 1e-3, from the release (the force jumps at
    t_release, and a fixed step must not straddle it: see the model docstring),
    for the three curves in one jax.vmap over (coefficients, hold)."""

    def run(c, h):
        model = PlanarArmOnCurve(coefficients=c, hold=h)
        return cdiff.simulate(model, cdiff.UdwadiaKalaba(), h, jnp.zeros(2),
                              t0=T_RELEASE, t1=3.0, dt=1e-3,
                              saveat=cdiff.SaveAt(ts=TS))

    return jax.vmap(run)(*stack_curves(CURVES))


def _run(curve):
    i = CURVES.index(curve)
    return jax.tree.map(lambda x: x[i], _runs())


def _lagrangian(model, q, v):
    """T - V of two rigid links, from their centres of mass (written out here)."""
    def centres(q):
        a, b = q[0], q[0] + q[1]
        r1 = model.lc1 * jnp.array([jnp.cos(a), jnp.sin(a)])
        r2 = (model.l1 * jnp.array([jnp.cos(a), jnp.sin(a)])
              + model.lc2 * jnp.array([jnp.cos(b), jnp.sin(b)]))
        return r1, r2

    (r1, r2), (u1, u2) = jax.jvp(centres, (q,), (v,))
    kinetic = 0.5 * (model.m1 * u1 @ u1 + model.m2 * u2 @ u2
                     + model.I1 * v[0] ** 2 + model.I2 * (v[0] + v[1]) ** 2)
    return kinetic - model.g * (model.m1 * r1[1] + model.m2 * r2[1])


def test_mass_matrix_and_forces_match_an_autodiff_lagrangian():
    """M = d2L/dv2 and Q = dL/dq - (d2L/dv dq) v (Euler-Lagrange) at random
    states; after the release the forces are exactly Q, before it Q + G(hold)."""
    # Every parameter distinct from the others, so that no term can hide.
    model = PlanarArmOnCurve("circle", l1=1.1, l2=0.9, lc1=0.4, lc2=0.6, m1=4.0,
                             m2=5.5, I1=1.2, I2=0.7, g=9.7)
    lag = functools.partial(_lagrangian, model)

    @jax.jit
    def compare(q, v):
        M = jax.hessian(lag, argnums=1)(q, v)
        Q = (jax.grad(lag, argnums=0)(q, v)
             - jax.jacfwd(jax.grad(lag, argnums=1), argnums=0)(q, v) @ v)
        gravity = -jax.grad(lag)(q, jnp.zeros(2))
        held = model.forces(0.0, q, v) - model.forces(1.0, q, v)
        G_hold = -jax.grad(lag)(model.hold, jnp.zeros(2))
        energy = v @ M @ v - lag(q, v)  # T + V = 2T - L

        def relative(x, ref):
            return _max_abs(x - ref) / _max_abs(ref)

        return jnp.stack([
            relative(model.mass_matrix(0.0, q), M),
            relative(model.forces(1.0, q, v), Q),
            relative(model.gravity_torques(q), gravity),
            relative(held, G_hold),
            relative(model.energy(0.0, q, v), energy),
        ])

    # Round-off, relative to each quantity: measured 0.64-2.2 eps (the largest of
    # the five at each state).
    bound = 6 * EPS
    rng = np.random.default_rng(0)
    for q, v in rng.uniform(-3.0, 3.0, (8, 2, 2)):
        errors = compare(jnp.asarray(q), jnp.asarray(v))
        assert float(jnp.max(errors)) < bound, errors


def _max_abs(x):
    return jnp.max(jnp.abs(x))


def test_initial_states_are_regular_and_on_the_curves():
    expected = {  # (q0, end effector), from the class docstring
        "line_x1": ((1.0, -2.0931), (1.0, -0.0466)),
        "line_x0": ((np.pi / 2 - 0.5, 1.0), (0.0, 2 * np.sin(np.pi / 2 - 0.5))),
        "circle": ((0.3, -2 * np.pi / 3), (np.cos(0.3 - np.pi / 3),
                                           np.sin(0.3 - np.pi / 3))),
    }
    # Bounds on |phi(q0)|, q0 and the end effector. Measured: 0, 4.2e-5, 4.5e-6 on
    # x = 1 (the docstring's 4 digits); 1.1e-16, 0, 2.2e-16 on x = 0; 2.2e-16,
    # 4.4e-16, 3.3e-16 on the circle.
    bounds = {"line_x1": (5e-16, 1e-4, 2e-5), "line_x0": (5e-16, 1e-15, 1e-15),
              "circle": (1e-15, 2e-15, 1.5e-15)}
    for curve in CURVES:
        model = PlanarArmOnCurve(curve)
        q0, v0 = model.initial_state()
        phi_bound, q_bound, p_bound = bounds[curve]
        np.testing.assert_array_equal(q0, model.hold)
        assert max_abs(v0) == 0.0
        assert max_abs(model.holonomic(0.0, q0)) < phi_bound
        np.testing.assert_allclose(q0, expected[curve][0], rtol=0, atol=q_bound)
        np.testing.assert_allclose(model.end_effector(q0), expected[curve][1],
                                   rtol=0, atol=p_bound)
        # Regular: the reduction index matrix (eq. 44) is far from zero.
        phi = cdiff.analysis.reduction_index_matrix(model, 0.0, q0).phi
        assert float(phi[0, 0]) > 0.3
    np.testing.assert_array_equal(model.coefficients, [1.0, 0.0, 0.0, -1.0])


def test_singular_configurations_of_proposition_1():
    """Table 1 / Sec. 5.2: on x = 0 the folded (0, pi) and (pi, pi) are on the
    curve and make J^T phi_x^T vanish; x = 1 and the circle have none. Checked
    against a numerical search (cdiff.analysis, Levenberg-Marquardt from 64
    random guesses, on x = 0)."""
    folded = np.array([[0.0, np.pi], [np.pi, np.pi]])
    guesses = jnp.asarray(np.random.default_rng(1).uniform(-np.pi, np.pi, (64, 2)))
    for curve in CURVES:
        model = PlanarArmOnCurve(curve)
        listed = model.singular_configurations()
        if curve != "line_x0":
            assert listed.shape == (0, 2)
            continue
        search = cdiff.analysis.singular_configurations(model, guesses)
        found = np.asarray(search.q)[np.asarray(search.found)]
        # Exact: the normal's angle is 0, and the candidates are sums of 0 and pi.
        np.testing.assert_array_equal(listed, folded)
        for q in jnp.asarray(listed):
            # Exact: cos rounds to -1 at pi and to 1 at 0 and 2 pi, so x = l1 cos
            # + l2 cos is 0 (l1 = l2; measured 0 in both builds). A: measured
            # 1.2e-16 and 2.5e-16, and 1.1e-32 and 3.2e-32 (A^2).
            assert max_abs(model.holonomic(0.0, q)) == 0.0
            A = jax.jacfwd(model.holonomic, argnums=1)(0.0, q)  # phi_x J
            assert max_abs(A) < 1e-15
            phi = cdiff.analysis.reduction_index_matrix(model, 0.0, q).phi
            assert max_abs(phi) < 1e-31
        # Every configuration the search finds is one of the two (mod 2 pi).
        assert found.shape[0] > 10
        wrapped = np.abs(np.mod(found + np.pi, 2 * np.pi) - np.pi)
        assert np.all(np.min(np.linalg.norm(
            wrapped[:, None] - np.abs(folded)[None], axis=-1), axis=1) < 1e-6)
    # On the circle the candidates sin(theta2) = 0 are at |p| = 0 or 2 (measured
    # 1.6e-16 and exactly 2, in both builds).
    circle = PlanarArmOnCurve("circle")
    for th2 in (0.0, np.pi):
        p = circle.end_effector(jnp.array([0.7, th2]))
        assert float(jnp.linalg.norm(p)) in (pytest.approx(0.0, abs=1e-15),
                                             pytest.approx(2.0, rel=2 * EPS, abs=0))


def _free_acceleration(model, q):
    """The constrained acceleration at rest once the torques are off:
    M a = -G + A^T lam with A a = 0 (phi'' = A a at rest)."""
    M = model.mass_matrix(1.0, q)
    a = jax.jacfwd(model.holonomic, argnums=1)(1.0, q)[0]  # the row phi_x J
    free = jnp.linalg.solve(M, -model.gravity_torques(q))
    lam = -(a @ free) / (a @ jnp.linalg.solve(M, a))
    return free + lam * jnp.linalg.solve(M, a)


def test_held_at_rest_until_release_vmapped_over_the_curves():
    """One jax.vmap over the three curves' (coefficients, hold): the arm stays
    exactly at rest for t < t_release. The last RK4 stage of the step that ends at
    t_release already sees the released arm, so v(t_release) = dt/6 a_free, the
    O(dt) error of a fixed step at a jump of the force (why the accuracy runs start
    at t_release)."""
    coefficients, holds = stack_curves(CURVES)

    def run(c, h):
        model = PlanarArmOnCurve(coefficients=c, hold=h)
        return cdiff.simulate(model, cdiff.UdwadiaKalaba(), h, jnp.zeros(2),
                              t1=T_RELEASE, dt=1e-2)

    sol = jax.vmap(run)(coefficients, holds)
    assert sol.q.shape == (3, 51, 2)
    # Exactly at rest: the holding torque is G(hold) itself, so the forces vanish.
    assert max_abs(sol.q - holds[:, None]) == 0.0
    assert max_abs(sol.v[:, :-1]) == 0.0
    for i, curve in enumerate(CURVES):
        model = PlanarArmOnCurve(curve)
        a = _free_acceleration(model, model.hold)
        # Measured 8.7e-18 to 1.2e-17 (on velocities of 2e-3 to 2e-2).
        np.testing.assert_allclose(sol.v[i, -1], 1e-2 / 6 * a, rtol=0, atol=5e-17)
        assert max_abs(a) > 1.0


def test_vmap_over_the_curves():
    """The curves share one parametrisation: vmapped residuals, index matrices and
    forces equal the per-curve ones."""
    coefficients, holds = stack_curves(CURVES)
    base = PlanarArmOnCurve()

    def at_start(c, h):
        model = eqx.tree_at(lambda m: (m.coefficients, m.hold), base, (c, h))
        index = cdiff.analysis.reduction_index_matrix(model, 1.0, h).phi[0, 0]
        return model.holonomic(1.0, h), index, model.forces(1.0, h, jnp.ones(2))

    residual, index, forces = jax.vmap(at_start)(coefficients, holds)
    assert max_abs(residual) < 1e-15  # measured 2.2e-16
    for i, curve in enumerate(CURVES):
        model = PlanarArmOnCurve(curve)
        q0, _ = model.initial_state()
        # Measured equal (both builds); 2 ulp allowed for the batched linear algebra.
        np.testing.assert_allclose(float(index[i]), float(
            cdiff.analysis.reduction_index_matrix(model, 1.0, q0).phi[0, 0]),
            rtol=2 * EPS, atol=0)
        # The same elementwise arithmetic, batched: exact.
        np.testing.assert_array_equal(forces[i], model.forces(1.0, q0, jnp.ones(2)))
    # The circle's |phi_x| = 2 |p| = 2 makes its index matrix the largest.
    assert int(jnp.argmax(index)) == 2


@pytest.mark.parametrize(
    "curve, q_tol, v_tol, e_tol",
    [
        # Measured max |q - q_ref|, |v - v_ref|, |E - E0| over 2.5 s of free motion:
        # 8.3e-12, 3.2e-11, 2.0e-11 J (circle); 1.2e-9, 9.5e-9, 8.8e-8 J (x = 1: fast
        # whipping of link 2, up to 16 rad/s; RK4 converges as dt^4 to the
        # reference, errors 2.1e-8, 1.2e-9, 6.8e-11 at dt = 2e-3, 1e-3, 5e-4).
        ("circle", 3e-11, 1e-10, 1e-10),
        ("line_x1", 3e-9, 3e-8, 3e-7),
    ],
)
def test_free_motion_agrees_with_the_minimal_reference(curve, q_tol, v_tol, e_tol):
    sol, ref = _run(curve), _reference(curve)
    assert max_abs(sol.q - ref.q) < q_tol
    assert max_abs(sol.v - ref.v) < v_tol
    assert float(sol.max_energy_error) < e_tol  # conserved after the release
    # Measured 2.9e-15 (circle), 1.5e-12 (x = 1).
    bound = {"circle": 1.5e-14, "line_x1": 6e-12}[curve]
    assert max_abs(sol.holonomic_residual) < bound
    assert float(jnp.ptp(ref.q[:, 0])) > 2.0  # the arm swings


def test_circle_keeps_the_elbow_angle():
    """On |p| = 1 the elbow angle is fixed: a compound pendulum about the base."""
    sol, ref = _run("circle"), _reference("circle")
    assert max_abs(ref.q[:, 1] + 2 * jnp.pi / 3) < 1e-15
    assert max_abs(sol.q[:, 1] + 2 * jnp.pi / 3) < 6e-15  # measured 1.3e-15


def test_single_solve_across_the_release_with_a_jump_time():
    """From t = 0 in one solve: an adaptive controller told about the jump
    (diffrax.ClipStepSizeController(jump_ts=[t_release])) steps to just before and
    just after it, and agrees with the reference (measured 1.5e-10)."""
    import diffrax

    model = PlanarArmOnCurve("circle")
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 1.5, 31)
    controller = diffrax.ClipStepSizeController(
        diffrax.PIDController(rtol=1e-10, atol=1e-10), jump_ts=[T_RELEASE])
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=1.5, dt=1e-3,
                         solver=diffrax.Tsit5(), stepsize_controller=controller,
                         saveat=cdiff.SaveAt(ts=ts))
    ref = model.reference(ts)
    assert max_abs(sol.q[ts < T_RELEASE] - q0) == 0.0  # exactly at rest, as above
    assert max_abs(sol.q - ref.q) < 6e-10


def test_x0_end_effector_falls_into_the_singular_base():
    """x = 0 (Fig. 4): released, the arm folds and the end effector slides down
    the y axis into the base, the singular configuration (0, pi), at t = 1.0905 s
    (0.59 s after the release); the index matrix (eq. 44) vanishes on the way."""
    model = PlanarArmOnCurve("line_x0")
    sol, ref = _run("line_x0"), _reference("line_x0")
    before = TS <= 1.09
    p = model.end_effector(sol.q[before])
    # On the y axis, falling monotonically to the base.
    assert max_abs(p[:, 0]) < 4e-15  # measured 8.9e-16
    assert bool(jnp.all(jnp.diff(p[:, 1]) < 0))
    assert float(p[0, 1]) == pytest.approx(1.7552, abs=1e-4)
    assert 0.0 < float(p[-1, 1]) < 0.01  # measured 3.5e-3 at t = 1.09
    # The reference crosses theta1 = 0 (the end effector at the base) in
    # (1.09, 1.10]: the singular configuration (0, pi).
    i = int(jnp.argmax(ref.q[:, 0] < 0.0))
    # TS's grid points, to 2 ulp (measured 1 ulp, 2.2e-16, from 1.09 and 0 from
    # 1.1; both 0 with XLA's default fusion emitter).
    np.testing.assert_allclose(float(TS[i - 1]), 1.09, rtol=2 * EPS, atol=0)
    np.testing.assert_allclose(float(TS[i]), 1.1, rtol=2 * EPS, atol=0)
    np.testing.assert_allclose(ref.q[i - 1], [0.0, np.pi], atol=0.01)
    index = cdiff.analysis.along(cdiff.analysis.reduction_index_matrix, model, sol)
    phi = index.phi[:, 0, 0]
    assert float(phi[0]) > 0.3 and float(phi[i - 1]) < 1e-4 * float(phi[0])
    # Up to there the simulation is the reference (measured 3.1e-12).
    assert max_abs(sol.q[before] - ref.q[before]) < 1.5e-11


def test_x0_udwadia_kalaba_passes_the_singular_configurations():
    """cdiff's pseudoinverse formulation does not stop at the singularities (no RK4
    stage lands on one; there the constraint force's pseudoinverse drops the
    vanishing row): it passes (0, pi) at 1.09 s and (pi, pi) at 1.66 s and goes on
    along the symmetric family, the smooth continuation that `reference` follows
    (measured max |q - q_ref| = 3.7e-10 over the whole run)."""
    sol, ref = _run("line_x0"), _reference("line_x0")
    assert float(jnp.min(ref.q[:, 0])) < -np.pi  # both singular passages
    assert max_abs(sol.q - ref.q) < 1.5e-9
    assert float(sol.max_energy_error) < 4e-7  # measured 9.5e-8 J


def test_reference_before_release_and_off_curve_hold():
    model = PlanarArmOnCurve("circle")
    ref = model.reference(jnp.array([0.0, 0.25, 0.49]))
    np.testing.assert_array_equal(ref.q, jnp.broadcast_to(model.hold, (3, 2)))
    assert max_abs(ref.v) == 0.0
    with pytest.raises(ValueError, match="off the curve"):
        PlanarArmOnCurve("circle", hold=[0.3, 0.0]).reference(jnp.array([1.0]))


def test_float32_methods():
    model = PlanarArmOnCurve("circle")
    q = model.initial_state()[0].astype(jnp.float32)
    for out in (model.mass_matrix(0.0, q), model.forces(0.0, q, q),
                model.holonomic(0.0, q), model.energy(0.0, q, q)):
        assert out.dtype == jnp.float32


def test_bad_curve_and_parameters():
    with pytest.raises(ValueError, match="'line_x1', 'line_x0', 'circle'"):
        PlanarArmOnCurve("parabola")
    with pytest.raises(ValueError, match="m2"):
        PlanarArmOnCurve(m2=-1.0)
    with pytest.raises(ValueError, match="coefficients"):
        PlanarArmOnCurve(coefficients=[1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="hold"):
        PlanarArmOnCurve(hold=[0.0, 1.0, 2.0])


def test_registered():
    assert cdiff.models.MODELS["planar-arm-on-curve"] is PlanarArmOnCurve
    model = cdiff.models.MODELS["planar-arm-on-curve"]()
    assert model.curve == "line_x1"
    assert model.observable(model.hold).shape == (len(model.observable_names),)
