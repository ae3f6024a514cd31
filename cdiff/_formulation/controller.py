"""Controllers with state, and how `simulate` integrates their state (see the
docstring of `cdiff.control`)."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from .base import AbstractFormulation, Context, Dynamics
from .._kinematics import kinematics
from .._model import AbstractModel, input_matrix
from .._results import error_if


class AbstractStatefulController(eqx.Module):
    r"""A controller with state: $u$ = `input(t, q, v, z, measurement)`,
    $\dot z$ = `state_rate(t, q, v, z, measurement)`, $z(t_0)$ =
    `init_state(t0, q0, v0)`.

    Pass it to [`cdiff.simulate`][] as `control=`: the state $z$ (a pytree of
    arrays) is integrated with the mechanical state by the same solver, saved in
    `Solution.controller_state` (one row per saved time, like `Solution.state`),
    batched by `jax.vmap` and differentiated like everything else (the
    docstring of `cdiff.control`, top of this page, says how). The input enters as $E(t, q)u$ (`model.input_matrix`), as for a controller without
    state. `q`, `v` are the plant's coordinates and velocities (for
    [`cdiff.NullSpace`][], $v = S\nu + \eta$).

    **Declarations** (class attributes):

    - `measures`: `True` when the controller reads the plant's multipliers: then
      `measurement` is $\lambda$, shape `(k,)` (one per row of $A_v$, cdiff's sign
      convention, as `Solution.multipliers`), obtained by solving the algebraic
      loop they form with the input (docstring of `cdiff.control`); otherwise
      `measurement` is `None`. Default `False`.
    - `measurement_iterations`: the number of Newton steps of that loop (default
      1: exact for an input affine in the measurement; a nonlinear law needs
      more, and a residual above the tolerance stops the solve).

    **Works with** every ODE formulation (including [`cdiff.NullSpace`][]), every
    diffrax solver and step-size controller, [`cdiff.Projected`][], and
    [`cdiff.BDF`][] with an ODE formulation. A DAE formulation ([`cdiff.GGL`][],
    [`cdiff.IndexOne`][]) is refused before tracing: integrate an ODE formulation
    (e.g. [`cdiff.Lagrange`][]) with `cdiff.BDF` instead.

    **Checked before tracing** (`ValueError`): `state_rate` must return the
    structure, shapes and dtypes of `init_state`, and `input` the shape of the
    plant's inputs.
    """

    measures: ClassVar[bool] = False
    measurement_iterations: ClassVar[int] = 1

    @abc.abstractmethod
    def init_state(self, t0, q0, v0) -> PyTree:
        """The controller's state $z(t_0)$ at the initial state `(t0, q0, v0)`."""

    @abc.abstractmethod
    def input(self, t, q, v, state, measurement) -> Float[Array, " nu"]:
        """The input $u$ at the plant's state `(t, q, v)`, the controller's `state`
        $z$ and the `measurement` (the multipliers, or `None`)."""

    @abc.abstractmethod
    def state_rate(self, t, q, v, state, measurement) -> PyTree:
        r"""$\dot z$, with the structure of `state`."""


class _Bound(eqx.Module):
    """A stateful controller at one controller state and measurement, called as
    the formulations call every controller: `u = control(t, q, v)`."""

    controller: AbstractStatefulController
    state: Any
    measurement: Any

    def __call__(self, t, q, v):
        return self.controller.input(t, q, v, self.state, self.measurement)


def _measurement_tol(dtype) -> float:
    """Relative tolerance of the algebraic loop's residual."""
    return 1e-8 if jnp.finfo(dtype).bits >= 64 else 1e-3


class ControllerState(AbstractFormulation):
    """The formulation `formulation` with a stateful controller's state appended:
    the state is `(y, z)`, `y` the formulation's own. Its dynamics call the
    wrapped formulation's with `context.control` bound to `(z, measurement)` (the
    measurement solved from the algebraic loop when the controller measures) and
    return `(rate of y, state_rate)`; the rest delegates to the wrapped
    formulation on `y`. Built by `Problem.build` for a stateful controller."""

    formulation: AbstractFormulation

    @property
    def stepwise(self) -> bool:  # pyright: ignore
        return self.formulation.stepwise

    @property
    def corrects_energy(self) -> bool:
        return self.formulation.corrects_energy

    def _plant(self, t, y, z, context: Context, frozen):
        """The wrapped formulation's dynamics as a function of the measurement."""

        def plant(measurement):
            bound = dataclasses.replace(
                context, control=_Bound(context.control, z, measurement))
            return self.formulation.dynamics(t, y, bound, frozen)

        return plant

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        y_inner, z = y
        control = context.control
        q, v = self.formulation.coordinates(t, y_inner, context)
        plant = self._plant(t, y_inner, z, context, frozen)
        if control.measures:
            measurement, dyn = _close_loop(plant, control, context.model, t, q, v,
                                           throw=context.throw)
        else:
            measurement, dyn = None, plant(None)
        rate = control.state_rate(t, q, v, z, measurement)
        return Dynamics((dyn.rate, rate), dyn.force, dyn.multipliers)

    def freeze(self, t0, t1, y0, context: Context):
        return self.formulation.freeze(t0, t1, y0[0], context)

    def prepare(self, model: AbstractModel, t0, q0, v0):
        return self.formulation.prepare(model, t0, q0, v0)

    def init_state(self, t0, q0, v0, context: Context):
        return (self.formulation.init_state(t0, q0, v0, context),
                context.control.init_state(t0, q0, v0))

    def coordinates(self, t, y, context: Context):
        return self.formulation.coordinates(t, y[0], context)

    def project(self, t, y, context: Context, projection):
        return self.formulation.project(t, y[0], context, projection), y[1]

    def end_step(self, t, y, context: Context):
        return self.formulation.end_step(t, y[0], context), y[1]


def _close_loop(plant, control: AbstractStatefulController, model, t, q, v, *,
                throw: bool):
    r"""The measurement $\lambda_m$ with $\lambda_m$ = `plant(lambda_m).multipliers`
    (Newton, `control.measurement_iterations` steps from zero, exact Jacobian) and
    the dynamics there, with the run-time check of the residual."""
    k = jax.eval_shape(lambda: kinematics(model, t, q, v).b_v).shape[0]
    lam = jnp.zeros((k,), q.dtype)
    if k == 0:
        return lam, plant(lam)
    eye = jnp.eye(k, dtype=q.dtype)
    scale = jnp.zeros((), q.dtype)
    for _ in range(control.measurement_iterations):
        g, linear = jax.linearize(lambda m: plant(m).multipliers, lam)
        jac = jax.vmap(linear)(eye).T  # d lambda / d lambda_m, (k, k)
        lam = lam + jnp.linalg.solve(eye - jac, g - lam)
        scale = jnp.maximum(scale, jnp.max(jnp.abs(g)))
    dyn = plant(lam)
    residual = jnp.max(jnp.abs(dyn.multipliers - lam))
    scale = jnp.maximum(scale, jnp.max(jnp.abs(lam)))
    bad = ~(residual <= _measurement_tol(q.dtype) * scale)
    name = type(control).__name__
    lam, dyn = error_if(
        (lam, dyn), bad,
        f"cdiff: the algebraic loop of {name} (its input reads the multipliers it "
        "changes) was not closed at a state reached by the solver: I - "
        "d lambda / d lambda_m is singular there (the loop is ill posed), or the law "
        f"is nonlinear in the measurement and {control.measurement_iterations} "
        "Newton step(s) (measurement_iterations) did not converge.",
        throw=throw,
    )
    return lam, dyn


def check_controller(control: AbstractStatefulController, model: AbstractModel,
                     t0, q0, v0) -> None:
    """Refuse, before tracing (`jax.eval_shape`: nothing is computed), a stateful
    controller whose `state_rate` does not match its `init_state`, or whose input
    does not fit the plant's input matrix. The controllers' own shape checks
    (e.g. a controller model of another size than the plant) raise here too."""
    name = type(control).__name__
    t0 = jnp.asarray(t0, q0.dtype)
    state = jax.eval_shape(control.init_state, t0, q0, v0)
    k = jax.eval_shape(lambda: kinematics(model, t0, q0, v0).b_v).shape[0]
    measurement = jax.ShapeDtypeStruct((k,), q0.dtype) if control.measures else None
    rate = jax.eval_shape(control.state_rate, t0, q0, v0, state, measurement)

    def describe(tree):
        return jax.tree.map(lambda x: f"{x.dtype}{list(x.shape)}", tree)

    same = jax.tree.structure(rate) == jax.tree.structure(state) and all(
        (a.shape, a.dtype) == (b.shape, b.dtype)
        for a, b in zip(jax.tree.leaves(rate), jax.tree.leaves(state)))
    if not same:
        raise ValueError(
            f"cdiff.simulate: {name}.state_rate returns {describe(rate)}, but its "
            f"state (init_state) is {describe(state)}: the rate must have the "
            "state's structure, shapes and dtypes."
        )
    u = jax.eval_shape(control.input, t0, q0, v0, state, measurement)
    nu = jax.eval_shape(input_matrix, model, t0, q0).shape[1]
    if getattr(u, "shape", None) != (nu,):
        raise ValueError(
            f"cdiff.simulate: {name}.input returns shape "
            f"{getattr(u, 'shape', type(u).__name__)}; "
            f"{type(model).__name__} takes {nu} inputs (model.input_matrix)."
        )
