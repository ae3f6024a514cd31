r"""Stick and slip of the held rows with Coulomb friction: what the segments'
loop (`event_segments`) reads and decides besides impacts and releases.

A held row with $\mu > 0$ is in one of two modes, carried as the model's
`stuck` (its slip held at zero as nonholonomic rows) and `sliding` (the slip's
direction, $\hat s$):

- **stick** holds while the force it needs lies in the cone: the *margin*
  $\mu\lambda_N - \|\lambda_T\|$ stays positive; where it reaches zero the row
  slips from there, in the direction $\hat s = -\lambda_T/\|\lambda_T\|$ against
  the friction force that held it (the force is continuous across it).
- **slip** holds while the slip keeps its direction: $s\cdot\hat s$ stays
  positive, $\hat s$ the direction at the segment's start; where it reaches
  zero with the slip (a stop), the row sticks, and the next segment's start
  checks the cone: where sticking needs more than the cone gives, the row slips
  on against the force that sticking needed (in the plane: a reversal). In
  space $s\cdot\hat s$ may also reach zero where the direction turned by a right
  angle: the direction is then renewed, and the row slips on.

Each of these is a root of the segment's monitor, located as a row's gap is.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._coulomb import safe_norm, unit
from .._impact import admissible_velocity
from .._mass import checked_mass
from .._problem import Problem
from .event_rules import _with


class Contact(NamedTuple):
    """The friction of the held rows at one state: the normal multipliers
    (`lam_n`, inf where not held), the friction force of the rows that stick
    (`lam_t`, shape `(r, d)`, zero elsewhere), the cone's `margin` (inf where not
    stuck), the slip monitor $s\\cdot\\hat s$ (`slip_monitor`, inf where not
    slipping) and the slip `s`."""

    lam_n: Float[Array, " r"]
    lam_t: Float[Array, "r d"]
    margin: Float[Array, " r"]
    slip_monitor: Float[Array, " r"]
    s: Float[Array, "r d"]


def set_modes(problem: Problem, stuck, sliding) -> Problem:
    """`problem` with the friction modes `stuck` and `sliding`."""
    return eqx.tree_at(lambda p: (p.context.model.stuck, p.context.model.sliding),
                       problem, (stuck, sliding))


def contact(problem: Problem, t, y, active, e0, *, dt_rest) -> Contact:
    """The `Contact` at `(t, y)` with the rows `active` held and `problem`'s
    modes, from one evaluation of the dynamics."""
    prob = _with(problem, active, e0)
    model = prob.context.model
    dyn = prob.dynamics(t, y, dt_rest)
    q, v = prob.coordinates(t, y)
    m = jax.eval_shape(model.model.holonomic, t, q).shape[0]
    r, d = model.sliding.shape
    normal = dyn.multipliers[m:m + r]
    lam_n = jnp.where(active, normal, jnp.inf)
    stuck = active & model.stuck & (model.mu > 0)
    lam_t = jnp.where(stuck[:, None], dyn.multipliers[-r * d:].reshape(r, d), 0.0)
    # (The finite multipliers inside: inf times a coefficient would make the
    # derivative NaN, though not selected.)
    margin = jnp.where(stuck, model.mu * normal - safe_norm(lam_t), jnp.inf)
    s = model.slip(t, q, v)
    slip_monitor = jnp.where(model.slipping, jnp.sum(s * model.sliding, axis=-1),
                             jnp.inf)
    return Contact(lam_n, lam_t, margin, slip_monitor, s)


def unstick(problem: Problem, c: Contact) -> tuple[Bool[Array, " r"], Array]:
    """`(stuck, sliding)`: the rows that stick, less those outside the cone
    (`margin < 0`), which slip against the force that sticking needed."""
    model = problem.context.model
    out = model.stuck & (c.margin < 0)
    return model.stuck & ~out, jnp.where(out[:, None], unit(-c.lam_t),
                                         model.sliding)


def modes_after(problem: Problem, c: Contact, s, held, *, speed_tol, cone_tol):
    """`(stuck, sliding)` after an event at a state with `Contact` `c` (read
    before the event), whose velocity after it has the slip `s`, with the rows
    `held` from there: a held row with friction sticks where its slip is zero
    (within `speed_tol`; checked against the cone at the next segment's start),
    except one whose cone was reached here (its margin within `cone_tol`): it
    slips against the force that held it; a row that slips takes its slip's
    direction."""
    model = problem.context.model
    zero = safe_norm(s) <= speed_tol
    cone = model.stuck & model.active & (c.margin <= cone_tol)
    stuck = held & (model.mu > 0) & zero & ~cone
    sliding = jnp.where(zero[:, None],
                        jnp.where(cone[:, None], unit(-c.lam_t), model.sliding),
                        unit(s))
    return stuck, jnp.where(held[:, None], sliding, model.sliding)


def admissible(problem: Problem, t, q, v):
    """`v` projected onto the velocity constraints of `problem`'s model (the held
    rows and the slip of those that stick included) in the kinetic metric: a
    row that sticks from an event holds its slip at zero exactly, not at the
    round-off it was located to (which it would keep: a creep)."""
    model = problem.context.model
    terms = model.terms(t, q, v)
    mf = checked_mass(model, t, q, terms, throw=problem.context.throw)[1]
    return admissible_velocity(mf, v, *terms.velocity_constraints)
