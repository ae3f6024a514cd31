"""One solve, set up once: what every integration route receives."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from ._formulation.base import AbstractFormulation, Context
from ._formulation.frictional import Frictional
from ._kinematics import ImpactTerms
from ._results import error_if
from ._solution import Solution, Trajectory, build_solution
from ._reschedule import compute_once
from ._formulation.controller import (
    AbstractStatefulController,
    ControllerState,
)


class Problem(eqx.Module):
    """A formulation bound to one solve (inside `jit`): the checked times and
    initial state, the solve's [`Context`][] (model, controller, initial energy,
    the formulation's prepared constants) and the formulation's initial state
    `y0`. Routes integrate `rate` (with the per-step data of `freeze` and the map
    `end_step`) from `y0` and hand their [`Trajectory`][] to `solution`.

    With a stateful controller (`controlled`), `formulation` is the user's
    formulation wrapped in `ControllerState`: its state is `(y, z)`, `z` the
    controller's, and every route integrates both.

    Build it with `Problem.build`, never directly: that is where the run-time
    checks of the arguments live.
    """

    formulation: AbstractFormulation
    context: Context
    t0: Float[Array, ""]
    t1: Float[Array, ""]
    dt: Float[Array, ""]
    q0: Float[Array, " nq"]
    v0: Float[Array, " nv"]
    y0: PyTree
    controlled: bool = eqx.field(static=True, default=False)
    #: The formulation's functions through `compute_once` (see `cdiff.RK4`).
    reschedule: bool = eqx.field(static=True, default=True)

    @classmethod
    def build(cls, model, formulation: AbstractFormulation, control, q0, v0, t0, t1,
              dt, *, checked: bool = False, reschedule: bool = True,
              throw: bool = True) -> Problem:
        """Check the times and the initial state at run time (`eqx.error_if`: the
        values may be traced; NaN, so a result code, without `throw`; not at all
        when `checked`, their values checked before tracing) and set
        the solve up: the initial energy, the formulation's
        `prepare` and `init_state` (of the formulation wrapped in
        `ControllerState` for a stateful controller). `throw`: whether the
        run-time checks of the model raise ([`cdiff.Context`][])."""
        if not checked:
            dt = error_if(dt, ~((dt > 0) & jnp.isfinite(dt)),
                          "cdiff.simulate: dt must be positive and finite", throw=throw)
            t1 = error_if(t1, ~(t1 > t0), "cdiff.simulate: t1 must be greater than t0",
                          throw=throw)
            q0 = error_if(
                q0,
                ~(jnp.all(jnp.isfinite(q0)) & jnp.all(jnp.isfinite(v0))),
                "cdiff.simulate: the initial state (q0, v0) is not finite",
                throw=throw,
            )
        e0 = model.energy(t0, q0, v0)
        e0 = jnp.asarray(jnp.nan if e0 is None else e0, q0.dtype)
        if getattr(model, "stuck", None) is not None:  # (a WithUnilateral's friction)
            formulation = Frictional(formulation)
        controlled = isinstance(control, AbstractStatefulController)
        if controlled:
            formulation = ControllerState(formulation)
        aux = formulation.prepare(model, t0, q0, v0)
        context = Context(model, control, e0, aux, formulation, throw)
        y0 = formulation.init_state(t0, q0, v0, context)
        return cls(formulation, context, t0, t1, dt, q0, v0, y0, controlled,
                   reschedule)

    def _fast(self, fn):
        return compute_once(fn) if self.reschedule else fn

    def rate(self, t, y, frozen) -> PyTree:
        """The formulation's vector field with the per-step data `frozen`."""
        return self._fast(self.formulation.vector_field)(t, y, self.context, frozen)

    def freeze(self, t0, t1, y) -> PyTree:
        """The per-step data of a step from `(t0, y)` to `t1`."""
        return self._fast(self.formulation.freeze)(t0, t1, y, self.context)

    @property
    def freezes_at_first_stage(self) -> bool:
        """Whether a one-step solver takes the per-step data from the first
        stage's evaluation (`rate_and_freeze`) instead of calling `freeze`: when
        the formulation reads only the model's terms to freeze, and the model
        computes its terms in one evaluation of its own (its `terms` returns
        [`cdiff.Terms`][] that declare `one_pass`, as a loaded MuJoCo model's do),
        so that the freeze's evaluation would repeat the first stage's. (Terms
        are computed when read: making them here computes nothing.)"""
        if not self.formulation.freezes_from_terms:
            return False
        terms = self.context.model.terms(self.t0, self.q0, self.v0)
        # (The held rows' terms wrap the model's own: theirs decide.)
        return getattr(terms, "base", terms).one_pass

    def rate_and_freeze(self, t, y, frozen, dt, first) -> tuple[PyTree, PyTree]:
        """The vector field at a stage and the per-step data it used: those of a
        step of size `dt` from `(t, y)` where `first`, else `frozen`."""
        return self._fast(self.formulation.vector_field_and_freeze)(
            t, y, self.context, frozen, dt, first)

    def dynamics(self, t, y, dt):
        """The formulation's `Dynamics` at `(t, y)` with the per-step data of a
        step of size `dt` from there (one evaluation of the model's terms where
        the formulation freezes from them)."""
        return self.dynamics_and_freeze(t, y, None, dt, True)[0]

    def dynamics_with(self, t, y, frozen):
        """The formulation's `Dynamics` with the per-step data `frozen` (as
        `rate`, the whole of it)."""
        return self._fast(self.formulation.dynamics)(t, y, self.context, frozen)

    def dynamics_and_freeze(self, t, y, frozen, dt, first):
        """As `rate_and_freeze`, the formulation's whole `Dynamics`."""
        return self._fast(self.formulation.dynamics_and_freeze)(
            t, y, self.context, frozen, dt, first)

    def dynamics_and_terms(self, t, y, frozen, dt, first):
        """As `dynamics_and_freeze`, with what an impact at `(t, y)` reads of the
        model's terms (`ImpactTerms`, of the model inside the held rows'
        `WithUnilateral`), from the one evaluation of the terms that the
        dynamics read: `(dyn, frozen, terms)`. For a formulation that
        `freezes_from_terms`."""
        return self._fast(_dynamics_and_terms)(self.formulation, t, y, self.context,
                                               frozen, dt, first)

    def end_step(self, t, y) -> PyTree:
        """The formulation's map of the state at the end of a step."""
        return self.formulation.end_step(t, y, self.context)

    def coordinates(self, t, y):
        """`(q, v)` of the formulation's state `y`."""
        return self.formulation.coordinates(t, y, self.context)

    def restart(self, t, q, v) -> PyTree:
        """The formulation's state at `(q, v)` after an event (see
        `AbstractFormulation.restart`)."""
        return self.formulation.restart(t, q, v, self.context)

    def solution(self, trajectory: Trajectory, *, dt, dt_taken, throw: bool,
                 divergence) -> Solution:
        """The [`Solution`][] of a route's `trajectory` (see `build_solution`)."""
        return build_solution(self.formulation, self.context, trajectory,
                              (self.q0, self.v0), dt=dt, dt_taken=dt_taken,
                              throw=throw, divergence=divergence,
                              controller_state=self.controlled)


def _dynamics_and_terms(formulation: AbstractFormulation, t, y, context: Context,
                        frozen, dt, first):
    q, v = formulation.coordinates(t, y, context)
    terms = context.model.terms(t, q, v)
    dyn, frozen = formulation.dynamics_and_freeze(t, y, context, frozen, dt, first,
                                                  terms=terms)
    base = getattr(terms, "base", terms)  # (the held rows' terms wrap the model's)
    return dyn, frozen, ImpactTerms(base.mass_matrix, base.velocity_constraints)


def frozen_placeholder(problem: Problem, dt) -> Any:
    """A zero value with the structure of the per-step data (for solvers that need
    the structure before the first step)."""
    frozen = problem.formulation.freeze(problem.t0, problem.t0 + dt, problem.y0,
                                        problem.context)
    return jax.tree.map(jnp.zeros_like, frozen)
