r"""Constraint kinematics by automatic differentiation.

A model writes residuals only; everything a formulation needs at velocity and
acceleration level is derived here with `jax.jvp` / `jax.jacfwd`:

* holonomic $\Phi_q(t, q)$: $A_q = (\partial\Phi_q/\partial q)\,T(q)$,
  $b_q = -\partial\Phi_q/\partial t$, $\dot\Phi_q = A_q v - b_q$ and
  $b_{qv} = -\tfrac{d^2}{ds^2}\Phi_q(t + s, q(s))|_{s=0}$ along the flow
  $q'(s) = T(q(s))\,v$ at constant $v$ (so that $A_q\dot v = b_{qv}$ is
  $\ddot\Phi_q = 0$);
* nonholonomic $\Phi_v(t, q, v)$: $A_{vv} = \partial\Phi_v/\partial v$,
  $b_{vv} = -(\partial\Phi_v/\partial q)\,\dot q - \partial\Phi_v/\partial t$;
* energy $E(t, q, v)$: $A_e = \partial E/\partial v$,
  $b_e = -\partial E/\partial t - (\partial E/\partial q)\,\dot q$,

with $\dot q = T(q)\,v$ the model's `position_rate` (the identity for most
models: then $A_q = \partial\Phi_q/\partial q$). Every Jacobian is with respect to
the velocities, shape `(rows, nv)`.

A model may supply all of these at one state itself, in one pass over its own
computation: its `terms(t, q, v)` method returns a [`Terms`][cdiff.Terms], whose
default (this module's [`Terms`][cdiff.Terms]) derives them by autodiff as above.
The functions here ask the model for its terms, so every formulation gets the
model's own when it has them ([`cdiff.models.MuJoCoModel`][] reads them from one MJX
pass).

Notation follows Braun & Goldfarb (2012), eqs. 4-5 and 19.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

#: A [`cdiff.AbstractModel`][] (not imported: `cdiff._model` builds on this module).
AbstractModel = Any


class Kinematics(eqx.Module):
    r"""Constraint quantities at one state $(t, q, v)$.

    Rows of the acceleration-level system stack the holonomic constraints first
    and the nonholonomic ones after them: $A_v = [A_q; A_{vv}]$,
    $b_v = [b_{qv}; b_{vv}]$.
    """

    phi_q: Float[Array, " m"]
    dphi_q: Float[Array, " m"]
    A_q: Float[Array, "m nv"]
    b_q: Float[Array, " m"]
    phi_v: Float[Array, " p"]
    A_v: Float[Array, "k nv"]
    b_v: Float[Array, " k"]

    @property
    def velocity_residual(self) -> Float[Array, " k"]:
        r"""$[\dot\Phi_q; \Phi_v]$: the constraint violation at velocity level."""
        return jnp.concatenate([self.dphi_q, self.phi_v])


def _unit(t):
    return jnp.ones_like(t)


def jacobian(f, x):
    r"""`(f(x), df/dx)` for a vector-valued `f`, one row per output.

    With fewer inputs than outputs, forward mode: one tangent per column (reverse
    mode's vmapped pullback would carry every row through the model, e.g.
    MuJoCo's kinematic tree).
    Otherwise reverse mode, with the residuals of the linearisation (the model's
    trigonometric functions and products) passed through
    `jax.lax.optimization_barrier`: XLA then evaluates them once per state and
    every Jacobian entry reads them, where `jax.jacfwd` lets XLA fuse the whole
    derivative into each entry and recompute the model's nonlinear functions for
    every one of them.
    """
    k = jax.eval_shape(f, x).shape[0]
    if x.shape[0] < k:
        y, tangent = jax.linearize(f, x)
        return y, jax.vmap(tangent, out_axes=1)(jnp.eye(x.shape[0], dtype=x.dtype))
    y, pullback = jax.vjp(f, x)
    pullback = jax.lax.optimization_barrier(pullback)
    (rows,) = jax.vmap(pullback)(jnp.eye(y.shape[0], dtype=y.dtype))
    return y, rows


def velocity_size(model: AbstractModel, q) -> int:
    """The number of velocities `nv` of `model` at `q` (the size of its mass
    matrix; no computation)."""
    t = jnp.zeros((), q.dtype)
    return jax.eval_shape(model.mass_matrix, t, q).shape[0]


# -- the autodiff derivations (the default terms) -------------------------------------


def _velocity_jacobian(model: AbstractModel, f, t, q):
    """`(f(q), (df/dq) T(q))`: position-level rows `f` and their Jacobian with
    respect to the velocities."""
    phi, rows = jacobian(f, q)
    # Rows times T(q): the transpose of position_rate applied to each row (free
    # for the identity map).
    zero = jnp.zeros(velocity_size(model, q), q.dtype)
    _, rate_transpose = jax.vjp(lambda w: model.position_rate(t, q, w), zero)
    return phi, jax.vmap(lambda r: rate_transpose(r)[0])(rows)


def _holonomic_jacobian(model: AbstractModel, t, q):
    t = jnp.asarray(t, dtype=q.dtype)
    return _velocity_jacobian(model, lambda q: model.holonomic(t, q), t, q)


def unilateral_jacobian(model: AbstractModel, t, q):
    r"""`(g, G, g_t)`: the unilateral rows $g(t, q)$ (see
    [`cdiff.AbstractModel.unilateral`][]), their velocity Jacobian
    $G = (\partial g/\partial q)\,T(q)$, shape `(r, nv)`, and $\partial g/\partial t$,
    so that $\dot g = Gv + \partial g/\partial t$."""
    t = jnp.asarray(t, dtype=q.dtype)
    g, G = _velocity_jacobian(model, lambda q: model.unilateral(t, q), t, q)
    _, g_t = jax.jvp(lambda t: model.unilateral(t, q), (t,), (_unit(t),))
    return g, G, g_t


def _kinematics(model: AbstractModel, t, q, v) -> Kinematics:
    """Every constraint term by autodiff: a Jacobian and a `jvp` of a `jvp` for
    $b_{qv}$, and the nonholonomic rows as `_nonholonomic_kinematics`."""
    t = jnp.asarray(t, dtype=q.dtype)

    def hol(t, q):
        return model.holonomic(t, q)

    def rate(t, q):
        return model.position_rate(t, q, v)

    def first(t, q):
        return jax.jvp(hol, (t, q), (_unit(t), rate(t, q)))

    qdot = rate(t, q)
    (phi_q, dphi_q), (_, ddphi0) = jax.jvp(first, (t, q), (_unit(t), qdot))
    _, A_q = _holonomic_jacobian(model, t, q)
    b_q = A_q @ v - dphi_q

    def non(t, q, v):
        return model.nonholonomic(t, q, v)

    phi_v, dphi_v0 = jax.jvp(non, (t, q, v), (_unit(t), qdot, jnp.zeros_like(v)))
    _, A_vv = jacobian(lambda v: non(t, q, v), v)
    A_v = jnp.concatenate([A_q, A_vv])
    b_v = jnp.concatenate([-ddphi0, -dphi_v0])
    return Kinematics(phi_q, dphi_q, A_q, b_q, phi_v, A_v, b_v)


def _nonholonomic_kinematics(model: AbstractModel, t, q, v):
    r"""`(phi_v, A_vv, b_vv)` of the nonholonomic rows by autodiff."""
    t = jnp.asarray(t, dtype=q.dtype)
    qdot = model.position_rate(t, q, v)

    def non(t, q, v):
        return model.nonholonomic(t, q, v)

    phi_v, dphi_v0 = jax.jvp(non, (t, q, v), (_unit(t), qdot, jnp.zeros_like(v)))
    _, A_vv = jacobian(lambda v: non(t, q, v), v)
    return phi_v, A_vv, -dphi_v0


def _residuals(model: AbstractModel, t, q, v):
    t = jnp.asarray(t, dtype=q.dtype)
    qdot = model.position_rate(t, q, v)
    phi_q, dphi_q = jax.jvp(
        lambda t, q: model.holonomic(t, q), (t, q), (_unit(t), qdot)
    )
    return phi_q, jnp.concatenate([dphi_q, model.nonholonomic(t, q, v)])


def assemble(holonomic, nonholonomic, v) -> Kinematics:
    """The [`Kinematics`][cdiff.Kinematics] from the holonomic rows
    `(phi_q, dphi_q, A_q, b_qv)` and the nonholonomic rows `(phi_v, A_vv, b_vv)`."""
    phi_q, dphi_q, A_q, b_qv = holonomic
    phi_v, A_vv, b_vv = nonholonomic
    return Kinematics(phi_q, dphi_q, A_q, A_q @ v - dphi_q, phi_v,
                      jnp.concatenate([A_q, A_vv]), jnp.concatenate([b_qv, b_vv]))


class EnergyLaw(eqx.Module):
    r"""The energy law as an acceleration-level row: $A_e\ddot q = b_e$ (eq. 19)."""

    energy: Float[Array, ""]
    A_e: Float[Array, " nv"]
    b_e: Float[Array, ""]


def _energy_law(model: AbstractModel, t, q, v, qdot=None) -> EnergyLaw:
    t = jnp.asarray(t, dtype=q.dtype)
    qdot = model.position_rate(t, q, v if qdot is None else qdot)

    def energy(t, q, v):
        return model.energy(t, q, v)

    E, dE0 = jax.jvp(energy, (t, q, v), (_unit(t), qdot, jnp.zeros_like(v)))
    A_e = jax.grad(energy, argnums=2)(t, q, v)
    return EnergyLaw(E, A_e, -dE0)


# -- the terms at one state -----------------------------------------------------------


class ImpactTerms(NamedTuple):
    """What an impact reads of the model's terms at its state: the mass matrix
    and the velocity constraints `(r_v, A_v)` (see [`cdiff.Terms`][])."""

    mass_matrix: Float[Array, "nv nv"]
    velocity_constraints: tuple


class Terms:
    r"""The terms of a model's equations of motion at one state $(t, q, v)$, each
    computed when first read and then kept: the mass matrix, the forces, the input
    matrix, the constraint kinematics and the energy law.

    [`cdiff.AbstractModel.terms`][] returns one; every formulation reads what it
    needs at a state from one `Terms`. This class derives the constraint terms from
    the model's residuals by autodiff (as described in `cdiff.kinematics`). A model
    that can compute them in one pass over its own computation (a rigid-body
    library's bias accelerations, say) returns a subclass that overrides the
    attributes it supplies; [`cdiff.models.MuJoCoModel`][] does so with one MJX
    pass. Each attribute must equal its autodiff default to round-off.

    `v` may be `None` for the position-level terms (`mass_matrix`,
    `input_matrix`, `holonomic_jacobian`).

    **Declarations:** `one_pass`: `True` on a subclass that computes its terms in
    one evaluation of the model's own computation (MuJoCoModel's MJX pass), so that
    a solver takes a step's per-step data from its first stage's evaluation instead
    of evaluating the terms again. Default `False`.
    """

    one_pass: ClassVar[bool] = False

    def __init__(self, model: AbstractModel, t, q, v=None):
        self.model = model
        self.q = q
        self.t = jnp.asarray(t, dtype=q.dtype)
        self.v = v

    def _velocity(self):
        if self.v is None:
            raise ValueError("these terms were evaluated without velocities (v=None)")
        return self.v

    @functools.cached_property
    def mass_matrix(self) -> Float[Array, "nv nv"]:
        """$M(t, q)$, the model's `mass_matrix`."""
        return self.model.mass_matrix(self.t, self.q)

    @functools.cached_property
    def forces(self) -> Float[Array, " nv"]:
        """$Q(t, q, v)$, the model's `forces`."""
        return self.model.forces(self.t, self.q, self._velocity())

    @functools.cached_property
    def input_matrix(self):
        """The model's `input_matrix(t, q)`: $E$, or `None` for $E = I$."""
        return self.model.input_matrix(self.t, self.q)

    @functools.cached_property
    def holonomic(self) -> Float[Array, " m"]:
        r"""$\Phi_q(t, q)$, the model's `holonomic`."""
        return self.model.holonomic(self.t, self.q)

    @functools.cached_property
    def holonomic_jacobian(self) -> tuple[Array, Array]:
        r"""$(\Phi_q, A_q)$ with $A_q = (\partial\Phi_q/\partial q)\,T(q)$, shape
        `(m, nv)`."""
        return _holonomic_jacobian(self.model, self.t, self.q)

    @functools.cached_property
    def kinematics(self) -> Kinematics:
        """The constraint [`Kinematics`][cdiff.Kinematics] at the state."""
        return _kinematics(self.model, self.t, self.q, self._velocity())

    @functools.cached_property
    def residuals(self) -> tuple[Array, Array]:
        r"""$\Phi_q$ and $[\dot\Phi_q; \Phi_v]$, without any Jacobian."""
        return _residuals(self.model, self.t, self.q, self._velocity())

    @functools.cached_property
    def velocity_constraints(self) -> tuple[Array, Array]:
        r"""$[\dot\Phi_q; \Phi_v]$ and its Jacobian $A_v$ with respect to `v`."""
        return jacobian(
            lambda v: _residuals(self.model, self.t, self.q, v)[1], self._velocity())

    @functools.cached_property
    def energy(self):
        """The model's `energy(t, q, v)`, or `None`."""
        return self.model.energy(self.t, self.q, self._velocity())

    def energy_law(self, qdot=None) -> EnergyLaw:
        r"""$E$, $A_e = \partial E/\partial v$ and
        $b_e = -\partial E/\partial t - (\partial E/\partial q)\,T(q)\,$`qdot`
        (`qdot` defaults to `v`)."""
        return _energy_law(self.model, self.t, self.q, self._velocity(), qdot)


# -- the functions formulations call --------------------------------------------------


def holonomic_jacobian(model: AbstractModel, t, q):
    r"""$\Phi_q(t, q)$ and its velocity Jacobian $A_q = (\partial\Phi_q/\partial
    q)\,T(q)$, shape `(m, nv)`."""
    return model.terms(t, q).holonomic_jacobian


def kinematics(model: AbstractModel, t, q, v) -> Kinematics:
    """The constraint kinematics of `model` at `(t, q, v)`: the model's own
    ([`cdiff.AbstractModel.terms`][]), by default by autodiff."""
    return model.terms(t, q, v).kinematics


def residuals(model: AbstractModel, t, q, v):
    r"""$\Phi_q$ and the velocity-level residual $[\dot\Phi_q; \Phi_v]$ at
    `(t, q, v)`, without the Jacobians and second derivatives of [`kinematics`][]."""
    return model.terms(t, q, v).residuals


def velocity_constraints(model: AbstractModel, t, q, v):
    r"""The velocity-level residual $[\dot\Phi_q; \Phi_v]$ and its Jacobian with
    respect to $v$, $A_v = [A_q; \partial\Phi_v/\partial v]$ (without the second
    derivatives that [`kinematics`][] also computes)."""
    return model.terms(t, q, v).velocity_constraints


def energy_law(model: AbstractModel, t, q, v, qdot=None) -> EnergyLaw:
    r"""Energy, its velocity gradient and its acceleration-free rate.

    `qdot` is the velocity at which the coordinates move, $\dot q = T(q)\,$`qdot`
    in $b_e = -\partial E/\partial t - (\partial E/\partial q)\,\dot q$; it
    defaults to `v`. Braun-Goldfarb's corrected first-order form has
    $\dot q \neq T(q)v$ (eq. 16), and the energy law must see the rate at which $q$
    actually changes.
    """
    return model.terms(t, q, v).energy_law(qdot)
