"""Yun-Sarkar's null-space formulation: exact solutions, agreement, the state-space
pair f, g, the continuity of nu, and the paper's eqs. 36 and 39."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EPS, Skate, kkt_numpy, slider_crank_numpy, slider_crank_saved

import cdiff



def _slider_crank(formulation, t1=10.0, dt=1e-3, redundant=False):
    return slider_crank_saved(formulation, t1=t1, dt=dt, redundant=redundant)


def test_slider_crank_agrees_with_the_other_formulations():
    """Issue #3: over 10 s at dt = 1e-3 (twenty singular passages) theta1 agrees
    with UdwadiaKalaba, Lagrange and the exact solution to 1e-6 (measured 8.5e-8,
    8.5e-8 and 7.9e-8)."""
    ns = _slider_crank(cdiff.NullSpace(alpha=10.0))
    model = cdiff.models.SliderCrank()
    exact = model.reference(ns.ts[1:]).q[:, 2]
    assert float(jnp.max(jnp.abs(ns.q[1:, 2] - exact))) < 8e-7
    for other in (cdiff.UdwadiaKalaba(), cdiff.Lagrange(10.0, 10.0)):
        sol = _slider_crank(other)
        assert float(jnp.max(jnp.abs(ns.q[:, 2] - sol.q[:, 2]))) < 8e-7
    assert float(ns.max_constraint_error) < 8e-11  # measured 2.0e-11


def test_redundant_constraints_change_nothing():
    """Duplicated rows: the same trajectory, on a horizon of constant rank (the
    formulation's premise: the first singular passage is at t = 0.5 s)."""
    f = cdiff.NullSpace(alpha=10.0)
    plain = _slider_crank(f, t1=0.4)
    redundant = _slider_crank(f, t1=0.4, redundant=True)
    # Round-off at most (measured: equal, bitwise on the CPU, in both builds; the
    # bound is 2 ulp of the largest coordinate, at most 1.5).
    scale = float(jnp.max(jnp.abs(plain.q)))
    np.testing.assert_allclose(redundant.q, plain.q, rtol=0, atol=2 * EPS * scale)


def test_skate_exact_solution_and_nu_continuity():
    model = Skate()
    q0, v0 = (jnp.asarray(x[0]) for x in Skate.exact(np.zeros(1)))
    sol = cdiff.simulate(model, cdiff.NullSpace(), q0, v0, t1=5.0, dt=1e-2)
    q_exact, v_exact = Skate.exact(np.asarray(sol.ts))
    assert float(jnp.max(jnp.abs(sol.q - q_exact))) < 1e-8  # measured 1.3e-9
    assert float(jnp.max(jnp.abs(sol.v - v_exact))) < 8e-10  # measured 8.4e-11
    # Round-off (measured 1.4e-16).
    assert float(jnp.max(jnp.abs(sol.velocity_residual))) < 6e-16
    # The null space turns a full circle (the blade rotates 10 rad) with the basis
    # transported along: nu (the blade's speed and spin in that basis) stays
    # constant, as in the exact motion (measured: changes of 1.8e-13 per step; an
    # SVD basis would jump by O(1)).
    _, nu, R = sol.state
    assert float(jnp.max(jnp.abs(jnp.diff(nu, axis=0)))) < 7e-13
    np.testing.assert_allclose(jnp.einsum("tij,tik->tjk", R, R),
                               jnp.broadcast_to(jnp.eye(2), (R.shape[0], 2, 2)),
                               rtol=0, atol=1.5e-15)  # round-off: 3.3e-16


def test_initial_velocity_by_least_squares():
    """Eq. 36: an inadmissible qdot0 is replaced by its least-squares admissible
    part S nu0 + eta."""
    model = cdiff.models.SliderCrank()
    q0, _ = model.initial_state()
    v0 = jnp.array([0.3, 0.1, -0.2, 0.5, 0.2, 0.4])  # violates A v = 0
    sol = cdiff.simulate(model, cdiff.NullSpace(), q0, v0, t1=0.01, dt=0.01)
    A = jax.jacfwd(model.holonomic, 1)(0.0, q0)
    N = jnp.eye(6) - jnp.linalg.pinv(A) @ A
    # Round-off: measured 1.7e-16.
    np.testing.assert_allclose(sol.v[0], N @ v0, rtol=0, atol=8e-16)


def _context(model, formulation, q0, v0):
    formulation = formulation.bind(model, 0.0, q0, v0)
    context = cdiff.Context(model, None, jnp.asarray(jnp.nan))
    return formulation, context, formulation.init_state(0.0, q0, v0, context)


def test_state_space_pair_f_g():
    """Eq. 28: x' = f(x) + g(x) u equals the simulated dynamics with control u."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    v0 = v0.at[2].set(1.0)
    f, context, x = _context(model, cdiff.NullSpace(alpha=3.0), q0, v0)
    u = jnp.array([0.1, -0.2, 0.3, 0.0, 0.5, -0.1])
    with_u = cdiff.Context(model, lambda t, q, v: u, context.e0)
    rate = f.dynamics(0.0, x, with_u, None).rate
    drift, gain = f.f(0.0, x, context), f.g(0.0, x, context)
    # The input enters through nu alone: for q and R (the first and last parts of
    # the state) g is zero and the pair is exact; for nu round-off (measured 8.9e-16).
    for r, d, g, exact in zip(rate, drift, gain, (True, False, True)):
        if exact:
            np.testing.assert_array_equal(r, d + g @ u)
        else:
            np.testing.assert_allclose(r, d + g @ u, rtol=0, atol=4e-15)
    # The acceleration: qdd = d/dt of v = S nu + eta along the rate (forward mode
    # through the public `coordinates`), against the KKT system of R2 written out
    # by hand in NumPy at the admissible velocity (eq. 36: the least-squares part
    # of v0); cdiff.Lagrange as an extra.
    _, v = f.coordinates(0.0, x, context)
    qdd = jax.jvp(lambda y: f.coordinates(0.0, y, context), (x,), (rate,))[1][1]
    A = slider_crank_numpy(np.asarray(q0), np.asarray(v0))[2]
    v_ref = np.asarray(v0) - np.linalg.pinv(A) @ (A @ np.asarray(v0))
    M, Q, A, Adot_v = slider_crank_numpy(np.asarray(q0), v_ref)
    qdd_ref, _ = kkt_numpy(M, Q + np.asarray(u), A, -Adot_v)
    acc = cdiff.Lagrange().dynamics(0.0, (q0, v), with_u, None).rate[1]
    # Round-off (measured 6.1e-16, 8.0e-15, 2.7e-15).
    np.testing.assert_allclose(v, v_ref, rtol=0, atol=2.5e-15)
    np.testing.assert_allclose(qdd, qdd_ref, rtol=0, atol=3e-14)
    np.testing.assert_allclose(qdd, acc, rtol=0, atol=1e-14)


def test_gamma_is_eq_39_for_the_transported_basis():
    """gamma = S' nu + eta' (by autodiff) equals the paper's A^+(a' - A' qdot)
    (eqs. 37-39) where the transported basis R lies in the null space: for
    S = P(q) R the null-space part of S' nu is P P' P R nu = 0."""
    model = Skate()
    q0 = jnp.array([0.0, 0.0, 0.4])
    v0 = jnp.array([np.cos(0.4), np.sin(0.4), 2.0])
    f, context, x = _context(model, cdiff.NullSpace(), q0, v0)
    x = f.end_step(0.0, x, context)
    q, nu, R = x
    # private on purpose: gamma is an internal term of the formulation's kernel.
    _, qdot, gamma, _, _, pinv = f._terms(0.0, q, nu, R, context)

    def A_of(q):  # the skate's velocity constraint matrix, by hand
        return jnp.stack([jnp.sin(q[2]), -jnp.cos(q[2]), jnp.zeros_like(q[2])])[None]

    A = A_of(q)
    adot_minus_Adot_qdot = -jax.jvp(A_of, (q,), (qdot,))[1] @ qdot  # a = 0 here
    eq39 = jnp.linalg.pinv(A) @ adot_minus_Adot_qdot
    row = jnp.linalg.pinv(A) @ (A @ gamma)
    # Round-off (measured 0 and 2.2e-16, on entries of up to 1.8).
    np.testing.assert_allclose(row, eq39, rtol=0, atol=1e-15)
    np.testing.assert_allclose(gamma, eq39, rtol=0, atol=1e-15)
    # Not trivially zero: the blade's centripetal acceleration u omega = 1 * 2
    # (measured 2.2e-16 relative, in both builds).
    assert float(jnp.linalg.norm(eq39)) == pytest.approx(2.0, rel=1e-15, abs=0)


def test_holonomic_errors_decay_as_exp_minus_alpha_t():
    """Eq. 18: C(t) = C0 exp(-alpha t) along the solution."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    q0 = q0.at[0].add(1e-3)  # violates the first constraint
    alpha = 4.0
    ts = jnp.linspace(0.0, 0.3, 7)
    sol = cdiff.simulate(model, cdiff.NullSpace(alpha=alpha), q0, v0, t1=0.3,
                         dt=1e-3, saveat=cdiff.SaveAt(ts=ts))
    phi0 = sol.holonomic_residual[0]
    expected = phi0[None, :] * jnp.exp(-alpha * ts)[:, None]
    # Measured 8.4e-13 (of C0 = 1e-3).
    np.testing.assert_allclose(sol.holonomic_residual, expected, rtol=0, atol=3e-12)


def test_traced_initial_state_needs_dof():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    with pytest.raises(ValueError, match="dof"):
        jax.vmap(lambda q: cdiff.simulate(model, cdiff.NullSpace(), q, v0, t1=0.1,
                                          dt=1e-2).q)(q0[None])
