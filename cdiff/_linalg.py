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

The damping is $\epsilon = \text{rtol}^2\,\|C\|_F^2 + \delta$: `rtol` is the
relative singular-value threshold (default $10\sqrt{\varepsilon_{mach}}$: 1.5e-7 in
float64, 3.5e-3 in float32, large enough that the Cholesky of the damped Gram
matrix never fails in floating point) and $\delta$ (`damping`) an absolute
threshold squared, in the units of $CC^T$, needed for a single row that can
vanish, where a relative threshold does nothing. One Cholesky of a `k x k` matrix (`k` rows)
serves every solve with the same $C$, and no SVD is needed, which keeps small
batched problems fast on CPU and GPU.

**Small matrices are unrolled.** [`cholesky`][], [`solve_triangular`][] and
[`cho_solve`][] write out the factorisation and the substitutions entry by entry
for matrices up to `UNROLL` (12) rows. Under `jax.vmap` every entry becomes one
elementwise operation over the whole batch, which XLA fuses with the rest of the
vector field; LAPACK (CPU) and cuSOLVER (GPU) would instead be called once per
matrix of the batch, and for 5 x 5 matrices the call costs more than the
arithmetic. Larger matrices go to `jax.numpy.linalg`, and their products
([`gram`][], [`matvec`][]) to `dot` (BLAS), which is then cheaper than products
and sums (`benchmarks/mid_size.py`).

**Products, not chained substitutions.** XLA's CPU compiler fuses a substitution
with several right-hand sides (or two substitutions in a row) into one loop that
recomputes the earlier rows for every later entry. So [`MassFactor`][] keeps the
inverse factor $L^{-1}$ (computed with $L$, `n x n` once per evaluation) and applies
every map as a product and a sum, like [`gram`][]; R2's simulation ran 1.1 times
faster and its gradient 1.15 times.

**Derivatives by matrix formulas.** The unrolled kernels are differentiated by
their matrix derivatives, not entry by entry: the Cholesky factor by $dL =
L\,\Phi(X)$ with $X = L^{-1}\,dA\,L^{-T}$ and $\Phi$ the lower triangle with
half the diagonal (and the inverse factor by $d(L^{-1}) = -\Phi(X)\,L^{-1}$), a
substitution as a linear solve, and [`PseudoInverse.multipliers`][] as the linear
solve it is, in $C$ and $r$ with the factor at hand (reverse mode never transposes
the Gram matrix's factorisation). Products in these rules are products and sums.
Gradients are then faster than through a substitution-based Cholesky derivative
and the factorisation (`benchmarks/gradients.py`).
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array, Float


#: Matrices with at most this many rows are factorised and solved unrolled.
UNROLL = 12

def gram(C: Float[Array, "k n"]) -> Float[Array, "k k"]:
    """`C C^T` as a product and a sum, which XLA fuses with its neighbours: a batched
    `dot` of small matrices costs a library call per matrix on CPU. Above `UNROLL`
    rows, a `dot`."""
    if C.shape[0] > UNROLL:
        return C @ C.T
    return jnp.sum(C[:, None, :] * C[None, :, :], axis=-1)


def matvec(A: Float[Array, "k n"], x: Float[Array, " n"]) -> Float[Array, " k"]:
    """`A x` as a product and a sum (see [`gram`][])."""
    if A.shape[0] > UNROLL:
        return A @ x
    return jnp.sum(A * x, axis=-1)


def _matmul(A, x):
    """`A x` for `x` of shape `(n,)` or `(n, r)`, as products and sums (see [`gram`][])."""
    if x.ndim == 1:
        return matvec(A, x)
    return jnp.sum(A[:, :, None] * x[None, :, :], axis=1)


def cholesky(A: Float[Array, "n n"]) -> Float[Array, "n n"]:
    r"""Lower Cholesky factor `L` of a symmetric positive definite `A = L L^T`
    (only the lower triangle of `A` is read). NaN where `A` is not positive
    definite, as `jnp.linalg.cholesky`. Differentiated by the matrix formula
    $dL = L\,\Phi(L^{-1}\,dA\,L^{-T})$ ($\Phi$: the lower triangle with half the
    diagonal), not through the unrolled factorisation."""
    n = A.shape[-1]
    if n > UNROLL:
        return jnp.linalg.cholesky(A)
    return _cholesky_jit(A)


def _entries(A):
    """The entries of a small matrix as a nested list of shape-`(1,)` arrays, split
    off in one `lax.split` (tracing cost matters: these kernels are traced entry by
    entry, and a slice and a squeeze per entry made up a third of a simulation's
    program)."""
    n, m = A.shape
    flat = jax.lax.split(jax.lax.reshape(A, (n * m,)), [1] * (n * m))
    return [flat[i * m:(i + 1) * m] for i in range(n)]


def _stack(values, shape):
    """`values` (equal-shaped arrays with a leading axis of 1) concatenated along
    that axis and reshaped to `shape`."""
    return jax.lax.reshape(jax.lax.concatenate(list(values), 0), shape)


@jax.custom_jvp
def _cholesky(A):
    n = A.shape[-1]
    a = _entries(A)
    zero = jnp.zeros((1,), A.dtype)
    one = jnp.ones((1,), A.dtype)
    nan = jnp.full((1,), jnp.nan, A.dtype)
    mul, sub = jax.lax.mul, jax.lax.sub
    L = [[zero] * n for _ in range(n)]
    for j in range(n):
        s = a[j][j]
        for k in range(j):
            s = sub(s, mul(L[j][k], L[j][k]))
        # A non-positive pivot gives NaN (as LAPACK's failure does), never 0 or inf.
        pos = jax.lax.gt(s, zero)
        d = jax.lax.select(pos, jax.lax.sqrt(jax.lax.select(pos, s, one)), nan)
        L[j][j] = d
        inv = jax.lax.div(one, d)
        for i in range(j + 1, n):
            s = a[i][j]
            for k in range(j):
                s = sub(s, mul(L[i][k], L[j][k]))
            L[i][j] = mul(s, inv)
    return _stack([x for row in L for x in row], (n, n))


@_cholesky.defjvp
def _cholesky_jvp(primals, tangents):
    (A,), (dA,) = primals, tangents
    L, Linv = _factor_and_inverse_jit(A)
    return L, _matmul(L, _factor_tangent(Linv, dA))


def _factor_tangent(Linv, dA):
    r"""$\Phi(L^{-1}\,dA\,L^{-T})$, with which $dL = L\Phi$ and $d(L^{-1}) = -\Phi
    L^{-1}$; through the inverse factor and products (two chained substitutions
    would be fused into one loop that recomputes the first for every entry of the
    second)."""
    dA = jnp.tril(dA) + jnp.tril(dA, -1).T  # the lower triangle is what is read
    X = _matmul(_matmul(Linv, dA), Linv.T)
    return jnp.tril(X) - 0.5 * jnp.diag(jnp.diag(X))


@jax.custom_jvp
def _factor_and_inverse(A):
    L = _cholesky(A)
    return L, _substitute(L, jnp.eye(A.shape[-1], dtype=A.dtype), True)


@_factor_and_inverse.defjvp
def _factor_and_inverse_jvp(primals, tangents):
    (A,), (dA,) = primals, tangents
    L, Linv = _factor_and_inverse_jit(A)
    phi = _factor_tangent(Linv, dA)
    return (L, Linv), (_matmul(L, phi), -_matmul(phi, Linv))


def _substitute(T, b, forward: bool):
    """`T^{-1} b` for triangular `T` (lower when `forward`), written entry by entry."""
    n = T.shape[-1]
    t = _entries(T)
    rows = jax.lax.split(b, [1] * n)  # shape (1,) or (1, r) each
    shape = rows[0].shape

    def coeff(i, k):
        if len(shape) == 1:
            return t[i][k]
        return jax.lax.broadcast_in_dim(t[i][k], shape, (0,))

    x = [None] * n
    for i in range(n) if forward else range(n - 1, -1, -1):
        s = rows[i]
        for k in range(i) if forward else range(i + 1, n):
            s = jax.lax.sub(s, jax.lax.mul(coeff(i, k), x[k]))
        x[i] = jax.lax.div(s, coeff(i, i))
    return _stack(x, b.shape)


def solve_triangular(
    L: Float[Array, "n n"], b, *, lower: bool = True, trans: bool = False
):
    r"""`L^{-1} b` (or `L^{-T} b` with `trans`) for a triangular `L` and `b` of shape
    `(n,)` or `(n, r)`, by substitution (`lower=False`: `L` is upper triangular).
    Differentiated as a linear solve, $dx = T^{-1}(db - dT\,x)$, not through the
    unrolled substitution."""
    n = L.shape[-1]
    if n > UNROLL or n == 0:
        return jsl.solve_triangular(L, b, lower=lower, trans="T" if trans else "N")
    # T x = b with T = L or L^T; T lower triangular: forward substitution.
    return _solve_jit(L.T if trans else L, b, lower != trans)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _solve(T, b, forward: bool):
    return _substitute(T, b, forward)


@_solve.defjvp
def _solve_jvp(forward, primals, tangents):
    (T, b), (dT, db) = primals, tangents
    x = _solve(T, b, forward)
    return x, _substitute(T, db - _matmul(dT, x), forward)


# Each kernel is traced once per shape and dtype and enters a program as one call,
# which XLA inlines before fusing: tracing and lowering the unrolled entries at
# every call site costs more than compiling them.
_cholesky_jit = jax.jit(_cholesky)
_factor_and_inverse_jit = jax.jit(_factor_and_inverse)
_solve_jit = jax.jit(_solve, static_argnums=2)


def cho_solve(L: Float[Array, "n n"], b):
    """`A^{-1} b` from the lower Cholesky factor `L` of `A`."""
    return solve_triangular(L, solve_triangular(L, b), trans=True)


def default_rtol(dtype) -> float:
    """The default relative singular-value threshold for `dtype`."""
    return 10.0 * float(jnp.finfo(dtype).eps) ** 0.5


class MassFactor(eqx.Module):
    r"""Cholesky factor of a symmetric positive definite mass matrix, `M = L L^T`.

    Up to `UNROLL` rows it also holds the inverse factor $L^{-1}$, and every map
    below is a product with it: products and sums run in parallel in one fused
    loop, where XLA's CPU compiler fuses a substitution with several right-hand
    sides into a loop that recomputes the earlier rows for every later one (R2's
    weighted constraint matrix was the most expensive operation of its gradient)."""

    L: Float[Array, "n n"]
    Linv: Float[Array, "n n"] | None

    def __init__(self, M: Float[Array, "n n"]):
        if M.shape[-1] > UNROLL:
            self.L, self.Linv = cholesky(M), None
        else:
            self.L, self.Linv = _factor_and_inverse_jit(M)

    @property
    def ok(self):
        """False where `M` was not positive definite (the factor is NaN)."""
        return jnp.all(jnp.isfinite(self.L))

    def weight(self, A: Float[Array, "k n"]) -> Float[Array, "k n"]:
        r"""$C = A R^{-1} = A L^{-T}$."""
        if A.shape[0] == 0:
            return A
        if self.Linv is None:
            return solve_triangular(self.L, A.T).T
        return jnp.sum(A[:, None, :] * self.Linv[None, :, :], axis=-1)

    def unweight(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$R^{-1}x = L^{-T}x$."""
        if self.Linv is None:
            return solve_triangular(self.L, x, trans=True)
        return matvec(self.Linv.T, x)

    def solve(self, f: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$M^{-1}f$."""
        if self.Linv is None:
            return cho_solve(self.L, f)
        return self.unweight(self.transpose_unweight(f))

    def transpose_unweight(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$R^{-T}x = L^{-1}x$."""
        if self.Linv is None:
            return solve_triangular(self.L, x)
        return matvec(self.Linv, x)

    def times_R_transpose(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$R^T x = L x$."""
        return matvec(self.L, x)


class PseudoInverse(eqx.Module):
    r"""Smooth, factorised pseudoinverse of $C$ (`k x n`), see the module docs.

    [`multipliers`][] (and so [`solve`][]) is differentiated as the linear solve it
    is, through the Gram matrix $G = CC^T$ and the factor at hand, $d\lambda_0 =
    (G + \epsilon I)^{-1}(dr - dG\,\lambda_0)$ and the same for the refinement
    step, with the damping $\epsilon$ held fixed as in the solve: reverse mode then
    never transposes the Cholesky factorisation.
    """

    C: Float[Array, "k n"]
    chol: Float[Array, "k k"]  # Cholesky factor of C C^T + eps I
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
        self.chol = cholesky(gram(C) + eps * jnp.eye(k, dtype=C.dtype))

    def multipliers(self, r: Float[Array, " k"]) -> Float[Array, " k"]:
        r"""$\lambda \approx (CC^T)^+ r$ such that $C^+ r = C^T \lambda$."""
        if self.C.shape[0] == 0:
            return r
        return _damped_solve(self.C, self.chol, r, self.refine)

    def solve(self, r: Float[Array, " k"]) -> Float[Array, " n"]:
        r"""$C^+ r$: the minimum-norm least-squares solution of $Cx = r$."""
        if self.C.shape[0] == 0:
            return jnp.zeros(self.C.shape[1], dtype=self.C.dtype)
        return matvec(self.C.T, self.multipliers(r))

    def null_project(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$N x = (I - C^+C)x$: the component of `x` tangent to the constraints."""
        return x - self.solve(matvec(self.C, x))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _damped_solve(C, chol, r, refine: bool):
    r"""$(CC^T + \epsilon I)^{-1}r$ from its factor `chol`, with one step of iterative
    refinement against $CC^T$ when `refine`. Differentiated in `C` and `r` with
    $\epsilon$ fixed (the tangent of `chol`, a function of `C`, is not read)."""
    lam = cho_solve(chol, r)
    if refine:  # the residual through C, not a formed C C^T: more accurate near rank loss
        lam = lam + cho_solve(chol, r - _gram_times(C, lam))
    return lam


def _gram_times(C, x):
    """`C C^T x`."""
    return matvec(C, matvec(C.T, x))


@functools.partial(_damped_solve.defjvp, symbolic_zeros=True)
def _damped_solve_jvp(refine, primals, tangents):
    (C, chol, r), (dC, _, dr) = primals, tangents
    if isinstance(dr, SymbolicZero):
        dr = jnp.zeros_like(r)

    def minus_dG(x, lam):  # x - dG lam with dG = dC C^T + C dC^T
        if isinstance(dC, SymbolicZero):
            return x
        return x - matvec(dC, matvec(C.T, lam)) - matvec(C, matvec(dC.T, lam))

    lam0 = cho_solve(chol, r)
    dlam0 = cho_solve(chol, minus_dG(dr, lam0))
    if not refine:
        return lam0, dlam0
    lam = lam0 + cho_solve(chol, r - _gram_times(C, lam0))
    # d(lam0 + (G + eps I)^-1 (r - G lam0)) = dlam0 + (G + eps I)^-1 (dr - dG lam - G dlam0)
    return lam, dlam0 + cho_solve(chol, minus_dG(dr, lam) - _gram_times(C, dlam0))
