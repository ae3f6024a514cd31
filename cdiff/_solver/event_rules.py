"""The record of a solve's impacts (`Events`), and the rules every route with
unilateral rows applies: the start's checks, the held rows' multipliers, the
release rule, and `take_event` (the impact, the rest rule, the rows held from
there, and the `Decision` a replay applies again)."""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._coulomb import friction_outside, has_friction
from .._impact import impact_law, restitution_outside, unilateral_rate
from .._kinematics import ImpactTerms
from .._problem import Problem
from .._results import RESULTS
from .._solution import rates

# Events recorded per solve (the count goes on beyond).
MAX_EVENTS = 64


#: The kinds of the events of `Solution.stats["events"]`, by their number: an
#: impact; a contact with friction that starts to stick; one that starts to slip
#: (from sticking, or turning its slip's direction back).
EVENT_KINDS = ("impact", "stick", "slip")


class Events(eqx.Module):
    r"""The events of a solve, in order (`Solution.stats["events"]`): the first
    `MAX_EVENTS` of them, unused rows NaN. `count` counts them all. Per event:
    its `kind` (an index into `cdiff.EVENT_KINDS`: impacts, and with friction a
    contact that starts to stick or to slip), time, configuration, velocities
    before and after, each row's impulse, the rows that took part, those the rest
    rule stopped, and those that arrived `grazing`: slower than one step's
    acceleration of the row turns them back,
    $|\dot g^-| < \ddot g\,\Delta t$ with $\ddot g > 0$ (a trajectory that only
    touches the row, or misses it by less than the solve resolves: the event
    and derivatives through it are unreliable, see the docs' limitations)."""

    t: Float[Array, " n"]
    q: Float[Array, "n nq"]
    v_before: Float[Array, "n nv"]
    v_after: Float[Array, "n nv"]
    impulse: Float[Array, "n r"]
    rows: Bool[Array, "n r"]
    rest: Bool[Array, "n r"]
    grazing: Bool[Array, "n r"]
    count: Array
    # (n,) int32, see EVENT_KINDS; None where only impacts are recorded (a model
    # without friction).
    kind: Array | None = None

    @classmethod
    def empty(cls, q, v, r: int, n: int = MAX_EVENTS, *, kinds: bool = False):
        """No events, with room for `n`; `kinds`: the events' kinds recorded
        (with friction)."""
        nan = jnp.asarray(jnp.nan, q.dtype)
        return cls(jnp.full((n,), nan), jnp.full((n,) + q.shape, nan),
                   jnp.full((n,) + v.shape, nan), jnp.full((n,) + v.shape, nan),
                   jnp.full((n, r), nan), jnp.zeros((n, r), bool),
                   jnp.zeros((n, r), bool), jnp.zeros((n, r), bool),
                   jnp.zeros((), jnp.int32),
                   jnp.zeros((n,), jnp.int32) if kinds else None)

    def add(self, when, t, q, v_before, v_after, impulse, rows, rest,
            grazing, kind: int = 0) -> Events:
        """This record with one event (an impact, or the `kind` of
        `EVENT_KINDS`) appended where `when` (and room is left)."""
        one = [x[None] for x in (t, q, v_before, v_after, impulse, rows, rest,
                                 grazing)]
        return self.extend(Events(
            *one, jnp.asarray(when).astype(jnp.int32),
            None if self.kind is None else jnp.full((1,), kind, jnp.int32)))

    def extend(self, new: Events) -> Events:
        """This record with the first `new.count` impacts of `new` appended (those
        that fit; the count counts them all)."""
        n = self.t.shape[0]
        j = jnp.arange(new.t.shape[0], dtype=self.count.dtype)
        # (An index past the end is dropped by the scatter: no room, or not new.)
        at = jnp.where(j < new.count, self.count + j, n)

        def put(buf, x):
            return buf.at[at].set(x, mode="drop")

        fields = ("t", "q", "v_before", "v_after", "impulse", "rows", "rest", "grazing")
        return Events(*(put(getattr(self, f), getattr(new, f)) for f in fields),
                      self.count + new.count,
                      None if self.kind is None else put(self.kind, new.kind))


def start_tolerance(q0):
    """How far below zero a unilateral row may start (round-off of a state at
    contact): sqrt(eps) times the size of `q0`."""
    return jnp.sqrt(jnp.finfo(q0.dtype).eps) * jnp.maximum(1.0, jnp.max(jnp.abs(q0)))


def start_result(problem: Problem, t0, y0):
    """The result a solve with unilateral rows starts from, the one check of every
    route: `RESULTS.penetrating_start` where the initial state is behind a row
    beyond `start_tolerance`, `RESULTS.bad_restitution` where the model's
    restitution (traced: outside `jit` `cdiff.simulate` refuses it before
    tracing) is outside [0, 1] or NaN, `RESULTS.bad_friction` where its friction
    is negative or not finite, otherwise successful."""
    model = problem.context.model.model
    q0 = problem.coordinates(t0, y0)[0]
    g0 = model.unilateral(t0, q0)
    # (A model without friction, known before tracing, has none to check.)
    friction = (RESULTS.where(friction_outside(model.friction), RESULTS.bad_friction,
                              RESULTS.successful)
                if has_friction(model) else RESULTS.successful)
    return RESULTS.where(
        jnp.any(g0 < -start_tolerance(q0)), RESULTS.penetrating_start,
        RESULTS.where(restitution_outside(model.restitution), RESULTS.bad_restitution,
                      friction))


def _with(problem: Problem, active, e0) -> Problem:
    return eqx.tree_at(lambda p: (p.context.model.active, p.context.e0), problem,
                       (active, e0))


def _held(problem: Problem, t, y, active, multipliers):
    """The held rows' entries of the `multipliers` at `(t, y)` (inf where not
    held): those after the model's holonomic rows."""
    m = jax.eval_shape(problem.context.model.model.holonomic, t,
                       problem.coordinates(t, y)[0]).shape[0]
    return jnp.where(active, multipliers[m:m + active.shape[0]], jnp.inf)


def held_multipliers(problem: Problem, t, y, active, e0, *, dt_rest):
    """The held rows' multipliers at `(t, y)` (inf where not held)."""
    prob = _with(problem, active, e0)
    return _held(problem, t, y, active, prob.dynamics(t, y, dt_rest).multipliers)


def held_dynamics(problem: Problem, t, y, active, e0, *, dt_rest):
    """`(lam, vdot)` at `(t, y)` with the rows `active` held, from one evaluation
    of the dynamics: the held rows' multipliers (inf where not held) and the
    acceleration (what the rows' accelerations before an impact, and the event
    time's correction, read)."""
    prob = _with(problem, active, e0)
    dyn = prob.dynamics(t, y, dt_rest)
    _, vdot = rates(prob.formulation, prob.context, t, y, dyn)
    return _held(problem, t, y, active, dyn.multipliers), vdot


def _row_acceleration(model, t, q, v, vdot):
    r"""The rows' accelerations $\ddot g$ at `(t, q, v)` with acceleration `vdot`."""
    return jax.jvp(lambda q, v: unilateral_rate(model, t, q, v)[1], (q, v),
                   (model.position_rate(t, q, v), vdot))[1]


def _plastic(restitution) -> bool:
    """Whether every impact is plastic, known before tracing (the rest rule has
    nothing to decide)."""
    if isinstance(restitution, jax.core.Tracer):
        return False
    return bool(np.all(np.asarray(restitution) == 0))


def release(problem: Problem, t, y, active, e0, lam):
    """`(active, y)`: `active` less the rows whose multiplier `lam` would pull,
    and the state restarted with the rows left."""
    active = active & ~(lam < 0)
    prob = _with(problem, active, e0)
    return active, prob.restart(t, *prob.coordinates(t, y))


def released_rows(m_gap, lam, active, tol):
    """The rows an event releases, on every route: where a held row's multiplier
    (`lam`, inf where not held) rather than an inactive row's gap (their minimum
    `m_gap`) attains the monitor, the held rows whose multiplier is within `tol`
    (the monitor's round-off, in its units) of zero, and at least the one that
    attains it (located to its bracket's width, its multiplier may stay a
    round-off above `tol`: kept held, it would be found crossing again at once)."""
    lam_min = jnp.min(lam, initial=jnp.inf)
    low = jnp.minimum(m_gap, lam_min)
    return (lam_min < m_gap) & active & (lam <= jnp.maximum(tol, low))


class Decision(NamedTuple):
    """What `take_event` decided at an event, none of it differentiable: the rows
    that take part in the impact (`rows`), those of them made plastic by the rest
    rule (`rest`), the rows held from there (`held`), whether some row was hit
    (`hit`: the impact is recorded), and whether the impact's conditions could not
    hold together (`infeasible`: no motion keeps the rows at contact and the
    equalities; the solve ends there with `RESULTS.infeasible_contact`), and the
    rows hit `grazing` (see `Events`)."""

    rows: Bool[Array, " r"]
    rest: Bool[Array, " r"]
    held: Bool[Array, " r"]
    hit: Bool[Array, ""]
    infeasible: Bool[Array, ""]
    grazing: Bool[Array, " r"]

    @classmethod
    def none(cls, active) -> Decision:
        """No event: no impact, the rows `active` held."""
        no = jnp.zeros(active.shape, bool)
        return cls(no, no, active, jnp.asarray(False), jnp.asarray(False), no)


def take_event(problem: Problem, t, q, v, active, released, e0, events: Events, *,
               record, dt_rest, decision: Decision | None = None, vdot=None,
               terms: ImpactTerms | None = None):
    """An event at the state `(t, q, v)` (on a row, or where a held row's
    multiplier reached zero), taken: the impact on the inactive rows at contact,
    made plastic by the rest rule where a bounce is too slow to leave for
    `dt_rest`; the rows that hold from there (those at contact that do not leave
    it, and the held ones less `released`); the energy after it (the reference of
    a formulation that holds the energy); the impact added
    to `events` where `record` and some row was hit. The held rows take part in
    the impact where the others' impulses would drive them inwards. Returns `(y,
    held, e0, events, decision)`, `y` the formulation's state restarted there.

    With the `decision` of an earlier call at this event (a search's), it is
    applied without being made again: one projection (no active-set iteration, no
    rest rule), the same values, and the same derivatives (the choices carry
    none). `vdot`: the acceleration at `(t, q, v)` with the rows `active` held,
    where the caller has it (the monitor's), else evaluated here for the
    decision; `terms`: the impact's mass matrix and constraints at `(t, q)`,
    where the caller evaluated them (`_stages`)."""
    model = problem.context.model.model
    throw = problem.context.throw
    # (Decided before tracing, as the model's modes are.)
    friction = problem.context.model.stuck is not None
    dtype = q.dtype
    r = active.shape[0]
    e = jnp.broadcast_to(jnp.asarray(model.restitution, dtype), (r,))
    if decision is None:
        eps = jnp.finfo(dtype).eps
        scale = jnp.maximum(1.0, jnp.max(jnp.abs(q)))
        hit = ~active & (model.unilateral(t, q) <= eps ** 0.75 * scale)
        # (A held row joins the impact where the others' impulses drive it in.)
        law = impact_law(model, t, q, v, hit | (active & ~released), throw=throw,
                         terms=terms, friction=friction)
        if vdot is None:
            y = _with(problem, active, e0).restart(t, q, v)
            vdot = held_dynamics(problem, t, y, active, e0, dt_rest=dt_rest)[1]
        decision = _decide(problem, law, t, q, v, vdot, active, released, hit, e, e0,
                           dt_rest=dt_rest)
    else:
        law = impact_law(model, t, q, v, throw=throw, terms=terms,
                         friction=friction)
    out = law(jnp.where(decision.rest, 0.0, e), rows=decision.rows)
    # (The energy reference, for a formulation that holds the energy.)
    e_after = (model.energy(t, q, out.v) if problem.formulation.corrects_energy
               else None)
    e_after = e0 if e_after is None else jnp.asarray(e_after, dtype)
    events = events.add(record & decision.hit, t, q, v, out.v, out.impulse, out.rows,
                        decision.rest & out.rows, decision.grazing)
    y = _with(problem, decision.held, e0).restart(t, q, out.v)
    return y, decision.held, e_after, events, decision


def _decide(problem: Problem, law, t, q, v, vdot, active, released, hit, e, e0, *,
            dt_rest) -> Decision:
    """`take_event`'s choices at `(t, q)` where the velocity `v` has the
    acceleration `vdot`: the rest rule, the rows that take part and those held from
    there."""
    model = problem.context.model.model
    eps = jnp.finfo(q.dtype).eps
    first = law(e)
    if _plastic(model.restitution):
        rest, out = first.rows, first
    else:
        # Rest: a bounce too slow to leave for a step becomes plastic (the
        # acceleration after the bounce, one more evaluation of the dynamics).
        prob = _with(problem, active, e0)
        y_plus = prob.restart(t, q, first.v)
        _, vdot_plus = held_dynamics(problem, t, y_plus, active, e0, dt_rest=dt_rest)
        q_plus, v_plus = prob.coordinates(t, y_plus)
        gdot_plus = unilateral_rate(model, t, q_plus, v_plus)[1]
        gddot_plus = _row_acceleration(model, t, q_plus, v_plus, vdot_plus)
        rest = first.rows & ((e == 0) | (2 * gdot_plus <= -gddot_plus * dt_rest))
        out = law(jnp.where(rest, 0.0, e))
    # Every row at contact that does not leave it holds from here: those stopped
    # by the impact, and those that arrived at zero speed.
    _, gdot_out, _ = unilateral_rate(model, t, q, out.v)
    vscale = jnp.maximum(1.0, jnp.max(jnp.abs(out.v)))
    contact = hit & (gdot_out <= jnp.sqrt(eps) * vscale)
    held = (active & ~released) | contact
    # Grazing: a row hit slower than one step of its acceleration as it arrives
    # would turn it back.
    _, gdot_minus, _ = unilateral_rate(model, t, q, v)
    gddot = _row_acceleration(model, t, q, v, vdot)
    grazing = hit & (gdot_minus < 0) & (gddot > 0) & (-gdot_minus < gddot * dt_rest)
    return Decision(out.rows, rest & out.rows, held, jnp.any(hit),
                    out.residual > jnp.sqrt(eps) * vscale, grazing)
