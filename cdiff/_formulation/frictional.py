r"""Coulomb friction on the held unilateral rows, around any formulation.

A held row that slips is pushed by $-\mu\lambda_N W^T\hat s$, a force that
depends on the row's own normal multiplier $\lambda_N$. A formulation's
accelerations and multipliers are affine in the applied forces, so with the
normal multipliers $p$ that the friction force reads (`WithUnilateral.push`),
the multipliers it returns are $\lambda_N(p) = \lambda_N(0) + \Lambda p$. The
friction force is consistent where $p = \lambda_N(p)$ on the rows that slip:
$(I - \Lambda_{SS})\,p_S = \lambda_N(0)_S$, one linear solve of the size of the
slipping rows, with the dynamics at no push and $\Lambda$ from their tangents
along each row's push (forward mode, by `vmap`). The dynamics at $p$ are then the
value plus the tangents' combination with $p$: the formulation is evaluated once,
not again.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from .._model import AbstractModel
from .._results import error_if
from .base import AbstractFormulation, Context, Dynamics


def _normal_rows(model, t, q) -> slice:
    """Where the held rows' multipliers sit among a `WithUnilateral`'s: after
    the wrapped model's holonomic rows."""
    m = jax.eval_shape(model.model.holonomic, t, q).shape[0]
    return slice(m, m + model.active.shape[0])


PAINLEVE = (
    "cdiff: Painleve's paradox at a state the solve reached: a sliding contact's "
    "friction takes away more of its normal force than the contact is pushed with "
    "(1 - d lambda_N / d p <= 0), so that no normal force is consistent with "
    "Coulomb's law, or several are. The friction coefficient is above this "
    "contact's critical value here; a smaller one, or a compliant contact, has a "
    "solution.")


def _plus(x, push, tangents):
    """`x` moved by `push` along its `tangents` (one per row, stacked first); `x`
    where it has none (integers)."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return x
    return x + jnp.tensordot(push, tangents, 1)


class Frictional(AbstractFormulation):
    """`formulation` for a model with Coulomb friction (a `WithUnilateral` with
    `stuck`, `sliding` and `push`): its dynamics with the normal multipliers of
    the slipping rows solved together with the friction force they carry (see
    the module); every other method is `formulation`'s. Built by `Problem.build`
    where the model has friction."""

    formulation: AbstractFormulation

    @property
    def stepwise(self) -> bool:  # pyright: ignore
        return self.formulation.stepwise

    @property
    def freezes_from_terms(self) -> bool:  # pyright: ignore
        return self.formulation.freezes_from_terms

    @property
    def supports_unilateral(self) -> bool:  # pyright: ignore
        return self.formulation.supports_unilateral

    @property
    def state_feedback(self) -> bool:  # pyright: ignore
        return self.formulation.state_feedback

    @property
    def corrects_energy(self) -> bool:
        return self.formulation.corrects_energy

    def _affine(self, t, y, context: Context, evaluate):
        r"""`evaluate(context)` at no push and its tangents along each row's push,
        the matrix $I - \Lambda_{SS}$ (identity outside the slipping rows), the
        right-hand side $\lambda_N(0)_S$, and whether Painleve's paradox holds."""
        model = context.model
        q = self.formulation.coordinates(t, y, context)[0]
        rows = _normal_rows(model, t, q)

        def at(push):
            return evaluate(eqx.tree_at(lambda c: c.model.push, context, push))

        zero = jnp.zeros_like(model.push)
        eye = jnp.eye(zero.shape[0], dtype=zero.dtype)
        # The dynamics at no push and their change per unit of push on each row
        # (one tangent per row, by `vmap`): affine in the push, so these give
        # the dynamics at any push without evaluating the formulation again.
        out, tangents = jax.vmap(lambda e: jax.jvp(at, (zero,), (e,)),
                                 out_axes=(None, 0))(eye)
        lam0 = out[0].multipliers[rows]
        # (Column j: the normal multipliers' change per unit of push on row j.)
        columns = tangents[0].multipliers[:, rows]
        slipping = model.slipping
        both = slipping[:, None] & slipping[None, :]
        matrix = eye - jnp.where(both, columns.T, 0.0)
        # Painleve: a sliding row whose friction takes away more normal force than
        # it is pushed with (1 - d lambda_N / d p <= 0) has no consistent normal
        # force, or several: Coulomb's law has no unique solution there.
        paradox = jnp.any(slipping & (jnp.diagonal(matrix) <= 0))
        return out, tangents, matrix, jnp.where(slipping, lam0, 0.0), paradox

    def _solved(self, t, y, context: Context, evaluate):
        """`evaluate(context)`, `(Dynamics, rest)`, with the friction force of the
        slipping rows at their own normal multipliers."""
        out, tangents, matrix, rhs, paradox = self._affine(t, y, context, evaluate)
        matrix = error_if(matrix, paradox, PAINLEVE, throw=context.throw)
        push = jnp.linalg.solve(matrix, rhs)
        return jax.tree.map(lambda x, dx: _plus(x, push, dx), out, tangents)

    def paradox(self, t, y, context: Context, dt):
        """Whether Painleve's paradox holds at `(t, y)` (the dynamics with the
        per-step data of a step `dt` from there): where a solve that stopped
        reads it, to name it (`RESULTS.painleve`)."""
        context = dataclasses.replace(context, throw=False)
        return self._affine(t, y, context, lambda c: (
            self.formulation.dynamics_and_freeze(t, y, c, None, dt, True)))[-1]

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        return self._solved(t, y, context, lambda c: (
            self.formulation.dynamics(t, y, c, frozen), None))[0]

    def vector_field_and_freeze(self, t, y, context: Context, frozen, dt, first):
        dyn, frozen = self.dynamics_and_freeze(t, y, context, frozen, dt, first)
        return dyn.rate, frozen

    def dynamics_and_freeze(self, t, y, context: Context, frozen, dt, first,
                            terms=None):
        # (The caller's terms carry no friction force: the wrapped formulation
        # evaluates its own, at each push.)
        del terms
        return self._solved(t, y, context, lambda c: self.formulation.dynamics_and_freeze(
            t, y, c, frozen, dt, first))

    def freeze(self, t0, t1, y0, context: Context) -> PyTree:
        return self.formulation.freeze(t0, t1, y0, context)

    def bind(self, model: AbstractModel, t0, q0, v0) -> AbstractFormulation:
        return Frictional(self.formulation.bind(model, t0, q0, v0))

    def prepare(self, model: AbstractModel, t0, q0, v0) -> PyTree:
        return self.formulation.prepare(model, t0, q0, v0)

    def init_state(self, t0, q0, v0, context: Context) -> PyTree:
        return self.formulation.init_state(t0, q0, v0, context)

    def coordinates(self, t, y, context: Context):
        return self.formulation.coordinates(t, y, context)

    def project(self, t, y, context: Context, projection) -> PyTree:
        return self.formulation.project(t, y, context, projection)

    def end_step(self, t, y, context: Context) -> PyTree:
        return self.formulation.end_step(t, y, context)

    def restart(self, t, q, v, context: Context) -> PyTree:
        return self.formulation.restart(t, q, v, context)
