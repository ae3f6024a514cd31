"""Adaptive step sizes (diffrax's PIDController) as a first-class path: accuracy
against an independent reference, rejected steps, post-step projection, jit, vmap
and grad.

The reference is SciPy's DOP853 at rtol = atol = 1e-13 on R2's minimal ODE
(Braun-Goldfarb eq. 24, written in NumPy here), independent of JAX and diffrax.
The run crosses the kinematic singularity theta1 = -pi/2 (near t = 0.8 s).
"""

import functools

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import cdiff

# private on purpose: the internal base of cdiff's solver wrappers (the spy is one)
from cdiff._solver.base import AbstractForwardingSolver, innermost

# private on purpose: internal; gives implicit root finders the controller's tolerances
from cdiff._solver.frozen import stepsize_tolerances

MODEL = cdiff.models.SliderCrank()
UK = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
T = 1.0
THETAS = (np.pi / 4, np.pi / 3)  # initial crank angles, at rest
TOLS = (1e-8, 1e-9, 1e-10)
SOLVERS = {"Tsit5": diffrax.Tsit5(), "Dopri5": diffrax.Dopri5(),
           "Dopri8": diffrax.Dopri8()}


# --- the independent reference ------------------------------------------------------


def _rhs(t, y):
    th, om = y[0], y[1]
    g = MODEL.g / MODEL.l
    d = 5.0 - 3.0 * np.cos(2 * th)
    n = np.sin(2 * th) * om**2 + g * np.cos(th)
    acc = -3.0 * n / d
    if len(y) == 2:
        return [om, acc]
    # With the sensitivity (s_th, s_om) = d(th, om)/d th0: s' = J s.
    dacc_dth = -3.0 * ((2 * np.cos(2 * th) * om**2 - g * np.sin(th)) * d
                       - n * 6 * np.sin(2 * th)) / d**2
    dacc_dom = -3.0 * 2 * np.sin(2 * th) * om / d
    return [om, acc, y[3], dacc_dth * y[2] + dacc_dom * y[3]]


@functools.cache
def _reference(theta0, t1=T):
    """(slider x_s(t1), d x_s(t1) / d theta0) from the minimal ODE and its
    variational equation."""
    sol = solve_ivp(_rhs, (0.0, t1), [theta0, 0.0, 1.0, 0.0], method="DOP853",
                    rtol=1e-13, atol=1e-13)
    th, s = sol.y[0, -1], sol.y[2, -1]
    return 2 * MODEL.l * np.cos(th), -2 * MODEL.l * np.sin(th) * s


def _state(theta0):
    theta0 = jnp.asarray(theta0, jnp.float64)
    return MODEL.minimal_state(jnp.stack([theta0, jnp.zeros_like(theta0)]))


# --- one compiled program per solver, tolerance and angles traced ------------------


def _final(solver, theta0, tol):
    q0, v0 = _state(theta0)
    tol = jnp.asarray(tol, jnp.float64)
    sol = cdiff.simulate(MODEL, UK, q0, v0, t1=T, dt=1e-2, solver=solver,
                         stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol),
                         saveat=cdiff.SaveAt(t1=True))
    q, v = sol.q[-1], sol.v[-1]
    return dict(
        slider=MODEL.slider(q),
        constraint=jnp.max(jnp.abs(MODEL.holonomic(T, q))),
        energy=jnp.abs(MODEL.energy(T, q, v) - MODEL.energy(0.0, q0, v0)),
        rejected=sol.stats["num_rejected_steps"],
        accepted=sol.stats["num_accepted_steps"],
    )


@functools.cache
def _batched(name):
    """`(thetas, tol) -> results`, jitted and vmapped over the initial angle."""
    return jax.jit(jax.vmap(functools.partial(_final, SOLVERS[name]),
                            in_axes=(0, None)))


@functools.cache
def _sweep(name):
    thetas = jnp.asarray(THETAS)
    return {tol: jax.tree.map(np.asarray, _batched(name)(thetas, tol)) for tol in TOLS}


# Measured max over the two angles of |x_s(1) - reference| (float64, CPU); the
# tests ask for less than 10 times these.
MEASURED = {
    "Tsit5": {1e-8: 8.4e-9, 1e-9: 8.5e-10, 1e-10: 8.3e-11},
    "Dopri5": {1e-8: 1.9e-8, 1e-9: 1.9e-9, 1e-10: 2.7e-10},
    "Dopri8": {1e-8: 1.7e-9, 1e-9: 2.5e-10, 1e-10: 2.1e-11},
}


@pytest.mark.parametrize("name", list(SOLVERS))
def test_uk_adaptive_matches_reference(name):
    """UK with both corrections and an explicit diffrax solver under a PID
    controller at rtol = atol = 1e-8, 1e-9, 1e-10, vmapped over the initial angle:
    the slider at t = 1 s against DOP853, through the singularity, with rejected
    steps in every run (measured 7-15 rejected of 25-130 attempts)."""
    sweep = _sweep(name)
    exact = np.array([_reference(th)[0] for th in THETAS])
    errors = [float(np.max(np.abs(sweep[tol]["slider"] - exact))) for tol in TOLS]
    for tol, err in zip(TOLS, errors):
        out = sweep[tol]
        assert err < 10 * MEASURED[name][tol], (tol, err)
        # Rejection is exercised, and the results above still match the reference.
        assert np.all(out["rejected"] > 0), out["rejected"]
        # On the constraints and at the initial energy: measured at most
        # tol / 100 (constraints) and 2.3e-10 (energy, Dopri5 at 1e-8).
        assert np.all(out["constraint"] < tol / 10), (tol, out["constraint"])
        assert np.all(out["energy"] < 10 * tol), (tol, out["energy"])
    # The error falls with the tolerance (by 10-100 per decade here).
    assert errors[0] > errors[1] > errors[2] and errors[2] < errors[0] / 10, errors


def test_jit_vmap_grad_through_adaptive_solve():
    """`jax.jit(jax.value_and_grad)` of an adaptive solve from the initial angle:
    the value equals the vmapped solve's, and the gradient matches central finite
    differences of the adaptive solve (each step size is re-chosen) and the
    reference's variational equation."""
    theta, tol = THETAS[0], TOLS[-1]
    loss = jax.jit(jax.value_and_grad(
        lambda th: _final(SOLVERS["Tsit5"], th, tol)["slider"]))
    value, grad = (float(x) for x in loss(jnp.asarray(theta)))
    # vmap: the batched solve, each row with its own step sizes, is the same (measured
    # equal in both XLA CPU emitters; two ulp of the slider x allowed).
    np.testing.assert_allclose(value, float(_sweep("Tsit5")[tol]["slider"][0]),
                               rtol=4.5e-16, atol=0)
    h = 1e-4
    plus, minus = np.asarray(_batched("Tsit5")(jnp.asarray([theta + h, theta - h]),
                                               tol)["slider"])
    fd = (plus - minus) / (2 * h)
    exact = _reference(theta)[1]
    print(f"grad {grad:.12g} fd {fd:.12g} exact {exact:.12g}",
          abs(grad - fd) / abs(fd), abs(grad - exact) / abs(exact))
    # Measured relative differences 5.2e-9 (finite differences, h = 1e-4) and
    # 1.6e-10 (variational equation).
    assert grad == pytest.approx(fd, rel=5e-8)
    assert grad == pytest.approx(exact, rel=6e-10, abs=0)


# --- what a rejected step leaves behind ---------------------------------------------

ATTEMPTS = []
EVALUATIONS = [0]


def _count():
    EVALUATIONS[0] += 1


class CountedUK(cdiff.UdwadiaKalaba):
    """UK counting its vector-field evaluations."""

    def vector_field(self, t, y, context, frozen):
        jax.debug.callback(_count, ordered=True)
        return super().vector_field(t, y, context, frozen)


def _record(t0, t1, y0, y1, frozen, e0):
    ATTEMPTS.append(jax.tree.map(np.asarray, dict(t0=t0, t1=t1, y0=y0, y1=y1,
                                                  frozen=frozen, e0=e0)))


class Spy(AbstractForwardingSolver):
    """Records every step attempt: its times, start and end states, and the frozen
    per-step data the inner solver is given (`FrozenStep` wraps this)."""

    solver: diffrax.AbstractSolver

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        out = self.solver.step(terms, t0, t1, y0, args, solver_state, made_jump)
        context, frozen = args
        jax.debug.callback(_record, t0, t1, y0, out[0], frozen, context.e0,
                           ordered=True)
        return out


class Replay(diffrax.StepTo):
    """diffrax's StepTo through `simulate` (which passes `dt` as the first step)."""

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        return super().init(terms, t0, t1, y0, None, args, func, error_order)


def _spied(formulation, solver, controller, dt, saveat=cdiff.SaveAt(t1=True)):
    """A solve through `Spy` (by default saving t1 only: the attempts record the
    rest)."""
    ATTEMPTS.clear()
    EVALUATIONS[0] = 0
    q0, v0 = MODEL.initial_state()
    sol = cdiff.simulate(MODEL, formulation, q0, v0, t1=T, dt=dt, solver=Spy(solver),
                         stepsize_controller=controller, saveat=saveat)
    jax.effects_barrier()
    return sol, list(ATTEMPTS), EVALUATIONS[0]


def _accepted(attempts):
    """Indices of accepted attempts: the last attempt, and every attempt whose
    successor starts at a later time (a rejected one is retried from its start)."""
    return [i for i, a in enumerate(attempts)
            if i + 1 == len(attempts) or attempts[i + 1]["t0"] != a["t0"]]


def test_rejected_steps_leave_no_trace():
    """UK (both corrections) + Tsit5 + PID at 1e-8 from a first step of 0.5 s (so
    the first attempts are rejected). Every attempt freezes its own
    Delta = Phi(t_n, y_n) / (t1 - t_n) from the accepted state y_n; a retry
    recomputes it for the shorter step; E0 never changes; the accepted attempts
    chain; and replaying the accepted steps alone (StepTo, no rejection) gives the
    same trajectory to the last bit. Every attempt costs 7 evaluations of the field
    (Tsit5's first-same-as-last stage is not reused: the per-step data change)."""
    controller = diffrax.PIDController(rtol=1e-8, atol=1e-8)
    uk = CountedUK(constraint_correction=True, energy_correction=True)
    sol, attempts, evaluations = _spied(uk, diffrax.Tsit5(), controller, dt=0.5)
    n, rejected = int(sol.stats["num_steps"]), int(sol.stats["num_rejected_steps"])
    # One attempt per loop iteration (measured 57: 47 accepted, 10 rejected).
    assert len(attempts) == n and rejected > 0
    assert evaluations == 7 * n
    accepted = _accepted(attempts)
    assert len(accepted) == int(sol.stats["num_accepted_steps"]) == n - rejected
    assert attempts[0]["t1"] == 0.5 and 0 not in accepted
    q0, v0 = MODEL.initial_state()
    e0 = float(MODEL.energy(0.0, q0, v0))
    for a in attempts:
        (q, v), fr, h = a["y0"], a["frozen"], a["t1"] - a["t0"]
        phi = np.asarray(MODEL.holonomic(a["t0"], q))
        # Phi is ~1e-10: relative round-off (measured 2.0e-16); the energy
        # difference cancels to ~1e-9: round-off of E0's size (measured one ulp).
        np.testing.assert_allclose(fr.delta_q * h, phi, rtol=8e-16, atol=0)
        np.testing.assert_allclose(
            fr.delta_e * h, float(MODEL.energy(a["t0"], q, v)) - e0, rtol=0,
            atol=4 * np.spacing(e0))
    # E0, the energy of the initial state, is the same in every attempt.
    assert len({float(a["e0"]) for a in attempts}) == 1
    # Computed in the solve and here: measured equal, two ulp allowed.
    np.testing.assert_allclose(float(attempts[0]["e0"]), e0, rtol=4.5e-16, atol=0)
    for i, a in enumerate(attempts[:-1]):
        b = attempts[i + 1]
        if i in accepted:  # the next attempt starts from this one's end
            assert b["t0"] == a["t1"]
            jax.tree.map(np.testing.assert_array_equal, b["y0"], a["y1"])
        else:  # a retry: same start, shorter step, same Phi_n, new Delta
            assert b["t1"] < a["t1"]
            jax.tree.map(np.testing.assert_array_equal, b["y0"], a["y0"])
            assert not np.array_equal(b["frozen"].delta_q, a["frozen"].delta_q)
    # The accepted steps alone, without any rejection: identical states.
    ts = np.array([0.0] + [attempts[i]["t1"] for i in accepted])
    replay, again, evaluations = _spied(uk, diffrax.Tsit5(), Replay(ts=ts), dt=0.5)
    assert int(replay.stats["num_rejected_steps"]) == 0 and len(again) == len(accepted)
    assert evaluations == 7 * len(accepted)
    for i, b in zip(accepted, again):
        assert (b["t0"], b["t1"]) == (attempts[i]["t0"], attempts[i]["t1"])
        jax.tree.map(np.testing.assert_array_equal, b["y1"], attempts[i]["y1"])
    np.testing.assert_array_equal(replay.q[-1], sol.q[-1])
    np.testing.assert_array_equal(replay.v[-1], sol.v[-1])


def test_projected_adaptive():
    """Projected(Tsit5, NewtonProjection) + PID at 1e-8 with Lagrange (Baumgarte):
    every attempt, rejected ones included, ends on the constraints (the projection
    runs inside the step); only accepted attempts are kept; the dense output
    (SaveAt(ts)) ends at the projected state; the slider matches the reference."""
    solver = cdiff.Projected(diffrax.Tsit5(), cdiff.NewtonProjection())
    controller = diffrax.PIDController(rtol=1e-8, atol=1e-8)
    ts = jnp.linspace(0.1, T, 10)
    sol, attempts, _ = _spied(cdiff.Lagrange(), solver, controller, dt=1e-2,
                              saveat=cdiff.SaveAt(ts=ts))
    rejected = int(sol.stats["num_rejected_steps"])
    assert len(attempts) == int(sol.stats["num_steps"]) and rejected > 0
    residuals = [float(np.max(np.abs(MODEL.holonomic(a["t1"], a["y1"][0]))))
                 for a in attempts]
    accepted = _accepted(attempts)
    # Measured at most 1.1e-16 (accepted and rejected attempts alike).
    assert max(residuals) < 5e-16
    # Only accepted attempts are kept: each starts where the previous one ended.
    for i, j in zip(accepted[:-1], accepted[1:]):
        jax.tree.map(np.testing.assert_array_equal, attempts[j]["y0"],
                     attempts[i]["y1"])
    # t1 = 1 s ends a step: the interpolant (Tsit5's never reads y1) ends at the
    # projected state (it ended 1.9e-11 away, 2.6e-11 off the constraints, before
    # Projected shifted the stage increments); inside steps it is off the
    # constraints by its interpolation error (measured 5.9e-9).
    end = attempts[accepted[-1]]
    assert end["t1"] == T
    np.testing.assert_allclose(sol.q[-1], end["y1"][0], rtol=0,
                               atol=1e-15)  # measured 2.2e-16
    hol = np.abs(np.asarray(sol.holonomic_residual))
    print(f"projected: residual at t1 {hol[-1].max():.1e}, inside {hol.max():.1e}")
    assert hol[-1].max() < 1e-14 and hol.max() < 5e-8
    err = abs(float(MODEL.slider(sol.q[-1])) - _reference(THETAS[0])[0])
    print(f"projected: {rejected} rejected, slider error {err:.2e}")
    assert err < 1.5e-8  # measured 3.8e-9


def test_implicit_solver_inside_projected_gets_the_controllers_tolerances():
    """diffrax hands an adaptive controller's tolerances to an implicit solver's
    root finder only through one wrapper; FrozenStep(Projected(Kvaerno5())) is two,
    and the solve failed in the root finder ("Type of `other` not understood").
    `simulate` now sets them (end to end: R2, Lagrange, rtol = atol = 1e-8, 1 s,
    error 9.2e-10, as Kvaerno5 alone)."""
    controller = diffrax.PIDController(rtol=1e-7, atol=1e-9)
    projection = cdiff.NewtonProjection()
    solver = stepsize_tolerances(cdiff.Projected(diffrax.Kvaerno5(), projection),
                                 controller)
    assert isinstance(solver, cdiff.Projected) and solver.projection == projection
    finder = innermost(solver).root_finder
    assert (finder.rtol, finder.atol, finder.norm) == (1e-7, 1e-9, controller.norm)
    # Explicit solvers, constant steps and tolerances already set: unchanged.
    explicit = cdiff.Projected(diffrax.Tsit5(), projection)
    assert stepsize_tolerances(explicit, controller) is explicit
    implicit = diffrax.Kvaerno5()
    assert stepsize_tolerances(implicit, diffrax.ConstantStepSize()) is implicit
    chosen = diffrax.Kvaerno5(root_finder=diffrax.VeryChord(rtol=1e-3, atol=1e-3,
                                                            norm=max))
    assert stepsize_tolerances(chosen, controller) is chosen
