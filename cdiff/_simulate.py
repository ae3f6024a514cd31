"""simulate(): the driver. It checks the arguments before tracing, sets up one
`Problem` and runs it by the route `choose_route` picks (`_routes.py`)."""

from __future__ import annotations

import math
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._consistent import inconsistency
from ._formulation.base import AbstractFormulation
from ._formulation.dae import AbstractDAEFormulation
from ._model import AbstractModel, check_model
from ._problem import Problem, check_combination
from ._results import DIVERGENCE, RESULTS, is_concrete, solver_errors
from ._solution import Solution, plain_saveat
from ._routes import AbstractRoute, choose_route, constant_steps
from ._solver.bdf import BDF
from ._solver.rk4 import RK4


_BDF_MAX_STEPS = 16_384
# diffrax's default bound, where the saved rows do not depend on it.
_TRACED_MAX_STEPS = 4096

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
      the README's performance notes). Wrap it in
      [`cdiff.Projected`][] to project onto the constraints after every step. A DAE
      formulation ([`cdiff.GGL`][], [`cdiff.IndexOne`][]) needs [`cdiff.BDF`][],
      which also takes ODE formulations without per-step data; with it `dt` is the
      first step, `saveat` may ask for `t0`, `t1`, `ts` and `steps`, and `adjoint`
      chooses reverse (default) or forward mode (`diffrax.ForwardMode()`).
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
      RK4 loop (see `solver`) stores the four stage inputs of each step up to 4096
      steps (its backward pass then recomputes single stages, not whole steps),
      one state per step up to 16384, and beyond that one state per block of
      about $\sqrt{n}$ steps (a block's steps are recomputed from it);
      `diffrax.ForwardMode()` for `jax.jacfwd` (cdiff's own RK4 loop, see `solver`,
      also takes `jax.jacfwd` with the default).
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
      `vmap`ped batch).
    - `divergence`: the divergence test. A solve whose saved states include a
      coordinate, velocity, position residual $\Phi_q$ or velocity residual larger
      in magnitude than `divergence` $\cdot \max(1, \|q_0\|_\infty,
      \|v_0\|_\infty)$ ends with `cdiff.RESULTS.diverged` (raised with `throw`):
      an explicit integrator above its stability limit grows finite states to
      $10^{80}$ and more before they overflow. Default $10^8$; `None` turns the
      test off. Only saved states are tested: with `saveat` at `t1` alone, a
      blow-up that recovers is not seen (none does in practice).

    **Returns:** a [`cdiff.Solution`][].

    **Raises:** `ValueError` for inconsistent shapes, non-finite initial states or
    parameters, `dt <= 0` or `t1 <= t0` (checked before tracing where concrete, and
    with `eqx.error_if` inside `jit`).
    """
    if not isinstance(formulation, AbstractFormulation):
        raise TypeError(
            f"formulation must be a cdiff formulation (e.g. cdiff.Lagrange()), got "
            f"{type(formulation).__name__}"
        )
    q0 = jnp.asarray(q0)
    if not jnp.issubdtype(q0.dtype, jnp.floating):
        q0 = q0.astype(jnp.result_type(float))
    if q0.dtype not in (jnp.float32, jnp.float64):
        raise ValueError(
            f"cdiff.simulate: q0 has dtype {q0.dtype}; cdiff simulates in float32 or "
            "float64 (its linear algebra has no half-precision kernels, and float16's "
            "round-off, 1e-3, is above most constraint tolerances): pass "
            "q0.astype(jnp.float32)")
    v0 = jnp.asarray(v0, dtype=q0.dtype)
    _note_float32(q0.dtype)
    nq, m, p = check_model(model, t0, q0, v0)
    dtype = q0.dtype
    solver = RK4() if solver is None else solver
    bdf = isinstance(solver, BDF)
    if bdf and stepsize_controller is not None:
        raise ValueError(
            "cdiff.simulate: cdiff.BDF chooses its own steps (rtol, atol); do not pass "
            "a stepsize_controller with it."
        )
    if stepsize_controller is None:
        stepsize_controller = diffrax.ConstantStepSize()
    constant = isinstance(stepsize_controller, diffrax.ConstantStepSize)
    if saveat is None:
        saveat = diffrax.SaveAt(t0=True, steps=True)
    max_steps = _max_steps(max_steps, t0, t1, dt, saveat=saveat, bdf=bdf,
                           constant=constant, sizes=(nq + v0.shape[0], m + p),
                           dtype=dtype)
    check_combination(model, formulation, control, q0, v0, t0)
    _check_solver(formulation, solver)
    divergence = _divergence(divergence, dtype)
    # Python floats in modules would be static under jit (one compilation per
    # value); as weakly-typed arrays they are traced, so sweeps reuse compilations.
    model, formulation, control = _floats_to_arrays((model, formulation, control))
    formulation = formulation.bind(model, t0, q0, v0)
    times = tuple(jnp.asarray(x, dtype) for x in (t0, t1, dt))
    if bdf:
        solver = _floats_to_arrays(solver)
    else:
        _check_save_times(saveat, t0, t1)
    # Concrete inputs (no jit, vmap or grad around this call): the solve is compiled
    # without host callbacks, its failures returned as result codes and raised here
    # with the message naming where it stopped. JAX's persistent compilation cache
    # keeps no program with host callbacks (`cdiff.use_compilation_cache`).
    # (check_model has checked a concrete initial state's values.)
    concrete = is_concrete(model, formulation, control, q0, v0, times, solver)

    def solve(inner_throw: bool) -> Solution:
        route = choose_route(solver, stepsize_controller, saveat, adjoint, progress,
                             max_steps, inner_throw, (t0, t1, dt))
        return _solve(route, model, formulation, control, q0, v0, *times,
                      throw=inner_throw, checks=inner_throw, checked=concrete,
                      divergence=divergence)

    try:
        sol = solve(throw and not concrete)
    except TypeError as e:
        if "forward-mode autodiff" not in str(e):
            raise
        raise TypeError(
            "cdiff.simulate: forward-mode differentiation (jax.jvp, jax.jacfwd) "
            "through diffrax's solve needs simulate(..., "
            "adjoint=diffrax.ForwardMode()); the default adjoint is reverse mode "
            f"only. ({e})"
        ) from e
    if concrete and sol.result in (RESULTS.nonfinite, RESULTS.diverged):
        # A blow-up is often the symptom of constraints that no configuration meets.
        sol = _name_inconsistency(model, sol, throw=throw, start=(times[0], q0))
    if throw and concrete and not bool(sol.succeeded):
        if sol.result == RESULTS.nonfinite:
            # Where a run-time check of the model (a mass matrix no longer positive
            # definite, ...) ended the solve, only the program with its checks
            # raising names it: compiled for failed solves alone.
            solve(True)
        raise RuntimeError(sol.message)
    return _name_inconsistency(model, sol, throw=throw)


_FLOAT32_NOTED = False


def _note_float32(dtype) -> None:
    """Say once per process that a solve runs in float32 because JAX's 64-bit mode
    is off (JAX's default): its constraint errors near 1e-7 are round-off, not a
    fault of the model or the method."""
    global _FLOAT32_NOTED
    if _FLOAT32_NOTED or dtype != jnp.float32 or jax.config.jax_enable_x64:
        return
    _FLOAT32_NOTED = True
    warnings.warn(
        "cdiff.simulate: simulating in float32, JAX's default: constraint and "
        "energy errors of about 1e-7 relative are float32's round-off. For float64 "
        "call jax.config.update('jax_enable_x64', True) before any JAX computation "
        "(to keep float32 and silence this: warnings.filterwarnings('ignore', "
        "'cdiff.simulate: simulating in float32')).", stacklevel=3)


def _check_time_resolution(t0, t1, dt, dtype) -> None:
    """A step `dt` that the times between `t0` and `t1` cannot resolve in `dtype`
    (representable times there at least `dt / 2` apart: a step's end rounds onto
    its start, or a step doubles) is refused, naming the resolution."""
    for t in (t0, t1):
        spacing = float(np.spacing(np.abs(np.asarray(t, dtype))))
        if spacing >= float(dt) / 2:
            raise ValueError(
                f"cdiff.simulate: dt = {float(dt):g} is below the time resolution of "
                f"{np.dtype(dtype).name} at t = {float(t):g}, where representable "
                f"times are {spacing:g} apart, so steps of dt cannot be represented "
                "(some would vanish). Measure time from a nearer origin (t0 = 0), "
                "take a larger dt, or simulate in float64 (jax_enable_x64)."
            )


@eqx.filter_jit
def _solve(route: AbstractRoute, model, formulation, control, q0, v0, t0, t1, dt, *, throw, checks,
           checked, divergence):
    # `checks`: whether the model checks at reached states raise; `throw` also
    # raises the solver's failures inside the program; `checked`: the times and
    # initial state were checked before tracing.
    with solver_errors(checks):
        problem = Problem.build(model, formulation, control, q0, v0, t0, t1, dt,
                                checked=checked)
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


# ---------------------------------------------------------------------------
# Checks before tracing.
# ---------------------------------------------------------------------------


def _max_steps(max_steps, t0, t1, dt, *, saveat, bdf: bool, constant: bool, sizes,
               dtype) -> int:
    """The static bound on the number of steps, checked: `max_steps` or its default
    (see `simulate`)."""
    if max_steps is not None and not (
        isinstance(max_steps, (int, np.integer)) and not isinstance(max_steps, bool)
        and max_steps > 0
    ):
        raise ValueError(
            f"cdiff.simulate: max_steps must be a positive integer, got {max_steps!r}"
        )
    if not is_concrete(t0, t1, dt):
        if max_steps is not None:
            return max_steps
        if bdf:
            return _BDF_MAX_STEPS
        if _saves_steps(saveat):
            raise ValueError(
                "cdiff.simulate: `dt`, `t0` or `t1` is traced (inside jax.jit, "
                "jax.vmap or jax.grad) and every step is saved, so the number of "
                "saved rows is not known when tracing: pass a static `max_steps=` "
                "(for a constant step, at least ceil((t1 - t0) / dt) for the "
                "smallest dt), or save at given times (SaveAt(ts=...) or "
                "SaveAt(t1=True))."
            )
        return _TRACED_MAX_STEPS
    if not (float(dt) > 0 and math.isfinite(float(dt))):
        raise ValueError(f"dt must be positive and finite, got dt={float(dt)}")
    if not (math.isfinite(float(t1)) and math.isfinite(float(t0))):
        raise ValueError(f"t0 and t1 must be finite, got t0={t0}, t1={t1}")
    if not float(t1) > float(t0):
        raise ValueError(f"t1 must be greater than t0, got t0={t0}, t1={t1}")
    _check_time_resolution(t0, t1, dt, dtype)
    if bdf:  # dt is the first step; its steps do not follow it
        return _BDF_MAX_STEPS if max_steps is None else max_steps
    n = constant_steps(t0, t1, dt)
    if constant:
        if max_steps is not None and n > max_steps:
            raise ValueError(
                f"cdiff.simulate: max_steps={max_steps} is fewer than the "
                f"ceil((t1 - t0) / dt) = {n} constant steps from t0={t0} to t1={t1} "
                f"with dt={dt}; raise max_steps or leave it out."
            )
        _check_size(n, saveat, *sizes, dtype)
    if max_steps is not None:
        return max_steps
    return n if constant else max(16 * n, 4096)


def _check_solver(formulation, solver) -> None:
    """Refuse, before tracing, a formulation and a solver that do not go together."""
    name = type(formulation).__name__
    if isinstance(formulation, AbstractDAEFormulation) and not isinstance(solver, BDF):
        raise ValueError(
            f"cdiff.simulate: {name} is a DAE formulation; integrate it with "
            "solver=cdiff.BDF(...) (diffrax's solvers take ODEs)."
        )
    if isinstance(solver, BDF) and formulation.stepwise:
        raise ValueError(
            f"cdiff.BDF: {name} needs per-step data (frozen corrections or an "
            "end-of-step map), which a multistep method cannot provide; use "
            "cdiff.RK4 (or another diffrax solver), or a DAE formulation such "
            "as cdiff.GGL."
        )


def _divergence(divergence, dtype):
    """The divergence bound as a traced array (`inf`: no test), so that its values
    share a compilation."""
    if divergence is not None and not (
        isinstance(divergence, (int, float)) and math.isfinite(divergence)
        and divergence > 0
    ):
        raise ValueError(
            "cdiff.simulate: divergence must be a positive finite number (or None "
            f"to turn the divergence test off), got {divergence!r}"
        )
    return jnp.asarray(jnp.inf if divergence is None else divergence, dtype)


# Saved trajectories larger than this are refused before anything is allocated.
_MAX_SAVED_BYTES = 2**34


def _saves_steps(saveat) -> bool:
    sub = plain_saveat(saveat)
    return sub is None or bool(sub.steps)


def _check_size(n: int, saveat, state: int, rows: int, dtype) -> None:
    """Refuse, before tracing, a constant-step solve of more steps than a loop
    counter holds, or one whose saved rows (every step saved) would not fit in
    memory: both used to fail deep inside XLA."""
    if n >= 2**31:
        raise ValueError(
            f"cdiff.simulate: ceil((t1 - t0) / dt) = {n:.3g} steps is more than a "
            "solve can take (2**31); raise dt."
        )
    if not _saves_steps(saveat):
        return
    # Per saved row: the state, q and v again with their rates, the residuals and
    # multipliers, the constraint force.
    size = n * (4 * state + 3 * rows) * np.dtype(dtype).itemsize
    if size > _MAX_SAVED_BYTES:
        raise ValueError(
            f"cdiff.simulate: saving all {n:,} steps would take about "
            f"{size / 2**30:,.0f} GiB; raise dt, or save fewer rows "
            "(saveat=cdiff.SaveAt(ts=...) or SaveAt(t1=True))."
        )


def _floats_to_arrays(tree):
    return jax.tree.map(lambda x: jnp.asarray(x) if type(x) is float else x, tree)


def _check_save_times(saveat, t0, t1) -> None:
    """Refuse, before tracing, save times that are not sorted or not in [t0, t1]."""
    sub = plain_saveat(saveat)
    if sub is None or sub.ts is None or not is_concrete(sub.ts, t0, t1):
        return
    ts = np.asarray(sub.ts, np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError("cdiff.simulate: saveat.ts must be a non-empty 1-D array of "
                         f"times, got shape {ts.shape}")
    if not np.all(np.isfinite(ts)):
        raise ValueError("cdiff.simulate: saveat.ts has a non-finite time")
    if np.any(np.diff(ts) < 0):
        i = int(np.argmax(np.diff(ts) < 0))
        raise ValueError("cdiff.simulate: saveat.ts must be sorted; "
                         f"ts[{i}] = {ts[i]} > ts[{i + 1}] = {ts[i + 1]}")
    if ts[0] < float(t0) or ts[-1] > float(t1):
        raise ValueError(f"cdiff.simulate: saveat.ts must lie in [t0, t1] = "
                         f"[{float(t0)}, {float(t1)}]; got [{ts[0]}, {ts[-1]}]")
