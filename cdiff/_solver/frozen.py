"""A formulation as a diffrax problem: its vector field, a solver wrapper that
evaluates its per-step quantities once per step, and the route of
[`cdiff.simulate`][] through `diffrax.diffeqsolve`."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from diffrax._root_finder import use_stepsize_tol

from .._formulation.base import AbstractFormulation
from .._problem import Problem, frozen_placeholder
from .._solution import Trajectory
from .._reschedule import compute_once
from .base import AbstractForwardingSolver, innermost, replace_innermost


def all_finite(tree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


class FormulationField(eqx.Module):
    """A formulation's vector field as diffrax calls it: `args` is
    `(context, frozen)`, the solve's context and the step's per-step data."""

    formulation: AbstractFormulation
    reschedule: bool = eqx.field(static=True, default=True)

    def __call__(self, t, y, args):
        context, frozen = args
        fn = self.formulation.vector_field
        return (compute_once(fn) if self.reschedule else fn)(t, y, context, frozen)


class FrozenStep(AbstractForwardingSolver):
    """Wraps a diffrax solver so that every step of `formulation` sees the
    quantities `formulation.freeze(t0, t1, y0, context)` computed once at the step
    start (the Braun-Goldfarb $\\Delta$ terms are those of the step start, not of
    each stage). diffrax has no hook for this, so, as for post-step projection, it
    is a wrapper whose `step` calls the inner solver.

    The diffeqsolve-level `args` is `(context, frozen0)`, with `frozen0` a
    zero-correction placeholder of the right structure; every step replaces it with
    `formulation.freeze(...)` before calling the inner solver. Because the vector
    field changes from one step to the next, a first-same-as-last stage cached by
    the inner solver would be stale, so the inner solver is always told
    `made_jump=True` when there is frozen data or the formulation is `stepwise`.
    A non-finite state ends the solve with `RESULTS.nonfinite`.
    """

    solver: diffrax.AbstractSolver
    formulation: AbstractFormulation
    reschedule: bool = eqx.field(static=True, default=True)

    def _args(self, t0, t1, y0, args):
        context, _ = args
        fn = self.formulation.freeze
        return context, (compute_once(fn) if self.reschedule else fn)(t0, t1, y0,
                                                                      context)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, self._args(t0, t1, y0, args))

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner_args = self._args(t0, t1, y0, args)
        if inner_args[1] is not None or self.formulation.stepwise:
            made_jump = True
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, inner_args, solver_state, made_jump
        )
        y1 = self.formulation.end_step(t1, y1, inner_args[0])
        result = diffrax.RESULTS.where(
            all_finite(y1), result, diffrax.RESULTS.nonfinite
        )
        return y1, y_error, dense_info, solver_state, result


def diffrax_problem(problem: Problem, solver: diffrax.AbstractSolver, dt):
    """`(terms, solver, args)` of `problem` for diffrax: the formulation's field,
    `solver` wrapped in [`FrozenStep`][], and `(context, frozen placeholder)`
    (the per-step data's structure, for a first step of about `dt`)."""
    return (diffrax.ODETerm(FormulationField(problem.formulation,
                                             problem.reschedule)),
            FrozenStep(solver, problem.formulation, problem.reschedule),
            (problem.context, frozen_placeholder(problem, dt)))


def stepsize_tolerances(solver: diffrax.AbstractSolver, stepsize_controller):
    """`solver` with the root finder of the implicit solver at its bottom given the
    adaptive controller's `rtol`, `atol` and `norm` where it asks for them
    (`diffrax.Kvaerno5()`'s default), as `diffrax.diffeqsolve` does itself. diffrax
    sees an implicit solver through one wrapper only, and [`FrozenStep`][] around
    [`cdiff.Projected`][] is two: without this, `Projected(Kvaerno5(), ...)` under
    a `PIDController` failed inside the root finder."""
    inner = innermost(solver)
    if not (isinstance(inner, diffrax.AbstractImplicitSolver) and isinstance(
            stepsize_controller, diffrax.AbstractAdaptiveStepSizeController)):
        return solver
    names = [name for name in ("rtol", "atol", "norm")
             if getattr(inner.root_finder, name) is use_stepsize_tol]
    if not names:
        return solver
    inner = eqx.tree_at(
        lambda s: tuple(getattr(s.root_finder, name) for name in names), inner,
        tuple(getattr(stepsize_controller, name) for name in names))
    return replace_innermost(solver, inner)


def diffrax_route(problem: Problem, solver: diffrax.AbstractSolver, *, dt0, dt,
                  stepsize_controller, saveat, adjoint, max_steps: int, throw: bool,
                  progress: bool) -> Trajectory:
    """Integrate `problem` by `diffrax.diffeqsolve` (any diffrax solver, step size
    controller, `saveat` and adjoint): the route of [`cdiff.simulate`][] for
    everything cdiff's own loops do not cover."""
    solver = stepsize_tolerances(solver, stepsize_controller)
    terms, solver, args = diffrax_problem(problem, solver, dt)
    sol = diffrax.diffeqsolve(
        terms, solver, problem.t0, problem.t1, dt0, problem.y0, args=args,
        saveat=saveat, stepsize_controller=stepsize_controller, adjoint=adjoint,
        max_steps=max_steps, throw=throw,
        progress_meter=(diffrax.TqdmProgressMeter() if progress
                        else diffrax.NoProgressMeter()),
    )
    return Trajectory(sol.ts, sol.ys, sol.result, sol.stats)
