"""Consistent initial states: a guess (q, v) projected onto the constraints."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._kinematics import residuals, velocity_size
from ._model import AbstractModel
from ._solver.projected import NewtonProjection


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(xs))


def consistent_state(
    model: AbstractModel,
    q,
    v=None,
    t=0.0,
    *,
    tol: float | None = None,
    iterations: int = 30,
    mass_weighted: bool = False,
    rtol: float | None = None,
):
    r"""Project a guess `(q, v)` onto the position and velocity constraints.

    Positions: Gauss-Newton steps $q \leftarrow q \oplus (-A_q^+\Phi_q(q))$, each the
    minimum-norm correction of the linearised constraints (Aghili eq. 37;
    `model.integrate_position` moves along the correction, so quaternions stay
    unit), until $\max|\Phi_q| \le$ `tol` or `iterations` steps. Velocities: the
    least-squares admissible velocity closest to `v`,
    $v \leftarrow v - A_v^+[\dot\Phi_q; \Phi_v]$ (Yun-Sarkar eq. 36; exact for
    constraints affine in $v$). With `mass_weighted=True` both corrections are the
    smallest in the kinetic metric instead ($M^{-1}A^T(AM^{-1}A^T)^+$), which does
    not depend on the coordinates' units.

    Use it on states from files or guesses (an MJCF keyframe rarely closes its
    loops to round-off): `q0, v0 = cdiff.consistent_state(model, q_guess, v_guess)`.
    It composes with `jax.jit`, `jax.vmap` and `jax.grad` (a fixed number of
    iterations; converged ones leave the state unchanged).

    **Arguments:**

    - `model`: a [`cdiff.AbstractModel`][].
    - `q`, `v`: the guess; `v` defaults to zero.
    - `t`: the time (for time-dependent constraints).
    - `tol`: the largest accepted $|\Phi_q|$ and $|[\dot\Phi_q; \Phi_v]|$; default
      $10^{-10}$ in float64, $10^{-4}$ in float32.
    - `iterations`: the most Gauss-Newton steps (static).
    - `mass_weighted`: corrections in the kinetic metric.
    - `rtol`: relative singular-value threshold of the pseudoinverse.

    **Returns:** `(q, v)` on the constraints.

    **Raises:** `ValueError` (outside `jit`; an `eqx.error_if` run-time error
    inside) when the constraints cannot be met from this guess: an inconsistent
    constraint set, or a guess too far from the constraint manifold. The message
    gives the residual reached.
    """
    q = jnp.asarray(q)
    if not jnp.issubdtype(q.dtype, jnp.floating):
        q = q.astype(jnp.result_type(float))
    nv = velocity_size(model, q)
    v = jnp.zeros(nv, q.dtype) if v is None else jnp.asarray(v, q.dtype)
    if v.shape != (nv,):
        raise ValueError(f"v must have shape ({nv},), got {v.shape}")
    t = jnp.asarray(t, q.dtype)
    if tol is None:
        tol = 1e-10 if q.dtype == jnp.float64 else 1e-4
    projection = NewtonProjection(iterations=1, mass_weighted=mass_weighted, rtol=rtol)

    def position_error(q):
        return jnp.max(jnp.abs(residuals(model, t, q, v)[0]), initial=0.0)

    def newton(_, q):
        step = projection.position(model, t, q)
        return jnp.where(position_error(q) > tol, step, q)

    q = jax.lax.fori_loop(0, iterations, newton, q)
    v = projection.velocity(model, t, q, v)
    phi_q, phi_v = residuals(model, t, q, v)
    err_q = jnp.max(jnp.abs(phi_q), initial=0.0)
    err_v = jnp.max(jnp.abs(phi_v), initial=0.0)
    message = (
        f"cdiff.consistent_state: {type(model).__name__}'s constraints cannot be met "
        f"from this guess to tol = {tol:g} after {iterations} Gauss-Newton steps "
    )
    if _is_concrete(q, v):
        if not (float(err_q) <= tol and float(err_v) <= tol):
            raise ValueError(
                message + f"(max |Phi_q| = {float(err_q):.3g}, max velocity residual "
                f"= {float(err_v):.3g}): the constraints are inconsistent (no "
                "configuration satisfies them all), or the guess is too far from "
                "the constraint manifold."
            )
        return q, v
    q, v = eqx.error_if(
        (q, v), ~((err_q <= tol) & (err_v <= tol)),
        message + "(inconsistent constraints, or a guess too far from them).",
    )
    return q, v
