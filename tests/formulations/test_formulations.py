"""Accuracy of the formulations against exact references (Braun-Goldfarb Sec. 4)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    Duplicated,
    Skate,
    dynamics_at,
    max_abs,
    rk4_minimal_slider_crank,
    slider_crank_run,
)

import cdiff

UK_CE = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
UK_C = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=False)


def _slider_error(sol):
    model = cdiff.models.SliderCrank()
    ok = np.asarray(jnp.all(jnp.isfinite(sol.q), axis=1))
    if not ok.all():
        return np.inf
    ref = model.reference(sol.ts[1:])
    err = jnp.abs(model.slider(sol.q[1:]) - model.slider(ref.q))
    return float(jnp.max(err))


# --- R2, dt = 1e-2: constraint and energy correction (Fig. 3) -------------------


def test_slider_crank_constraint_correction_is_steady():
    sol = slider_crank_run(UK_CE, 1e-2)
    assert sol.message == ""
    # 100 / 10000 rounds to the double nearest 1e-2 (measured equal).
    assert float(sol.dt) == 1e-2
    phi = jnp.abs(sol.holonomic_residual)
    assert max_abs(phi) <= 1e-7  # measured 1.22e-8
    # Steady: the last 10 s no worse than twice the first (measured equal to 0.4%).
    first, last = max_abs(phi[:1000]), max_abs(phi[-1000:])
    assert last <= 2 * first
    # The energy correction must not disturb the constraint errors (Fig. 3a-b):
    # measured 1.4% apart.
    plain = slider_crank_run(UK_C, 1e-2)
    assert max_abs(plain.holonomic_residual) == pytest.approx(max_abs(phi), rel=0.05)


def test_slider_crank_energy_correction_stops_drift():
    with_e = slider_crank_run(UK_CE, 1e-2)
    without = slider_crank_run(UK_C, 1e-2)
    err = jnp.abs(with_e.energy - with_e.energy[0])
    # The README's figure: |E - E0| at 1.2e-6 over 100 s (measured 1.17e-6).
    assert max_abs(err) < 1.5e-6
    # No growth: the last 10 s are no worse than twice the first 10 s (measured
    # equal to 0.3%).
    assert max_abs(err[-1000:]) <= 2 * max_abs(err[:1000])
    # Without correction the energy drifts; with it, it stays 20x lower (measured
    # 2.68e-5 against 1.17e-6: 23x).
    assert max_abs(without.energy - without.energy[0]) > 20 * max_abs(err)
    # The overall (slider) error improves too (Fig. 3d): measured 3.0e-5 m
    # against 8.7e-4 m.
    assert _slider_error(with_e) < 3e-4
    assert _slider_error(with_e) < 0.1 * _slider_error(without)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "Issue #2 target max|E - E0| <= 1e-6 at dt = 1e-2 is not reached: measured "
        "1.17e-6. With the correction frozen per step, the energy error left after "
        "each step is RK4's local error in the quadratic energy invariant "
        "(per-step |dE| up to 2.9e-6 without correction at this step size), which "
        "an explicit per-step correction cannot remove within the step."
    ),
)
def test_slider_crank_energy_error_target():
    sol = slider_crank_run(UK_CE, 1e-2)
    assert sol.max_energy_error <= 1e-6


# --- R2, dt = 5e-2: the Fig. 2 / Fig. 4d claim ------------------------------------


def test_slider_crank_large_step_claim():
    corrected = _slider_error(slider_crank_run(UK_CE, 5e-2))
    no_energy = _slider_error(slider_crank_run(UK_C, 5e-2))
    ts, xs = rk4_minimal_slider_crank(5e-2)
    model = cdiff.models.SliderCrank()
    exact = model.slider(model.reference(ts[1:]).q)
    rk4_minimal = float(jnp.max(jnp.abs(xs[1:] - exact)))
    # A small Baumgarte sweep, all gains in one vmapped call; the best one counts.
    q0, v0 = model.initial_state()
    save = cdiff.SaveAt(ts=jnp.linspace(0.0, 100.0, 2001))
    ref = model.slider(model.reference(save.subs.ts).q)

    @jax.jit
    @jax.vmap
    def baumgarte(alpha, beta):
        sol = cdiff.simulate(
            model, cdiff.Lagrange(alpha, beta), q0, v0, t1=100.0, dt=5e-2,
            saveat=save, throw=False,
        )
        err = jnp.max(jnp.abs(model.slider(sol.q) - ref))
        return jnp.where(jnp.isfinite(err), err, jnp.inf)

    gains = jnp.array([1.0, 2.0, 5.0, 10.0, 20.0])
    alpha, beta = (g.ravel() for g in jnp.meshgrid(gains, gains))
    best_lagrange = float(jnp.min(baumgarte(alpha, beta)))
    print(
        f"slider error over 100 s at dt=5e-2: constraint+energy {corrected:.3g}, "
        f"constraint only {no_energy:.3g}, RK4 minimal ODE {rk4_minimal:.3g}, "
        f"best Baumgarte {best_lagrange:.3g}"
    )
    assert corrected < rk4_minimal  # not a tolerance: an ordering of two errors
    assert corrected < no_energy  # not a tolerance: an ordering of two errors
    assert corrected < best_lagrange  # not a tolerance: an ordering of two errors
    # The Fig. 2 picture: it tracks the exact solution (measured 1.9e-2 m; the
    # others 3.6, 4.0 and 3.0 m).
    assert corrected < 0.1


# --- R4: a thousand seconds through kinematic singularities (Figs. 6-7) ------------


@pytest.mark.slow
def test_double_four_bar_long_run():
    model = cdiff.models.DoubleFourBar()
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 1000.0, 20001)
    sol = cdiff.simulate(
        model, UK_CE, q0, v0, t1=1000.0, dt=1e-2, saveat=cdiff.SaveAt(ts=ts)
    )
    assert bool(jnp.all(jnp.isfinite(sol.q)))
    ref = model.reference(ts[1:])
    err = jnp.max(jnp.abs(model.observable(sol.q[1:]) - model.observable(ref.q)))
    # It really crosses the singular configuration, as often as the exact motion.
    crossings = int(jnp.sum(jnp.diff(jnp.sign(ref.q[:, 5])) != 0))
    assert crossings == 1030
    assert int(jnp.sum(jnp.diff(jnp.sign(sol.q[1:, 5])) != 0)) == crossings
    # docs/reference-mechanisms.md: joint error 2.37e-4 (measured here 2.37e-4).
    assert float(err) < 2e-3


# --- R1: Baumgarte stabilisation bounds the drift --------------------------------


def test_particle_on_circle_baumgarte():
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()

    def drift(alpha, beta):
        sol = cdiff.simulate(model, cdiff.Lagrange(alpha, beta), q0, v0, t1=40.0,
                             dt=2e-2)
        phi = jnp.abs(sol.holonomic_residual[:, 0])
        return max_abs(phi[: phi.shape[0] // 4]), max_abs(phi[-(phi.shape[0] // 4) :])

    # Measured: unstabilised 4.8e-4 in the first quarter, 7.9e-3 in the last;
    # stabilised 1.66e-6 and 1.64e-6.
    early, late = drift(0.0, 0.0)
    assert late > 10 * early  # unstabilised: the drift grows
    early_s, late_s = drift(5.0, 5.0)
    assert late_s <= 2 * early_s + 1e-12  # stabilised: bounded
    assert late_s < 1.6e-5
    assert late_s < 1e-3 * late


# --- Nonholonomic constraints ---------------------------------------------------


@pytest.mark.parametrize(
    "formulation, error, slip",
    # Baumgarte holds the slip where its feedback balances RK4's local error;
    # the frozen Braun-Goldfarb correction removes it at every step, leaving one
    # step's local error. Measured (error, slip): Lagrange 6.4e-9, 2.3e-10;
    # UK 3.0e-10, 2.7e-11; UK + energy 7.1e-9, 2.7e-11.
    [(cdiff.Lagrange(alpha=2.0), 2.5e-8, 1e-9), (UK_C, 1.2e-9, 1e-10),
     (UK_CE, 3e-8, 1e-10)],
    ids=repr,
)
def test_skate_matches_exact_solution(formulation, error, slip):
    model = Skate()
    q0, v0 = (jnp.asarray(x[0]) for x in Skate.exact(np.zeros(1)))
    sol = cdiff.simulate(model, formulation, q0, v0, t1=5.0, dt=1e-2)
    q_exact, _ = Skate.exact(np.asarray(sol.ts))
    assert max_abs(sol.q - q_exact) < error
    assert max_abs(sol.velocity_residual) < slip


def test_skate_nonholonomic_drift_is_corrected():
    """Start off the velocity constraint: the correction removes the slip."""
    model = Skate()
    q0 = jnp.zeros(3)
    v0 = jnp.array([1.0, 0.1, 2.0])  # slipping sideways at 0.1 m/s
    # The slip left after 2 s: measured 6.2e-9 (Baumgarte), 2.7e-11 (UK).
    for formulation, bound in ((cdiff.Lagrange(alpha=10.0), 6e-8), (UK_C, 2.5e-10)):
        sol = cdiff.simulate(model, formulation, q0, v0, t1=2.0, dt=1e-2)
        assert max_abs(sol.velocity_residual[-1]) < bound


# --- Agreement and redundancy -----------------------------------------------------


def test_formulations_agree_at_small_step():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    ref = model.reference(jnp.array([2.0])).q[-1]
    # Measured 1.6e-10 (Baumgarte), 4.5e-12 (UK), 8.2e-12 (UK + energy).
    for f, bound in ((cdiff.Lagrange(10.0, 10.0), 1.5e-9), (UK_C, 4e-11),
                     (UK_CE, 8e-11)):
        sol = cdiff.simulate(model, f, q0, v0, t1=2.0, dt=1e-3,
                             saveat=cdiff.SaveAt(t1=True))
        assert max_abs(sol.q[-1] - ref) < bound, f


@pytest.mark.parametrize("formulation", [cdiff.Lagrange(10.0, 10.0), UK_CE], ids=repr)
def test_redundant_constraints_change_nothing(formulation):
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    kw = dict(t1=3.0, dt=1e-2, saveat=cdiff.SaveAt(ts=jnp.linspace(0, 3, 31)))
    plain = cdiff.simulate(model, formulation, q0, v0, **kw)
    redundant = cdiff.simulate(Duplicated(model), formulation, q0, v0, **kw)
    # Round-off (measured 8.9e-15 for Baumgarte, 1.8e-15 for UK).
    bound = 4e-14 if isinstance(formulation, cdiff.Lagrange) else 8e-15
    assert max_abs(plain.q - redundant.q) < bound


def test_kkt_at_the_singular_configuration():
    """At theta1 = -pi/2 the Jacobian of R2 loses rank. Moving along the branch
    theta2 = -theta1 at 3 rad/s, the acceleration is finite and exact: eq. 24 gives
    theta1'' = 0 there (sin 2 theta1 = cos theta1 = 0), so both centres of mass
    accelerate by (l/2) omega^2 = 4.5 m/s^2 upwards and nothing else moves:
    qdd = [0, 4.5, 0, 0, 4.5, 0]."""
    model = cdiff.models.SliderCrank()
    th = -jnp.pi / 2
    q = jnp.array([0.0, -0.5, th, 0.0, -0.5, -th])
    v = jnp.array([0.5 * 3.0, 0.0, 3.0, 0.5 * 3.0 * 3, 0.0, -3.0])
    kin = cdiff.kinematics(model, 0.0, q, v)
    assert np.linalg.matrix_rank(np.asarray(kin.A_q)) == 4
    exact = np.array([0.0, 4.5, 0.0, 0.0, 4.5, 0.0])
    # Round-off (measured 2.5e-15 and 8.9e-15).
    for f, bound in ((cdiff.Lagrange(5.0, 5.0), 1e-14), (UK_CE, 4e-14)):
        # The formulation's dynamics at (q, v), its per-step data taken with the
        # step dt = 1e-2 from there (the energy correction's E0 is E(q, v)).
        qdd, _, _ = dynamics_at(model, f, q, v, dt=1e-2)
        np.testing.assert_allclose(qdd, exact, rtol=0, atol=bound)


def test_control_enters_through_the_input_matrix():
    """A pendulum on a circle, driven by a tangential torque u through E(q): the
    angle follows phi'' = (u - m g r cos phi) / (m r^2), solved independently."""
    from scipy.integrate import solve_ivp

    class Driven(cdiff.models.ParticleOnCircle):
        def input_matrix(self, t, q):  # a torque about the centre -> tangential force
            return (jnp.stack([-q[1], q[0]]) / (q @ q))[:, None]

    model = Driven(g=9.81)
    q0, v0 = model.initial_state()
    torque = lambda t, q, v: jnp.stack([2.0 + jnp.sin(3.0 * t)])  # noqa: E731
    # Measured 6.3e-11 (Baumgarte), 5.8e-12 (UK).
    for f, bound in ((cdiff.Lagrange(10.0, 10.0), 2.5e-10), (UK_C, 2.5e-11)):
        sol = cdiff.simulate(model, f, q0, v0, t1=2.0, dt=1e-3, control=torque,
                             saveat=cdiff.SaveAt(t1=True))
        phi = jnp.arctan2(sol.q[-1, 1], sol.q[-1, 0])

        def rhs(t, y):
            u = 2.0 + np.sin(3.0 * t)
            return [y[1], (u - model.m * model.g * model.rho * np.cos(y[0]))
                    / (model.m * model.rho**2)]

        exact = solve_ivp(rhs, (0, 2), [0.0, model.speed / model.rho], rtol=1e-12,
                          atol=1e-12, method="DOP853").y[0, -1]
        assert abs(float(phi) - np.arctan2(np.sin(exact), np.cos(exact))) < bound


# --- diffrax's adaptive solvers, explicit and implicit --------------------------


@pytest.mark.parametrize("solver", [diffrax.Tsit5(), diffrax.Kvaerno5()],
                         ids=["Tsit5", "Kvaerno5"])
def test_adaptive_diffrax_solvers(solver):
    """An adaptive explicit and an adaptive implicit diffrax solver through
    `simulate`, against R2's exact eq. 24. Implicit solvers read their root
    finder's tolerances through cdiff's solver wrappers (they used to fail with
    "'FrozenStep' object has no attribute 'root_finder'")."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(
        model, cdiff.Lagrange(), q0, v0, t1=1.0, dt=1e-3, solver=solver,
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
        saveat=cdiff.SaveAt(ts=jnp.linspace(0.1, 1.0, 10)))
    assert sol.message == ""
    ref = model.reference(sol.ts)
    err = max_abs(model.slider(sol.q) - model.slider(ref.q))
    # Measured 1.3e-8 (Tsit5), 9.6e-10 (Kvaerno5).
    assert err < {"Tsit5": 5e-8, "Kvaerno5": 4e-9}[type(solver).__name__], err
