"""The slider-crank (R2) against a hard stop on its slider, against SciPy's event
location on its one-degree-of-freedom equation (Braun & Goldfarb eq. 24): impact
times, the restitution law, the rest in finite time, and the stop's force at rest
against the static equilibrium."""

import jax
import jax.numpy as jnp
import numpy as np

import cdiff
from helpers import restitution_events, slider_crank_theta_ddot

GRAVITY, STOP, E = 9.81, 0.8, 0.5


class StoppedSliderCrank(cdiff.models.SliderCrank):
    """R2 (unit masses and lengths) with a stop: the slider stays at x_s >= STOP."""

    stop: float = STOP
    restitution: float = E

    def unilateral(self, t, q):
        return jnp.atleast_1d(self.slider(q) - self.stop)


def reference(t1, impacts):
    """Impact times and crank rates of eq. 24 (`slider_crank_theta_ddot`) from the
    crank at 45 degrees, at rest, with SciPy's event location on x_s = 2 cos(theta)
    = STOP. With one degree of freedom, Newton's law reverses the crank rate,
    scaled by e."""
    return restitution_events(
        lambda t, y: [y[1], slider_crank_theta_ddot(y[0], y[1], GRAVITY)],
        lambda t, y: 2 * np.cos(y[0]) - STOP, [np.pi / 4, 0.0], E, t1, impacts)


def test_slider_crank_against_a_stop_matches_its_angle_equation():
    model = StoppedSliderCrank()
    q0, v0 = model.initial_state()
    sol = jax.jit(lambda q0, v0: cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0,
                                                t1=4.0, dt=2e-3))(q0, v0)
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    n = int(ev.count)
    ref = reference(4.0, 10)
    # Ten bounces, then the rest rule's plastic impact before the bounces' limit.
    assert 11 <= n <= 14
    np.testing.assert_allclose(np.asarray(ev.t[:10]), ref[:, 0], rtol=0, atol=1e-9)
    omega_before = np.asarray(ev.v_before[:n, 2])
    omega_after = np.asarray(ev.v_after[:n, 2])
    np.testing.assert_allclose(omega_before[:10], ref[:, 1], rtol=1e-8)
    rest = np.asarray(ev.rest[:n, 0])
    assert rest[-1] and not rest[:-1].any()
    np.testing.assert_allclose(omega_after[:-1], -E * omega_before[:-1], rtol=1e-12)
    assert abs(omega_after[-1]) < 1e-12
    # The bounces' durations halve: they end by t_10 + 2 (t_10 - t_9).
    assert float(ev.t[n - 1]) < ref[-1, 0] + 2 * (ref[-1, 0] - ref[-2, 0])
    # At rest on the stop, the closed chain intact, never through the stop.
    assert float(sol.max_penetration) < 1e-12
    assert float(sol.max_constraint_error) < 1e-10
    theta = -np.arccos(STOP / 2)
    held = np.asarray(sol.active[:, 0])
    assert held[-100:].all()
    np.testing.assert_allclose(np.asarray(sol.q[-1, 2]), theta, atol=1e-10)
    # The stop's force at rest from the static equilibrium of eq. 24's coordinate:
    # gravity's moment m g l cos(theta) against lambda d(x_s)/d(theta).
    force = -GRAVITY * np.cos(theta) / (2 * np.sin(theta))
    np.testing.assert_allclose(np.asarray(sol.unilateral_multipliers[-100:, 0]),
                               force, rtol=1e-9)
    assert float(sol.unilateral_multipliers[held, 0].min()) >= 0
