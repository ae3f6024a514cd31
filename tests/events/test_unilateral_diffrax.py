"""Unilateral rows through diffrax (segments of `diffrax.diffeqsolve` between
events): adaptive steps, save times, other solvers and `Projected`, against the
same closed forms and SciPy references as cdiff's own RK4 loop
(tests/events/test_unilateral.py), in batches and under `jax.grad`."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    GRAVITY,
    T_RELEASE,
    Ball,
    LiftedBall,
    PendulumAgainstWall,
    assert_two_wall_impacts,
    ball_height_derivative,
    ball_impacts,
)

import cdiff

PID = diffrax.PIDController(rtol=1e-10, atol=1e-10)
SAVE_TS = np.linspace(0.0, 2.5, 126)


def ball_height(ts, h0, e):
    """The height of a ball dropped from rest at h0 at the times `ts`, bouncing
    with restitution e (until it rests, past which it is 0)."""
    times, speeds = ball_impacts(h0, e, 60)
    q = np.zeros_like(ts)
    first = ts < times[0]
    q[first] = h0 - 0.5 * GRAVITY * ts[first] ** 2
    for t_i, u in zip(times[:-1], e * speeds[:-1]):
        s = ts - t_i
        flight = (s >= 0) & (s < 2 * u / GRAVITY)
        q[flight] = u * s[flight] - 0.5 * GRAVITY * s[flight] ** 2
    return q


@pytest.fixture(scope="module")
def ball_adaptive():
    @jax.jit
    def run(h0):
        return cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([h0]),
                              jnp.array([0.0]), t1=2.5, dt=1e-2, solver=diffrax.Tsit5(),
                              stepsize_controller=PID,
                              saveat=cdiff.SaveAt(ts=jnp.asarray(SAVE_TS)))
    return run


def test_bouncing_ball_with_adaptive_steps_and_save_times(ball_adaptive):
    """Tsit5 with a PID controller: impact times to 1e-10 and e^2 per bounce to
    1e-12 (free flight is quadratic, within Tsit5's order), the state at 126 save
    times equal to the closed form (a save time at an impact has the state after
    it), rest on the ground."""
    sol = ball_adaptive(1.0)
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    n = int(ev.count)
    times, speeds = ball_impacts(1.0, 0.5, n)
    np.testing.assert_allclose(np.asarray(ev.t[:n]), times, rtol=0, atol=1e-10)
    np.testing.assert_allclose(-np.asarray(ev.v_before[:n, 0]), speeds, rtol=1e-10)
    before, after = np.asarray(ev.v_before[:n, 0]), np.asarray(ev.v_after[:n, 0])
    bounced = ~np.asarray(ev.rest[:n, 0])
    np.testing.assert_allclose(after[bounced] ** 2, 0.25 * before[bounced] ** 2,
                               rtol=1e-12)
    assert bool(ev.rest[n - 1, 0]) and bounced[: n - 1].all()
    np.testing.assert_array_equal(np.asarray(sol.ts), SAVE_TS)
    # (The rest rule stops the last bounces, shorter than a step dt, early.)
    resting = SAVE_TS > times[-1]
    exact = np.where(resting, 0.0, ball_height(SAVE_TS, 1.0, 0.5))
    np.testing.assert_allclose(np.asarray(sol.q[:, 0]), exact, rtol=0, atol=1e-10)
    assert np.asarray(sol.active[resting, 0]).all()
    assert not np.asarray(sol.active[SAVE_TS < times[0], 0]).any()
    assert float(sol.max_penetration) < 1e-12
    np.testing.assert_allclose(np.asarray(sol.unilateral_multipliers[resting, 0]),
                               2 * GRAVITY, rtol=1e-12)
    # Far fewer steps than a constant dt = 1e-2 (250).
    assert int(sol.stats["num_steps"]) < 60


def test_batch_with_adaptive_steps_has_each_members_events(ball_adaptive):
    """Each member of a vmap takes its own steps and events: equal to solving one
    at a time."""
    h0 = jnp.array([0.3, 1.0, 1.7])
    batch = jax.vmap(ball_adaptive)(h0)
    assert np.all(np.asarray(batch.result._value) == 0)
    for i, h in enumerate(h0):
        one = ball_adaptive(h)
        np.testing.assert_allclose(np.asarray(batch.q[i]), np.asarray(one.q), rtol=0,
                                   atol=1e-13)
        n = int(one.stats["events"].count)
        assert int(batch.stats["events"].count[i]) == n
        np.testing.assert_allclose(np.asarray(batch.stats["events"].t[i, :n]),
                                   np.asarray(one.stats["events"].t[:n]), rtol=0,
                                   atol=1e-13)


@pytest.mark.parametrize("name, kw", [
    ("tsit5", dict(solver=diffrax.Tsit5(),
                   stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12))),
    # (Slow tier: NullSpace's events run in the default tier on cdiff's RK4 loop.)
    pytest.param("null-space-tsit5", dict(
        formulation=cdiff.NullSpace(alpha=10.0, dof=1), solver=diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12)),
        marks=pytest.mark.slow),
    ("projected-dopri8", dict(
        solver=cdiff.Projected(diffrax.Dopri8(), cdiff.NewtonProjection()),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12))),
])
def test_pendulum_against_a_wall_with_diffrax_solvers(name, kw, wall_release):
    """Against SciPy's event location on the angle ODE (tests/events/conftest.py):
    impact times to 1e-9 and the energy ratio e^2 (NullSpace takes a new basis at
    each event); with `Projected`, every saved state (steps, and the events' states
    after their impacts) on the circle to round-off."""
    q0, reference = wall_release
    kw = {"formulation": cdiff.UdwadiaKalaba(), **kw}
    sol = cdiff.simulate(PendulumAgainstWall(), q0=q0, v0=jnp.zeros(2), t1=3.0, dt=2e-3,
                         **kw)
    assert_two_wall_impacts(sol, reference, after_rtol=1e-8)
    ev = sol.stats["events"]
    assert np.abs(np.asarray(ev.q[:2, 0]) + 0.4).max() < 1e-12
    saved = np.isfinite(np.asarray(sol.ts))
    assert float(np.min(np.asarray(sol.q[saved, 0]))) > -0.4 - 1e-12
    residual = np.abs(np.asarray(sol.holonomic_residual[saved])).max()
    assert residual < (1e-15 if name.startswith("projected") else 1e-9)


def test_release_with_adaptive_steps():
    """A ball lifted off the ground by a growing force (tests/events/test_unilateral.py):
    the release is the root of the multiplier on the dense output, and the motion
    after it, a cubic that Tsit5 integrates exactly, follows the closed form."""
    ts = np.linspace(0.0, 1.0, 41)
    sol = cdiff.simulate(LiftedBall(), cdiff.UdwadiaKalaba(), jnp.array([0.0]),
                         jnp.array([0.0]), t1=1.0, dt=1e-2, solver=diffrax.Tsit5(),
                         stepsize_controller=PID, saveat=cdiff.SaveAt(ts=ts))
    assert sol.result == cdiff.RESULTS.successful
    exact = GRAVITY * np.maximum(ts - T_RELEASE, 0.0) ** 3 / (6 * T_RELEASE)
    np.testing.assert_allclose(np.asarray(sol.q[:, 0]), exact, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(np.asarray(sol.active[1:, 0]), ts[1:] < T_RELEASE)


def test_gradient_through_an_impact_with_adaptive_steps():
    """d q(T) / d(h0, e) after one bounce: the event time's derivative by the
    implicit function theorem on the dense output (optimistix's implicit adjoint),
    against the closed form's derivative."""
    def height(h0, e):
        sol = cdiff.simulate(Ball(restitution=e), cdiff.UdwadiaKalaba(),
                             jnp.array([h0]), jnp.array([0.0]), t1=0.8, dt=1e-2,
                             saveat=cdiff.SaveAt(t1=True), solver=diffrax.Tsit5(),
                             stepsize_controller=PID)
        return sol.q[-1, 0]

    g_h, g_e = (float(x) for x in jax.jit(jax.grad(height, argnums=(0, 1)))(1.0, 0.5))
    np.testing.assert_allclose([g_h, g_e], ball_height_derivative(), rtol=1e-8)


def test_what_diffrax_cannot_take_is_named():
    with pytest.raises(ValueError, match="unilateral row.*adjoint"):
        cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([1.0]),
                       jnp.array([0.0]), t1=0.1, dt=1e-2, solver=diffrax.Tsit5(),
                       adjoint=diffrax.ForwardMode())


def test_the_cap_on_events_is_named_and_an_option():
    """`max_events` caps a solve in segments: three allowed, the ball's fourth
    impact ends it with `too_many_events` (naming the option), after its first
    three impacts at their closed-form times (the uncapped solve takes 7 before
    t = 1.5). Where it cannot apply it is refused."""
    def solve(max_events):
        return cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([1.0]),
                              jnp.array([0.0]), t1=1.5, dt=1e-2, solver=diffrax.Tsit5(),
                              stepsize_controller=PID, saveat=cdiff.SaveAt(t1=True),
                              throw=False, max_events=max_events)

    capped = jax.jit(lambda: solve(3))()
    assert capped.result == cdiff.RESULTS.too_many_events
    assert "max_events" in capped.message
    np.testing.assert_allclose(np.asarray(capped.stats["events"].t[:3]),
                               ball_impacts(1.0, 0.5, 3)[0], rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="cdiff's RK4 loop.*max_events out"):
        cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([1.0]),
                       jnp.array([0.0]), t1=0.1, dt=1e-2, max_events=3)
    with pytest.raises(ValueError, match="max_events must be a positive int"):
        solve(0)
