"""The model API: what a user writes to describe a constrained mechanical system."""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class AbstractModel(eqx.Module):
    r"""A mechanical system $M(t, q)\,\ddot q = Q(t, q, \dot q) + E(t, q)\,u + Q_c$.

    Subclass it, declare the physical parameters as fields and implement
    [`cdiff.AbstractModel.mass_matrix`][] (and usually `forces` and `holonomic`).
    Constraints are written as residuals that vanish on the constraint manifold;
    their Jacobians and time derivatives come from JAX autodiff, so a model never
    writes a Jacobian by hand.

    Because a model is an `equinox.Module`, its fields are pytree leaves:
    `jax.vmap` sweeps them and `jax.grad` / `eqx.filter_grad` differentiates
    with respect to them.

    **Methods to implement:**

    - `mass_matrix(t, q)`: symmetric positive definite, shape `(nq, nq)`.
    - `forces(t, q, v)`: generalized applied and velocity-dependent forces $Q$
      (gravity, springs, Coriolis/centrifugal terms), shape `(nq,)`. Default: zero.
    - `holonomic(t, q)`: holonomic residuals $\Phi_q$, shape `(m,)`. Default: none.
    - `nonholonomic(t, q, v)`: nonholonomic residuals $\Phi_v$, shape `(p,)`; any
      smooth function of `v`, Pfaffian or not. Default: none.
    - `energy(t, q, v)`: the total mechanical energy, a scalar. Optional; needed for
      the energy correction of [`cdiff.UdwadiaKalaba`][] and for energy diagnostics.
    - `input_matrix(t, q)`: $E$, shape `(nq, nu)`, mapping control inputs to
      generalized forces. Default: the identity.
    """

    @abc.abstractmethod
    def mass_matrix(self, t, q):
        """The mass matrix $M(t, q)$, shape `(nq, nq)`."""

    def forces(self, t, q, v):
        """Generalized forces $Q(t, q, v)$, shape `(nq,)`. Default: zero."""
        del t, v
        return jnp.zeros_like(q)

    def holonomic(self, t, q):
        r"""Holonomic residuals $\Phi_q(t, q)$, shape `(m,)`. Default: none."""
        del t
        return jnp.zeros((0,), dtype=q.dtype)

    def nonholonomic(self, t, q, v):
        r"""Nonholonomic residuals $\Phi_v(t, q, v)$, shape `(p,)`. Default: none."""
        del t, v
        return jnp.zeros((0,), dtype=q.dtype)

    def energy(self, t, q, v):
        """Total mechanical energy (a scalar). Optional."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define `energy(t, q, v)`."
        )

    def input_matrix(self, t, q):
        """Input matrix $E(t, q)$, shape `(nq, nu)`. Default: the identity."""
        del t
        return jnp.eye(q.shape[0], dtype=q.dtype)


def has_energy(model: AbstractModel) -> bool:
    """Whether the model overrides `energy`."""
    return type(model).energy is not AbstractModel.energy


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
    if v0.shape != q0.shape:
        raise ValueError(
            f"v0 must have the shape of q0 {_shape_str(q0)}, got {_shape_str(v0)}"
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
                f"{name}.{method} failed on q0 of shape {_shape_str(q0)}: {e}"
            ) from e

    M = shape_of("mass_matrix", t0, q0)
    if M.shape != (nq, nq):
        raise ValueError(
            f"{name}.mass_matrix(t, q) returned shape {M.shape}; expected ({nq}, {nq}) "
            f"for q0 of shape {_shape_str(q0)}"
        )
    Q = shape_of("forces", t0, q0, v0)
    if Q.shape != (nq,):
        raise ValueError(
            f"{name}.forces(t, q, v) returned shape {Q.shape}; expected ({nq},)"
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
    if has_energy(model):
        E = shape_of("energy", t0, q0, v0)
        if E.shape != ():
            raise ValueError(
                f"{name}.energy(t, q, v) must return a scalar, got shape {E.shape}"
            )
    B = shape_of("input_matrix", t0, q0)
    if B.ndim != 2 or B.shape[0] != nq:
        raise ValueError(
            f"{name}.input_matrix(t, q) returned shape {B.shape}; expected ({nq}, nu)"
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
