"""R5 (Yun-Sarkar Sec. V-B): the two-link arm with its end point on a circle.

Independent references: the printed Jacobian of eq. 54, the geometry of the end
point, the exponential decay of eq. 18, the compound-pendulum ODE of the welded arm
(`reference`, Dopri8 at 1e-12), energy conservation and the work of the torque."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EPS, max_abs

import cdiff
from cdiff.models import TwoLinkOnCircle


T1 = 2.0
TS = jnp.linspace(0.0, T1, 201)  # every 0.01 s
ALPHA = 5.0  # the paper's stabilisation factor


class _Torque(eqx.Module):
    """A constant joint torque tau1 (traced, so every value shares a compilation)."""

    tau: jax.Array

    def __call__(self, t, q, v):
        return jnp.stack([self.tau]).astype(q.dtype)


@functools.cache
def _run(formulation, dt, violated=False, tau=0.0):
    model = TwoLinkOnCircle()
    q0, v0 = model.initial_state(violated=violated)
    return cdiff.simulate(model, formulation, q0, v0, t1=T1, dt=dt,
                          control=_Torque(jnp.asarray(tau)),
                          saveat=cdiff.SaveAt(ts=TS))


@functools.cache
def _reference(tau=0.0):
    return TwoLinkOnCircle().reference(TS[1:], torque=jnp.asarray(tau))


def test_constraints_are_eq_53_with_the_jacobian_of_eq_54():
    """Autodiff's Jacobian equals eq. 54 (signs restored), and c3 is the end point's
    distance condition l3^2 - |p_E|^2 wherever the joint is closed."""
    model = TwoLinkOnCircle()
    l1, l2, lc2 = model.l1, model.l2, model.lc2
    rng = np.random.default_rng(0)
    for q in rng.uniform(-3.0, 3.0, (5, 4)):
        th1, _, _, th2 = q
        s = np.sin(np.pi + th1 - th2)
        printed = np.array([
            [l1 * np.sin(th1), 1.0, 0.0, lc2 * np.sin(th2)],
            [-l1 * np.cos(th1), 0.0, 1.0, -lc2 * np.cos(th2)],
            [-2 * l1 * l2 * s, 0.0, 0.0, 2 * l1 * l2 * s],
        ])
        A = jax.jacfwd(model.holonomic, argnums=1)(0.0, jnp.asarray(q))
        # Measured equal at every state; 1e-15 is 1 to 4 ulp of the entries (up to 4).
        np.testing.assert_allclose(A, printed, rtol=0, atol=1e-15)
        # Close the joint (choose x2, y2 so that c1 = c2 = 0): c3 = l3^2 - |p_E|^2.
        closed = jnp.asarray(q).at[1:3].set(
            [l1 * np.cos(th1) + lc2 * np.cos(th2), l1 * np.sin(th1) + lc2 * np.sin(th2)]
        )
        c = model.holonomic(0.0, closed)
        # Round-off: measured 2.2e-16 at one state, 0 at the others.
        np.testing.assert_allclose(c[:2], 0.0, rtol=0, atol=1e-15)
        end = model.end_point(closed)
        # Measured up to 3.7e-16 relative (0 at two states).
        assert float(c[2]) == pytest.approx(model.l3**2 - float(end @ end), rel=1.5e-15,
                                            abs=0)


def test_starts():
    model = TwoLinkOnCircle()
    q0, v0 = model.initial_state()
    assert max_abs(model.holonomic(0.0, q0)) < 1e-14
    # Measured equal (both builds); 2 ulp of 2.5 allowed.
    np.testing.assert_allclose(float(jnp.linalg.norm(model.end_point(q0))), 2.5,
                               rtol=2 * EPS, atol=0)
    assert max_abs(v0) == 0.0
    # The paper's scenario: every constraint violated by 0.1 to 0.3.
    qv, vv = model.initial_state(violated=True)
    c = np.abs(np.asarray(model.holonomic(0.0, qv)))
    assert np.all((0.1 < c) & (c < 0.3)), c
    assert max_abs(vv) == 0.0
    assert model.input_matrix(0.0, q0).shape == (4, 1)


def test_violated_start_converges_by_1_2_s():
    """Issue acceptance (Fig. 5): NullSpace with alpha = 5 and the paper's 0.01 s
    step, u = 0: every constraint is below 1e-3 from t = 1.2 s on, and each decays
    as c(0) exp(-alpha t) (eq. 18), so it falls below 1e-3 at ln(|c(0)|/1e-3)/alpha
    (1.03, 0.98, 1.06 s for this start)."""
    sol = _run(cdiff.NullSpace(alpha=ALPHA), 1e-2, violated=True)
    c = sol.holonomic_residual
    c0 = c[0]
    assert bool(jnp.all(jnp.abs(c0) > 0.1))
    assert max_abs(c[TS >= 1.2]) < 1e-3
    # Eq. 18; measured deviation 5.9e-8 (RK4 at dt = 1e-2).
    np.testing.assert_allclose(c, c0 * jnp.exp(-ALPHA * TS)[:, None], atol=2e-7)
    below = np.asarray(jnp.abs(c) < 1e-3)
    first = np.asarray(TS)[np.argmax(below, axis=0)]
    predicted = np.log(np.abs(np.asarray(c0)) / 1e-3) / ALPHA
    np.testing.assert_allclose(first, predicted, atol=0.01)  # the save grid
    assert np.all(first < 1.2)
    # The velocity constraints converge with them (J qdot = -alpha c).
    # Round-off (measured 2.7e-15, on values up to 1.5).
    np.testing.assert_allclose(sol.velocity_residual, -ALPHA * c, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "formulation, dt, q_tol, v_tol",
    [
        # Measured max |q - q_ref| / |v - v_ref|: 8.1e-8 / 4.8e-7 (dt = 1e-2, the
        # acceptance test's compilation), 2.5e-11 / 8.0e-11, 1.9e-11 / 6.8e-11.
        (cdiff.NullSpace(alpha=ALPHA), 1e-2, 2e-7, 1e-6),
        (cdiff.UdwadiaKalaba(), 1e-3, 1e-10, 3e-10),
        (cdiff.Lagrange(), 1e-3, 1e-10, 3e-10),
    ],
    ids=["NullSpace", "UdwadiaKalaba", "Lagrange"],
)
def test_consistent_start_agrees_with_the_minimal_reference(formulation, dt, q_tol,
                                                            v_tol):
    sol = _run(formulation, dt)
    ref = _reference()
    assert max_abs(sol.q[1:] - ref.q) < q_tol
    assert max_abs(sol.v[1:] - ref.v) < v_tol
    # The arm swings (the comparison is not trivial).
    assert float(jnp.ptp(ref.q[:, 0])) > 1.0


def test_reference_conserves_energy_and_lies_on_the_constraints():
    model = TwoLinkOnCircle()
    ref = _reference()
    q0, v0 = model.initial_state()
    energy = jax.vmap(lambda q, v: model.energy(0.0, q, v))(ref.q, ref.v)
    kinetic = jax.vmap(lambda v: 0.5 * v @ model.mass_matrix(0.0, q0) @ v)(ref.v)
    # Measured 3.8e-9 J over 2 s, with a kinetic energy of up to 199 J.
    assert max_abs(energy - model.energy(0.0, q0, v0)) < 1e-10 * float(jnp.max(kinetic))
    # Round-off (measured 1.8e-15 and 8.9e-16).
    assert max_abs(jax.vmap(lambda q: model.holonomic(0.0, q))(ref.q)) < 8e-15
    A = jax.vmap(lambda q: jax.jacfwd(model.holonomic, argnums=1)(0.0, q))(ref.q)
    assert max_abs(jnp.einsum("tij,tj->ti", A, ref.v)) < 4e-15


@pytest.mark.parametrize(
    "formulation, dt, tol",
    # Measured |E - E0| over 2 s: 9.1e-6 J, 6.9e-10 J, 6.5e-10 J (|E| ~ 200 J).
    [(cdiff.NullSpace(alpha=ALPHA), 1e-2, 3e-5), (cdiff.UdwadiaKalaba(), 1e-3, 3e-9),
     (cdiff.Lagrange(), 1e-3, 3e-9)],
    ids=["NullSpace", "UdwadiaKalaba", "Lagrange"],
)
def test_energy_is_conserved_without_input(formulation, dt, tol):
    sol = _run(formulation, dt)
    assert float(sol.max_energy_error) < tol


def test_torque_enters_through_the_input_matrix():
    """A constant torque tau1: the trajectory of the minimal ODE with the torque,
    and the energy changes by the work tau1 (theta1(t) - theta1(0))."""
    tau = 40.0
    sol = _run(cdiff.UdwadiaKalaba(), 1e-3, tau=tau)
    free = _run(cdiff.UdwadiaKalaba(), 1e-3)
    ref = _reference(tau)
    assert max_abs(sol.q[1:] - ref.q) < 1e-10  # measured 2.0e-11
    assert max_abs(sol.q - free.q) > 0.1  # the torque matters
    work = tau * (sol.q[:, 0] - sol.q[0, 0])
    assert max_abs(sol.energy - sol.energy[0] - work) < 1.5e-9  # measured 3.2e-10 J


def test_float32_methods():
    model = TwoLinkOnCircle()
    q, v = (x.astype(jnp.float32) for x in model.initial_state(violated=True))
    for out in (model.mass_matrix(0.0, q), model.forces(0.0, q, v),
                model.holonomic(0.0, q), model.energy(0.0, q, v),
                model.input_matrix(0.0, q)):
        assert out.dtype == jnp.float32


@pytest.mark.parametrize(
    "kwargs, word",
    [({"l3": 3.5}, "l3"), ({"l3": 0.5}, "l3"), ({"m2": -1.0}, "m2"),
     ({"I1": 0.0}, "I1"), ({"l1": float("nan")}, "l1")],
)
def test_bad_parameters(kwargs, word):
    with pytest.raises(ValueError, match=word):
        TwoLinkOnCircle(**kwargs)


def test_vmap_over_a_parameter():
    """Fields are traced leaves: the model's dynamics vmap over m2."""
    q0, v0 = TwoLinkOnCircle().initial_state()
    energies = jax.vmap(lambda m2: TwoLinkOnCircle(m2=m2).energy(0.0, q0, v0))(
        jnp.array([1.0, 2.0]))
    # Measured equal; 2 ulp allowed.
    np.testing.assert_allclose(energies[1] - energies[0], 9.81 * q0[2], rtol=4.5e-16)
