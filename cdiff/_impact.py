r"""Impacts on unilateral constraints $g(t, q) \ge 0$: Newton's law of restitution
as the projection of the velocity in the kinetic metric."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from ._kinematics import ImpactTerms, Kinematics, Terms, jacobian, unilateral_jacobian
from ._linalg import PseudoInverse, matvec
from ._mass import checked_mass
from ._model import AbstractModel
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


def has_friction(model: AbstractModel) -> bool:
    """Whether `model`'s friction may be nonzero, known before tracing (a traced
    coefficient, under `vmap` or `grad`, may)."""
    mu = model.friction
    return not is_concrete(mu) or bool(np.any(np.asarray(mu) != 0))


def friction_outside(mu):
    """Whether a friction coefficient `mu` is negative or not finite: a boolean
    scalar."""
    mu = jnp.asarray(mu)
    return ~jnp.all((mu >= 0) & jnp.isfinite(mu))


def check_friction(model: AbstractModel, rows: int, t0, q0, v0) -> int:
    """Before tracing: the dimension `d` of the slip of `model` (0 where it has
    no friction), with a `ValueError` naming what is wrong where its `friction`
    is neither a scalar nor one per row, or, where concrete, negative or not
    finite, or where its `slip` is missing or not of shape `(rows, 1)` or
    `(rows, 2)`."""
    name = type(model).__name__
    mu = model.friction
    if jnp.shape(mu) not in ((), (1,), (rows,)):
        raise ValueError(f"{name}.friction has shape {jnp.shape(mu)}; it must be a "
                         f"scalar or one coefficient per unilateral row: {rows} "
                         "row(s).")
    if is_concrete(mu) and not np.all((np.asarray(mu) >= 0)
                                      & np.isfinite(np.asarray(mu))):
        raise ValueError(f"{name}.friction must be finite and non-negative, got "
                         f"{np.asarray(mu)}")
    if not has_friction(model):
        return 0
    t0 = jnp.asarray(t0, q0.dtype)
    shape = jax.eval_shape(model.slip, t0, q0, v0)
    if shape is None:
        raise ValueError(f"{name} has friction but no slip(t, q, v): the tangential "
                         "velocity at each unilateral row's contact, shape (r, d), "
                         "d = 1 in the plane or 2 in space.")
    if shape.shape not in ((rows, 1), (rows, 2)):
        raise ValueError(f"{name}.slip(t, q, v) has shape {shape.shape}; it must be "
                         f"({rows}, 1) in the plane or ({rows}, 2) in space: one "
                         "tangential velocity per unilateral row.")
    return shape.shape[1]


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
        plastic = _coulomb_plastic(mf, v, r_v, A_v, G, gdot, mu,
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
        # restitution without friction (see `_coulomb_plastic`).
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


def _coulomb_plastic(mf, v, r_v, A_v, G, gdot, mu, s, W, *, rtol=None):
    r"""The plastic impact with Coulomb friction, as a function of the rows that
    take part: `rows -> (v1, normal, tangential, residual)`, the velocity after
    it, each row's normal and tangential impulses, and the residual of its
    conditions.

    Each row that takes part stops, $\dot g_i^+ = 0$, and with $\mu_i > 0$ sticks,
    $s_i^+ = 0$, where the impulse that needs lies in the cone,
    $\|\Lambda_{T,i}\| \le \mu_i\Lambda_{N,i}$; outside it, the row slips, and its
    tangential impulse is $-\mu_i\Lambda_{N,i}\hat s_i$ against the slip after the
    impact. That impulse depends on the row's own normal impulse, which is solved
    together with it as [`Frictional`][] does for forces: the impulses are affine
    in the slipping rows' normal impulses $p$, so $(I - \Lambda_{SS})p_S =
    \Lambda_N(0)_S$. In the plane $\hat s$ is against the impulse that sticking
    needed (the impulse saturates on its side). In space it is the direction on
    the cone's edge that leaves the least kinetic energy (Coulomb's law is the
    optimality condition of that least energy over the cone, with the rows
    stopped): see `_least_energy_direction`.

    The restitution follows without friction (`impact_law`): the rows leave at
    $-e_i\dot g_i^-$. The kinetic energy never grows: the plastic part loses at
    least $\tfrac12\dot g^{-T}W_{NN}^{-1}\dot g^-$ (Coulomb's law dissipates, and
    the normal impulse alone is the least-energy way to stop the rows), the
    restitution gives back $e^2$ times that (one row, or rows struck together
    with the same $e$). An impact with a slipping row whose friction takes away
    more normal impulse than it adds ($1 - \partial\Lambda_N/\partial p \le 0$,
    Painlevé's paradox at impulse level) has no consistent impulse: its residual
    is infinite."""
    data = (mf, v, r_v, A_v, G, gdot, mu, s, W)

    def plastic(rows):
        # Friction acts on the rows struck: those that arrive faster than the
        # round-off of a located event (a row taken at contact with a round-off
        # approach gets no tangential impulse: a finite one from a vanishing
        # approach would be Painleve's impulsive resolution, which the smooth
        # dynamics name instead).
        vscale = jnp.maximum(1.0, jnp.max(jnp.abs(v)))
        struck = rows & (gdot < -jnp.sqrt(jnp.finfo(v.dtype).eps) * vscale)
        live = _Plastic(data, rows, struck, rtol)
        direction = unit(-live.lam_t)
        if s.shape[1] > 1:
            # (The search on the data without derivatives: only its last step,
            # on the live data, carries them.)
            frozen = _Plastic(jax.lax.stop_gradient(data), rows, struck, rtol)
            direction = _least_energy_direction(frozen.energy, live.energy,
                                                direction, live.out)
        return live.result(direction)

    return plastic


class _Plastic:
    """`_coulomb_plastic`'s parts at the impact's `data` with the `rows` that take
    part: the rows with friction that stick (`stick`) and those that slip
    (`out`, outside the cone when stuck: `lam_t` is the impulse sticking
    needed), and, given the slipping rows' directions, their consistent normal
    impulses, the energy after the impact and the impact's result."""

    def __init__(self, data, rows, struck, rtol):
        self.mf, self.v, self.r_v, self.A_v, self.G, self.gdot, self.mu, self.s, \
            self.W = data
        self.rtol, self.rows = rtol, rows
        self.k = self.A_v.shape[0]
        self.r, self.d = self.s.shape
        sticky = struck & (self.mu > 0)
        # Every row with friction stuck, first.
        _, lam, _ = self.solve(*self.constraints(sticky), jnp.zeros_like(self.v))
        k, r = self.k, self.r
        lam_n, self.lam_t = lam[k:k + r], lam[k + r:].reshape(r, self.d)
        scale = jnp.max(jnp.abs(lam_n), initial=0.0)
        tol = jnp.sqrt(jnp.finfo(self.v.dtype).eps) * scale
        self.out = sticky & (safe_norm(self.lam_t) > self.mu * lam_n + tol)
        self.stick = sticky & ~self.out
        self.A, self.asked = self.constraints(self.stick)

    def solve(self, A, asked, dv):
        """`v + dv` moved by the constraints' impulse to `A (v' - v) = asked`, the
        impulse's multipliers and the residual."""
        mf, v = self.mf, self.v
        pinv = PseudoInverse(mf.weight(A), self.rtol)
        lam = pinv.multipliers(asked - matvec(A, dv))
        v_new = v + dv + mf.unweight(matvec(pinv.C.T, lam))
        return v_new, lam, jnp.max(jnp.abs(matvec(A, v_new - v) - asked), initial=0.0)

    def constraints(self, stick):
        """The rows that take part stopped, those that `stick` with no slip."""
        d = self.d
        A = jnp.concatenate([self.A_v, jnp.where(self.rows[:, None], self.G, 0.0),
                             jnp.where(jnp.repeat(stick, d)[:, None],
                                       self.W.reshape(self.r * d, -1), 0.0)])
        asked = jnp.concatenate([-self.r_v, jnp.where(self.rows, -self.gdot, 0.0),
                                 jnp.where(stick[:, None], -self.s, 0.0).ravel()])
        return A, asked

    def response(self, p, direction):
        """The impact with the slipping rows pushed by `-mu p direction`."""
        impulse = -jnp.einsum("r,rd,rdn->n", jnp.where(self.out, self.mu * p, 0.0),
                              direction, self.W)
        return self.solve(self.A, self.asked, self.mf.solve(impulse))

    def consistent(self, direction):
        """The slipping rows' normal impulses with their friction in `direction`,
        and whether they are not unique (Painleve)."""
        k, r = self.k, self.r
        zero = jnp.zeros(r, self.v.dtype)

        def normal(p):
            return self.response(p, direction)[1][k:k + r]

        lam0, columns = normal(zero), jax.jacfwd(normal)(zero)
        both = self.out[:, None] & self.out[None, :]
        matrix = jnp.eye(r, dtype=self.v.dtype) - jnp.where(both, columns, 0.0)
        paradox = jnp.any(self.out & (jnp.diagonal(matrix) <= 0))
        return jnp.linalg.solve(matrix, jnp.where(self.out, lam0, 0.0)), paradox

    def energy(self, direction):
        """The kinetic energy after the impact with the slipping rows' friction in
        `direction` (inf where no normal impulse is consistent)."""
        p, paradox = self.consistent(direction)
        v1 = self.response(p, direction)[0]
        energy = 0.5 * jnp.sum(matvec(self.mf.L.T, v1) ** 2)
        return jnp.where(paradox | jnp.any(self.out & (p < 0)), jnp.inf, energy)

    def result(self, direction):
        """`(v1, normal, tangential, residual)` with the slipping rows' friction
        in `direction`."""
        k, r = self.k, self.r
        p, paradox = self.consistent(direction)
        v1, lam, residual = self.response(p, direction)
        normal = jnp.where(self.out, p, lam[k:k + r])
        tangential = jnp.where(
            self.out[:, None], -(self.mu * p)[:, None] * direction,
            jnp.where(self.stick[:, None], lam[k + r:].reshape(r, self.d), 0.0))
        return v1, normal, tangential, jnp.where(paradox, jnp.inf, residual)


def _least_energy_direction(search, energy, start, rows, *, grid: int = 32,
                            halvings: int = 52):
    r"""The unit directions (shape `(r, 2)`) of the `rows` that minimise
    `energy(direction)`, the others' kept at `start`: per row, the best of
    `grid` angles, then the root of the energy's derivative in the angle
    bracketed around it, by bisection (to round-off), both on `search` (the
    same energy without derivatives), then one Newton step on `energy` from
    there, whose derivative is the implicit function theorem's."""
    angle0 = jax.lax.stop_gradient(jnp.arctan2(start[:, 1], start[:, 0]))

    def at(angle):
        return jnp.where(rows[:, None], jnp.stack([jnp.cos(angle), jnp.sin(angle)], -1),
                         start)

    def slope(f):  # each row's derivative in its angle (r forward tangents)
        return jax.jacfwd(lambda angle: f(at(angle)))

    step = 2 * jnp.pi / grid
    tries = angle0[None, :] + step * jnp.arange(grid, dtype=angle0.dtype)[:, None]
    values = jax.vmap(lambda a: jnp.where(rows, search(at(a)), 0.0))(tries)
    values = jnp.where(jnp.isfinite(values), values, jnp.inf)
    best = jnp.take_along_axis(tries, jnp.argmin(values, axis=0)[None], axis=0)[0]

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        rising = slope(search)(mid) > 0
        return jnp.where(rising, lo, mid), jnp.where(rising, mid, hi)

    lo, hi = jax.lax.fori_loop(0, halvings, halve, (best - step, best + step))
    angle = jax.lax.stop_gradient(0.5 * (lo + hi))
    # (The step is zero here: it changes no value, and gives the derivative.)
    curvature = jnp.diagonal(jax.jacfwd(slope(energy))(angle))
    angle = angle - slope(energy)(angle) / jnp.where(rows & (curvature > 0),
                                                     curvature, 1.0)
    return at(angle)


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


def slip_jacobian(model: AbstractModel, t, q, v):
    """`(s, W)`: the slip `model.slip(t, q, v)`, shape `(r, d)`, and its Jacobian
    with respect to `v`, shape `(r, d, nv)` (the slip is linear in `v`)."""
    s = model.slip(t, q, v)
    _, W = jacobian(lambda v: model.slip(t, q, v).ravel(), v)
    return s, W.reshape(s.shape + v.shape)


def safe_norm(x):
    """The Euclidean norm over the last axis, with a finite derivative at zero."""
    n2 = jnp.sum(x * x, axis=-1)
    positive = n2 > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, n2, 1.0)), 0.0)


def unit(x, fallback=0.0):
    """`x / |x|` over the last axis, `fallback` where `x` is zero (with a finite
    derivative there)."""
    n = safe_norm(x)[..., None]
    return jnp.where(n > 0, x / jnp.where(n > 0, n, 1.0), fallback)


def slip_direction(s, sliding):
    r"""The unit direction $\hat s$ of each row's slip `s`, shape `(r, d)`: in the
    plane (`d = 1`) the sign `sliding` (a slip keeps its sign until it stops, an
    event); in space $s/\|s\|$, or `sliding` where the slip is zero (its onset,
    whose direction the event that starts it sets)."""
    return sliding if s.shape[-1] == 1 else unit(s, sliding)


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
