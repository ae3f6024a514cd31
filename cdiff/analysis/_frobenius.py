r"""How many Pfaffian constraints are holonomic: the Frobenius test.

Yun & Sarkar, Remark 1: for $m$ constraints $B(q)\dot q = 0$ on $n$ coordinates,
let $\Delta$ be the distribution spanned by the null space of $B$ and $\Delta^*$
its involutive closure (the smallest involutive distribution containing it,
obtained by adding Lie brackets until the dimension stops growing). Then
$n - \dim\Delta^*$ of the constraints are holonomic (integrable) and the other
$m - (n - \dim\Delta^*)$ are nonholonomic.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._kinematics import velocity_constraints, velocity_size
from .._linalg import PseudoInverse, default_rtol
from .._model import AbstractModel
from ._constraints import rank


class Involutivity(eqx.Module):
    """Result of [`cdiff.analysis.frobenius`][]: the numbers of constraints, of
    holonomic and nonholonomic ones, and the dimensions of the distribution and of
    its involutive closure at the configuration tested."""

    constraints: int = eqx.field(static=True)
    holonomic: int = eqx.field(static=True)
    nonholonomic: int = eqx.field(static=True)
    dim_distribution: int = eqx.field(static=True)
    dim_closure: int = eqx.field(static=True)


def _lie_bracket(f, g):
    r"""$[f, g](q) = Dg(q)f(q) - Df(q)g(q)$, by forward-mode autodiff."""

    def bracket(q):
        return jax.jvp(g, (q,), (f(q),))[1] - jax.jvp(f, (q,), (g(q),))[1]

    return bracket


def _dim(vectors, rtol) -> int:
    """The dimension spanned by `vectors` (numerical rank)."""
    return int(rank(jnp.stack(vectors), rtol))


def frobenius(model: AbstractModel, q, t=0.0, *, rtol=None) -> Involutivity:
    r"""Classify the model's velocity constraints at configuration `q` as holonomic
    or nonholonomic (Yun & Sarkar, Remark 1).

    The constraint rows are $B(q) = \partial\Phi_v/\partial v$ (the model's
    `nonholonomic` residuals, which must be Pfaffian, $B(q)\dot q = 0$) stacked
    below the velocity form $G(q)\dot q = 0$ of its `holonomic` ones, so a
    holonomic constraint written at velocity level is recognised too. The
    distribution is spanned by the smooth fields $P(q)e_i$ with $P = I - B^+B$;
    Lie brackets (by `jax.jvp`) of the independent fields are added level by level
    until the dimension at `q` stops growing. Take a generic `q` (the classification
    is local: at special points distributions can drop rank).

    Ranks use singular values above `rtol` (default $10^4\sqrt{\varepsilon}$,
    looser than elsewhere: brackets of brackets accumulate round-off) times the
    largest. Outside `jit`.
    """
    q = jnp.asarray(q)
    t = jnp.asarray(t, q.dtype)
    n = velocity_size(model, q)  # the dimension of the configuration space
    rtol = 1e3 * default_rtol(q.dtype) if rtol is None else rtol

    def rows(q):  # [G; B]: the velocity constraints' Jacobian in v (at v = 0)
        return velocity_constraints(model, t, q, jnp.zeros(n, q.dtype))[1]

    m = rows(q).shape[0]

    def field(i):
        # The admissible velocity P e_i as a vector field on the coordinates.
        def f(q):
            w = PseudoInverse(rows(q)).null_project(jnp.eye(n, dtype=q.dtype)[i])
            return model.position_rate(t, q, w)

        return f

    fields = [field(i) for i in range(n)]
    dim_distribution = _dim([f(q) for f in fields], rtol)
    # Keep a basis of independent fields at q (greedy), then bracket level by level.
    basis = []
    for f in fields:
        if _dim([g(q) for g in basis + [f]], rtol) > len(basis):
            basis.append(f)
    level = list(basis)
    while len(basis) < n and level:
        new = []
        for f in level:
            for g in basis:
                h = _lie_bracket(f, g)
                if _dim([b(q) for b in basis + [h]], rtol) > len(basis):
                    basis.append(h)
                    new.append(h)
                if len(basis) == n:
                    break
            if len(basis) == n:
                break
        level = new
    dim_closure = len(basis)
    holonomic = n - dim_closure
    return Involutivity(m, holonomic, m - holonomic, dim_distribution, dim_closure)
