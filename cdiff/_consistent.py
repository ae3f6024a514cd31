"""Consistent initial states: a guess (q, v) projected onto the constraints."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._kinematics import (holonomic_jacobian, residuals, velocity_constraints,
                          velocity_size)
from ._model import AbstractModel
from ._projection import NewtonProjection, gauss_newton
from ._results import is_concrete


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
    fixed: int | Sequence[int] = (),
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
    - `fixed`: an index, or indices, of velocity coordinates (entries of `v`) to
      hold at the guess's values: the corrections move only the others. A
      minimum-norm projection otherwise moves every coordinate, the one you chose
      too (a four-bar's crank started at 0.4 rad ends elsewhere); for a hinge or slide
      joint its position is held as well (`q` and `v` share the index when the
      model has no quaternions). With as many fixed coordinates as the mechanism
      has degrees of freedom, the others follow from the constraints (one of a
      four-bar's assembly branches: the one nearest the guess).

    ```python
    # The crank (coordinate 0) at 0.4 rad turning at 2 rad/s; the rest solved.
    q0, v0 = cdiff.consistent_state(four_bar, q_guess, v_guess, fixed=(0,))
    ```

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
    projection = NewtonProjection(mass_weighted=mass_weighted, rtol=rtol,
                                  fixed=fixed)
    q, v, err_q, err_v = _project(model, t, q, v, tol, projection, iterations)
    message = (
        f"cdiff.consistent_state: {type(model).__name__}'s constraints cannot be met "
        f"from this guess to tol = {tol:g} after {iterations} Gauss-Newton steps "
    )
    if is_concrete(q, v):
        if not (float(err_q) <= tol and float(err_v) <= tol):
            reached = (f"(max |Phi_q| = {float(err_q):.3g}, max velocity residual "
                       f"= {float(err_v):.3g})")
            if projection.fixed:
                rank = int(np.linalg.matrix_rank(np.asarray(
                    _velocity_jacobian(model, t, q, v))))
                raise ValueError(
                    message + f"with fixed = {projection.fixed} {reached}: "
                    f"{len(projection.fixed)} coordinate(s) held, and the mechanism "
                    f"has {nv - rank} degree(s) of freedom here (nv - rank A_v = "
                    f"{nv} - {rank}). Hold at most that many coordinates, and ones "
                    "the constraints do not tie together; or the guess is too far "
                    "from the constraint manifold.")
            raise ValueError(
                message + f"{reached}: the constraints are inconsistent (no "
                "configuration satisfies them all), or the guess is too far from "
                "the constraint manifold."
            )
        return q, v
    q, v = eqx.error_if(
        (q, v), ~((err_q <= tol) & (err_v <= tol)),
        message + "(inconsistent constraints, or a guess too far from them).",
    )
    return q, v


@eqx.filter_jit
def _velocity_jacobian(model, t, q, v):
    return velocity_constraints(model, t, q, v)[1]


@eqx.filter_jit
def _project(model, t, q, v, tol, projection, iterations):
    """`consistent_state`'s Gauss-Newton steps and velocity projection, compiled
    once per model structure, tolerance and settings: another guess (or other
    parameter values) reuses the program. Returns `(q, v, max |Phi_q|, max
    velocity residual)`."""

    if jax.eval_shape(model.holonomic, t, q).shape[0]:
        # The correction chosen afresh at every step (for a mass-weighted one: the
        # metric at the current configuration).
        q = gauss_newton(model, t, q, lambda q, A: projection.corrector(model, t, q, A),
                         iterations, tol=tol)
    v = projection.velocity(model, t, q, v)
    phi_q, phi_v = residuals(model, t, q, v)
    return (q, v, jnp.max(jnp.abs(phi_q), initial=0.0),
            jnp.max(jnp.abs(phi_v), initial=0.0))


def inconsistency(model: AbstractModel, t, q, *, iterations: int = 20, tol=None):
    r"""Whether the holonomic constraints $\Phi_q(t, \cdot) = 0$ have no solution
    reachable from `q` by descent: an inconsistent constraint set.

    Minimises $f = \tfrac12\|\Phi_q\|^2$ from `q` by `iterations` damped Newton
    steps in the velocity coordinates, $q \leftarrow q \oplus h$ by
    `model.integrate_position` (so quaternions stay unit):
    $h = -V(|\Lambda| + \mu)^{-1}V^T A^T\Phi$ with $V\Lambda V^T$ the Hessian of $f$
    (absolute eigenvalues: a descent step at saddles too) and Levenberg-Marquardt
    control of $\mu$ by the gain ratio (Nielsen's rule; a step that does not
    decrease $f$ is rejected). The Hessian, unlike Gauss-Newton's $A^TA$, converges
    quickly to a minimum with a nonzero residual, where its curvature term
    $\sum_i \Phi_i\nabla^2\Phi_i$ is not small; it is taken by forward differences
    of the gradient $A^T\Phi$ (step $\sqrt\epsilon\max(1, \|q\|)$), so that the
    compiled program holds one copy of the model's Jacobian (vmapped over the
    $n_v + 1$ points) and no second-order derivative. A consistent set is solved on
    the way (quadratic convergence; linear at a kinematic singularity), and the
    point reached is flagged `inconsistent` when all three hold:

    - the residual is clearly nonzero, $\|\Phi\| >$ `tol` $\cdot\|A\|_F$ (the
      distance to the constraints estimated to first order exceeds `tol`, in the
      units of the velocity coordinates);
    - the point is stationary, $\|A^T\Phi\| \le \epsilon^{1/4}\|A\|_F\|\Phi\|$
      ($\epsilon$ the machine epsilon: $1.2\cdot 10^{-4}$ in float64): the residual
      is orthogonal to every direction the constraints can move;
    - it is a local minimum of $f$: the Hessian's least eigenvalue is at least
      $-\epsilon^{1/4}$ times its largest magnitude. A saddle, such as the point
      half-way between two intersecting circles that the iteration reaches from a
      start on their axis of symmetry, is not flagged.

    `False` therefore means "not shown inconsistent": also a start too far to
    converge in `iterations` steps. `True` means "no solution reachable from `q` by
    descent": a consistent but nonconvex set may have a local minimum of $f$ with a
    nonzero residual, and a start in its basin is flagged too. Redundant
    constraints and kinematic singularities (rank-deficient $A$) are not flagged:
    the residual goes to zero there (near a singularity only linearly, halving per
    step, but the relative stationarity test is not met on the way). Without
    holonomic constraints the answer is a constant `False` (nothing is computed).

    It composes with `jax.jit` and `jax.vmap` (a fixed number of steps); under
    `jax.grad` its inputs are held constant (`stop_gradient`: the answer is a
    boolean, and the residual gets no gradient).

    **Arguments:**

    - `model`: a [`cdiff.AbstractModel`][].
    - `t`: the time (for time-dependent constraints).
    - `q`: the configuration to start from.
    - `iterations`: the number of Newton steps (static).
    - `tol`: the smallest first-order distance $\|\Phi\|/\|A\|_F$ to the
      constraints counted as nonzero; default $\sqrt\epsilon\max(1, \|q\|)$.

    **Returns:** `(inconsistent, residual)`: a boolean scalar, and $\|\Phi_q\|$
    at the point reached (the least residual found).
    """
    q = jnp.asarray(q)
    if not jnp.issubdtype(q.dtype, jnp.floating):
        q = q.astype(jnp.result_type(float))
    t = jnp.asarray(t, q.dtype)
    if jax.eval_shape(model.holonomic, t, q).shape[0] == 0:
        return jnp.zeros((), bool), jnp.zeros((), q.dtype)
    # A yes/no answer: nothing to differentiate (the loop is not linearised).
    arrays, static = eqx.partition((model, t, q), eqx.is_inexact_array)
    model, t, q = eqx.combine(jax.lax.stop_gradient(arrays), static)
    nv = velocity_size(model, q)
    eps = float(jnp.finfo(q.dtype).eps)
    flat = eps**0.25
    if tol is None:
        tol = eps**0.5 * jnp.maximum(1.0, jnp.linalg.norm(q))

    def at(q):
        # Phi, A and the Hessian of f by forward differences of its gradient A^T Phi
        # along the velocity coordinates: nv + 1 Jacobians, vmapped (one copy of
        # the model's Jacobian in the compiled program).
        delta = eps**0.5 * jnp.maximum(1.0, jnp.linalg.norm(q))
        moved = jax.vmap(model.integrate_position, (None, 0))(
            q, delta * jnp.eye(nv, dtype=q.dtype))
        phis, As = jax.vmap(lambda p: holonomic_jacobian(model, t, p))(
            jnp.concatenate([q[None], moved]))
        grads = jnp.einsum("kmv,km->kv", As, phis)
        H = (grads[1:] - grads[0]) / delta
        w, V = jnp.linalg.eigh(0.5 * (H + H.T))
        return q, phis[0], As[0], w, V

    def newton(i, carry):
        (q, phi, A, w, V), lam, nu = carry
        # Step 0 evaluates the start (one traced copy of `at`).
        c = V.T @ (A.T @ phi)
        mu = lam * jnp.max(jnp.abs(w))
        d = jnp.abs(w) + mu
        trial = at(jnp.where(i == 0, q, model.integrate_position(q, -V @ (c / d))))
        # Gain ratio: decrease of f over the decrease of its model (with |H|).
        # (0.5 at step 0: accepted, lam unchanged.)
        gain = (phi @ phi - trial[1] @ trial[1]) / jnp.sum(c**2 * (d + mu) / d**2)
        gain = jnp.where(i == 0, 0.5, gain)
        ok = gain > 0
        lam = jnp.where(ok, lam * jnp.maximum(1 / 3, 1 - (2 * gain - 1) ** 3),
                        lam * nu)
        point = jax.tree.map(lambda a, b: jnp.where(ok, a, b), trial, (q, phi, A, w, V))
        return point, jnp.clip(lam, eps, 1 / eps), jnp.where(ok, 2.0, 2 * nu)

    one = jnp.ones((), q.dtype)
    # Finite placeholders for the start's quantities, which step 0 computes.
    start = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), jax.eval_shape(at, q))
    carry = ((q, *start[1:]), 1e-3 * one, 2 * one)
    (q, phi, A, w, _), _, _ = jax.lax.fori_loop(0, iterations + 1, newton, carry)
    residual, size = jnp.linalg.norm(phi), jnp.linalg.norm(A)
    nonzero = residual > tol * size
    stationary = jnp.linalg.norm(A.T @ phi) <= flat * size * residual
    minimum = w[0] >= -flat * jnp.max(jnp.abs(w))
    return nonzero & stationary & minimum, residual
