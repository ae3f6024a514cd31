r"""Rank, reduction index matrix, differential index and singular configurations.

Costa-Castelló, Griñó & Basañez (1998): a constrained mechanical system
$M\ddot q = Q + G^T f$, $g(q) = 0$ is a DAE in Hessenberg form of size 3, of
differential index 3, where its reduction index matrix $\varphi = GM^{-1}G^T$
(eq. 44, $G = \partial g/\partial q$) is nonsingular (Remark 3). Since $M$ is
positive definite, $\varphi$ is singular exactly where $G$ loses row rank
(Proposition 1: $\varphi$ singular iff $G^Tw = 0$ for some $w \neq 0$), and there the
DAE has no index (Remark 4). With velocity constraints only, the system is of
index 2 where $BM^{-1}B^T$ is nonsingular.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._kinematics import holonomic_jacobian, velocity_constraints, velocity_size
from .._linalg import default_rtol
from .._model import AbstractModel, _check_finite_if_concrete
from .._results import is_concrete


def _check_configuration(name: str, model: AbstractModel, t, q) -> None:
    """A concrete configuration must be finite, and the mass matrix there positive
    definite: a NaN state (or a negative mass) otherwise reads as a singular or
    well-conditioned point."""
    if not is_concrete(q, t):
        return
    _check_finite_if_concrete(f"cdiff.analysis.{name}: the configuration q", q)
    M = np.asarray(model.mass_matrix(jnp.asarray(t, q.dtype), q))
    if not (np.all(np.isfinite(M)) and np.all(np.linalg.eigvalsh(
            0.5 * (M + M.T)) > 0)):
        raise ValueError(
            f"cdiff.analysis.{name}: {type(model).__name__}.mass_matrix is not "
            "positive definite at q (a negative or zero mass or inertia?): "
            f"eigenvalues {np.linalg.eigvalsh(0.5 * (M + M.T))}")


def _holonomic_rows(name: str, model: AbstractModel, t, q) -> int:
    """The number of holonomic rows, refused when there are none (shapes only)."""
    m = jax.eval_shape(model.holonomic, jnp.asarray(t, q.dtype), q).shape[0]
    if m == 0:
        raise ValueError(
            f"cdiff.analysis.{name}: {type(model).__name__} has no holonomic "
            "constraints (holonomic(t, q) has no rows), so there is no reduction "
            "index matrix G M^-1 G^T to evaluate or make singular.")
    return m


def rank(A, rtol=None, atol=0.0) -> Array:
    """Numerical rank: singular values above `rtol` times the largest and above
    `atol` (a relative threshold alone cannot find a single row that vanishes)."""
    if A.shape[0] == 0:
        return jnp.zeros((), jnp.int32)
    sv = jnp.linalg.svd(A, compute_uv=False)
    rtol = default_rtol(A.dtype) if rtol is None else rtol
    return jnp.sum(sv > jnp.maximum(rtol * sv[0], atol)).astype(jnp.int32)


def constraint_rank(
    model: AbstractModel, t, q, v=None, *, rtol=None, atol=None
) -> Array:
    r"""The rank of the velocity-level constraint matrix $A_v = [G; B]$ at `(t, q)`
    (the holonomic Jacobian and the nonholonomic rows $\partial\Phi_v/\partial v$,
    taken at `v`, default zero). Less than its number of rows at a kinematic
    singularity or with redundant constraints. Singular values below `rtol` times
    the largest, or below `atol`, count as zero (both default
    $10\sqrt{\varepsilon}$; `atol` finds a single vanishing row)."""
    q = jnp.asarray(q)
    _check_configuration("constraint_rank", model, t, q)
    v = jnp.zeros(velocity_size(model, q), q.dtype) if v is None else v
    _, A_v = velocity_constraints(model, t, q, v)
    atol = default_rtol(A_v.dtype) if atol is None else atol
    return rank(A_v, rtol, atol)


class IndexMatrix(eqx.Module):
    r"""The reduction index matrix $\varphi = GM^{-1}G^T$ (eq. 44) at one
    configuration, with its determinant and its 2-norm condition number (`inf`
    where it is singular)."""

    phi: Float[Array, "m m"]
    det: Float[Array, ""]
    cond: Float[Array, ""]


def reduction_index_matrix(model: AbstractModel, t, q) -> IndexMatrix:
    r"""$\varphi = GM^{-1}G^T$ (Costa-Castelló eq. 44) of the holonomic constraints
    at `(t, q)`, its determinant and condition number."""
    q = jnp.asarray(q)
    _holonomic_rows("reduction_index_matrix", model, t, q)
    _check_configuration("reduction_index_matrix", model, t, q)
    _, G = holonomic_jacobian(model, t, q)
    M = model.mass_matrix(jnp.asarray(t, q.dtype), q)
    phi = G @ jnp.linalg.solve(M, G.T)
    sv = jnp.linalg.svd(phi, compute_uv=False)
    cond = jnp.where(sv[-1] > 0, sv[0] / jnp.where(sv[-1] > 0, sv[-1], 1.0), jnp.inf)
    return IndexMatrix(phi, jnp.linalg.det(phi), cond)


def along(fn, model: AbstractModel, solution, **kwargs):
    """`fn(model, t, q, ...)` at every saved row of a `Solution` (one `jax.vmap`),
    e.g. `along(reduction_index_matrix, model, sol).cond`. Rows that the solve did
    not reach (inf) are dropped."""
    valid = np.isfinite(np.asarray(solution.ts))
    ts, qs = solution.ts[valid], solution.q[valid]
    return jax.vmap(lambda t, q: fn(model, t, q, **kwargs))(ts, qs)


def differential_index(
    model: AbstractModel, t, q, *, rtol=None, atol=None
) -> int | None:
    r"""The differential index of the model's DAE at configuration `q` (Costa-
    Castelló Definition 2, Theorem 1, Remarks 3-4): 3 with holonomic constraints
    where $\varphi = GM^{-1}G^T$ is nonsingular; 2 with only (Pfaffian)
    nonholonomic constraints where $BM^{-1}B^T$ is; 0 without constraints (an
    ODE). `None` where the matrix is singular: the DAE then has no index (the
    constraint forces are not determined), as at a kinematic singularity or with
    redundant constraints.

    Singular values of the mass-weighted constraint matrix $C = A_vL^{-T}$
    ($CC^T = \varphi$) below `rtol` times the largest (default
    $10\sqrt{\varepsilon}$) or below `atol` count as zero. The absolute `atol`
    (default $10\sqrt{\varepsilon}$, in the units of $C$) is what finds a single
    constraint whose gradient vanishes, as at the planar arm's singular
    configurations (R8), where no relative threshold can.

    Evaluated outside `jit` (it returns a Python value)."""
    q = jnp.asarray(q)
    t = jnp.asarray(t, q.dtype)
    _check_configuration("differential_index", model, t, q)
    phi, G = holonomic_jacobian(model, t, q)
    _, A_v = velocity_constraints(model, t, q, jnp.zeros(G.shape[1], q.dtype))
    if A_v.shape[0] == 0:
        return 0
    # phi = C C^T with C = A L^{-T}: its rank is the rank of the weighted rows.
    L = jnp.linalg.cholesky(model.mass_matrix(t, q))
    C = jax.scipy.linalg.solve_triangular(L, A_v.T, lower=True).T
    atol = default_rtol(C.dtype) if atol is None else atol
    if int(rank(C, rtol, atol)) < A_v.shape[0]:
        return None
    return 3 if G.shape[0] > 0 else 2


class SingularSearch(eqx.Module):
    r"""Result of [`cdiff.analysis.singular_configurations`][]: configurations `q`
    (one per starting guess), the unit vectors `w` with $G^Tw \approx 0$, the
    residuals $\|[\Phi(q); G^T(q)w]\|$ and `found`, where the residual is below
    the tolerance (a singular configuration on the constraint manifold)."""

    q: Float[Array, "s n"]
    w: Float[Array, "s m"]
    residual: Float[Array, " s"]
    found: Array


def singular_configurations(
    model: AbstractModel, guesses, t=0.0, *, iterations=60, tol=1e-9
) -> SingularSearch:
    r"""Search for singular configurations on the constraint manifold: points
    where $\Phi(q) = 0$ and $G^T(q)\,w = 0$ for a unit $w$ (Proposition 1, eq. 45:
    the reduction index matrix is singular there).

    From each row of `guesses` (shape `(s, n)`), damped Gauss-Newton
    (Levenberg-Marquardt, a fixed number of `iterations`, vmapped over the
    guesses) on $F(q, w) = [\Phi(q);\ G^T(q)w;\ (w^Tw - 1)/2]$, with $w$ started
    at the left singular vector of the smallest singular value of $G$. `found`
    marks the converged ones (residual below `tol`); the others are regular
    local minima of $\|F\|$ and are not singular configurations.
    """
    guesses = jnp.atleast_2d(jnp.asarray(guesses))
    t = jnp.asarray(t, guesses.dtype)
    _holonomic_rows("singular_configurations", model, t, guesses[0])

    def residual(x, m):
        q, w = x[:-m], x[-m:]
        phi, G = holonomic_jacobian(model, t, q)
        return jnp.concatenate([phi, G.T @ w, 0.5 * (w @ w - 1)[None]])

    def solve(q0):
        phi, G = holonomic_jacobian(model, t, q0)
        m = phi.shape[0]
        w0 = jnp.linalg.svd(G)[0][:, -1]
        x0 = jnp.concatenate([q0, w0])

        def step(_, x):
            r = residual(x, m)
            J = jax.jacfwd(residual)(x, m)
            # Levenberg-Marquardt, damped by the squared residual (Gauss-Newton's
            # quadratic convergence near a zero-residual solution).
            JtJ = J.T @ J
            mu = jnp.sum(r**2) + jnp.finfo(J.dtype).eps * jnp.trace(JtJ)
            JtJ = JtJ + mu * jnp.eye(J.shape[1], dtype=J.dtype)
            return x - jax.scipy.linalg.solve(JtJ, J.T @ r, assume_a="pos")

        x = jax.lax.fori_loop(0, iterations, step, x0)
        return x[:-m], x[-m:], jnp.linalg.norm(residual(x, m))

    q, w, res = jax.vmap(solve)(guesses)
    return SingularSearch(q, w, res, res < tol)
