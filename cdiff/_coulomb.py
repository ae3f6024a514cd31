r"""Coulomb friction on unilateral rows, what the impacts and the solves share:
the checks of a model's `friction` and `slip`, the slip's Jacobian and
direction, and the plastic impact with Coulomb's law (`coulomb_plastic`), which
[`cdiff.impact`][] follows with Newton's restitution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._kinematics import jacobian
from ._linalg import PseudoInverse, matvec
from ._model import AbstractModel
from ._results import is_concrete


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



def coulomb_plastic(mf, v, r_v, A_v, G, gdot, mu, s, W, *, rtol=None):
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
