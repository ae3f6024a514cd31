r"""The linear algebra every formulation shares.

Two kernels:

* [`MassFactor`][]: the Cholesky factor $M = R^T R$ (stored as $L = R^T$), used to
  weight constraint matrices, $C = A R^{-1}$, and to map weighted quantities
  back, $R^{-1}x$.
* [`PseudoInverse`][]: a factorised, smooth pseudoinverse of a short, wide matrix
  $C$ (rows are constraints) for batched small problems.

**The pseudoinverse and its tolerance.** $C^+ r$ is computed as
$C^T\lambda$ with $(CC^T + \epsilon I)\lambda = r$ solved by Cholesky and one
step of iterative refinement ("iterated Tikhonov"). In terms of the singular
values $\sigma_i$ of $C$, the exact pseudoinverse multiplies the $i$-th
component by $1/\sigma_i$; this one multiplies it by
$f(\sigma_i)/\sigma_i$ with the filter
$f(\sigma) = 1 - (\epsilon / (\sigma^2 + \epsilon))^2$. So

* singular values well above $\sqrt\epsilon$ are inverted exactly (relative
  error $(\epsilon/\sigma^2)^2$),
* singular values well below $\sqrt\epsilon$ are suppressed: the gain
  $f(\sigma)/\sigma \approx 2\sigma/\epsilon$ vanishes with $\sigma$, as a
  rank-revealing cut-off would drop the direction. It is not exactly zero: a
  direction whose singular value is zero only up to round-off
  ($\sigma \approx \varepsilon_{mach}\|C\|$, e.g. a duplicated constraint row)
  passes a fraction $2\varepsilon_{mach}/\text{rtol}^2 \approx 1\%$ of the part
  of $r$ that is inconsistent with it, so for rank-deficient $C$ and $r \notin
  \operatorname{range}(C)$ the result differs from the exact least-squares
  solution at the 1e-3 level (for consistent $r$, as from redundant but
  compatible constraints, it agrees to round-off),
* (with `refine=False` the plain Tikhonov filter $\sigma^2/(\sigma^2 + \epsilon)$,
  as the regularised constraint force of [`cdiff.Regularized`][] prescribes),
* and the transition is smooth, so the result and its derivatives stay finite and
  continuous when the rank changes: redundant constraints, kinematic
  singularities, a vanishing energy row at rest.

The damping is $\epsilon = \text{rtol}^2\,\|C\|_F^2 + \delta$: `rtol`
is the relative singular-value threshold (default $10\sqrt{\varepsilon_{mach}}$:
1.5e-7 in float64, 3.5e-3 in float32, large enough that the Cholesky of the
damped Gram matrix never fails in floating point) and
threshold (the `damping` $\delta$, an absolute threshold squared, in the units of
$CC^T$; needed for a single row that can vanish, where a relative threshold does
nothing). One Cholesky of a `k x k` matrix (`k` rows)
serves every solve with the same $C$, and no SVD is needed, which keeps small
batched problems fast on CPU and GPU.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jaxtyping import Array, Float


def default_rtol(dtype) -> float:
    """The default relative singular-value threshold for `dtype`."""
    return 10.0 * float(jnp.finfo(dtype).eps) ** 0.5


class MassFactor(eqx.Module):
    """Cholesky factor of a symmetric positive definite mass matrix, `M = L L^T`."""

    L: Float[Array, "n n"]

    def __init__(self, M: Float[Array, "n n"]):
        self.L = jnp.linalg.cholesky(M)

    @property
    def ok(self):
        """False where `M` was not positive definite (the factor is NaN)."""
        return jnp.all(jnp.isfinite(self.L))

    def weight(self, A: Float[Array, "k n"]) -> Float[Array, "k n"]:
        r"""$C = A R^{-1} = A L^{-T}$."""
        if A.shape[0] == 0:
            return A
        return jsl.solve_triangular(self.L, A.T, lower=True).T

    def unweight(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$R^{-1}x = L^{-T}x$."""
        return jsl.solve_triangular(self.L, x, lower=True, trans="T")

    def solve(self, f: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$M^{-1}f$."""
        return self.unweight(jsl.solve_triangular(self.L, f, lower=True))

    def transpose_unweight(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$R^{-T}x = L^{-1}x$."""
        return jsl.solve_triangular(self.L, x, lower=True)

    def times_R_transpose(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$R^T x = L x$."""
        return self.L @ x


class PseudoInverse(eqx.Module):
    r"""Smooth, factorised pseudoinverse of $C$ (`k x n`), see the module docs."""

    C: Float[Array, "k n"]
    chol: Float[Array, "k k"]
    refine: bool = eqx.field(static=True)

    def __init__(
        self,
        C: Float[Array, "k n"],
        rtol: float | None = None,
        damping=0.0,
        refine: bool = True,
    ):
        if rtol is None:
            rtol = default_rtol(C.dtype)
        self.C = C
        self.refine = refine
        k = C.shape[0]
        if k == 0:
            self.chol = jnp.zeros((0, 0), dtype=C.dtype)
            return
        tiny = jnp.finfo(C.dtype).eps ** 2
        eps = jax.lax.stop_gradient(
            rtol**2 * jnp.sum(C**2) + jnp.asarray(damping, C.dtype) + tiny
        )
        G = C @ C.T + eps * jnp.eye(k, dtype=C.dtype)
        self.chol = jnp.linalg.cholesky(G)

    def _gram_solve(self, r):
        return jsl.cho_solve((self.chol, True), r)

    def multipliers(self, r: Float[Array, " k"]) -> Float[Array, " k"]:
        r"""$\lambda \approx (CC^T)^+ r$ such that $C^+ r = C^T \lambda$."""
        if self.C.shape[0] == 0:
            return r
        lam = self._gram_solve(r)
        if not self.refine:  # plain Tikhonov: (CC^T + eps I)^-1 r
            return lam
        # One step of iterative refinement against the undamped Gram matrix.
        return lam + self._gram_solve(r - self.C @ (self.C.T @ lam))

    def solve(self, r: Float[Array, " k"]) -> Float[Array, " n"]:
        r"""$C^+ r$: the minimum-norm least-squares solution of $Cx = r$."""
        if self.C.shape[0] == 0:
            return jnp.zeros(self.C.shape[1], dtype=self.C.dtype)
        return self.C.T @ self.multipliers(r)

    def null_project(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$N x = (I - C^+C)x$: the component of `x` tangent to the constraints."""
        return x - self.solve(self.C @ x)
