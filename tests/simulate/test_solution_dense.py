"""`Solution.evaluate` (dense output between saved rows) and
`Solution.max_velocity_error`, against exact references."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff

MODEL = cdiff.models.SliderCrank()
UK = cdiff.UdwadiaKalaba()
# Both solves take 50 steps, so they share one compiled program: dt = 1e-2 to
# t = 0.5 and dt = 5e-3 to t = 0.25, compared on [0, 0.25].
T1 = {1e-2: 0.5, 5e-3: 0.25}


def _solve(model, q0, v0, dt=1e-2):
    return cdiff.simulate(model, UK, q0, v0, t1=T1[dt], dt=dt)


@functools.cache
def _run(dt):
    q0, v0 = MODEL.initial_state()
    return _solve(MODEL, q0, v0, dt)


def _midpoints(ts):
    return 0.5 * (ts[1:] + ts[:-1])


@functools.cache
def _reference():
    """The exact motion at every saved time and midpoint of both runs (one solve
    of the reference ODE)."""
    ts = np.unique(np.concatenate([np.asarray(t) for dt in T1 for t in
                                   (_run(dt).ts, _midpoints(_run(dt).ts))]))
    ref = MODEL.reference(jnp.asarray(ts))
    return ts, np.asarray(ref.q), np.asarray(ref.v)


def _exact(t):
    ts, q, v = _reference()
    i = np.searchsorted(ts, np.asarray(t))
    np.testing.assert_array_equal(ts[i], t)
    return q[i], v[i]


_evaluate = jax.jit(lambda sol, t: sol.evaluate(t))


def _rows(sol, f):
    """`sol` with `f` applied to the saved rows that `evaluate` reads (the rates
    `qdot`, `vdot` follow from the formulation's state)."""
    return eqx.tree_at(lambda s: (s.ts, s.q, s.v, s.state), sol,
                       jax.tree.map(f, (sol.ts, sol.q, sol.v, sol.state)))


def _midpoint_errors(dt, until=None):
    sol = _run(dt)
    t = _midpoints(sol.ts)
    if until is not None:
        t = t[t < until]
    q, v = _evaluate(sol, t)
    q_ref, v_ref = _exact(t)
    return np.max(np.abs(q - q_ref)), np.max(np.abs(v - v_ref))


def test_midpoints_match_the_exact_slider_crank():
    # R2 at dt = 1e-2: between the steps the interpolant is as accurate as the
    # saved rows are (measured: midpoints 3.7e-7 in q, 9.9e-6 in v; saved rows
    # 1.6e-7 and 1.1e-6).
    sol = _run(1e-2)
    err_q, err_v = _midpoint_errors(1e-2)
    rows_q, rows_v = _exact(sol.ts)
    assert np.max(np.abs(sol.q - rows_q)) < 1e-6
    assert err_q < 2e-6, err_q
    assert err_v < 5e-5, err_v


def test_saved_times_give_the_saved_rows():
    # Measured: exactly equal (s = 0 or 1 selects one row).
    sol = _run(1e-2)
    q, v = _evaluate(sol, sol.ts)
    np.testing.assert_array_equal(q, sol.q)
    np.testing.assert_array_equal(v, sol.v)


def test_fourth_order_convergence():
    # Halving dt: midpoint errors on [0, 0.25] fall from 6.3e-9 to 4.0e-10 in q
    # and from 7.0e-8 to 4.6e-9 in v, 15.6x and 15.3x (observed orders 3.96 and
    # 3.94).
    coarse = np.array(_midpoint_errors(1e-2, until=0.25))
    fine = np.array(_midpoint_errors(5e-3, until=0.25))
    order = np.log2(coarse / fine)
    assert np.all((order > 3.5) & (order < 4.5)), order


def test_max_velocity_error_against_numpy():
    sol = _run(1e-2)
    jac = jax.jit(jax.vmap(jax.jacfwd(MODEL.holonomic, argnums=1)))(sol.ts, sol.q)
    # SliderCrank's constraints do not depend on t: the velocity residual is A_q v.
    residual = np.einsum("tij,tj->ti", np.asarray(jac), np.asarray(sol.v))
    expected = np.max(np.abs(residual))
    # Round-off of A_q v (measured 5.6e-17).
    np.testing.assert_allclose(sol.max_velocity_error, expected, rtol=0, atol=2e-16)
    assert 0 < expected < 3e-7  # measured 8.2e-8


def test_rows_past_the_saved_range_and_repeated_times():
    sol = _run(1e-2)
    t = jnp.array([0.0, 0.205, 0.4])
    # Unused trailing rows (inf), as when a vmapped solve takes fewer steps.
    short = eqx.tree_at(lambda s: s.ts, sol, sol.ts.at[41:].set(jnp.inf))
    np.testing.assert_array_equal(_evaluate(short, t)[0], _evaluate(sol, t)[0])
    with pytest.raises(Exception, match="outside the saved times"):
        _evaluate(short, t + 0.005)
    # A time saved twice (t1 by both `steps` and `t1`): no zero-length interval.
    twice = _rows(sol, lambda x: jnp.concatenate([x, x[-1:]]))
    q, _ = _evaluate(twice, jnp.array([0.5, 0.495, 0.0]))
    np.testing.assert_array_equal(q[0], sol.q[-1])
    # The same interval, the same arithmetic: measured equal.
    np.testing.assert_array_equal(q[1], _evaluate(sol, jnp.array([0.495]))[0][0])
    # Every tenth row: the intervals of a sparser save, exact at their ends.
    sparse = _rows(sol, lambda x: x[::10])
    np.testing.assert_array_equal(_evaluate(sparse, t)[0][2], sol.q[40])


@pytest.mark.parametrize("t", [-1e-3, 0.5 + 1e-9, jnp.nan])
def test_times_outside_the_saved_range_raise(t):
    sol = _run(1e-2)
    with pytest.raises(Exception, match="outside the saved times"):
        sol.evaluate(t)  # outside jit
    with pytest.raises(Exception, match="outside the saved times"):
        _evaluate(sol, jnp.array([0.1, t]))


def test_jit_and_vmap_over_initial_states():
    sol = _run(1e-2)
    # Consistent initial states: saved rows of the run.
    rows = np.array([0, 10, 20])
    q0s, v0s = sol.q[rows], sol.v[rows]
    t = jnp.array([0.0, 0.123, 0.377])

    def solve_and_evaluate(q0, v0):
        sol = _solve(MODEL, q0, v0)
        return sol, sol.evaluate(t)

    batched, (q_i, v_i) = jax.jit(jax.vmap(solve_and_evaluate))(q0s, v0s)
    # A batched solution evaluates every trajectory at the same times.
    q_b, v_b = _evaluate(batched, t)
    assert q_b.shape == (3, 3, 6) and v_b.shape == (3, 3, 6)
    np.testing.assert_array_equal(q_b, q_i)
    np.testing.assert_array_equal(v_b, v_i)
    for k in range(3):
        one = _solve(MODEL, q0s[k], v0s[k])
        q, v = _evaluate(one, t)
        # Batched against separate: round-off (measured 5.6e-17 and 2.2e-16).
        np.testing.assert_allclose(q_b[k], q, rtol=0, atol=2e-16)
        np.testing.assert_allclose(v_b[k], v, rtol=0, atol=1e-15)
    # Over the whole batch, as max_constraint_error: the same maximum.
    np.testing.assert_array_equal(
        batched.max_velocity_error,
        np.max(np.abs(np.asarray(batched.velocity_residual))))


def test_gradients_in_t_and_through_the_solve():
    sol = _run(1e-2)
    t = 0.255
    # In t: the interpolant's derivative against a central difference.
    dq_dt = jax.jit(jax.jacfwd(lambda t: sol.evaluate(t)[0]))(t)
    h = 1e-6
    q, v = _evaluate(sol, jnp.array([t - h, t + h, t]))
    # Measured: 3.7e-11 from the difference, 9.7e-8 from the interpolated v.
    np.testing.assert_allclose(dq_dt, (q[1] - q[0]) / (2 * h), rtol=0, atol=1.5e-10)
    np.testing.assert_allclose(dq_dt, v[2], rtol=0, atol=4e-7)

    # Through the solve, in the gravity g, against central differences.
    q0, v0 = MODEL.initial_state()

    def crank_angle(g):
        model = eqx.tree_at(lambda m: m.g, MODEL, g)
        return _solve(model, q0, v0).evaluate(t)[0][2]

    grad = jax.jit(jax.grad(crank_angle))(jnp.asarray(9.81))
    h = 1e-4
    up, down = (crank_angle(jnp.asarray(9.81 + d)) for d in (h, -h))
    fd = (up - down) / (2 * h)
    # Measured: -1.64e-2, relative difference 7.9e-11.
    assert abs(grad) > 1e-3
    np.testing.assert_allclose(grad, fd, rtol=5e-10)
