r"""Impacts on unilateral constraints $g(t, q) \ge 0$: Newton's law of restitution
as the projection of the velocity in the kinetic metric."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from ._kinematics import ImpactTerms, Kinematics, Terms, unilateral_jacobian
from ._linalg import PseudoInverse, matvec
from ._mass import checked_mass
from ._model import AbstractModel
from ._coulomb import (check_friction, coulomb_plastic, has_friction, slip_direction,
                       slip_jacobian)
from ._results import is_concrete


class Impact(eqx.Module):
    r"""The outcome of [`cdiff.impact`][]: the velocity after the impact `v`, the
    impulse on each unilateral row (non-negative: it pushes; zero on rows that took
    no part), the rows that took part, and `residual`, the largest amount by which
    `v` misses the conditions it was asked to meet (the equalities at velocity
    level and each row's rate after the impact): round-off, unless those
    conditions cannot hold together (a row that the equalities do not let move
    away, two rows that close on the body from both sides). With friction,
    `friction`: each row's tangential impulse, shape `(r, d)`, in the directions
    of the model's `slip` (its generalized impulse is $W_i^T\Lambda_{T,i}$);
    `None` without."""

    v: Float[Array, " nv"]
    impulse: Float[Array, " r"]
    rows: Bool[Array, " r"]
    residual: Float[Array, ""]
    friction: Float[Array, "r d"] | None = None


def restitution_outside(e):
    """Whether a restitution `e` (a scalar or one per row) is outside [0, 1] or
    NaN: a boolean scalar."""
    e = jnp.asarray(e)
    return ~jnp.all((e >= 0) & (e <= 1))


def check_restitution(e, rows: int, what: str) -> None:
    """Before tracing: a `ValueError` naming `what` (e.g. `Ball.restitution`) where
    `e` is neither a scalar nor one per row of `rows`, or, where concrete, outside
    [0, 1] or NaN (inside `jit` the solve's result code or `impact`'s run-time
    error says so)."""
    if jnp.shape(e) not in ((), (1,), (rows,)):
        raise ValueError(f"{what} has shape {jnp.shape(e)}; it must be a scalar or one "
                         f"coefficient per unilateral row: {rows} row(s).")
    # (NumPy: inside a trace, jax.numpy makes even constants traced.)
    if is_concrete(e) and not np.all((np.asarray(e) >= 0) & (np.asarray(e) <= 1)):
        raise ValueError(f"{what} must lie in [0, 1] (NaN is not allowed), got "
                         f"{np.asarray(e)}")


def unilateral_rate(model: AbstractModel, t, q, v):
    r"""`(g, gdot, G)`: the unilateral rows at `(t, q)`, their rate
    $\dot g = Gv + \partial g/\partial t$ and their velocity Jacobian $G$."""
    g, G, g_t = unilateral_jacobian(model, t, q)
    return g, matvec(G, v) + g_t, G


def impact(model: AbstractModel, t, q, v, hit=None, *, restitution=None,
           rtol: float | None = None, throw: bool = True) -> Impact:
    r"""The velocity after an impact on the unilateral rows of `model` at `(t, q)`,
    from the velocity `v` before it.

    Newton's law as a projection in the kinetic metric: $v^+$ is the velocity
    nearest to $v$, $\min\tfrac12(v^+ - v)^TM(v^+ - v)$, such that every equality
    constraint holds at velocity level, $[\dot\Phi_q; \Phi_v](v^+) = 0$, and every
    row $i$ that takes part leaves with $\dot g_i^+ = -e_i\,\dot g_i^-$ when it
    arrived ($\dot g_i^- < 0$), $\dot g_i^+ = 0$ otherwise. Then
    $M(v^+ - v) = A_v^T\mu + G^T\lambda$: $\lambda$, the impulses of the unilateral
    rows, is returned. The rates $\dot g^-$ are read from `v` made admissible
    first (projected onto the equalities in the same metric), so that an
    integrator's drift off them is not taken for an approach. With $e = 0$
    (plastic) and one row, the kinetic energy lost is
    $\tfrac12(\dot g^-)^2/(GM^{-1}G^T)$ (the equalities held); with $e = 1$ none.

    **Simultaneous impacts** are one projection. The rows that take part start as
    those in `hit` that arrive; a row whose impulse would pull ($\lambda_i < 0$)
    leaves the set, and a row in `hit` that the others' impulses would drive
    inwards joins it; the projection is repeated once per row (a fixed count, so
    that it composes with `jax.vmap` and `jax.grad`).

    **With friction** ([`cdiff.AbstractModel.friction`][]), the impact is
    Newton's law on the rows with a Coulomb tangential impulse: first the rows
    stop ($\dot g_i^+ = 0$) and stick ($s_i^+ = 0$) where the impulse that needs
    lies in the cone $\|\Lambda_{T,i}\| \le \mu_i\Lambda_{N,i}$, or slip with
    $\Lambda_{T,i} = -\mu_i\Lambda_{N,i}\hat s_i^+$ against their slip after the
    impact; then they leave at $-e_i\dot g_i^-$ by a normal impulse alone. The
    kinetic energy never grows (one row, or rows struck together with the same
    $e$); `Impact.friction` has the tangential impulses. Each row's stick or slip
    is decided on its own: exact for one contact.

    **Arguments:**

    - `model`, `t`, `q`, `v`: the model and the state at the impact.
    - `hit`: a boolean mask of the rows at contact (default: every row with
      $g_i \le 0$).
    - `restitution`: $e$, a scalar or one per row (default: `model.restitution`).
    - `rtol`: the relative singular-value threshold of the pseudoinverse
      (redundant rows, e.g. a limit that an equality already holds).
    - `throw`: whether a mass matrix that is not positive definite raises, or
      returns NaN (see [`cdiff.Context`][]).
    """
    e = model.restitution if restitution is None else restitution
    # (The rows' count, from their shape alone.)
    r = jax.eval_shape(model.unilateral, t, jnp.asarray(q)).shape[0]
    check_restitution(e, r, "cdiff.impact: the restitution")
    check_friction(model, r, t, q, v)
    law = impact_law(model, t, q, v, hit, rtol=rtol, throw=throw)
    out = law(e)
    if not is_concrete(e):
        bad = restitution_outside(e)
        if throw:
            out = eqx.error_if(out, bad, "cdiff.impact: the restitution must lie in "
                               "[0, 1] (NaN is not allowed).")
        else:  # (NaN, as for a mass matrix that is not positive definite)
            out = jax.tree.map(lambda x: jnp.where(bad, jnp.nan, x)
                               if jnp.issubdtype(x.dtype, jnp.inexact) else x, out)
    return out


def admissible_velocity(mf, v, r_v, A_v, rtol=None):
    """`v` projected onto the velocity constraints `A_v v' = A_v v - r_v` (the
    residual `r_v` removed) in the kinetic metric of the mass factor `mf`."""
    return v + mf.unweight(PseudoInverse(mf.weight(A_v), rtol).solve(-r_v))


def impact_law(model: AbstractModel, t, q, v, hit=None, *, rtol=None, throw=True,
               terms: ImpactTerms | None = None, friction: bool | None = None):
    """[`cdiff.impact`][] as a function of the restitution: the mass matrix, the
    constraints' Jacobians and the admissible velocity evaluated once, for
    several restitutions at the same state (the rest rule of an event).
    `terms`: the model's terms at `(t, q, v)`, where the caller has them;
    `friction`: whether the impact has friction, where the caller knows it
    before tracing (a solve's model holds its coefficients as traced arrays;
    default: `has_friction(model)`)."""
    q = jnp.asarray(q)
    v = jnp.asarray(v, q.dtype)
    if terms is None:
        terms = model.terms(t, q, v)  # (one evaluation for M and A_v)
    mf = checked_mass(model, t, q, terms, throw=throw)[1]
    r_v, A_v = terms.velocity_constraints
    k = A_v.shape[0]
    if k:
        # The velocity made admissible first (an integrator's drift off the
        # equalities is not part of the impact): Newton's law reads its rates.
        v = admissible_velocity(mf, v, r_v, A_v, rtol)
        r_v = jnp.zeros_like(r_v)
    g, gdot, G = unilateral_rate(model, t, q, v)
    if hit is None:
        hit = g <= 0
    hit = jnp.broadcast_to(jnp.asarray(hit, bool), g.shape)
    if friction is None:
        friction = has_friction(model)
    if friction:
        mu = jnp.broadcast_to(jnp.asarray(model.friction, q.dtype), g.shape)
        plastic = coulomb_plastic(mf, v, r_v, A_v, G, gdot, mu,
                                  *slip_jacobian(model, t, q, v), rtol=rtol)

    def law(restitution, rows=None) -> Impact:
        """The impact with `restitution`; `rows`: the rows that take part, where
        already known (one projection, the last of the iteration that found
        them)."""
        e = jnp.broadcast_to(jnp.asarray(restitution, q.dtype), g.shape)
        # The change of each row's rate Newton's law asks for.
        change = -jnp.where(gdot < 0, 1 + e, 1.0) * gdot

        def project(rows):
            A = jnp.concatenate([A_v, jnp.where(rows[:, None], G, 0.0)])
            pinv = PseudoInverse(mf.weight(A), rtol)
            asked = jnp.concatenate([-r_v, jnp.where(rows, change, 0.0)])
            lam = pinv.multipliers(asked)
            v_new = v + mf.unweight(matvec(pinv.C.T, lam))
            # (Zero to round-off where the conditions are consistent: a least-squares
            # compromise otherwise.)
            residual = jnp.max(jnp.abs(matvec(A, v_new - v) - asked), initial=0.0)
            return v_new, jnp.where(rows, lam[k:], 0.0), residual

        def update(_, rows):
            v_new, impulse, _ = project(rows)
            gdot_new = matvec(G, v_new - v) + gdot
            return (rows & (impulse >= 0)) | (hit & ~rows & (gdot_new < 0))

        if rows is None:
            # (A loop, not unrolled: one projection in the compiled program.)
            rows = jax.lax.fori_loop(0, g.shape[0], update, hit & (gdot < 0))
        if not friction:
            v_new, impulse, residual = project(rows)
            return Impact(v_new, impulse, rows, residual)
        # With friction: the plastic impact with Coulomb's law, then the
        # restitution without friction (see `coulomb_plastic`).
        v1, normal, tangential, residual1 = plastic(rows)
        gdot1 = matvec(G, v1 - v) + gdot
        A = jnp.concatenate([A_v, jnp.where(rows[:, None], G, 0.0)])
        pinv = PseudoInverse(mf.weight(A), rtol)
        asked = jnp.concatenate([jnp.zeros_like(r_v), jnp.where(
            rows, jnp.where(gdot < 0, -e * gdot, 0.0) - gdot1, 0.0)])
        lam = pinv.multipliers(asked)
        v_new = v1 + mf.unweight(matvec(pinv.C.T, lam))
        residual = jnp.maximum(residual1, jnp.max(
            jnp.abs(matvec(A, v_new - v1) - asked), initial=0.0))
        return Impact(v_new, jnp.where(rows, normal + lam[k:], 0.0), rows, residual,
                      tangential)

    return law


class WithUnilateral(AbstractModel):
    r"""`model` with its unilateral rows that are `active` appended to its holonomic
    rows as equalities (an inactive row is a zero row, so that the shapes stay
    fixed under `jax.vmap`). What a solve with unilateral rows integrates between
    events; every other method is `model`'s.

    With friction (`stuck`, `sliding`, `push` set; None for a frictionless model,
    whose terms are then those without friction at no cost): the held rows that
    `stuck` have their `slip` appended to the nonholonomic rows (zero rows for the
    others), and a held row that slips is pushed by Coulomb's force
    $-\mu\,\lambda_N W^T\hat s$ ($W = \partial s/\partial v$, $\hat s$ the slip's
    direction, `sliding` where the slip is zero) with $\lambda_N$ = `push`, the
    row's normal multiplier, which [`Frictional`][] solves for."""

    model: AbstractModel
    active: Bool[Array, " r"]
    stuck: Bool[Array, " r"] | None = None
    sliding: Float[Array, "r d"] | None = None
    push: Float[Array, " r"] | None = None

    def mass_matrix(self, t, q):
        return self.model.mass_matrix(t, q)

    def forces(self, t, q, v):
        f = self.model.forces(t, q, v)
        return f if self.push is None else f + self.friction_force(t, q, v)

    def holonomic(self, t, q):
        return jnp.concatenate([self.model.holonomic(t, q), self.held(t, q)])

    def held(self, t, q):
        """The unilateral rows held as equalities: the active ones, zero rows for
        the others."""
        return jnp.where(self.active, self.model.unilateral(t, q), 0.0)

    def terms(self, t, q, v=None) -> Terms:
        """`model`'s own terms (one pass of a rigid-body library, say) with the
        held rows appended, derived by autodiff from `unilateral` alone."""
        return _HeldTerms(self, t, q, v)

    def nonholonomic(self, t, q, v):
        base = self.model.nonholonomic(t, q, v)
        if self.stuck is None:
            return base
        return jnp.concatenate([base, self.stuck_rows(t, q, v)])

    # -- friction ---------------------------------------------------------------

    def stuck_rows(self, t, q, v):
        """The slip of the held rows that stick, flattened (zero rows for the
        others)."""
        stuck = self.stuck & self.active
        return jnp.where(stuck[:, None], self.model.slip(t, q, v), 0.0).ravel()

    @property
    def mu(self):
        """Coulomb's coefficient of each row, shape `(r,)`."""
        return jnp.broadcast_to(jnp.asarray(self.model.friction),
                                self.active.shape)

    @property
    def slipping(self):
        """The held rows with friction that slip."""
        return self.active & ~self.stuck & (self.mu > 0)

    def friction_force(self, t, q, v):
        r"""Coulomb's force of the rows that slip with the normal multipliers
        `push`: $-\sum_i \mu_i\lambda_{N,i} W_i^T\hat s_i$."""
        s, W = slip_jacobian(self.model, t, q, v)
        direction = slip_direction(s, self.sliding)
        load = jnp.where(self.slipping, self.mu * self.push, 0.0)
        return -jnp.einsum("r,rd,rdn->n", load, direction.astype(W.dtype), W)

    def friction_of(self, t, q, v, multipliers):
        r"""Each row's friction force $f_i$, shape `(r, d)`, with generalized force
        $\sum_i W_i^T f_i$, from the `multipliers` of the dynamics with these
        modes: a row that sticks, its own multipliers (the last `r d`); one that
        slips, $-\mu\lambda_N\hat s$ (its normal multiplier after the
        holonomic rows'); zero elsewhere."""
        m = jax.eval_shape(self.model.holonomic, t, q).shape[0]
        r, d = self.sliding.shape
        lam_n = multipliers[m:m + r]
        stuck = self.stuck & self.active & (self.mu > 0)
        held = multipliers[multipliers.shape[0] - r * d:].reshape(r, d)
        direction = slip_direction(self.model.slip(t, q, v), self.sliding)
        slipping = -(self.mu * lam_n)[:, None] * direction.astype(lam_n.dtype)
        return jnp.where(stuck[:, None], held,
                         jnp.where(self.slipping[:, None], slipping, 0.0))

    def unilateral(self, t, q):
        return self.model.unilateral(t, q)

    @property
    def restitution(self):
        return self.model.restitution

    @property
    def friction(self):
        return self.model.friction

    def slip(self, t, q, v):
        return self.model.slip(t, q, v)

    @property
    def conservative(self) -> bool:
        return self.model.conservative

    def energy(self, t, q, v):
        return self.model.energy(t, q, v)

    def input_matrix(self, t, q):
        return self.model.input_matrix(t, q)

    def position_rate(self, t, q, v):
        return self.model.position_rate(t, q, v)

    def integrate_position(self, q, dv):
        return self.model.integrate_position(q, dv)


def free_rows(model: AbstractModel, t, q, v):
    r"""`(holonomic, velocity)`: boolean masks of the rows of $\Phi_q$ and of $A_v$
    that are a `WithUnilateral`'s inactive unilateral rows (zero rows), or None for
    another model."""
    if not isinstance(model, WithUnilateral):
        return None
    m = jax.eval_shape(model.model.holonomic, t, q).shape[0]
    p = jax.eval_shape(model.model.nonholonomic, t, q, v).shape[0]
    free = ~model.active
    holonomic = jnp.concatenate([jnp.zeros(m, bool), free])
    velocity = [holonomic, jnp.zeros(p, bool)]
    if model.stuck is not None:  # (the slip rows of those that do not stick)
        d = model.sliding.shape[-1]
        velocity.append(jnp.repeat(~(model.stuck & model.active), d))
    return holonomic, jnp.concatenate(velocity)


def unilateral_indices(model: "WithUnilateral", t, q, v):
    r"""`(base velocity rows -> rows of the wrapped model, unilateral rows)`: where
    the rows of `model.model`'s $A_v$ and the unilateral rows sit among the rows of
    the `WithUnilateral`'s $A_v$ (holonomic, then held, then nonholonomic)."""
    m = jax.eval_shape(model.model.holonomic, t, q).shape[0]
    p = jax.eval_shape(model.model.nonholonomic, t, q, v).shape[0]
    r = model.active.shape[0]
    return (list(range(m)) + list(range(m + r, m + r + p)), list(range(m, m + r)))


class _HeldRows(AbstractModel):
    """The held rows of a `WithUnilateral` as the holonomic rows of a model, for
    their terms by autodiff."""

    wrapped: WithUnilateral

    def mass_matrix(self, t, q):
        return self.wrapped.mass_matrix(t, q)

    def holonomic(self, t, q):
        return self.wrapped.held(t, q)

    def position_rate(self, t, q, v):
        return self.wrapped.position_rate(t, q, v)


class _StuckRows(AbstractModel):
    """The slip rows of a `WithUnilateral`'s rows that stick as the nonholonomic
    rows of a model, for their terms by autodiff."""

    wrapped: WithUnilateral

    def mass_matrix(self, t, q):
        return self.wrapped.mass_matrix(t, q)

    def nonholonomic(self, t, q, v):
        return self.wrapped.stuck_rows(t, q, v)

    def position_rate(self, t, q, v):
        return self.wrapped.position_rate(t, q, v)


class _HeldTerms(Terms):
    """The terms of a `WithUnilateral`: the underlying model's terms, with the
    held rows appended after its holonomic rows (before its nonholonomic ones),
    and with friction the slip rows of those that stick after its nonholonomic
    rows and Coulomb's force of those that slip added to its forces."""

    def __init__(self, model: WithUnilateral, t, q, v=None):
        super().__init__(model, t, q, v)
        self.base = model.model.terms(t, q, v)
        self.held = Terms(_HeldRows(model), t, q, v)
        self.stuck = None if model.stuck is None else Terms(_StuckRows(model), t, q, v)

    @functools.cached_property
    def mass_matrix(self):
        return self.base.mass_matrix

    @functools.cached_property
    def forces(self):
        if self.model.push is None:
            return self.base.forces
        return self.base.forces + self.model.friction_force(self.t, self.q,
                                                            self._velocity())

    @functools.cached_property
    def input_matrix(self):
        return self.base.input_matrix

    @functools.cached_property
    def energy(self):
        return self.base.energy

    def energy_law(self, qdot=None):
        return self.base.energy_law(qdot)

    @functools.cached_property
    def holonomic(self):
        return jnp.concatenate([self.base.holonomic, self.held.holonomic])

    @functools.cached_property
    def holonomic_jacobian(self):
        (phi, A), (phi_h, A_h) = (self.base.holonomic_jacobian,
                                  self.held.holonomic_jacobian)
        return jnp.concatenate([phi, phi_h]), jnp.concatenate([A, A_h])

    def _after(self, base, part):
        """The rows `base` with `part(terms of the slip rows that stick)` appended
        (with friction)."""
        if self.stuck is None:
            return base
        return jnp.concatenate([base, part(self.stuck)])

    @functools.cached_property
    def kinematics(self) -> Kinematics:
        k, h = self.base.kinematics, self.held.kinematics
        m = k.phi_q.shape[0]
        return Kinematics(
            jnp.concatenate([k.phi_q, h.phi_q]), jnp.concatenate([k.dphi_q, h.dphi_q]),
            jnp.concatenate([k.A_q, h.A_q]), jnp.concatenate([k.b_q, h.b_q]),
            self._after(k.phi_v, lambda s: s.kinematics.phi_v),
            self._after(jnp.concatenate([k.A_v[:m], h.A_v, k.A_v[m:]]),
                        lambda s: s.kinematics.A_v),
            self._after(jnp.concatenate([k.b_v[:m], h.b_v, k.b_v[m:]]),
                        lambda s: s.kinematics.b_v))

    @functools.cached_property
    def residuals(self):
        (phi, vel), (phi_h, vel_h) = self.base.residuals, self.held.residuals
        m = phi.shape[0]
        return (jnp.concatenate([phi, phi_h]),
                self._after(jnp.concatenate([vel[:m], vel_h, vel[m:]]),
                            lambda s: s.residuals[1]))

    @functools.cached_property
    def velocity_constraints(self):
        (r, A), (r_h, A_h) = self.base.velocity_constraints, self.held.velocity_constraints
        m = self.base.holonomic.shape[0]
        return (self._after(jnp.concatenate([r[:m], r_h, r[m:]]),
                            lambda s: s.velocity_constraints[0]),
                self._after(jnp.concatenate([A[:m], A_h, A[m:]]),
                            lambda s: s.velocity_constraints[1]))
