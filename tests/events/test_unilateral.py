"""Unilateral constraints in `cdiff.simulate` against closed forms and an independent
reference: a bouncing ball (impact times, e^2 per impact, rest in finite time) and
a Cartesian pendulum against a wall (the wall's event against SciPy's event
location on the angle ODE, the energy ratio e^2, no penetration), under every
supported formulation; batches and gradients through an impact."""

import functools

import diffrax
import equinox as eqx
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
    ball_height_closed_form,
    ball_height_derivative,
    ball_impacts,
)

import cdiff

FORMULATIONS = {"udwadia-kalaba": cdiff.UdwadiaKalaba(),
                "lagrange": cdiff.Lagrange(alpha=10.0, beta=10.0),
                "projection": cdiff.Projection(),
                "null-space": cdiff.NullSpace(alpha=10.0, dof=1)}
# Each formulation with cdiff's RK4; and Aghili's projection formulation with his
# post-step coordinate projection (eq. 37) after every sub-step.
RUNS = {name: dict(formulation=f) for name, f in FORMULATIONS.items()} | {
    "projected": dict(formulation=cdiff.Projection(),
                      solver=cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection()))}


@pytest.fixture(scope="module")
def ball_runs():
    @jax.jit
    def run(h0, e):
        model = Ball(restitution=e)
        return {name: cdiff.simulate(model, q0=jnp.array([h0]), v0=jnp.array([0.0]),
                                     t1=2.5, dt=1e-2, **kw)
                for name, kw in RUNS.items()}

    return run(1.0, 0.5)


@pytest.mark.parametrize("name", list(RUNS))
def test_bouncing_ball_matches_its_closed_form(ball_runs, name):
    sol = ball_runs[name]
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    n = int(ev.count)
    times, speeds = ball_impacts(1.0, 0.5, n)
    t_rest = times[0] * (1 + 0.5) / (1 - 0.5)
    # Free flight is quadratic in t, which RK4 integrates exactly: impact times
    # and speeds to round-off.
    bounced = ~np.asarray(ev.rest[:n, 0])
    np.testing.assert_allclose(np.asarray(ev.t[:n]), times, rtol=0, atol=1e-10)
    np.testing.assert_allclose(-np.asarray(ev.v_before[:n, 0]), speeds, rtol=1e-10)
    # Kinetic energy after a bounce: e^2 of that before.
    before, after = np.asarray(ev.v_before[:n, 0]), np.asarray(ev.v_after[:n, 0])
    np.testing.assert_allclose(after[bounced] ** 2, 0.25 * before[bounced] ** 2,
                               rtol=1e-12)
    # The last impact is the plastic one of the rest rule; it comes before the
    # closed form's time of rest, by less than a step's worth of bounces.
    assert bool(ev.rest[n - 1, 0]) and bounced[: n - 1].all()
    assert 0 <= t_rest - times[-1] < 2 * 1e-2
    # At rest from there: on the ground, without penetration.
    ts, q, v = (np.asarray(x) for x in (sol.ts, sol.q[:, 0], sol.v[:, 0]))
    after_rest = ts > times[-1] + 1e-2
    assert after_rest.sum() > 10
    assert np.abs(q[after_rest]).max() < 1e-12
    assert np.abs(v[after_rest]).max() < 1e-12
    assert q.min() > -1e-12
    # The solution's diagnostics: the row's value, the active set, and the contact
    # force at rest, the ball's weight 2 g, pushing.
    assert sol.holonomic_residual.shape[-1] == 0
    np.testing.assert_array_equal(np.asarray(sol.unilateral[:, 0]), q)
    assert float(sol.max_penetration) < 1e-12
    active = np.asarray(sol.active[:, 0])
    assert active[after_rest].all() and not active[ts < times[0]].any()
    lam = np.asarray(sol.unilateral_multipliers[:, 0])
    np.testing.assert_allclose(lam[after_rest], 2 * GRAVITY, rtol=1e-12)
    assert np.all(lam[~active] == 0)
    np.testing.assert_allclose(np.asarray(sol.constraint_force[after_rest, 0]),
                               2 * GRAVITY, rtol=1e-12)
    assert np.abs(np.asarray(sol.vdot[after_rest, 0])).max() < 1e-10


def test_regularized_holds_a_row_with_its_own_bias():
    """Regularized (Costa-Castello eq. 35) on the bouncing ball: free flight and
    impacts as exact as the others; at rest its regularisation eps leaves the
    held row at its steady state q = -g eps h^2 / (2 phi^2), phi = 1/m, where the
    force f = g/phi carries the weight."""
    eps, h, phi = 1e-8, 0.05, 0.5
    sol = jax.jit(lambda: cdiff.simulate(Ball(), cdiff.Regularized(eps=eps, h=h),
                                         jnp.array([1.0]), jnp.array([0.0]), t1=2.5,
                                         dt=1e-2))()
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    n = int(ev.count)
    times, _ = ball_impacts(1.0, 0.5, n)
    np.testing.assert_allclose(np.asarray(ev.t[:n]), times, rtol=0, atol=1e-10)
    before, after = np.asarray(ev.v_before[:n - 1, 0]), np.asarray(ev.v_after[:n - 1, 0])
    np.testing.assert_allclose(after**2, 0.25 * before**2, rtol=1e-12)
    rest = np.asarray(sol.ts) > times[-1] + 0.8  # the bias settles as exp(-t/h)
    bias = -GRAVITY * eps * h**2 / (2 * phi**2)
    np.testing.assert_allclose(np.asarray(sol.q[rest, 0]), bias, rtol=1e-6)
    # (Approached with a small overshoot.)
    assert -bias <= float(sol.max_penetration) < -1.1 * bias
    np.testing.assert_allclose(np.asarray(sol.unilateral_multipliers[rest, 0]),
                               2 * GRAVITY, rtol=1e-12)


@pytest.fixture(scope="module")
def wall_runs(wall_release):
    model = PendulumAgainstWall()
    q0, reference = wall_release

    @jax.jit
    def run(q0):
        return {name: cdiff.simulate(model, q0=q0, v0=jnp.zeros(2), t1=3.0, dt=2e-3,
                                     **kw)
                for name, kw in RUNS.items()}

    return model, reference, run(q0)


@pytest.mark.parametrize("name", list(RUNS))
def test_pendulum_against_a_wall_matches_the_angle_ode(wall_runs, name):
    model, reference, runs = wall_runs
    sol = runs[name]
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    assert int(ev.count) >= 2
    t_ref, omega_ref = reference[:, 0], reference[:, 1]
    np.testing.assert_allclose(np.asarray(ev.t[:2]), t_ref, rtol=0, atol=1e-9)
    speed = np.linalg.norm(np.asarray(ev.v_before[:2]), axis=1)
    np.testing.assert_allclose(speed, np.abs(omega_ref), rtol=1e-8)
    # One degree of freedom: the impact reverses the velocity along the circle,
    # scaled by e, so the kinetic energy falls by e^2. (The impact also removes
    # the integrator's drift off the circle's tangent, ~1e-10 of the speed:
    # compared is the energy of the tangential part before.)
    q_ev, v_ev = np.asarray(ev.q[:2]), np.asarray(ev.v_before[:2])
    normal = q_ev / np.linalg.norm(q_ev, axis=1, keepdims=True)
    tangential = v_ev - np.sum(v_ev * normal, axis=1, keepdims=True) * normal
    before = np.sum(tangential**2, axis=1)
    after = np.sum(np.asarray(ev.v_after[:2]) ** 2, axis=1)
    np.testing.assert_allclose(after, 0.36 * before, rtol=1e-12)
    assert np.all(np.asarray(ev.impulse[:2, 0]) > 0)
    # The event states lie on the wall and on the circle; no saved state is
    # behind the wall.
    q_ev = np.asarray(ev.q[:2])
    assert np.abs(q_ev[:, 0] + 0.4).max() < 1e-12
    assert np.abs(np.sum(q_ev**2, axis=1) - 1).max() < 1e-9
    assert float(np.min(np.asarray(sol.q[:, 0]))) > -0.4 - 1e-12
    if name == "projected":
        # Every sub-step ends on the circle (and, while the wall is held, on it).
        assert float(jnp.abs(sol.holonomic_residual).max()) < 1e-14
        held = np.asarray(sol.active[:, 0])
        assert np.max(np.abs(np.asarray(sol.q[held, 0]) + 0.4), initial=0) < 1e-14


def _ball_height(h0, e, t1=0.8, dt=1e-2, formulation=cdiff.UdwadiaKalaba()):
    sol = cdiff.simulate(Ball(restitution=e), formulation, jnp.array([h0]),
                         jnp.array([0.0]), t1=t1, dt=dt, saveat=cdiff.SaveAt(t1=True))
    return sol.q[-1, 0]


# (NullSpace in the slow tier: its events in the default run are those of `wall_runs`
# and of the release test below.)
@pytest.mark.parametrize("name", ["udwadia-kalaba",
                                  pytest.param("null-space", marks=pytest.mark.slow)])
def test_gradient_through_an_impact(name):
    """d q(T) / d(h0, e) after one bounce, through the event time (implicit
    function theorem), against the closed form's derivative and central
    differences. (NullSpace takes a new basis at the impact.)"""
    height = functools.partial(_ball_height, formulation=FORMULATIONS[name])
    grad = jax.jit(jax.grad(height, argnums=(0, 1)))
    g_h, g_e = (float(x) for x in grad(1.0, 0.5))
    np.testing.assert_allclose([g_h, g_e], ball_height_derivative(), rtol=1e-8)
    if name != "udwadia-kalaba":
        return
    run = jax.jit(_ball_height)
    h = 1e-5
    sim_h = (float(run(1.0 + h, 0.5)) - float(run(1.0 - h, 0.5))) / (2 * h)
    np.testing.assert_allclose(g_h, sim_h, rtol=1e-6)
    np.testing.assert_allclose(float(run(1.0, 0.5)), ball_height_closed_form(1.0, 0.5),
                               rtol=0, atol=1e-12)


def test_forward_mode_through_an_impact():
    """`jax.jacfwd` with `adjoint=diffrax.ForwardMode()` (the event steps in a
    plain scan) equals reverse mode (the discrete adjoint of the replayed events)
    to round-off, and the closed form's derivative; forward mode on the segments'
    route is refused, naming the RK4 loop it needs."""
    def height(h0, e, **kwargs):
        sol = cdiff.simulate(Ball(restitution=e), cdiff.UdwadiaKalaba(),
                             jnp.atleast_1d(h0), jnp.zeros(1), t1=0.8, dt=1e-2,
                             saveat=cdiff.SaveAt(t1=True), **kwargs)
        return sol.q[-1, 0]

    forward = jax.jit(jax.jacfwd(functools.partial(
        height, adjoint=diffrax.ForwardMode()), argnums=(0, 1)))(1.0, 0.5)
    reverse = jax.jit(jax.grad(height, argnums=(0, 1)))(1.0, 0.5)
    np.testing.assert_allclose(forward, reverse, rtol=1e-13)
    np.testing.assert_allclose(forward, ball_height_derivative(), rtol=1e-8)
    with pytest.raises(ValueError, match="forward-mode.*own RK4 loop"):
        height(1.0, 0.5, adjoint=diffrax.ForwardMode(), solver=diffrax.Tsit5())
    # (jax.jacfwd with the default adjoint names both what it needs.)
    with pytest.raises(TypeError, match="ForwardMode.*own RK4 loop"):
        jax.jacfwd(functools.partial(height, solver=diffrax.Tsit5()))(1.0, 0.5)


@pytest.mark.parametrize("solver", [None, diffrax.Tsit5()], ids=["rk4", "tsit5"])
def test_progress_bar_with_rows(capfd, solver):
    """`progress=True` with unilateral rows, on cdiff's RK4 loop (in blocks) and
    on the segments of diffrax.diffeqsolve: the same numbers, one bar that
    reaches 100 % across the impacts."""
    def run(progress):
        return cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([1.0]),
                              jnp.array([0.0]), t1=1.5, dt=1e-2, solver=solver,
                              saveat=cdiff.SaveAt(t1=True), progress=progress).q[-1]

    quiet = run(False)
    capfd.readouterr()
    shown = run(True)
    err = capfd.readouterr().err
    # (At rest on the ground after its bounces: q is round-off, 1e-35.)
    np.testing.assert_allclose(np.asarray(shown), np.asarray(quiet), rtol=0,
                               atol=1e-15)
    assert "100.00%" in err and err.count("%|") >= 5, err


def test_batch_has_its_own_events():
    """A batch of 1,000 balls with different drop heights and restitutions (so
    different impact times, bounces and rests) in one jax.vmap: equal to one solve
    at a time."""
    rng = np.random.default_rng(0)
    h0 = jnp.asarray(rng.uniform(0.1, 1.5, 1000))
    e = jnp.asarray(rng.uniform(0.0, 0.9, 1000))
    run = jax.jit(_ball_height)
    batch = np.asarray(jax.jit(jax.vmap(_ball_height))(h0, e))
    loop = np.array([float(run(a, b)) for a, b in zip(h0, e)])
    np.testing.assert_allclose(batch, loop, rtol=0, atol=1e-14)
    closed = [ball_height_closed_form(float(a), float(b)) for a, b in zip(h0, e)]
    # Where the closed form holds: one bounce before T = 0.8, the second after it.
    first = np.sqrt(2 * np.asarray(h0) / GRAVITY)
    flying = (first < 0.8) & (first * (1 + 2 * np.asarray(e)) > 0.8)
    assert flying.sum() > 300
    np.testing.assert_allclose(np.asarray(batch)[flying], np.array(closed)[flying],
                               atol=1e-12)


def test_batched_solution_has_each_members_active_set():
    """A vmapped solution's unilateral multipliers, read outside the vmap, use each
    member's own active set: equal to those of the members solved one at a time."""
    def solve(h0):
        return cdiff.simulate(Ball(restitution=0.0), cdiff.UdwadiaKalaba(),
                              jnp.atleast_1d(h0), jnp.zeros(1), t1=0.6, dt=1e-2)

    h0 = jnp.array([0.2, 0.5, 2.0])  # at rest from 0.20 s and 0.32 s; never lands
    batch = jax.jit(jax.vmap(solve))(h0)
    lam = np.asarray(batch.unilateral_multipliers[..., 0])
    active = np.asarray(batch.active[..., 0])
    assert active[0, -1] and active[1, -1] and not active[2].any()
    for i, h in enumerate(h0):
        one = jax.jit(solve)(h)
        np.testing.assert_array_equal(np.asarray(one.active[:, 0]), active[i])
        np.testing.assert_allclose(np.asarray(one.unilateral_multipliers[:, 0]),
                                   lam[i], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lam[active], 2 * GRAVITY, rtol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(formulation=cdiff.Lagrange(), solver=cdiff.BDF()), "BDF with an ODE"),
    (dict(saveat=cdiff.SaveAt(ts=jnp.linspace(0.0, 0.1, 3), steps=True)), "saveat"),
])
def test_unsupported_combinations_are_named(kwargs, match):
    kwargs = {"formulation": cdiff.UdwadiaKalaba(), **kwargs}
    formulation = kwargs.pop("formulation")
    with pytest.raises(ValueError, match=f"unilateral row.*{match}"):
        cdiff.simulate(Ball(), formulation, jnp.array([1.0]), jnp.array([0.0]), t1=0.1,
                       dt=1e-2, **kwargs)


def test_a_start_behind_a_row_is_refused():
    """Outside jit a ValueError naming the row; inside jit, the solve's result."""
    with pytest.raises(ValueError, match=r"violates Ball's unilateral row\(s\) \[0\]"):
        cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([-1e-3]),
                       jnp.array([0.0]), t1=0.1, dt=1e-2)
    sol = jax.jit(lambda q0: cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), q0,
                                            jnp.array([0.0]), t1=0.1, dt=1e-2,
                                            throw=False))(jnp.array([-1e-3]))
    assert sol.result == cdiff.RESULTS.penetrating_start
    # At contact within round-off, it starts (and rests there).
    sol = cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(), jnp.array([-1e-12]),
                         jnp.array([0.0]), t1=0.1, dt=1e-2)
    assert sol.result == cdiff.RESULTS.successful


def test_restitution_outside_its_range_is_refused():
    with pytest.raises(ValueError, match=r"restitution must lie in \[0, 1\]"):
        cdiff.simulate(Ball(restitution=1.5), cdiff.UdwadiaKalaba(), jnp.array([1.0]),
                       jnp.array([0.0]), t1=0.1, dt=1e-2)


def test_traced_restitution_outside_its_range_ends_with_its_result_code():
    """Inside jit (and per member of a vmapped batch) a restitution outside [0, 1]
    or NaN cannot be refused before tracing: the solve ends with
    `bad_restitution` at its start, raised with `throw`."""
    def solve(e, throw=False):
        return cdiff.simulate(Ball(restitution=e), cdiff.UdwadiaKalaba(),
                              jnp.array([0.1]), jnp.array([0.0]), t1=0.2, dt=1e-2,
                              throw=throw)

    results = jax.jit(jax.vmap(solve))(jnp.array([0.5, 1.2, jnp.nan, -0.1, 1.0]))
    assert [int(r) for r in results.result._value] == [
        int(cdiff.RESULTS.successful._value)] + [
        int(cdiff.RESULTS.bad_restitution._value)] * 3 + [
        int(cdiff.RESULTS.successful._value)]
    with pytest.raises(Exception, match="restitution"):
        jax.block_until_ready(jax.jit(lambda e: solve(e, True).q)(1.2))


def test_restitution_of_the_wrong_length_is_named():
    class Floor(Ball):
        def unilateral(self, t, q):
            return jnp.concatenate([q, 1.0 - q])

    with pytest.raises(ValueError, match=r"restitution has shape \(3,\).*2 row"):
        cdiff.simulate(Floor(restitution=jnp.array([0.5, 0.5, 0.5])),
                       cdiff.UdwadiaKalaba(), jnp.array([0.5]), jnp.array([0.0]),
                       t1=0.1, dt=1e-2)
    with pytest.raises(ValueError, match=r"restitution has shape \(3,\)"):
        cdiff.impact(Floor(), 0.0, jnp.array([0.0]), jnp.array([-1.0]),
                     restitution=jnp.array([0.5, 0.5, 0.5]))


def test_impact_refuses_a_restitution_outside_its_range():
    q, v = jnp.array([0.0]), jnp.array([-1.0])
    for e in (2.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match=r"restitution must lie in \[0, 1\]"):
            cdiff.impact(Ball(), 0.0, q, v, restitution=e)
    bounce = jax.jit(lambda e: cdiff.impact(Ball(), 0.0, q, v, restitution=e).v)
    np.testing.assert_allclose(bounce(0.5), [0.5], rtol=1e-15)
    with pytest.raises(Exception, match=r"restitution must lie in \[0, 1\]"):
        jax.block_until_ready(bounce(2.0))
    quiet = jax.jit(lambda e: cdiff.impact(Ball(), 0.0, q, v, restitution=e,
                                           throw=False).v)
    assert np.isnan(quiet(2.0)).all() and not np.isnan(quiet(1.0)).any()


def test_restitution_is_a_field_that_eqx_can_replace():
    model = eqx.tree_at(lambda m: m.restitution, Ball(), 0.25)
    assert model.restitution == 0.25


@pytest.mark.parametrize("name", ["udwadia-kalaba", "null-space"])
def test_a_row_is_released_when_its_multiplier_would_pull(name):
    """Held at rest until t_r, then q = g (t - t_r)^3 / (6 t_r), a cubic that RK4
    integrates exactly: the release is located inside the step (the root of the
    multiplier), so the motion after it is exact to round-off. (NullSpace takes a
    new basis at the release.)"""
    sol = jax.jit(lambda: cdiff.simulate(
        LiftedBall(), FORMULATIONS[name], jnp.array([0.0]), jnp.array([0.0]),
        t1=1.0, dt=1e-2))()
    assert sol.result == cdiff.RESULTS.successful
    ts, q = np.asarray(sol.ts), np.asarray(sol.q[:, 0])
    held = ts <= T_RELEASE
    assert np.abs(q[held]).max() < 1e-14
    exact = GRAVITY * np.maximum(ts - T_RELEASE, 0.0) ** 3 / (6 * T_RELEASE)
    np.testing.assert_allclose(q, exact, rtol=1e-10, atol=1e-14)
    assert int(sol.stats["events"].count) == 1  # the contact made at t0
    # While held, the contact force is m g (1 - t / t_r), never pulling.
    lam = np.asarray(sol.unilateral_multipliers[:, 0])
    active = np.asarray(sol.active[:, 0])
    np.testing.assert_array_equal(active[1:], held[1:])
    np.testing.assert_allclose(lam[active], 2 * GRAVITY * (1 - ts[active] / T_RELEASE),
                               rtol=0, atol=1e-12)
    assert lam[active].min() > 0 and np.all(lam[~active] == 0)


class ShakenBall(Ball):
    """A ball on a plate at height 0.01 sin(40 t), plastic: the plate's downward
    acceleration exceeds gravity where sin(40 t) > g / 16, so the ball leaves it
    there, at t_l = asin(g / 16) / 40, flies, lands, and leaves again one period
    later."""

    restitution: float = 0.0

    def unilateral(self, t, q):
        return q - 0.01 * jnp.sin(40 * t)


@pytest.mark.parametrize("dt", [2.5e-3, 1e-3])
def test_a_row_that_accelerates_away_releases_the_ball(dt):
    """The release is driven by the row's own motion (the multiplier m (g + p'')
    reaches zero): it is located and taken, where it used to be found again and
    again until the sub-steps ran out (event_limit at the first lift-off). The
    flight is the closed form from the exact lift-off (RK4 integrates the
    parabola exactly), the landing at its root, and the second lift-off one
    period after the first."""
    from scipy.optimize import brentq

    sol = jax.jit(lambda: cdiff.simulate(ShakenBall(), cdiff.UdwadiaKalaba(),
                                         jnp.array([0.0]), jnp.array([0.4]), t1=0.2,
                                         dt=dt))()
    assert sol.result == cdiff.RESULTS.successful
    t_l = np.arcsin(GRAVITY / 16) / 40
    q_l, v_l = 0.01 * np.sin(40 * t_l), 0.4 * np.cos(40 * t_l)

    def flight(t):
        return q_l + v_l * (t - t_l) - 0.5 * GRAVITY * (t - t_l) ** 2

    landing = brentq(lambda t: flight(t) - 0.01 * np.sin(40 * t), 0.05, 0.15)
    ev = sol.stats["events"]
    assert int(ev.count) == 2  # the contact at t0, and the landing
    assert abs(float(ev.t[1]) - landing) < 1e-9
    ts, q = np.asarray(sol.ts), np.asarray(sol.q[:, 0])
    flying = (ts > t_l) & (ts < landing)
    np.testing.assert_allclose(q[flying], flight(ts[flying]), rtol=0, atol=1e-9)
    active = np.asarray(sol.active[:, 0])
    second = t_l + 2 * np.pi / 40
    assert not active[flying].any()
    assert active[(ts > landing) & (ts < second)].all()
    assert not active[ts > second].any()


class HeldOverRisingFloor(cdiff.AbstractModel):
    """A particle (x, y) held on y = 0 by an equality, with a floor y >= t - 0.5
    rising through it: from t = 0.5 no motion keeps both."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.zeros(2, q.dtype)

    def holonomic(self, t, q):
        return q[1:]

    def unilateral(self, t, q):
        return q[1:] - (t - 0.5)


class Squeezed(Ball):
    """A ball resting on the ground under a ceiling at 0.75 - t, plastic: at
    t = 0.75 the ceiling reaches it, and no motion keeps both rows."""

    restitution: float = 0.0

    def unilateral(self, t, q):
        return jnp.concatenate([q, (0.75 - t) - q])


@pytest.mark.parametrize("model, q0, t_event", [
    (HeldOverRisingFloor(), [0.0, 0.0], 0.5), (Squeezed(), [0.0], 0.75)])
@pytest.mark.parametrize("solver", ["rk4", "tsit5"])
def test_rows_that_cannot_hold_together_end_the_solve(model, q0, t_event, solver):
    """The impact's conditions (the rows at contact, the equalities, the held rows
    driven inwards) have no common solution: the solve ends with
    `infeasible_contact` at that event, instead of a least-squares compromise
    that ran on behind the rows (0.25 and 0.12 behind them at t = 1). The
    states saved before it are on every row."""
    kw = {} if solver == "rk4" else dict(
        solver=diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8))
    sol = jax.jit(lambda: cdiff.simulate(model, cdiff.UdwadiaKalaba(), jnp.array(q0),
                                         jnp.zeros(len(q0)), t1=1.0, dt=1e-2,
                                         throw=False, **kw))()
    assert sol.result == cdiff.RESULTS.infeasible_contact
    ev = sol.stats["events"]
    n = int(ev.count)
    assert abs(float(ev.t[n - 1]) - t_event) < 1e-9
    ts = np.asarray(sol.ts)
    saved = np.isfinite(ts)
    assert ts[saved].max() <= t_event + 1e-9
    assert float(np.asarray(sol.unilateral)[saved].min()) > -1e-12


class Notch(cdiff.AbstractModel):
    """A free particle on a line at unit speed past a row that is negative only
    for |q - 0.5| < 1e-3: a dip of 1e-6 that lasts 2e-3, a fifth of a step."""

    restitution: float = 0.0

    def mass_matrix(self, t, q):
        return jnp.eye(1, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.zeros(1, q.dtype)

    def unilateral(self, t, q):
        return (q - 0.5) ** 2 - 1e-6


def test_a_shallow_crossing_inside_a_step_is_found():
    """From q0 = 0.005 at dt = 1e-2 the step ends are at q = ...0.495, 0.505,
    both outside the notch: checked only there, the particle passed through it
    (no event, 0.5 past it at t = 1). The rows are also checked inside each step
    on its interpolant, so the crossing at q = 0.499 (t = 0.494) is located and
    the particle stops there (plastic). What can still be missed is a dip between
    the interpolant's points: shallower than max|g''| (dt/4)^2 / 8."""
    sol = jax.jit(lambda: cdiff.simulate(Notch(), cdiff.UdwadiaKalaba(),
                                         jnp.array([0.005]), jnp.array([1.0]),
                                         t1=1.0, dt=1e-2))()
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    assert int(ev.count) == 1
    assert abs(float(ev.t[0]) - 0.494) < 1e-12
    np.testing.assert_allclose(np.asarray(sol.q[-1]), [0.499], rtol=0, atol=1e-12)
    assert float(sol.max_penetration) < 1e-12


APEX_TIME = 0.45


class Ceiling(Ball):
    """A ball thrown up at g t_apex under a ceiling at `height` (plastic)."""

    restitution: float = 0.0
    height: float = 1.0

    def unilateral(self, t, q):
        return self.height - q


def test_a_grazing_impact_is_flagged():
    """A ball whose apex (at a step's end) is 1e-6 above the ceiling reaches it at
    |dg/dt| = sqrt(2 g 1e-6) = 4.4e-3, below what one step's acceleration turns
    (g dt = 0.098): the impact is located (at t_apex - sqrt(2e-6 / g)) and flagged
    grazing, with a warning outside jit; a ceiling 0.2 below the apex is hit
    at 2 m/s and is not."""
    apex = GRAVITY * APEX_TIME**2 / 2
    v0 = jnp.array([GRAVITY * APEX_TIME])
    with pytest.warns(UserWarning, match=r"1 impact\(s\) arrived grazing"):
        sol = cdiff.simulate(Ceiling(height=apex - 1e-6), cdiff.UdwadiaKalaba(),
                             jnp.array([0.0]), v0, t1=0.6, dt=1e-2)
    ev = sol.stats["events"]
    assert int(ev.count) == 1 and bool(ev.grazing[0, 0])
    assert abs(float(ev.t[0]) - (APEX_TIME - np.sqrt(2e-6 / GRAVITY))) < 1e-9
    clean = jax.jit(lambda h: cdiff.simulate(Ceiling(height=h), cdiff.UdwadiaKalaba(),
                                             jnp.array([0.0]), v0, t1=0.6,
                                             dt=1e-2))(apex - 0.2)
    assert int(clean.stats["events"].count) == 1
    assert not np.asarray(clean.stats["events"].grazing).any()


def test_bouncing_ball_in_float32():
    """In float32 the impact times hold to what the location resolves, the row to
    8 eps (its tolerance) over the approach speed: relative 1e-7 to 1e-5 as the
    bounces slow down (the seventh arrives at 0.07 m/s); and the ball comes to rest
    on the ground."""
    f32 = jnp.float32
    sol = jax.jit(lambda: cdiff.simulate(Ball(), cdiff.UdwadiaKalaba(),
                                         jnp.array([1.0], f32), jnp.array([0.0], f32),
                                         t1=2.5, dt=1e-2))()
    assert sol.q.dtype == f32 and sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    n = int(ev.count)
    times, speeds = ball_impacts(1.0, 0.5, n)
    resolved = 8 * np.finfo(np.float32).eps / speeds + np.finfo(np.float32).eps * times
    assert np.all(np.abs(np.asarray(ev.t[:n]) - times) <= resolved)
    assert np.abs(np.asarray(sol.q[-20:, 0])).max() < 1e-6
    assert float(sol.q.min()) > -1e-6
