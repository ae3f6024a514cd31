"""What every controller shares: the controller interface, the mapping of a
generalized force to the model's inputs, gains, and the model's terms at a state."""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._kinematics import kinematics, velocity_size
from .._linalg import PseudoInverse
from .._model import AbstractModel


def default_tol(dtype) -> float:
    """Relative tolerance of the run-time consistency checks."""
    return 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-3


def apply_gain(G, x):
    """`G x` for a scalar, a vector (diagonal) or a matrix gain."""
    G = jnp.asarray(G).astype(x.dtype)
    return G @ x if G.ndim == 2 else G * x


def gain_matrix(G, k: int, dtype):
    """A scalar, vector (diagonal) or matrix gain as a `(k, k)` matrix."""
    G = jnp.asarray(G).astype(dtype)
    if G.ndim == 2:
        return G
    return jnp.diag(jnp.broadcast_to(G, (k,)))


def check_gain(owner: str, name: str, G, *, allow_zero: bool) -> None:
    """`ValueError` for a concrete scalar/vector gain that is negative, zero (unless
    allowed) or not finite. Matrices and traced gains are not checked."""
    if G is None or isinstance(G, jax.core.Tracer):
        return
    value = np.asarray(G)
    if value.ndim > 1 or value.dtype.kind not in "fiu":
        return
    ok = np.all(np.isfinite(value)) and (
        np.all(value >= 0) if allow_zero else np.all(value > 0)
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{owner}: the gain `{name}` must be finite and {bound}, "
                         f"got {value}")


def to_input(model: AbstractModel, t, q, f, tol, owner: str):
    r"""$u$ with $Eu = f$: $f$ for the default $E = I$, else $u = E^+f$ (smooth
    least squares, `PseudoInverse` of $E^T$), checked at run time."""
    E = model.input_matrix(t, q)
    if E is None:
        return f
    E = jnp.asarray(E).astype(f.dtype)
    u = PseudoInverse(E.T).multipliers(E.T @ f)  # (E^T E)^+ E^T f = E^+ f
    tol = default_tol(f.dtype) if tol is None else tol
    residual = jnp.linalg.norm(E @ u - f)
    return eqx.error_if(
        u,
        residual > tol * jnp.linalg.norm(f),
        f"cdiff.control.{owner}: the generalized force is not in the range of "
        "model.input_matrix(t, q) (E u = f has no solution: the force needs "
        "unactuated coordinates). Wrap the controller in "
        "cdiff.control.PassiveJoints (Aghili eqs. 53-60).",
    )


class ControllerTerms(eqx.Module):
    """Model quantities at one state, shared by the controllers."""

    M: Float[Array, "n n"]
    Q: Float[Array, " n"]
    A: Float[Array, "k n"]
    b: Float[Array, " k"]
    pinv: PseudoInverse


def controller_terms(model: AbstractModel, t, q, v, rtol) -> ControllerTerms:
    if velocity_size(model, q) != q.shape[0]:
        raise ValueError(
            f"cdiff.control: {type(model).__name__} has {velocity_size(model, q)} "
            f"velocities for {q.shape[0]} coordinates (quaternions); Aghili's "
            "controllers track coordinates with v = dq/dt and do not support it."
        )
    t = jnp.asarray(t, dtype=q.dtype)
    M = jnp.asarray(model.mass_matrix(t, q)).astype(q.dtype)
    Q = jnp.asarray(model.forces(t, q, v)).astype(q.dtype)
    kin = kinematics(model, t, q, v)
    return ControllerTerms(M, Q, kin.A_v, kin.b_v, PseudoInverse(kin.A_v, rtol))


def second_order(fn, q, v):
    r"""$(\theta, J v, \dot J v)$ of $\theta$ = `fn(q)` along $\dot q = v$
    ($\dot Jv = \partial^2\theta/\partial q^2[v, v]$), by nested `jax.jvp`."""

    def first(q):
        return jax.jvp(fn, (q,), (v,))

    (theta, dtheta), (_, ddtheta) = jax.jvp(first, (q,), (v,))
    return theta, dtheta, ddtheta


class AbstractController(eqx.Module):
    """A controller of cdiff's `simulate`: `u = controller(t, q, v)`.

    Subclasses implement `generalized_force(t, q, v)` (the generalized force
    $f = Eu$ they want applied) and expose the controlled model as `model`
    (optionally `tol`, `rtol`); `__call__` maps $f$ to the input $u$ (module
    docstring). Any subclass can be wrapped in [`cdiff.control.PassiveJoints`][].
    """

    @abc.abstractmethod
    def generalized_force(self, t, q, v) -> Float[Array, " n"]:
        """The generalized force $f$ (cdiff's $Eu$) at `(t, q, v)`."""

    def _force_and_terms(self, t, q, v) -> tuple[Float[Array, " n"], ControllerTerms]:
        """The generalized force and the model quantities at `(t, q, v)` (the
        built-in controllers return the ones they computed it from)."""
        rtol = getattr(self, "rtol", None)
        return self.generalized_force(t, q, v), controller_terms(self.model, t, q, v, rtol)

    def __call__(self, t, q, v):
        f = self.generalized_force(t, q, v)
        return to_input(self.model, t, q, f, getattr(self, "tol", None),
                         type(self).__name__)
