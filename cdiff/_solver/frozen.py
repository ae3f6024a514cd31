"""A solver wrapper that evaluates a formulation's per-step quantities once per step."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp

from .._formulation.base import AbstractFormulation
from .._xla import compute_once
from .base import AbstractForwardingSolver


def all_finite(tree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _overrides(formulation, method: str) -> bool:
    return getattr(type(formulation), method) is not getattr(
        AbstractFormulation, method
    )


class FrozenStep(AbstractForwardingSolver):
    """Wraps a diffrax solver so that every step of `formulation` sees the
    quantities `formulation.freeze(t0, t1, y0, context)` computed once at the step
    start (DESIGN: the Braun-Goldfarb $\\Delta$ terms must not be re-evaluated per
    stage). diffrax has no hook for this, so, as for post-step projection, it is a
    wrapper whose `step` calls the inner solver.

    The diffeqsolve-level `args` is `(context, frozen0)`, with `frozen0` a
    zero-correction placeholder of the right structure; every step replaces it with
    `formulation.freeze(...)` before calling the inner solver. Because the vector field changes from one step
    to the next, a first-same-as-last stage cached by the inner solver would be
    stale, so the inner solver is always told `made_jump=True` when there is
    frozen data or the formulation maps the state after each step (`end_step`).
    A non-finite state ends the solve with `RESULTS.nonfinite`.
    """

    solver: diffrax.AbstractSolver
    formulation: AbstractFormulation

    def _args(self, t0, t1, y0, args):
        context, _ = args
        return context, compute_once(self.formulation.freeze)(t0, t1, y0, context)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, self._args(t0, t1, y0, args))

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        inner_args = self._args(t0, t1, y0, args)
        if inner_args[1] is not None or _overrides(self.formulation, "end_step"):
            made_jump = True
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, inner_args, solver_state, made_jump
        )
        y1 = self.formulation.end_step(t1, y1, inner_args[0])
        result = diffrax.RESULTS.where(
            all_finite(y1), result, diffrax.RESULTS.nonfinite
        )
        return y1, y_error, dense_info, solver_state, result
