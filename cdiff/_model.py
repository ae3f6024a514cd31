"""The model API: what a user writes to describe a constrained mechanical system."""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._kinematics import Terms


class AbstractModel(eqx.Module):
    r"""A mechanical system $M(t, q)\,\dot v = Q(t, q, v) + E(t, q)\,u + Q_c$ with
    $\dot q = T(q)\,v$.

    Subclass it, declare the physical parameters as fields and implement
    [`cdiff.AbstractModel.mass_matrix`][] (and usually `forces` and `holonomic`).
    Constraints are written as residuals that vanish on the constraint manifold;
    their Jacobians and time derivatives come from JAX autodiff, so a model never
    writes a Jacobian by hand.

    Because a model is an `equinox.Module`, its fields are pytree leaves:
    `jax.vmap` sweeps them and `jax.grad` / `eqx.filter_grad` differentiates
    with respect to them.

    **Methods to implement:**

    - `mass_matrix(t, q)`: symmetric positive definite, shape `(nv, nv)`.
    - `forces(t, q, v)`: generalized applied and velocity-dependent forces $Q$
      (gravity, springs, Coriolis/centrifugal terms), shape `(nv,)`. Default: zero.
    - `holonomic(t, q)`: holonomic residuals $\Phi_q$, shape `(m,)`. Default: none.
    - `nonholonomic(t, q, v)`: nonholonomic residuals $\Phi_v$, shape `(p,)`; any
      smooth function of `v`, Pfaffian or not. Default: none.
    - `energy(t, q, v)`: the total mechanical energy, a scalar. Optional (default
      `None`: no energy); needed for the energy correction of
      [`cdiff.UdwadiaKalaba`][] and for energy diagnostics.
    - `input_matrix(t, q)`: $E$, shape `(nv, nu)`, mapping control inputs to
      generalized forces. Default `None`: $E = I$, the input is a generalized force.
    - `unilateral(t, q)`: one-sided constraints $g(t, q) \ge 0$ (joint limits,
      stops, a point above a plane), shape `(r,)`. Default: none. A row that
      reaches zero is hit (an impact with the model's `restitution`), then holds
      as an equality while its force pushes and is released when it would pull
      (see [`cdiff.impact`][]).
    - `slip(t, q, v)`: the tangential relative velocity at each unilateral row's
      contact, shape `(r, d)` with `d = 1` (planar) or `d = 2` (spatial), linear in
      `v` (its Jacobian comes by autodiff). Needed where `friction` is not zero.
      Default: none.

    **Declarations:**

    - `restitution`: Newton's coefficient of restitution $e \in [0, 1]$ of the
      unilateral rows' impacts, a scalar or one per row (default 0: plastic). A
      model may declare it as a field, so that `jax.vmap` and `jax.grad` reach it.
    - `friction`: Coulomb's coefficient $\mu \ge 0$ of the unilateral rows, a
      scalar or one per row (default 0: frictionless). Where it is not zero, a
      held row sticks (its `slip` held at zero while the force that needs stays
      inside the cone $\|\lambda_T\| \le \mu\lambda_N$) or slips (the force
      $\mu\lambda_N$ against the slip), see the docs' "Contact and friction"
      page. A field, like `restitution`, for `vmap` and `grad`.

    - `conservative`: whether `energy` is conserved by the model's own forces
      (default `True`). A model whose applied forces do work or dissipate sets
      `conservative = False` (a class attribute or property); energy correction is
      then refused, and diagnostics report an energy *change*, not an error.

    **Coordinates and velocities.** Usually $v = \dot q$ and `nv = nq`. A model whose
    coordinates include unit quaternions (MuJoCo's ball and free joints) has
    `nv < nq` velocities (angular velocities) and overrides the kinematic map
    `position_rate(t, q, v)` $= T(q)v$ and its exact integral
    `integrate_position(q, dv)`; everything velocity-level (mass matrix, forces,
    constraint Jacobians, multipliers) then lives in the `nv` velocity coordinates.
    The defaults ($T = I$) cost nothing.

    **Terms at one state.** Formulations read the mass matrix, forces, constraint
    Jacobians and their velocity-product terms, and the energy law at a state from
    one [`cdiff.Terms`][] that `terms(t, q, v)` returns. The default derives the
    constraint terms by autodiff; a model whose computation yields them more
    cheaply in one pass (bias accelerations of a rigid-body library) overrides
    `terms` with a subclass of [`cdiff.Terms`][], as
    [`cdiff.models.MuJoCoModel`][] does.
    """

    @abc.abstractmethod
    def mass_matrix(self, t, q):
        """The mass matrix $M(t, q)$, shape `(nq, nq)`."""

    def forces(self, t, q, v):
        """Generalized forces $Q(t, q, v)$, shape `(nv,)`. Default: zero."""
        del t, q
        return jnp.zeros_like(v)

    def holonomic(self, t, q):
        r"""Holonomic residuals $\Phi_q(t, q)$, shape `(m,)`. Default: none."""
        del t
        return jnp.zeros((0,), dtype=q.dtype)

    def nonholonomic(self, t, q, v):
        r"""Nonholonomic residuals $\Phi_v(t, q, v)$, shape `(p,)`. Default: none."""
        del t, v
        return jnp.zeros((0,), dtype=q.dtype)

    def unilateral(self, t, q):
        r"""One-sided constraints $g(t, q) \ge 0$, shape `(r,)`. Default: none."""
        del t
        return jnp.zeros((0,), dtype=q.dtype)

    @property
    def restitution(self):
        """Newton's coefficient of restitution of the unilateral rows' impacts, a
        scalar or one per row (see the class docstring). Default: 0 (plastic)."""
        return 0.0

    @property
    def friction(self):
        """Coulomb's coefficient of friction of the unilateral rows, a scalar or
        one per row (see the class docstring). Default: 0 (frictionless)."""
        return 0.0

    def slip(self, t, q, v):
        """The tangential relative velocity at each unilateral row's contact,
        shape `(r, d)`, linear in `v`, or `None` (the default): no tangential
        direction (a model with `friction` must define it)."""
        del t, q, v
        return None

    @property
    def conservative(self) -> bool:
        """Whether the model's own forces conserve `energy` (see the class
        docstring). Default: `True`."""
        return True

    def energy(self, t, q, v):
        """Total mechanical energy (a scalar), or `None` (the default) when the model
        defines none."""
        del t, q, v
        return None

    def input_matrix(self, t, q):
        """Input matrix $E(t, q)$, shape `(nv, nu)`, or `None` (the default) for
        $E = I$: the input is a generalized force of shape `(nv,)`."""
        del t, q
        return None

    def terms(self, t, q, v=None) -> Terms:
        """The terms of the equations of motion at `(t, q, v)`, computed when read
        (see [`cdiff.Terms`][]). Default: the model's methods, constraint
        derivatives by autodiff. `v` may be `None` for position-level terms."""
        return Terms(self, t, q, v)

    def position_rate(self, t, q, v):
        r"""The coordinate rate $\dot q = T(q)\,v$, shape `(nq,)`, linear in `v`.
        Default: `v` ($T = I$).

        Override it together with `integrate_position` when the coordinates are not
        the integrals of the velocities (quaternions: $\dot q = \tfrac12 q\otimes
        (0, \omega)$)."""
        del t, q
        return v

    def integrate_position(self, q, dv):
        r"""The configuration reached from `q` by the velocity-space displacement
        `dv` (shape `(nv,)`) in unit time: the exact flow of $\dot q = T(q)\,dv$
        (for quaternions the exponential map, as MuJoCo's `mj_integratePos`). Used
        by the position projections. Default: `q + dv`."""
        return q + dv


def has_energy(model: AbstractModel, t, q, v) -> bool:
    """Whether `model.energy` returns an energy (not `None`) at states shaped like
    `(t, q, v)` (by `jax.eval_shape`: nothing is computed)."""
    return jax.eval_shape(model.energy, t, q, v) is not None


def apply_input(model: AbstractModel, t, q, u):
    r"""The generalized force $E(t, q)\,u$ of the input `u` (`u` itself when the
    model's `input_matrix` is `None`, $E = I$)."""
    E = model.input_matrix(t, q)
    u = jnp.asarray(u, q.dtype)
    return u if E is None else jnp.asarray(E, q.dtype) @ u


def input_matrix(model: AbstractModel, t, q):
    """The input matrix $E(t, q)$ as an array: the identity of size `nv` when the
    model's `input_matrix` is `None`."""
    E = model.input_matrix(t, q)
    if E is None:
        nv = jax.eval_shape(model.mass_matrix, t, q).shape[0]
        return jnp.eye(nv, dtype=q.dtype)
    return jnp.asarray(E, q.dtype)


def _shape_str(x) -> str:
    return str(tuple(x.shape)) if hasattr(x, "shape") else repr(type(x).__name__)


def check_model(model: AbstractModel, t0, q0, v0) -> tuple[int, int, int]:
    """Check the model's methods and the initial state before tracing.

    Shapes are checked with `jax.eval_shape`, so nothing is computed. Values are
    checked only where they are concrete (outside `jit`/`vmap`/`grad`); inside a
    transformation the solver's run-time checks take over.

    **Returns:** `(nq, m, p)`: the numbers of coordinates, holonomic and
    nonholonomic constraints.

    **Raises:** `ValueError` naming the offending method and the shapes it returned.
    """
    name = type(model).__name__
    if not isinstance(model, AbstractModel):
        raise TypeError(f"expected a cdiff.AbstractModel, got {type(model).__name__}")
    q0 = jnp.asarray(q0)
    v0 = jnp.asarray(v0)
    if q0.ndim != 1:
        raise ValueError(f"q0 must be 1-D, got shape {_shape_str(q0)}")
    if v0.ndim != 1:
        raise ValueError(
            f"v0 must be 1-D (q0 has shape {_shape_str(q0)}), got shape "
            f"{_shape_str(v0)}"
        )
    if not jnp.issubdtype(q0.dtype, jnp.floating):
        raise ValueError(f"q0 must be a floating-point array, got dtype {q0.dtype}")
    nq = q0.shape[0]
    t0 = jnp.asarray(t0, dtype=q0.dtype)

    def shape_of(method: str, *args: Any):
        try:
            return jax.eval_shape(getattr(model, method), *args)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with context
            raise ValueError(
                f"{name}.{method} failed on q0 of shape {_shape_str(q0)} and v0 of "
                f"shape {_shape_str(v0)}: {e}"
            ) from e

    M = shape_of("mass_matrix", t0, q0)
    if len(M.shape) != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(
            f"{name}.mass_matrix(t, q) returned shape {M.shape}; expected a square "
            f"(nv, nv) matrix, ({nq}, {nq}) for q0 of shape {_shape_str(q0)} and "
            "v = dq/dt"
        )
    nv = M.shape[0]
    if v0.shape != (nv,) and v0.shape == q0.shape:
        raise ValueError(
            f"{name}.mass_matrix(t, q) returned shape {M.shape}; expected ({nq}, {nq}) "
            f"for q0 and v0 of shape {_shape_str(q0)} (or v0 must have shape ({nv},), "
            "for a model whose velocities are not dq/dt, such as quaternions)"
        )
    if v0.shape != (nv,):
        raise ValueError(
            f"v0 must have shape ({nv},) to match {name}.mass_matrix(t, q), which "
            f"returned shape {M.shape} for q0 of shape {_shape_str(q0)}; got v0 of "
            f"shape {_shape_str(v0)}"
        )
    qdot = shape_of("position_rate", t0, q0, v0)
    default_rate = type(model).position_rate is AbstractModel.position_rate
    if qdot.shape != (nq,) and default_rate:
        raise ValueError(
            f"q0 has shape {_shape_str(q0)}, but {name} has nv = {nv} velocities "
            f"({name}.mass_matrix(t, q) is {nv} x {nv}) and q' = v "
            f"(position_rate is not overridden), so q0 must have shape ({nv},). "
            "(A model whose coordinates are not its velocities, such as one with "
            "quaternions, overrides position_rate and integrate_position.)"
        )
    if qdot.shape != (nq,):
        raise ValueError(
            f"{name}.position_rate(t, q, v) returned shape {qdot.shape}; expected "
            f"({nq},), the shape of q0 (a model with nv = {nv} velocities and "
            f"{nq} coordinates must override position_rate and integrate_position)"
        )
    Q = shape_of("forces", t0, q0, v0)
    if Q.shape != (nv,):
        raise ValueError(
            f"{name}.forces(t, q, v) returned shape {Q.shape}; expected ({nv},)"
        )
    hol = shape_of("holonomic", t0, q0)
    if hol.ndim != 1:
        raise ValueError(
            f"{name}.holonomic(t, q) must return a 1-D array of residuals, got shape "
            f"{hol.shape}"
        )
    non = shape_of("nonholonomic", t0, q0, v0)
    if non.ndim != 1:
        raise ValueError(
            f"{name}.nonholonomic(t, q, v) must return a 1-D array of residuals, got "
            f"shape {non.shape}"
        )
    E = shape_of("energy", t0, q0, v0)
    if E is not None:
        if E.shape != ():
            raise ValueError(
                f"{name}.energy(t, q, v) must return a scalar, got shape {E.shape}"
            )
    B = shape_of("input_matrix", t0, q0)
    if B is not None and (B.ndim != 2 or B.shape[0] != nv):
        raise ValueError(
            f"{name}.input_matrix(t, q) returned shape {B.shape}; expected ({nv}, nu)"
        )
    _check_finite_if_concrete("q0", q0)
    _check_finite_if_concrete("v0", v0)
    for path, leaf in jax.tree_util.tree_leaves_with_path(
        eqx.filter(model, eqx.is_array_like)
    ):
        _check_finite_if_concrete(f"{name}{jax.tree_util.keystr(path)}", leaf)
    return nq, hol.shape[0], non.shape[0]


def check_positive(model: AbstractModel, names) -> None:
    """`ValueError` for a concrete non-positive or non-finite parameter of `model`
    (for a model's `__check_init__`; traced values are skipped: inside
    jit/vmap/grad the solver's run-time checks take over)."""
    for name in names:
        x = getattr(model, name)
        if isinstance(x, jax.core.Tracer):
            continue
        value = np.asarray(x)
        if value.dtype.kind in "fiu" and not (
            np.all(np.isfinite(value)) and np.all(value > 0)
        ):
            raise ValueError(
                f"{type(model).__name__}: `{name}` must be positive and finite, "
                f"got {value}"
            )


def _check_finite_if_concrete(what: str, x) -> None:
    if isinstance(x, jax.core.Tracer):
        return
    if isinstance(x, (bool, np.bool_)):
        return
    arr = np.asarray(x)
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} contains non-finite values (NaN or inf): {arr}")
