"""The mass matrix at a state, factorised and checked: symmetric positive definite
(a run-time check at every state a solver reaches)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ._kinematics import ImpactTerms, Terms
from ._linalg import UNROLL, MassFactor
from ._model import AbstractModel
from ._results import error_if


def is_symmetric(M) -> Array:
    """Whether `M` is symmetric to round-off (relative sqrt(eps)): factorisations
    read one triangle only, so a non-symmetric matrix would be taken silently for
    another."""
    n = M.shape[-1]
    if n > UNROLL:
        # Larger matrices by a bilinear test, u^T M w = w^T M u for two fixed
        # irregular vectors, relative to the size of the terms: three products
        # where the entrywise test reads M's transpose, which dominates for
        # large M. Fails only if M - M^T is orthogonal to u w^T.
        i = jnp.arange(n, dtype=M.dtype)
        u, w = jnp.sin(1.0 + 0.7 * i), jnp.cos(0.3 + 1.3 * i)
        scale = jnp.abs(u) @ (jnp.abs(M) @ jnp.abs(w))
        tol = jnp.sqrt(jnp.finfo(M.dtype).eps) * scale
        return jnp.abs(u @ (M @ w) - w @ (M @ u)) <= tol
    tol = jnp.sqrt(jnp.finfo(M.dtype).eps) * jnp.abs(M).max()
    return jnp.all(jnp.abs(M - M.T) <= tol)


def checked_mass(model: AbstractModel, t, q,
                 terms: Terms | ImpactTerms | None = None, *,
                 throw: bool = True) -> tuple[Array, MassFactor]:
    """The mass matrix and its Cholesky factor, both carrying a run-time check that
    the matrix is symmetric positive definite (`eqx.error_if`: the check runs
    where either output is used). `terms`: the model's terms at `(t, q)`, when
    already at hand. `throw`: whether a failed check raises, or turns the outputs
    into NaN (see `Context.throw`)."""
    M = (model.terms(t, q) if terms is None else terms).mass_matrix
    mf = MassFactor(M)
    M, L, Linv = error_if(
        (M, mf.L, mf.Linv),
        ~(mf.ok & is_symmetric(M)),
        f"cdiff: {type(model).__name__}.mass_matrix(t, q) is not symmetric positive "
        "definite (not symmetric, or its Cholesky factorisation failed) at a state "
        "reached by the solver.",
        throw=throw,
    )
    return M, eqx.tree_at(lambda m: (m.L, m.Linv), mf, (L, Linv),
                          is_leaf=lambda x: x is None)


def mass_factor(model: AbstractModel, t, q, *, throw: bool = True) -> MassFactor:
    """Cholesky factor of the mass matrix, with the run-time check of
    [`checked_mass`][]."""
    return checked_mass(model, t, q, throw=throw)[1]
