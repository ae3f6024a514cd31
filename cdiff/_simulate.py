"""simulate(): the driver. It checks the arguments before tracing, sets up one
`Problem` and runs it by the route `choose_route` picks (`_routes.py`)."""

from __future__ import annotations

import functools
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._compiler import hint_if_nested, top_level_options
from ._consistent import inconsistency
from ._kinematics import residuals
from ._impact import WithUnilateral
from ._formulation.base import AbstractFormulation
from ._model import AbstractModel, check_model
from ._checks import (
    check_combination,
    check_friction,
    check_unilateral,
    penetration_message,
    check_divergence,
    check_formulation,
    check_max_steps,
    check_save_times,
    check_solver,
    initial_state,
)
from ._problem import Problem
from ._results import DIVERGENCE, RESULTS, is_concrete
from ._solution import Solution
from ._routes import AbstractRoute, choose_route
from ._solver.bdf import BDF
from ._solver.rk4 import RK4


def simulate(
    model: AbstractModel,
    formulation: AbstractFormulation,
    q0,
    v0,
    *,
    t1,
    dt,
    t0=0.0,
    solver: diffrax.AbstractSolver | BDF | None = None,
    saveat: diffrax.SaveAt | None = None,
    control=None,
    max_steps: int | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
    progress: bool = False,
    divergence: float | None = DIVERGENCE,
    max_events: int | None = None,
) -> Solution:
    r"""Simulate `model` with `formulation` from `(q0, v0)` at time `t0` to `t1`.

    Composes with `jax.jit`, `jax.vmap` (over `dt`, formulation gains, model fields,
    initial state) and `jax.grad` (over model fields and initial state).

    **Arguments:**

    - `model`: a [`cdiff.AbstractModel`][].
    - `formulation`: e.g. [`cdiff.Lagrange`][] or [`cdiff.UdwadiaKalaba`][].
    - `q0`, `v0`: initial coordinates and velocities, shape `(nq,)`. They need not
      satisfy the constraints (the formulation decides what happens then).
    - `t1`: final time. `t0`: initial time (default 0).
    - `dt`: step size (the initial step size for an adaptive controller). With the
      default constant step size, `ceil((t1 - t0) / dt)` equal steps are taken
      (reported as `Solution.dt`).
    - `solver`: any diffrax solver; default [`cdiff.RK4`][], which cdiff runs in
      its own loop when the step is constant and known before tracing and `adjoint`
      is left at its default, and `saveat` asks for `t0`, `t1`, every step and/or
      save times `ts` (not both `ts` and steps; `ts` known before tracing, or at
      most 16 traced ones): the same results as `diffrax.diffeqsolve`, faster (see
      the performance notes of the docs' Benchmarks page, `docs/benchmarks.md`).
      Wrap it in [`cdiff.Projected`][] to project onto the constraints after
      every step. A DAE formulation ([`cdiff.GGL`][], [`cdiff.IndexOne`][]) needs
      [`cdiff.BDF`][], which also takes ODE formulations without per-step data;
      with it `dt` is the first step, `saveat` may ask for `t0`, `t1`, `ts` and
      `steps`, and `adjoint` chooses reverse (default) or forward mode
      (`diffrax.ForwardMode()`).
    - `saveat`: a `cdiff.SaveAt` (= `diffrax.SaveAt`); default: `t0` and every step.
      Save times `ts` must be sorted and lie in `[t0, t1]` (checked before tracing
      when known); the state between steps is the solver's dense output (RK4:
      cubic Hermite from the step's ends and its first and last stage).
    - `control`: optional callable `u = control(t, q, v)` (e.g. an
      `equinox.Module` controller); its output enters as $E(t, q)u$. Or a
      controller with state, a [`cdiff.control.AbstractStatefulController`][]:
      its state is integrated with the mechanical state by the same solver (any
      route above, BDF with an ODE formulation only) and saved in
      `Solution.controller_state`, and it may read the plant's multipliers.
    - `max_steps`: static bound on the number of steps. Computed from `dt` when `dt`
      is a concrete number. When `dt` is traced (e.g. under `jax.vmap` over step
      sizes) it is **required** if every step is saved (it fixes the number of
      saved rows), and otherwise defaults to 4096, as in diffrax; a solve that
      needs more steps ends with `RESULTS.max_steps_reached`. With
      [`cdiff.BDF`][] (whose steps do not follow `dt`), default 16384, rejected
      steps included.
    - `stepsize_controller`: default `diffrax.ConstantStepSize()`.
    - `adjoint`: default reverse mode, `diffrax.RecursiveCheckpointAdjoint` with one
      checkpoint per step for constant steps up to 16384 of them (memory: the
      loop state per step and per trajectory; pass
      `diffrax.RecursiveCheckpointAdjoint()` for diffrax's $O(\sqrt{n})$
      checkpoints when that is too much), otherwise diffrax's default. cdiff's own
      RK4 loop (see `solver`) stores one state per step up to 16384 steps, and
      beyond that one state per block of about $\sqrt{n}$ steps (a block's steps
      are recomputed from it);
      `diffrax.ForwardMode()` for `jax.jacfwd`. cdiff's own RK4 loop (see
      `solver`) differentiates in reverse mode by the discrete adjoint: the state
      kept once per step, and a reverse scan that takes each step's VJP once;
      with `diffrax.ForwardMode()` it runs as a plain scan, which `jax.jacfwd`
      (and `jax.grad`) differentiate.
    - `throw`: raise on solver failure (default). With `throw=False` check
      `Solution.result`: a failure is a result code, including the run-time checks
      of the model at the states the solver reaches (a mass matrix that stops being
      symmetric positive definite, NullSpace's basis losing rank), which then end
      the solve with `RESULTS.nonfinite`. Outside `jit`, a solve of one trajectory
      that ends more than $10^{-6}\max(1, \|q\|_\infty)$ off its holonomic
      constraints is tested for an inconsistent constraint set
      ([`cdiff.analysis.inconsistency`][]), reported as
      `RESULTS.inconsistent_constraints`. Called eagerly (no `jit`, `vmap` or
      `grad` around it), the solve is compiled with result codes alone and a
      failure is raised from its code after it (a model check's failure by
      running it once more with the check raising), so that the compiled program
      has no host callback and `cdiff.use_compilation_cache` can keep it; inside
      your own `jit`, `throw=False` does the same.
    - `progress`: show a progress bar (diffrax's `TqdmProgressMeter`; cdiff's own
      RK4 loop updates it about 20 times, between blocks of steps, for a whole
      `vmap`ped batch; with unilateral rows one bar spans the segments between
      events). Not with `cdiff.BDF`.
    - `divergence`: the divergence test. A solve whose saved states include a
      coordinate, velocity, position residual $\Phi_q$ or velocity residual larger
      in magnitude than `divergence` $\cdot \max(1, \|q_0\|_\infty,
      \|v_0\|_\infty)$ ends with `cdiff.RESULTS.diverged` (raised with `throw`):
      an explicit integrator above its stability limit grows finite states to
      $10^{80}$ and more before they overflow. Default $10^8$; `None` turns the
      test off. Only saved states are tested: with `saveat` at `t1` alone, a
      blow-up that recovers is not seen (none does in practice).
    - `max_events`: for a model with unilateral rows solved in segments between
      events (a diffrax solver, an adaptive step, save times, or `cdiff.BDF`), the
      most events (impacts and releases) the solve takes: it ends with
      `cdiff.RESULTS.too_many_events` at the first one beyond; default 256
      (static). cdiff's RK4 loop has no such cap (at most 64 sub-steps in a
      step), and refuses it.

    **Returns:** a [`cdiff.Solution`][].

    **Raises:** `ValueError` for inconsistent shapes, non-finite initial states or
    parameters, `dt <= 0` or `t1 <= t0` (checked before tracing where concrete, and
    with `eqx.error_if` inside `jit`).
    """
    check_formulation(formulation)
    q0, v0 = initial_state(q0, v0)
    nq, m, p = check_model(model, t0, q0, v0)
    dtype = q0.dtype
    solver = RK4() if solver is None else solver
    bdf = isinstance(solver, BDF)
    check_solver(formulation, solver, stepsize_controller)
    if stepsize_controller is None:
        stepsize_controller = diffrax.ConstantStepSize()
    constant = isinstance(stepsize_controller, diffrax.ConstantStepSize)
    if saveat is None:
        saveat = diffrax.SaveAt(t0=True, steps=True)
    max_steps = check_max_steps(max_steps, t0, t1, dt, saveat=saveat, bdf=bdf,
                           constant=constant, sizes=(nq + v0.shape[0], m + p),
                           dtype=dtype)
    check_combination(model, formulation, control, q0, v0, t0)
    if max_events is not None and not (isinstance(max_events, (int, np.integer))
                                       and not isinstance(max_events, bool)
                                       and max_events >= 1):
        raise ValueError("cdiff.simulate: max_events must be a positive int (static), "
                         f"got {max_events!r}")
    unilateral = check_unilateral(model, formulation, solver, stepsize_controller,
                                  saveat, adjoint, control, t0, q0)
    if max_events is not None and not unilateral:
        raise ValueError(f"cdiff.simulate: max_events caps the events of unilateral "
                         f"rows, and {type(model).__name__} has none.")
    original_model = model
    slip_dims = (check_friction(model, unilateral, t0, q0, v0, formulation, solver)
                 if unilateral else 0)
    if unilateral:
        # Rows held as equalities while active: none at the start (a row at
        # contact and arriving is hit by the first step). With friction, none
        # sticks, and no force is pushed yet.
        friction = (dict(stuck=jnp.zeros(unilateral, bool),
                         sliding=jnp.zeros((unilateral, slip_dims), q0.dtype),
                         push=jnp.zeros(unilateral, q0.dtype)) if slip_dims else {})
        model = WithUnilateral(model, jnp.zeros(unilateral, bool), **friction)
    divergence = check_divergence(divergence, dtype)
    # Python floats in modules would be static under jit (one compilation per
    # value); as weakly-typed arrays they are traced, so sweeps reuse compilations.
    model, formulation, control = _floats_to_arrays((model, formulation, control))
    formulation = formulation.bind(model, t0, q0, v0)
    times = tuple(jnp.asarray(x, dtype) for x in (t0, t1, dt))
    if bdf:
        solver = _floats_to_arrays(solver)
    else:
        check_save_times(saveat, t0, t1)
    # Concrete inputs (no jit, vmap or grad around this call): the solve is compiled
    # without host callbacks, its failures returned as result codes and raised here
    # with the message naming where it stopped. JAX's persistent compilation cache
    # keeps no program with host callbacks (`cdiff.use_compilation_cache`).
    # (check_model has checked a concrete initial state's values.)
    concrete = is_concrete(model, formulation, control, q0, v0, times, solver)
    if throw and concrete and unilateral and (
            behind := penetration_message(original_model, times[0], q0)):
        raise ValueError(behind)

    def solve(inner_throw: bool) -> Solution:
        route = choose_route(solver, stepsize_controller, saveat, adjoint, progress,
                             max_steps, inner_throw, (t0, t1, dt),
                             unilateral=bool(unilateral), max_events=max_events,
                             friction=bool(slip_dims))
        options = tuple(sorted(top_level_options().items()))
        return _jitted_solve(options)(
            route, model, formulation, control, q0, v0, *times, throw=inner_throw,
            checks=inner_throw, checked=concrete, divergence=divergence)

    hint_if_nested("cdiff.simulate")

    try:
        sol = solve(throw and not concrete)
    except TypeError as e:
        if "forward-mode autodiff" not in str(e):
            raise
        rows = (" With unilateral rows it also needs cdiff's own RK4 loop (solver "
                "cdiff.RK4() or cdiff.Projected(cdiff.RK4(), ...), a constant dt "
                "known before tracing, a SaveAt of t0, t1 and/or steps): the "
                "segments of other solvers take reverse mode only."
                if unilateral else "")
        raise TypeError(
            "cdiff.simulate: forward-mode differentiation (jax.jvp, jax.jacfwd) "
            "needs simulate(..., adjoint=diffrax.ForwardMode()); the default "
            "adjoint is reverse mode only (cdiff's own RK4 loop: the discrete "
            f"adjoint).{rows} ({e})"
        ) from e
    if concrete and sol.result in (RESULTS.nonfinite, RESULTS.diverged):
        # A blow-up is often the symptom of constraints that no configuration meets.
        sol = _name_inconsistency(model, sol, throw=throw, start=(times[0], q0))
    if throw and concrete and not bool(sol.succeeded):
        if sol.result == RESULTS.nonfinite or (
                slip_dims and sol.result == RESULTS.max_steps_reached):
            # Where a run-time check of the model (a mass matrix no longer positive
            # definite, ...) ended the solve, only the program with its checks
            # raising names it: compiled for failed solves alone. (With friction,
            # Painleve's check turns the state into NaN, which an adaptive solver
            # meets by shrinking its step until it runs out of steps.)
            solve(True)
        raise RuntimeError(sol.message)
    sol = _name_inconsistency(model, sol, throw=throw)
    if concrete:
        _warn_off_constraints(original_model, sol, times[0], q0, v0)
        if unilateral:
            _warn_grazing(sol, dt)
    return sol


@functools.cache
def _jitted_solve(options: tuple):
    """`run_route` jitted with XLA's compiler options `options` (pairs: those JAX
    takes where `simulate` is called, `cdiff._compiler.top_level_options`)."""
    return eqx.filter_jit(run_route, **({"compiler_options": dict(options)}
                                     if options else {}))


def run_route(route: AbstractRoute, model, formulation, control, q0, v0, t0, t1, dt,
              *, throw, checks, checked, divergence) -> Solution:
    """The driver's solve, traced: the `Problem` set up, integrated by `route`,
    and its `Solution`. `checks`: whether the model checks at reached states
    raise; `throw` also raises the solver's failures inside the program;
    `checked`: the times and initial state were checked before tracing. (Also
    the studies' solve on `GridRoute`.)"""
    problem = Problem.build(model, formulation, control, q0, v0, t0, t1, dt,
                            checked=checked, reschedule=route.reschedule, throw=checks)
    trajectory = route(problem)
    return problem.solution(trajectory, dt=trajectory.dt, dt_taken=trajectory.dt_taken,
                            throw=throw, divergence=divergence)


# A solve that ends with a larger holonomic residual than this (relative to the
# size of the configuration) is tested for inconsistent constraints.
_INCONSISTENCY_TEST = 1e-6
_inconsistency = eqx.filter_jit(inconsistency)


def _name_inconsistency(model, sol: Solution, *, throw: bool,
                        start=None) -> Solution:
    """A successful solve (outside `jit`, one trajectory) that ends far from its
    holonomic constraints is tested for an inconsistent constraint set
    ([`cdiff.analysis.inconsistency`][] from the last saved configuration); with
    `start = (t0, q0)`, a failed solve is tested from its initial configuration.
    When the test says so, the result becomes `RESULTS.inconsistent_constraints`
    (raised with `throw`). The test compiles only for such solves."""
    hol = sol.holonomic_residual
    if not is_concrete(sol) or hol.shape[-1] == 0 or np.ndim(sol.result._value):
        return sol
    if start is not None:
        t, q = start
    else:
        if not bool(sol.succeeded):
            return sol
        ts = np.asarray(sol.ts)
        rows = np.flatnonzero(np.isfinite(ts))
        if rows.size == 0:
            return sol
        last = rows[-1]
        t, q = sol.ts[last], sol.q[last]
        scale = max(1.0, float(jnp.abs(q).max()))
        if not float(jnp.abs(hol[last]).max()) > _INCONSISTENCY_TEST * scale:
            return sol
    if not bool(_inconsistency(model, t, q)[0]):
        return sol
    sol = eqx.tree_at(lambda s: s.result, sol, RESULTS.inconsistent_constraints)
    if throw:
        raise RuntimeError(sol.message)
    return sol


# A start farther off its constraints than this (relative to the size of the
# state) is named: the formulations keep such an error (cf. initial_state's).
_START_TOLERANCE = 1e-6


@eqx.filter_jit
def _start_residuals(model, t0, q0, v0):
    hol, vel = residuals(model, t0, q0, v0)
    return jnp.max(jnp.abs(hol), initial=0.0), jnp.max(jnp.abs(vel), initial=0.0)


def _warn_off_constraints(model, sol: Solution, t0, q0, v0) -> None:
    """Warn where a successful solve of one trajectory started off its
    constraints (read from its first saved row where that is `t0`, else evaluated
    at the start): the formulations integrate the constraints' derivatives and
    keep the error they start with."""
    if (sol.velocity_residual.shape[-1] == 0 or np.ndim(sol.result._value)
            or not bool(sol.succeeded)):
        return
    if sol.ts.shape[0] and float(sol.ts[0]) == float(t0):
        position = float(jnp.max(jnp.abs(sol.holonomic_residual[0]), initial=0.0))
        velocity = float(jnp.max(jnp.abs(sol.velocity_residual[0]), initial=0.0))
    else:
        position, velocity = (float(x) for x in _start_residuals(model, t0, q0, v0))
    scale = max(1.0, float(jnp.abs(q0).max(initial=0.0)),
                float(jnp.abs(v0).max(initial=0.0)))
    if max(position, velocity) > _START_TOLERANCE * scale:
        warnings.warn(
            f"cdiff.simulate: the initial state is off {type(model).__name__}'s "
            f"constraints: max |Phi(t0, q0)| = {position:.3g} (positions), max "
            f"|[dPhi/dt; Phi_v](t0, q0, v0)| = {velocity:.3g} (velocities), above "
            f"{_START_TOLERANCE:g} x max(1, |q0|, |v0|). The formulations keep an "
            "error they start with (Baumgarte's gains only damp it). Project the "
            "start onto the constraints first: q0, v0 = cdiff.consistent_state("
            "model, q0, v0).", stacklevel=3)


def _warn_grazing(sol: Solution, dt) -> None:
    """Warn where impacts of a solve of one trajectory arrived grazing
    (`Events.grazing`)."""
    events = sol.stats.get("events")
    if events is None or np.ndim(sol.result._value):
        return
    grazing = np.asarray(events.grazing).any(axis=-1)
    if grazing.any():
        times = ", ".join(f"{t:.6g}" for t in np.asarray(events.t)[grazing][:5])
        warnings.warn(
            f"cdiff.simulate: {int(grazing.sum())} impact(s) arrived grazing (t = "
            f"{times}{', ...' if grazing.sum() > 5 else ''}): slower than one step's "
            f"acceleration of the row turns it back (|dg/dt| < d2g/dt2 x dt, dt = "
            f"{float(dt):g}). The solve cannot tell such a touch from a near miss, "
            "and derivatives through it are unreliable (see Solution.stats['events']"
            ".grazing and the limitations page of the docs). A smaller dt resolves "
            "slower approaches.", stacklevel=3)


def _floats_to_arrays(tree):
    return jax.tree.map(lambda x: jnp.asarray(x) if type(x) is float else x, tree)


