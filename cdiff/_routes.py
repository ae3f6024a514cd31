"""The routes by which `simulate` integrates a `Problem`: cdiff's own constant-step
RK4 loop, `diffrax.diffeqsolve`, or cdiff's BDF; `choose_route` picks one. The
step-size studies run their solves on `GridRoute`, through the same driver."""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._problem import Problem
from ._results import RESULTS, is_concrete
from ._solution import Trajectory, plain_saveat
from ._solver.base import declares, innermost, replace_innermost
from ._solver.bdf import BDF, bdf_route
from ._solver.event_segments import (MAX_SEGMENTS, event_bdf_route,
                                     event_diffrax_route)
from ._solver.events import event_rk4_route
from ._solver.frozen import diffrax_problem, diffrax_route
from ._solver.grid import UniformGrid, grid_solve
from ._solver.rk4 import (CHECKPOINT_EVERY_STEP, SavePlan, blocks_of, rk4_route,
                          save_plan)


def constant_steps(t0, t1, dt) -> int:
    """The number of steps diffrax's `ConstantStepSize` takes from `t0` to `t1`."""
    return int(math.ceil((float(t1) - float(t0)) / float(np.nextafter(dt, np.inf))))


# Traced save times (e.g. `jnp.array` inside `jax.jit`) are interpolated by every
# step (a few multiply-adds each); more of them go through diffrax.
_TRACED_SAVE_TIMES = 16


class AbstractRoute(eqx.Module):
    """How a `Problem` is integrated: `route(problem)` is the `Trajectory`, with
    the step the per-step data were frozen for (`dt`) and the constant step taken
    (`dt_taken`, NaN for adaptive steps). Each route calls the route function
    beside its solver; `choose_route` picks one."""

    #: Whether the problem's vector field evaluates each distinct transcendental
    #: function once (`compute_once`; off for `RK4(fast_paths=False)`).
    reschedule: bool = eqx.field(static=True, default=True, kw_only=True)

    @abc.abstractmethod
    def __call__(self, problem: Problem) -> Trajectory:
        ...


class OwnRK4Route(AbstractRoute):
    """Constant-step RK4 in cdiff's own loop (`rk4_route`)."""

    steps: int
    save: tuple[bool, bool, bool]  # t0, t1, steps
    rows: int
    throw: bool
    progress: bool
    blocks: tuple[int, int]
    save_ts: Any = None
    plan: SavePlan | None = None
    # adjoint=diffrax.ForwardMode(): a plain scan, which jax.jvp differentiates
    # (else reverse mode is the discrete adjoint).
    forward_mode: bool = False
    # What reverse mode keeps (the solver's options, `cdiff.RK4`): one state per
    # block, not per step; every stage's input (of the plain scan).
    checkpoint_blocks: bool = False
    keep_stages: bool = True

    def __call__(self, problem: Problem):
        grid = UniformGrid.build(problem.t0, problem.t1, problem.dt, self.rows + 1)
        save_ts = (None if self.save_ts is None
                   else jnp.asarray(self.save_ts, grid.ts.dtype))
        trajectory = rk4_route(
            problem, grid.ts, steps=self.steps, save_t0=self.save[0],
            save_t1=self.save[1], save_steps=self.save[2], rows=self.rows,
            keep_stages=self.keep_stages, throw=self.throw,
            save_ts=save_ts, plan=self.plan, blocks=self.blocks[0],
            block=self.blocks[1], progress=self.progress,
            forward_mode=self.forward_mode,
            checkpoint_blocks=self.checkpoint_blocks)
        return dataclasses.replace(trajectory, dt=grid.step, dt_taken=grid.step)


class EventRK4Route(AbstractRoute):
    """Constant-step RK4 with unilateral rows: events located inside the step,
    impacts and the active set (`event_rk4_route`)."""

    steps: int
    save: tuple[bool, bool, bool]  # t0, t1, steps
    rows: int
    throw: bool
    projection: Any = None  # of cdiff.Projected(cdiff.RK4(), projection)
    progress: bool = False
    forward_mode: bool = False  # adjoint=diffrax.ForwardMode(): a plain scan

    def __call__(self, problem: Problem):
        grid = UniformGrid.build(problem.t0, problem.t1, problem.dt, self.rows + 1)
        trajectory = event_rk4_route(
            problem, grid.ts, steps=self.steps, save_t0=self.save[0],
            save_t1=self.save[1], save_steps=self.save[2], rows=self.rows,
            throw=self.throw, projection=self.projection, progress=self.progress,
            forward_mode=self.forward_mode)
        return dataclasses.replace(trajectory, dt=grid.step, dt_taken=grid.step)


class EventDiffraxRoute(AbstractRoute):
    """Unilateral rows with a diffrax solver, an adaptive step or save times:
    segments of `diffrax.diffeqsolve` between events (`event_diffrax_route`); or
    with cdiff's BDF, segments of it (`event_bdf_route`)."""

    solver: Any
    stepsize_controller: Any
    save: tuple[bool, bool, bool]  # t0, t1, steps
    save_ts: Any
    max_steps: int
    throw: bool
    progress: bool = eqx.field(static=True, default=False, kw_only=True)
    max_events: int | None = eqx.field(static=True, default=None, kw_only=True)

    def __call__(self, problem: Problem):
        save_ts = (None if self.save_ts is None
                   else jnp.asarray(self.save_ts, problem.t0.dtype))
        max_events = MAX_SEGMENTS if self.max_events is None else self.max_events
        dae = declares(self.solver, "integrates_dae")
        if dae:
            trajectory = event_bdf_route(
                problem, self.solver, save=self.save, save_ts=save_ts,
                max_steps=self.max_steps, throw=self.throw, max_events=max_events)
        else:
            trajectory = event_diffrax_route(
                problem, self.solver, stepsize_controller=self.stepsize_controller,
                save=self.save, save_ts=save_ts, max_steps=self.max_steps,
                throw=self.throw, progress=self.progress, max_events=max_events)
        constant = (not dae and isinstance(
            self.stepsize_controller, diffrax.ConstantStepSize))
        taken = problem.dt if constant else jnp.asarray(jnp.nan, problem.q0.dtype)
        return dataclasses.replace(trajectory, dt=problem.dt, dt_taken=taken)


class DiffraxRoute(AbstractRoute):
    """Any diffrax solver through `diffrax.diffeqsolve` (`diffrax_route`)."""

    solver: Any
    stepsize_controller: Any
    saveat: Any
    adjoint: Any
    max_steps: int
    throw: bool
    progress: bool

    def __call__(self, problem: Problem):
        controller, dt0, dt = self.stepsize_controller, problem.dt, problem.dt
        taken = jnp.asarray(jnp.nan, problem.q0.dtype)
        if isinstance(controller, diffrax.ConstantStepSize):
            # Steps of T / ceil(T / dt) to times read from a grid computed once, so
            # that a step recomputed for reverse mode has bit-identical times (see
            # UniformGrid); the step taken is reported.
            controller = UniformGrid.build(problem.t0, problem.t1, problem.dt,
                                           self.max_steps + 1)
            dt0, dt = None, controller.step
            taken = dt
        trajectory = diffrax_route(
            problem, self.solver, dt0=dt0, dt=dt, stepsize_controller=controller,
            saveat=self.saveat, adjoint=self.adjoint, max_steps=self.max_steps,
            throw=self.throw, progress=self.progress)
        return dataclasses.replace(trajectory, dt=dt, dt_taken=taken)


class GridRoute(AbstractRoute):
    r"""Constant steps from $t_0 = 0$ saved at every `k`-th step end, the times
    `ts` ($t_1 j/n$, $j = 1 \dots n$, $n$ = `len(ts)`, each the end of a step of
    $h = t_1/(k n)$: the problem's `dt`), by `grid_solve`, which carries the
    state alone: under `jax.vmap` over step sizes `k` is traced per trajectory,
    and nothing is written to a per-trajectory save buffer. The step-size
    studies' route ([`cdiff.studies.step_size_study`][] when every measurement
    time ends a step of every step size; they know `k` before tracing, which
    `simulate` does not for a traced `dt`, so `choose_route` never picks it).
    Forward only: its loops have traced bounds. A trajectory that fails keeps its
    last good state and its later rows are unreached (`ts` = inf)."""

    solver: Any
    k: Any  # integer steps between saves (traced under vmap)
    ts: Any

    def __call__(self, problem: Problem):
        terms, stepper, args = diffrax_problem(problem, self.solver, problem.dt)
        ys, ok = grid_solve(terms, stepper, problem.y0, args, problem.t1, self.k,
                            self.ts.shape[0])
        result = RESULTS.where(jnp.all(ok), RESULTS.successful, RESULTS.nonfinite)
        return Trajectory(jnp.where(ok, self.ts, jnp.inf), ys, result, {},
                          dt=problem.dt, dt_taken=problem.dt)


class BDFRoute(AbstractRoute):
    """cdiff's BDF (`bdf_route`)."""

    solver: BDF
    save: tuple[bool, bool, bool]
    save_ts: Any
    max_steps: int
    forward: bool
    throw: bool

    def __call__(self, problem: Problem):
        trajectory = bdf_route(
            problem, self.solver, save=self.save, save_ts=self.save_ts,
            max_steps=self.max_steps, forward=self.forward, throw=self.throw)
        nan = jnp.asarray(jnp.nan, problem.q0.dtype)
        return dataclasses.replace(trajectory, dt=nan, dt_taken=nan)


def _ode_route(solver, stepsize_controller, saveat, adjoint, progress, max_steps,
               throw, times):
    """cdiff's own RK4 loop where it applies (see `_own_loop_steps`), else
    `diffrax.diffeqsolve` with cdiff's default adjoint."""
    steps = _own_loop_steps(solver, stepsize_controller, saveat, adjoint,
                            max_steps, times)
    every_step = getattr(innermost(solver), "checkpoint_every_step",
                         CHECKPOINT_EVERY_STEP)
    if steps is not None:
        sub = plain_saveat(saveat)
        save = (bool(sub.t0), bool(sub.t1), bool(sub.steps))
        # Nested blocks for save times, the progress bar and long solves (reverse
        # mode then keeps a state per block).
        long = steps > every_step
        blocks = blocks_of(steps, nested=sub.ts is not None or progress or long)
        options = {"forward_mode": isinstance(adjoint, diffrax.ForwardMode),
                   "checkpoint_blocks": long,
                   "keep_stages": steps <= solver.keep_stages}
        if sub.ts is None:
            return OwnRK4Route(steps, save, max_steps, throw, progress, blocks,
                               **options)
        if not is_concrete(sub.ts):  # each step interpolates at every time
            return OwnRK4Route(steps, save, max_steps, throw, progress, blocks, sub.ts,
                               **options)
        t0, t1, _ = (float(x) for x in times)
        plan = save_plan(np.asarray(sub.ts), t0, t1, steps, *blocks)
        return OwnRK4Route(steps, save, max_steps, throw, progress, blocks,
                           np.asarray(sub.ts), plan, **options)
    constant = isinstance(stepsize_controller, diffrax.ConstantStepSize)
    if adjoint is None:
        # Up to `every_step` constant steps, one checkpoint per step (the loop
        # state, times the batch under vmap): the backward pass then recomputes
        # each step once, where diffrax's default O(sqrt(n)) checkpoints recompute
        # most steps twice or more.
        adjoint = diffrax.RecursiveCheckpointAdjoint(
            checkpoints=max_steps if constant and max_steps <= every_step else None
        )
    inner = innermost(solver)
    if isinstance(adjoint, diffrax.ForwardMode) and isinstance(
        inner, diffrax.AbstractRungeKutta
    ):
        # What diffrax.ForwardMode does for a bare Runge-Kutta solver (it cannot see
        # through cdiff's wrappers): stage loops that JAX can differentiate forwards.
        inner = eqx.tree_at(
            lambda s: s.scan_kind, inner, "lax", is_leaf=lambda x: x is None
        )
        solver = replace_innermost(solver, inner)
    return DiffraxRoute(solver, stepsize_controller, saveat, adjoint, max_steps, throw,
                        progress,
                        reschedule=getattr(inner, "fast_paths", True))


def _bdf_route(solver, saveat, adjoint, progress, max_steps, *, throw: bool):
    if progress:
        raise ValueError("cdiff.simulate: progress=True is not supported with cdiff.BDF")
    sub = plain_saveat(saveat)
    if sub is None:
        raise ValueError(
            "cdiff.simulate: with cdiff.BDF, saveat supports t0, t1, ts and steps "
            "(no nested SaveAt, no fn, no dense)."
        )
    if sub.steps not in (0, 1, True, False):
        raise ValueError("cdiff.simulate: with cdiff.BDF, saveat.steps must be a bool")
    return BDFRoute(solver, (bool(sub.t0), bool(sub.t1), bool(sub.steps)), sub.ts,
                max_steps, isinstance(adjoint, diffrax.ForwardMode), throw)


def _own_loop_steps(solver, stepsize_controller, saveat, adjoint, max_steps,
                    times) -> int | None:
    """The number of steps when `simulate` runs its own constant-step RK4 loop
    (`rk4_route`), or None for `diffrax.diffeqsolve`: the default RK4 with a
    constant step known before tracing, the default adjoint (reverse mode, the
    discrete adjoint) or `diffrax.ForwardMode()`, and a `saveat` of
    `t0`, `t1`, every step and/or save times `ts` (known before tracing, or up to
    `_TRACED_SAVE_TIMES` traced ones)."""
    sub = plain_saveat(saveat)
    if not (
        declares(solver, "own_loop")
        and solver.fast_paths
        and isinstance(stepsize_controller, diffrax.ConstantStepSize)
        and (adjoint is None or isinstance(adjoint, diffrax.ForwardMode))
        and sub is not None
        and sub.steps in (0, 1, True, False)
        # diffrax puts save times and steps in one buffer in the order of time
        and (sub.ts is None or not sub.steps)
        and (sub.ts is None or is_concrete(sub.ts)
             or jnp.shape(sub.ts)[0] <= _TRACED_SAVE_TIMES)
        and is_concrete(*times)
    ):
        return None
    steps = constant_steps(*times)
    return steps if steps <= max_steps else None


def choose_route(solver, stepsize_controller, saveat, adjoint, progress: bool,
                 max_steps: int, throw: bool, times, *, unilateral: bool = False,
                 max_events: int | None = None, friction: bool = False
                 ) -> AbstractRoute:
    """The route of a solve: `cdiff.BDF` by its own; cdiff's RK4 loop where it
    applies (see `_own_loop_steps`); else `diffrax.diffeqsolve`. For a model with
    `unilateral` rows (`check_unilateral` has checked the solve), cdiff's RK4 loop
    with events where it applies (also for `Projected(RK4())`, without save
    times), else segments of `diffrax.diffeqsolve` between events (at most
    `max_events`, default 256; refused on the RK4 loop, which has no such cap;
    `friction`, refused there too)."""
    if unilateral:
        sub = plain_saveat(saveat)
        save = (bool(sub.t0), bool(sub.t1), bool(sub.steps))
        if declares(solver, "integrates_dae"):
            if progress:
                raise ValueError("cdiff.simulate: progress=True is not supported "
                                 "with cdiff.BDF")
            return EventDiffraxRoute(solver, None, save, sub.ts, max_steps, throw,
                                     max_events=max_events)
        projected = declares(solver, "projects_steps")
        steps = _own_loop_steps(solver.solver if projected else solver,
                                stepsize_controller, saveat, adjoint, max_steps, times)
        if steps is not None and sub.ts is None:
            if friction:
                raise ValueError(
                    "cdiff.simulate: friction is simulated in segments between "
                    "events (a diffrax solver, e.g. diffrax.Tsit5() with a "
                    "diffrax.PIDController); cdiff's RK4 loop does not take it yet.")
            if max_events is not None:
                raise ValueError(
                    "cdiff.simulate: max_events caps the events of a solve in "
                    "segments (a diffrax solver, an adaptive step, save times or "
                    "cdiff.BDF); this solve runs on cdiff's RK4 loop, which takes "
                    "any number of events (at most 64 sub-steps in a step). Leave "
                    "max_events out.")
            return EventRK4Route(steps, save, max_steps, throw,
                                 solver.projection if projected else None, progress,
                                 isinstance(adjoint, diffrax.ForwardMode))
        if isinstance(adjoint, diffrax.ForwardMode):
            raise ValueError(
                "cdiff.simulate: forward-mode differentiation (adjoint="
                "diffrax.ForwardMode()) of a model with unilateral rows needs cdiff's "
                "own RK4 loop: solver cdiff.RK4() or cdiff.Projected(cdiff.RK4(), ...), "
                "a constant dt known before tracing and a SaveAt of t0, t1 and/or "
                "steps. Reverse mode (the default adjoint; jax.grad, jax.jacrev) "
                "works on every route.")
        return EventDiffraxRoute(solver, stepsize_controller, save, sub.ts, max_steps,
                                 throw, reschedule=getattr(innermost(solver),
                                                           "fast_paths", True),
                                 progress=progress, max_events=max_events)
    if declares(solver, "integrates_dae"):
        return _bdf_route(solver, saveat, adjoint, progress, max_steps, throw=throw)
    return _ode_route(solver, stepsize_controller, saveat, adjoint, progress,
                      max_steps, throw, times)
