"""Unilateral rows with the DAE formulations (GGL, IndexOne) and cdiff's BDF:
segments of BDF restarted at order 1 from a consistent state after every event,
the event located on BDF's interpolating polynomial. Against the closed forms and
SciPy references of tests/events/test_unilateral.py; BDF's error is its tolerance's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    GRAVITY,
    Ball,
    PendulumAgainstWall,
    assert_two_wall_impacts,
    ball_height_derivative,
    ball_impacts,
)

import cdiff

DAES = {"ggl": cdiff.GGL(), "index-one": cdiff.IndexOne()}
SAVE_TS = jnp.linspace(0.0, 2.5, 126)


@pytest.fixture(scope="module")
def ball_runs():
    @jax.jit
    def run():
        return {name: cdiff.simulate(Ball(), f, jnp.array([1.0]), jnp.array([0.0]),
                                     t1=2.5, dt=1e-2,
                                     solver=cdiff.BDF(rtol=1e-10, atol=1e-10),
                                     saveat=cdiff.SaveAt(ts=SAVE_TS))
                for name, f in DAES.items()}
    return run()


@pytest.mark.parametrize("name", list(DAES))
def test_bouncing_ball_with_bdf(ball_runs, name):
    """Impact times to BDF's tolerance (each segment restarts at order 1), e^2
    per bounce to round-off (the impact law is exact), rest in finite time with
    the ground carrying the weight, no penetration. The rows not held get zero
    multipliers (the DAE's equations for them)."""
    sol = ball_runs[name]
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    n = int(ev.count)
    times, _ = ball_impacts(1.0, 0.5, n)
    np.testing.assert_allclose(np.asarray(ev.t[:n]), times, rtol=0, atol=1e-7)
    before, after = np.asarray(ev.v_before[:n, 0]), np.asarray(ev.v_after[:n, 0])
    bounced = ~np.asarray(ev.rest[:n, 0])
    np.testing.assert_allclose(after[bounced] ** 2, 0.25 * before[bounced] ** 2,
                               rtol=1e-12)
    assert bool(ev.rest[n - 1, 0]) and bounced[: n - 1].all()
    ts = np.asarray(sol.ts)
    resting = ts > times[-1]
    assert resting.sum() > 10 and np.asarray(sol.active[resting, 0]).all()
    assert np.abs(np.asarray(sol.q[resting, 0])).max() < 1e-12
    assert float(sol.max_penetration) < 1e-12
    lam = np.asarray(sol.unilateral_multipliers[:, 0])
    np.testing.assert_allclose(lam[resting], 2 * GRAVITY, rtol=1e-10)
    assert np.all(lam[~np.asarray(sol.active[:, 0])] == 0)


def test_pendulum_against_a_wall_with_ggl(wall_release):
    """GGL keeps the circle to round-off through the impacts; the impact times
    converge to SciPy's with BDF's tolerance."""
    q0, reference = wall_release
    sol = cdiff.simulate(PendulumAgainstWall(), cdiff.GGL(), q0, jnp.zeros(2), t1=3.0,
                         dt=1e-3, solver=cdiff.BDF(rtol=1e-12, atol=1e-12))
    assert_two_wall_impacts(sol, reference, after_rtol=1e-12)
    saved = np.isfinite(np.asarray(sol.ts))
    assert np.abs(np.asarray(sol.holonomic_residual[saved])).max() < 1e-14
    assert float(sol.max_penetration) < 1e-12


@pytest.mark.slow
def test_gradient_through_an_impact_with_bdf():
    """d q(T) / d(h0, e) after one bounce through GGL and BDF (the event time's
    first-order correction on BDF's polynomial; the next segment's start time
    differentiated): against the closed form's derivative to BDF's tolerance and
    against central differences of the same solve. (Slow: its compilation takes
    about 90 s.)"""
    def height(h0, e):
        sol = cdiff.simulate(Ball(restitution=e), cdiff.GGL(), jnp.array([h0]),
                             jnp.array([0.0]), t1=0.8, dt=1e-3,
                             saveat=cdiff.SaveAt(t1=True),
                             solver=cdiff.BDF(rtol=1e-10, atol=1e-10))
        return sol.q[-1, 0]

    g_h, g_e = (float(x) for x in jax.jit(jax.grad(height, argnums=(0, 1)))(1.0, 0.5))
    np.testing.assert_allclose([g_h, g_e], ball_height_derivative(), rtol=1e-7)
    run = jax.jit(height)
    h = 1e-5
    sim_h = (float(run(1.0 + h, 0.5)) - float(run(1.0 - h, 0.5))) / (2 * h)
    np.testing.assert_allclose(g_h, sim_h, rtol=1e-8)
