r"""Constant-step RK4 with unilateral constraints: events located inside the step,
impacts, and the active set.

Each step of the grid, from $t_a$ to $t_b$, is a loop of RK4 sub-steps:

1. **Release.** A held row whose multiplier changes sign within a sub-step
   ($\lambda_i < 0$ would pull: Aghili's condition that a unilateral constraint
   holds only while its force pushes) is an event like a crossing, located as the
   root of $\lambda_i$ and released there; the motion is smooth across it (the
   force is zero), so no correction follows. A held row that pulls at the start
   of a sub-step after an event (read from the sub-step's first stage), or at
   the end of a step, is released there.
2. **Detection.** An RK4 step to $t_b$ with the active rows held as equalities; an
   inactive row that ends below zero, and lower than it started, is crossed.
3. **Location.** The crossing time is the root of $m(t) = \min_i g_i$ over the
   inactive rows (with the held rows' multipliers), with each trial time
   integrated by RK4 from the sub-step's start (Illinois' regula falsi, to
   round-off in $g$). The state at the root is
   corrected to first order, $t^* = t - m/\dot m$, with $t$ held constant under
   differentiation: the event time's derivative is the implicit function
   theorem's, $dt^*/dp = -(\partial m/\partial p)/\dot m$.
4. **Impact** ([`cdiff.impact`][]) on the rows at contact, with the model's
   restitution. A row that bounces back slower than it could leave for a whole
   step, $2\dot g^+ < -\ddot g\,\Delta t$, stops instead (plastic): repeated
   bounces that shrink geometrically end in contact after finitely many impacts.
   Every row at contact that does not leave it becomes active (stopped by the
   impact, or arrived at zero speed); the energy reference of a formulation that
   holds the energy is reset to the energy after the impact. The sub-steps go on from $t^*$ to $t_b$.

**What a step costs.** A step is first the plain RK4 step with the held rows as
equalities, with the monitor and the held rows' multipliers at its end; where no
row crosses and no multiplier changes sign, that is the step, and the loop above
runs only in a step where some trajectory of the batch has an event
(`lax.cond`). Each of the loop's iterations evaluates the dynamics in one loop
(`_stages`): the sub-step's four stages (whose first gives the multipliers at
its start) and a fifth evaluation at its end, which gives the held rows'
multipliers, the acceleration and, for a model whose terms are one evaluation
of their own (a loaded MuJoCo model), the impact's mass matrix and constraints;
the impact and the rest rule run only in an iteration with an event: a
compiled program holds few copies of the model's dynamics. The
loop runs without derivatives (`_locate`): it records each change it makes to
the state (a restart, an accepted sub-step, an event, with what was decided at
it), and `_replay` applies the same changes again by the same functions,
differentiably, so that reverse mode never goes through the loop's trials, the
impact's active-set iteration or the rest rule. Over the steps, reverse mode is
the discrete adjoint (`adjoint_scan`): each step is searched once, in the forward
pass, which keeps what it found (`StepTape`); the backward pass takes the VJP of
the step applied (the plain step again, or the replay by `adjoint_loop` over the
changes recorded), so a program that only runs forward holds the search alone,
and a gradient holds it once.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._impact import impact_law, restitution_outside, unilateral_rate
from .._kinematics import ImpactTerms
from .._problem import Problem
from .._results import RESULTS
from .._solution import Trajectory, rates, stack_saved
from .adjoint import adjoint_loop, adjoint_scan
from .locate import Bracket, narrow, trial
from .rk4 import _axpy, _show_progress, rk4_step

# Sub-steps (detection, location trials, sub-steps after events) within one step.
MAX_SUBSTEPS = 64
# Illinois trials before the event is taken where the bracket stands.
_MAX_TRIALS = 48
# Events recorded per solve (the count goes on beyond), and per step of the grid
# (the sub-steps' record, merged into the solve's after the step).
MAX_EVENTS = 64
_STEP_EVENTS = 4


class Events(eqx.Module):
    r"""The impacts of a solve, in order (`Solution.stats["events"]`): the first
    `MAX_EVENTS` of them, unused rows NaN. `count` counts them all. Per impact:
    its time, configuration, velocities before and after, each row's impulse, the
    rows that took part, those the rest rule stopped, and those that arrived
    `grazing`: slower than one step's acceleration of the row turns them back,
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

    @classmethod
    def empty(cls, q, v, r: int, n: int = MAX_EVENTS):
        nan = jnp.asarray(jnp.nan, q.dtype)
        return cls(jnp.full((n,), nan), jnp.full((n,) + q.shape, nan),
                   jnp.full((n,) + v.shape, nan), jnp.full((n,) + v.shape, nan),
                   jnp.full((n, r), nan), jnp.zeros((n, r), bool),
                   jnp.zeros((n, r), bool), jnp.zeros((n, r), bool),
                   jnp.zeros((), jnp.int32))

    def add(self, when, t, q, v_before, v_after, impulse, rows, rest,
            grazing) -> Events:
        """This record with one impact appended where `when` (and room is left)."""
        one = [x[None] for x in (t, q, v_before, v_after, impulse, rows, rest,
                                 grazing)]
        return self.extend(Events(*one, jnp.asarray(when).astype(jnp.int32)))

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
                      self.count + new.count)


def start_tolerance(q0):
    """How far below zero a unilateral row may start (round-off of a state at
    contact): sqrt(eps) times the size of `q0`."""
    return jnp.sqrt(jnp.finfo(q0.dtype).eps) * jnp.maximum(1.0, jnp.max(jnp.abs(q0)))


def start_result(problem: Problem, t0, y0):
    """The result a solve with unilateral rows starts from, the one check of every
    route: `RESULTS.penetrating_start` where the initial state is behind a row
    beyond `start_tolerance`, `RESULTS.bad_restitution` where the model's
    restitution (traced: outside `jit` `cdiff.simulate` refuses it before
    tracing) is outside [0, 1] or NaN, otherwise successful."""
    model = problem.context.model.model
    q0 = problem.coordinates(t0, y0)[0]
    g0 = model.unilateral(t0, q0)
    return RESULTS.where(
        jnp.any(g0 < -start_tolerance(q0)), RESULTS.penetrating_start,
        RESULTS.where(restitution_outside(model.restitution), RESULTS.bad_restitution,
                      RESULTS.successful))


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
    dtype = q.dtype
    r = active.shape[0]
    e = jnp.broadcast_to(jnp.asarray(model.restitution, dtype), (r,))
    if decision is None:
        eps = jnp.finfo(dtype).eps
        scale = jnp.maximum(1.0, jnp.max(jnp.abs(q)))
        hit = ~active & (model.unilateral(t, q) <= eps ** 0.75 * scale)
        # (A held row joins the impact where the others' impulses drive it in.)
        law = impact_law(model, t, q, v, hit | (active & ~released), throw=throw,
                         terms=terms)
        if vdot is None:
            y = _with(problem, active, e0).restart(t, q, v)
            vdot = held_dynamics(problem, t, y, active, e0, dt_rest=dt_rest)[1]
        decision = _decide(problem, law, t, q, v, vdot, active, released, hit, e, e0,
                           dt_rest=dt_rest)
    else:
        law = impact_law(model, t, q, v, throw=throw, terms=terms)
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


class _Op(NamedTuple):
    """One change of the state in a step's loop of sub-steps (`_locate`), kept so
    that `_replay` can apply the same changes differentiably: a restart at its
    start (the held rows checked for release), a sub-step to `t_try` (to `t_step`,
    where it `moved`) with the rows `active` held, kept where `free`, or ended by
    an event there (at a release where `releasing`) and what was `decided` at
    it, with the acceleration there (`vdot`, for the event time's correction).
    """

    valid: Bool[Array, ""]
    restart: Bool[Array, ""]
    active: Bool[Array, " r"]
    t_try: Float[Array, ""]
    t_step: Float[Array, ""]
    moved: Bool[Array, ""]
    free: Bool[Array, ""]
    event: Bool[Array, ""]
    releasing: Bool[Array, ""]
    decided: Decision
    vdot: Float[Array, " nv"]


class _Carry(NamedTuple):
    t: Float[Array, ""]
    y: tuple
    active: Bool[Array, " r"]
    e0: Float[Array, ""]
    locating: Bool[Array, ""]
    lo: Float[Array, ""]
    hi: Float[Array, ""]
    m_lo: Float[Array, ""]
    m_hi: Float[Array, ""]
    side: Array
    trials: Array
    done: Bool[Array, ""]
    events: Events
    substeps: Array
    # The held rows' multipliers at the last accepted sub-step's end (inf: not
    # held); only their signs are read.
    lam: Float[Array, " r"]
    # An event was just taken: the held rows are checked at the next sub-step's
    # start.
    fresh: Bool[Array, ""]
    # An event whose impact could not meet its conditions ended the loop there.
    infeasible: Bool[Array, ""]
    ops: Array
    tape: _Op


def _gap(model, t, q, active):
    """The monitor of the inactive rows, min g_i (inf if none), and the rows."""
    g = model.unilateral(t, q)
    return jnp.min(jnp.where(active, jnp.inf, g), initial=jnp.inf), g


# Where the rows are also checked inside a sub-step, as fractions of it, on its
# cubic Hermite interpolant: a dip below a row that starts and ends within one
# sub-step (a shallow crossing) is found where it covers one of them.
_INSIDE = (0.25, 0.5, 0.75)


def _monitor(problem: Problem, t0, y0, t1, y1, active, lam, *, dense=None):
    """The monitor over a sub-step from `(t0, y0)` to `(t1, y1)` with the rows
    `active` held, whose held rows' multipliers at its end are `lam` (inf where
    not held; `_stages`'): `(m_start, m_gap, m_end, crossed, t_hi, m_hi)`, the
    inactive rows' minimum at its start and end, the minimum of both at its end,
    whether it crossed zero downwards (an event inside the sub-step), and the end
    of the bracket that holds the first such crossing with the monitor there.
    With `dense = (k_first, k_last, moved)`, the sub-step's first and last RK4 stages, the
    inactive rows are also checked at `_INSIDE` on the coordinates' interpolant
    (diffrax's dense output of RK4): a dip below zero there, with both ends above
    it, is a crossing too, bracketed by the first point below."""
    model = problem.context.model.model
    m_start, _ = _gap(model, t0, problem.coordinates(t0, y0)[0], active)
    m_gap, _ = _gap(model, t1, problem.coordinates(t1, y1)[0], active)
    m_end = jnp.minimum(m_gap, jnp.min(lam, initial=jnp.inf))
    below = jnp.minimum(m_start, 0.0)
    crossed = (m_end < 0) & (m_end < below)
    t_hi, m_hi = t1, m_end
    if dense is not None:
        k_first, k_last, moved = dense
        # The coordinates' cubic Hermite (diffrax's RK4 interpolant: the end states,
        # the first and the last stage) at the fractions s of the sub-step.
        s = jnp.asarray(_INSIDE, t1.dtype)[:, None]
        q = (((2 * s - 3) * s**2 + 1) * y0[0] + ((s - 2) * s + 1) * s * k_first[0]
             + (3 - 2 * s) * s**2 * y1[0] + (s - 1) * s**2 * k_last[0])
        ts = t0 + (t1 - t0) * s[:, 0]
        inside = jax.vmap(lambda t, q: _gap(model, t, q, active)[0])(ts, q)
        dips = moved & (inside < 0) & (inside < below)
        first = jnp.argmax(dips)
        dipped = jnp.any(dips)
        crossed = crossed | dipped
        t_hi = jnp.where(dipped, ts[first], t1)
        m_hi = jnp.where(dipped, inside[first], m_end)
    return m_start, m_gap, m_end, crossed, t_hi, m_hi


def _sub_step(problem: Problem, t, t_step, y, active, e0, moved, projection):
    """An RK4 sub-step from `(t, y)` to `t_step` with the rows `active` held (and
    `projection` after it), or `y` where it has not `moved`: the step applied,
    differentiably (`_replay`, `event_step`)."""
    prob = _with(problem, active, e0)
    y_try, _, _ = rk4_step(
        prob.rate, prob.freeze, prob.end_step, t, t_step, y,
        rate_and_freeze=(prob.rate_and_freeze if problem.freezes_at_first_stage
                         else None))
    if projection is not None:
        y_try = prob.formulation.project(t_step, y_try, prob.context, projection)
    return jax.tree.map(lambda a, b: jnp.where(moved, a, b), y_try, y)


# Classic RK4's nodes and weights, and a fifth evaluation after the stages.
_NODES = (0.0, 0.5, 0.5, 1.0, 0.0)
_WEIGHTS = (1 / 6, 1 / 3, 1 / 3, 1 / 6, 0.0)


def _stages(problem: Problem, t, t_step, y, active, e0, moved, projection, *,
            dt_rest, evaluate, end, monitor: bool = True, start: bool = True):
    """An RK4 sub-step from `(t, y)` to `t_step` with the rows `active` held (and
    `projection` after it; `y` where it has not `moved`), and a fifth evaluation
    of the dynamics at the point `end(y_step) = (t_end, y_end)`, made where some
    trajectory of the batch has `evaluate`: the four stages and the fifth in one
    loop, so that the compiled program holds one copy of the dynamics. The
    search evaluates at the sub-step's end (its monitor); `_replay`, at the
    event's state (the impact's mass matrix and constraints).

    Returns `(y_step, lam_start, (k_first, k_last), (t_end, y_end), lam_end,
    vdot_end, terms_end)`: the held rows' multipliers at the start (read from
    the first stage, whose per-step data are the sub-step's) and at the fifth
    point (inf where not held or not evaluated), the first and last stages'
    increments (for the interpolant), the acceleration at the fifth point (with
    the per-step data of a step of `dt_rest` from there, as `held_dynamics`), and
    the `ImpactTerms` there, read from the same evaluation of the model's terms
    (`None` for a formulation that does not compute its dynamics from them: the
    impact evaluates its own). Differentiable.

    Where the model's terms are not one evaluation of their own (they come by
    autodiff: a small model, quick to compile), the fifth evaluation is made
    apart, after the stages (`_stages_apart`): fewer branches per stage, so a
    faster run. `monitor=False`: the fifth evaluation is for the impact alone
    (none apart); `start=False`: the multipliers at the start are not read (inf,
    apart: the stages compute the rates alone)."""
    if not problem.freezes_at_first_stage:
        return _stages_apart(problem, t, t_step, y, active, e0, moved, projection,
                             dt_rest=dt_rest, evaluate=evaluate if monitor else None,
                             end=end, start=start)
    prob = _with(problem, active, e0)
    h = t_step - t
    dtype = jnp.result_type(h)
    nodes, weights = jnp.array(_NODES, dtype), jnp.array(_WEIGHTS, dtype)
    v = prob.coordinates(t, y)[1]
    # (The per-step data are set at the first evaluation and again at the fifth.)
    frozen = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                          jax.eval_shape(prob.freeze, t, t_step, y))
    t_end0, _ = jax.eval_shape(end, y)
    any_end = eqxi.unvmap_any(evaluate)

    shapes = jax.eval_shape(prob.dynamics_and_terms, t, y, frozen, h,
                            jnp.asarray(True))

    def end_state(total):
        y1 = prob.end_step(t_step, jax.tree.map(jnp.add, y, total))
        if projection is not None:
            y1 = prob.formulation.project(t_step, y1, prob.context, projection)
        y1 = jax.tree.map(lambda a, b: jnp.where(moved, a, b), y1, y)
        return y1, *end(y1)

    def select(which, a, b):
        return jax.tree.map(lambda a, b: jnp.where(which, a, b), a, b)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def body(i, carry):
        k_prev, total, k_first, frozen, lam_start, out = carry
        last = i == 4
        y_step, t_i, y_i = jax.lax.cond(
            last, end_state,
            lambda total: (y, t + nodes[i] * h, _axpy(y, nodes[i], k_prev)), total)
        first = (i == 0) | last
        h_i = jnp.where(last, dt_rest, h)
        dyn, frozen, terms = jax.lax.cond(
            ~last | any_end,
            lambda: prob.dynamics_and_terms(t_i, y_i, frozen, h_i, first),
            lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
        lam = _held(problem, t_i, y_i, active, dyn.multipliers)
        k = jax.tree.map(lambda f: h * f, dyn.rate)
        vdot = jax.lax.cond(
            last & any_end,
            lambda: rates(prob.formulation, prob.context, t_i, y_i, dyn)[1],
            lambda: jnp.zeros_like(v))
        # (The fifth evaluation is no stage: k_last stays the fourth stage's.)
        return (select(last, k_prev, k),
                select(last, total, _axpy(total, weights[i], k)),
                select(i == 0, k, k_first), frozen, jnp.where(i == 0, lam, lam_start),
                select(last, (y_step, t_i, y_i, lam, vdot, terms), out))

    zero = jax.tree.map(jnp.zeros_like, y)
    inf = jnp.full(active.shape, jnp.inf, dtype)
    out = (y, jnp.zeros(t_end0.shape, t_end0.dtype), y, inf, jnp.zeros_like(v),
           jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[2]))
    k_last, _, k_first, _, lam_start, out = jax.lax.fori_loop(
        0, 5, body, (zero, zero, zero, frozen, inf, out))
    y_step, t_end, y_end, lam_end, vdot_end, terms_end = out
    lam_end = jnp.where(evaluate, lam_end, jnp.inf)
    return (y_step, lam_start, (k_first, k_last), (t_end, y_end), lam_end, vdot_end,
            terms_end)


def _stages_apart(problem: Problem, t, t_step, y, active, e0, moved, projection, *,
                  dt_rest, evaluate, end, start):
    """`_stages` with the fifth evaluation after the stages (where `evaluate` is
    not None): the four stages by `rk4_step`, the held rows' multipliers read at
    the first, and no `ImpactTerms`."""
    prob = _with(problem, active, e0)
    inf = jnp.full(active.shape, jnp.inf, jnp.result_type(t_step - t))
    if start:
        frozen = prob.freeze(t, t_step, y)

        def stage(t_i, y_i, lam, h, first):
            dyn = prob.dynamics_with(t_i, y_i, frozen)
            return dyn.rate, jnp.where(first, _held(problem, t_i, y_i, active,
                                                    dyn.multipliers), lam)

        y1, k_first, k_last, lam_start = rk4_step(
            None, prob.freeze, prob.end_step, t, t_step, y, rate_and_freeze=stage,
            carried=inf, keep_first=True)
    else:
        y1, k_first, k_last = rk4_step(prob.rate, prob.freeze, prob.end_step, t,
                                       t_step, y, keep_first=True)
        lam_start = inf
    if projection is not None:
        y1 = prob.formulation.project(t_step, y1, prob.context, projection)
    y1 = jax.tree.map(lambda a, b: jnp.where(moved, a, b), y1, y)
    t_end, y_end = end(y1)
    v = prob.coordinates(t, y)[1]
    lam_end, vdot_end = inf, jnp.zeros_like(v)
    if evaluate is not None:
        lam_end, vdot_end = jax.lax.cond(
            eqxi.unvmap_any(evaluate),
            lambda: held_dynamics(problem, t_end, y_end, active, e0, dt_rest=dt_rest),
            lambda: (inf, jnp.zeros_like(v)))
        lam_end = jnp.where(evaluate, lam_end, jnp.inf)
    return y1, lam_start, (k_first, k_last), (t_end, y_end), lam_end, vdot_end, None


def _corrected(problem: Problem, t_try, y_try, vdot, active, releasing, e0):
    """`(t_e, y_e)`: the event located at the trial `(t_try, y_try)` (acceleration
    `vdot`, the monitor's), corrected to first order to the monitor's root (none
    at a release). The correction is zero in value and carries the event time's
    derivative (the implicit function theorem's): `_replay` applies it, the search
    has no derivatives and leaves it out."""
    model = problem.context.model.model
    prob = _with(problem, active, e0)
    q_try, v_try = prob.coordinates(t_try, y_try)
    m_gap, g_try = _gap(model, t_try, q_try, active)
    i = jnp.argmin(jnp.where(active, jnp.inf, g_try))
    _, gdot, _ = unilateral_rate(model, t_try, q_try, v_try)
    mdot = jnp.where(gdot[i] < 0, gdot[i], -1.0)
    # (None at a release: the constraint force is zero there, so the motion is
    # smooth across it.)
    delta = jnp.where(releasing | ~jnp.isfinite(m_gap), 0.0,
                      -(m_gap - jax.lax.stop_gradient(m_gap)) / mdot)
    # (With delta zero, d(delta * rate) = rate d(delta): the rates' own
    # derivatives would be multiplied by zero, and are left out.)
    qdot, vdot = jax.lax.stop_gradient((model.position_rate(t_try, q_try, v_try), vdot))
    t_e = t_try + delta
    return t_e, prob.restart(t_e, q_try + delta * qdot, v_try + delta * vdot)


def _event_at(problem: Problem, t_e, y_e, vdot, terms, active, released, e0,
              events: Events, *, record, dt_rest, decision: Decision | None = None):
    """The event at `(t_e, y_e)` (a located trial, or `_corrected`'s state in
    `_replay`) taken by `take_event`, with the acceleration `vdot` and the
    `terms` that `_stages` evaluated there (and the `decision` of the search that
    found it, in `_replay`): `(t_e, y, held, e0, events, decision)`."""
    q_e, v_e = _with(problem, active, e0).coordinates(t_e, y_e)
    return (t_e, *take_event(problem, t_e, q_e, v_e, active, released, e0, events,
                             record=record, dt_rest=dt_rest, decision=decision,
                             vdot=vdot, terms=terms))


def _locate(problem: Problem, ta, tb, y, active, e0, *, dt_rest,
            projection) -> _Carry:
    """The loop of sub-steps of a step from `ta` to `tb` (see the module's
    docstring), without derivatives: its state at the end, and the changes it made
    to the state (`_Carry.tape`, for `_replay`). Its first iteration is the whole
    step again. Each iteration evaluates the dynamics in `_stages`: the
    sub-step's stages and, where a row is held or an event is being located, a
    fifth time at the trial's end."""
    eps = jnp.finfo(ta.dtype).eps

    def body(c: _Carry) -> _Carry:
        # Illinois' trial point in the bracket, or the end of the step.
        bracket = Bracket(c.lo, c.hi, c.m_lo, c.m_hi, c.side)
        t_try = jnp.where(c.locating, trial(bracket), tb)
        # A trial at the sub-step's start (a row at contact there) is its state: no
        # step of size zero, which a formulation's per-step data may divide by.
        moved = t_try > c.t
        t_step = jnp.where(moved, t_try, tb)
        # (The dynamics at the trial's end: for the held rows' multipliers, and
        # while locating, for the event that may be taken there.)
        y_try, lam_start, (k_first, k_last), _, lam_try, vdot_try, terms_try = _stages(
            problem, c.t, t_step, c.y, c.active, c.e0, moved, projection,
            dt_rest=dt_rest, evaluate=jnp.any(c.active) | c.locating,
            end=lambda y_try: (t_try, y_try))
        # After an event, a held row that pulls at the sub-step's start is released
        # there: this iteration is then that restart, and the sub-step is taken
        # again, from the state restarted with the rows left.
        lam_start = jnp.where(c.fresh, lam_start, jnp.inf)
        restart = jnp.any(lam_start < 0)
        active, y_start = jax.lax.cond(
            eqxi.unvmap_any(restart),
            lambda: release(problem, c.t, c.y, c.active, c.e0, lam_start),
            lambda: (c.active, c.y))
        y_start = jax.tree.map(lambda a, b: jnp.where(restart, a, b), y_start, c.y)
        go = ~restart
        # The held rows' multipliers at the end: a sign change is a release inside
        # the step. (At the sub-step's start they push: rows that would pull were
        # released.)
        # (Where the iteration is a restart, the rest is not read: it is taken
        # again.)
        lam_try = jnp.where(go, lam_try, jnp.inf)
        m_start, m_gap, m_try, crossed, t_hi, m_hi_try = _monitor(
            problem, c.t, c.y, t_try, y_try, active, lam_try,
            dense=(k_first, k_last, moved))
        # A row below zero inside the sub-step only (its interpolant): the
        # crossing is bracketed by that point, and the end's values do not count.
        dipped = go & (t_hi < t_try)
        releasing = (jnp.min(lam_try, initial=jnp.inf) < m_gap) & ~dipped
        q_try, _ = _with(problem, active, c.e0).coordinates(t_try, y_try)
        scale = jnp.maximum(1.0, jnp.max(jnp.abs(q_try)))
        # (Relative to the bracket's values for multipliers, which have units of
        # force.)
        tol = 8 * eps * jnp.maximum(scale, jnp.where(
            releasing, jnp.abs(c.m_lo) + jnp.abs(c.m_hi), 0.0))
        crossed = go & crossed
        # Free sub-step: accepted unless a row was crossed, which opens a bracket.
        start_locating = ~c.locating & crossed
        # Locating: Illinois' update, or the event when converged. A trial whose
        # interpolant dips below zero after the bracket's start has a crossing
        # before its end: the bracket closes on that point.
        inside = dipped & (t_hi > c.lo)
        feasible = (m_try >= 0) & ~inside
        width = c.hi - c.lo
        event = go & c.locating & (((jnp.abs(m_try) <= tol) & ~inside)
                                   | (width <= 4 * eps * jnp.abs(c.hi))
                                   | (c.trials >= _MAX_TRIALS))
        # A release (not where the bracket closes on a dip of a row's gap).
        released = ~dipped & released_rows(m_gap, lam_try, active, tol)

        # Computed only where some trajectory of the batch has an event.
        t_e, y_e, held, e_after, events, decided = jax.lax.cond(
            eqxi.unvmap_any(event),
            lambda: _event_at(problem, t_try, y_try, vdot_try, terms_try, active,
                              released, c.e0, c.events, record=event,
                              dt_rest=dt_rest),
            lambda: (t_try, y_try, active, c.e0, c.events, Decision.none(active)))

        accept_free = go & ~c.locating & ~crossed
        t_new = jnp.where(event, t_e, jnp.where(accept_free, t_try, c.t))
        y_new = jax.tree.map(
            lambda ev, fr, old: jnp.where(event, ev, jnp.where(accept_free, fr, old)),
            y_e, y_try, y_start)
        active_new = jnp.where(event, held, active)
        # Bracket: opened on a crossing, narrowed while locating (a restart leaves
        # it as it is).
        narrowed = narrow(bracket, t_try, m_try, ~feasible)
        lo = jnp.where(start_locating, c.t, narrowed.lo)
        closer = start_locating | inside  # (where the monitor puts the bracket's end)
        hi = jnp.where(closer, t_hi, narrowed.hi)
        # (A release's multipliers at the sub-step's start are not at hand: 0 makes
        # the first trial the start, whose value then enters the bracket.)
        m_lo = jnp.where(start_locating, jnp.where(releasing, 0.0,
                                                   jnp.maximum(m_start, 0.0)),
                         narrowed.m_lo)
        m_hi = jnp.where(closer, m_hi_try, narrowed.m_hi)
        side = jnp.where(start_locating, 0, narrowed.side)
        locating = jnp.where(start_locating, True, c.locating & ~event)
        narrowing = go & (c.locating | start_locating)
        lo, hi, m_lo, m_hi, side = (
            jnp.where(narrowing, a, b) for a, b in
            zip((lo, hi, m_lo, m_hi, side), (c.lo, c.hi, c.m_lo, c.m_hi, c.side)))
        trials = jnp.where(go, jnp.where(locating & ~start_locating, c.trials + 1, 0),
                           c.trials)
        # The change this iteration made, for the replay.
        changed = restart | accept_free | event
        op = _Op(changed, restart, active, t_try, t_step, moved & go, accept_free,
                 event, releasing, decided, vdot_try)
        # (Past the end, where nothing changed or no room is left: dropped.)
        i = jnp.where(changed, jnp.minimum(c.ops, MAX_SUBSTEPS - 1), MAX_SUBSTEPS)
        tape = jax.tree.map(lambda buf, x: buf.at[i].set(x, mode="drop"), c.tape, op)
        return _Carry(
            t=t_new, y=y_new, active=active_new,
            e0=jnp.where(event, e_after, c.e0), locating=locating,
            lo=lo, hi=hi, m_lo=m_lo, m_hi=m_hi, side=side, trials=trials,
            done=accept_free | (event & decided.infeasible),
            events=events,
            substeps=c.substeps + 1,
            lam=jnp.where(accept_free, lam_try, c.lam),
            fresh=restart | (event & jnp.any(held)),
            infeasible=event & decided.infeasible,
            ops=c.ops + changed.astype(c.ops.dtype), tape=tape)

    return jax.lax.while_loop(lambda c: ~c.done & (c.substeps < MAX_SUBSTEPS), body,
                              _initial(problem, ta, y, active, e0))


def _initial(problem: Problem, ta, y, active, e0) -> _Carry:
    """The loop's carry at the step's start (no change recorded)."""
    r = active.shape[0]
    dtype = ta.dtype
    zero = jnp.zeros((), dtype)
    false = jnp.asarray(False)
    n = MAX_SUBSTEPS
    rows = jnp.zeros((n, r), bool)
    v = problem.coordinates(ta, y)[1]
    tape = _Op(jnp.zeros(n, bool), jnp.zeros(n, bool), rows,
               jnp.zeros(n, dtype), jnp.zeros(n, dtype), jnp.zeros(n, bool),
               jnp.zeros(n, bool), jnp.zeros(n, bool), jnp.zeros(n, bool),
               Decision(rows, rows, rows, jnp.zeros(n, bool), jnp.zeros(n, bool),
                        rows), jnp.zeros((n,) + v.shape, v.dtype))
    step_events = Events.empty(*problem.coordinates(ta, y), r, _STEP_EVENTS)
    return _Carry(ta, y, active, e0, false, zero, zero, zero, zero,
                  jnp.asarray(0), jnp.asarray(0), false, step_events,
                  jnp.asarray(0), jnp.full(r, jnp.inf, dtype), false, false,
                  jnp.asarray(0), tape)


def _replay(problem: Problem, dt_rest, projection, carry, op: _Op):
    """The change `op` recorded by `_locate`, applied to `(t, y, e0, events)` by
    the same functions: differentiable (the trial times carry no derivative; an
    event's time carries the implicit function theorem's through `_corrected`).
    The impact reads the mass matrix and constraints at the event from the
    sub-step's fifth evaluation (`_stages`)."""

    def apply(carry):
        t, y, e0, events = carry
        prob = _with(problem, op.active, e0)
        y = jax.lax.cond(
            eqxi.unvmap_any(op.restart),
            lambda: jax.tree.map(lambda a, b: jnp.where(op.restart, a, b),
                                 prob.restart(t, *prob.coordinates(t, y)), y),
            lambda: y)

        def end(y_try):
            # (The event's state, where the sub-step ends in one.)
            corrected = _corrected(problem, op.t_try, y_try, op.vdot, op.active,
                                   op.releasing, e0)
            return jax.tree.map(lambda a, b: jnp.where(op.event, a, b), corrected,
                                (op.t_try, y_try))

        y_try, _, _, (t_e, y_e), _, _, terms = _stages(
            problem, t, op.t_step, y, op.active, e0, op.moved, projection,
            dt_rest=dt_rest, evaluate=op.event, end=end, monitor=False,
            start=False)
        t_e, y_e, _, e_after, events, _ = jax.lax.cond(
            eqxi.unvmap_any(op.event),
            lambda: _event_at(problem, t_e, y_e, op.vdot, terms, op.active, None, e0,
                              events, record=op.event, dt_rest=dt_rest,
                              decision=op.decided),
            lambda: (op.t_try, y_try, op.active, e0, events, op.decided))
        t_new = jnp.where(op.event, t_e, jnp.where(op.free, op.t_try, t))
        y_new = jax.tree.map(
            lambda ev, fr, old: jnp.where(op.event, ev, jnp.where(op.free, fr, old)),
            y_e, y_try, y)
        return t_new, y_new, jnp.where(op.event, e_after, e0), events

    keep = jax.lax.cond(eqxi.unvmap_any(op.valid), apply, lambda c: c, carry)
    return jax.tree.map(lambda a, b: jnp.where(op.valid, a, b), keep, carry), None


class StepTape(NamedTuple):
    """What `event_step`'s search found, for its differentiable application: the
    changes its loop of sub-steps made (the first `count` of `ops`: one free
    sub-step where nothing happened); the rows held at the end, their multipliers
    (for the release there), whether the sub-steps sufficed, and whether an
    impact could not meet its conditions (`Decision.infeasible`: the step ends
    there, and the solve with it)."""

    count: Array
    ops: _Op
    active: Bool[Array, " r"]
    lam: Float[Array, " r"]
    done: Bool[Array, ""]
    infeasible: Bool[Array, ""]


def event_step(problem: Problem, ta, tb, y, active, e0, events: Events, *, dt_rest,
               projection=None, tape: StepTape | None = None,
               forward_mode: bool = False, replay: bool | None = None):
    """The state at `tb` from `y` at `ta`, with the events between: `(y, active,
    e0, events, done, tape)`; `done` is False when the sub-steps ran out.
    `projection` (of [`cdiff.Projected`][]) maps every sub-step's end onto the
    constraints with the rows held there.

    Without `tape`, the step is searched, without derivatives. It is first taken
    as a plain RK4 step with the held rows as equalities, with the monitor at its
    end. Where no row is crossed and no held row's multiplier changes sign, that
    is the step. Only where some trajectory of the batch has an event does the
    loop of sub-steps run (`_locate`, from the step's start); the changes it made
    are returned in `tape`.

    With the `tape` of a search, the step is applied, differentiably: the plain
    step again, or the changes the loop made (`_replay`), to the same values to
    round-off. Reverse mode never goes through the loop of trials, and a step
    without events is differentiated as a plain step. (A model whose terms are
    one evaluation of their own, a loaded MuJoCo model, applies every step by
    the replay: its program then holds the step's VJP once instead of twice, for
    a gradient run about 15 % longer.) `forward_mode`: the replay in a
    `fori_loop` (which `jax.jvp` differentiates) instead of the discrete
    adjoint. `replay` (with a `tape`): True or False applies the step by the
    replay or as a plain step, for a caller that knows which (the discrete
    adjoint chooses between their VJPs, `plain_step`); None chooses here."""
    if tape is None:
        final, tape = _search(problem, ta, tb, y, active, e0, dt_rest=dt_rest,
                              projection=projection)
        t, y, e0, step_events = final.t, final.y, final.e0, final.events
    else:
        no_events = Events.empty(*problem.coordinates(ta, y), active.shape[0],
                                 _STEP_EVENTS)

        def replay(c, op):
            return _replay(problem, dt_rest, projection, c, op)[0]

        init = (ta, y, e0, no_events)

        def replayed():
            if forward_mode:
                return jax.lax.fori_loop(0, tape.count, lambda i, c: replay(
                    c, jax.tree.map(lambda x: x[i], tape.ops)), init)
            return adjoint_loop(replay, init, tape.ops, tape.count)

        def plain():
            y1 = _sub_step(problem, ta, tb, y, active, e0, jnp.asarray(True),
                           projection)
            return tb, y1, e0, no_events

        if replay is not None:
            t, y, e0, step_events = replayed() if replay else plain()
        elif problem.freezes_at_first_stage:
            t, y, e0, step_events = replayed()
        else:
            # (The plain step where no trajectory of the batch had an event: a loop
            # costs more than its one iteration in a small model's step.)
            t, y, e0, step_events = jax.lax.cond(eqxi.unvmap_any(tape.count != 1),
                                                 replayed, plain)
    # A held row that pulls at the step's end (round-off the monitor let pass) is
    # released there, so that the active set saved with the state holds only rows
    # that push. Its multipliers are the last accepted sub-step's.
    active, y = jax.lax.cond(
        eqxi.unvmap_any(jnp.any(tape.active & (tape.lam < 0))),
        lambda: release(problem, t, y, tape.active, e0, tape.lam),
        lambda: (tape.active, y))

    # The step's events appended to the solve's, where some trajectory had one.
    events = jax.lax.cond(eqxi.unvmap_any(step_events.count > 0),
                          lambda new: events.extend(new), lambda _: events,
                          step_events)
    return y, active, e0, events, tape.done, tape


def plain_step(tape: StepTape) -> Array:
    """Whether a searched step is applied as a plain step (no trajectory of the
    batch had an event in it), as an index for `lax.switch`: 0 plain, 1 the
    replay."""
    return eqxi.unvmap_any(tape.count != 1).astype(jnp.int32)


def _search(problem: Problem, ta, tb, y, active, e0, *, dt_rest, projection):
    """`event_step`'s search: `(final, tape)`, the loop's carry at the step's end
    and the `StepTape`. The plain step first, with the monitor at its end: the
    loop of sub-steps runs only where some trajectory of the batch has an event
    (a `while_loop` costs more than its one iteration in a small model's step).

    Where the model's terms are one evaluation of their own (a loaded MuJoCo
    model), the search is the loop alone, whose first iteration is that plain
    step and its monitor: the program then holds one copy of the dynamics for the
    search instead of two (XLA's time for a large model is about proportional to
    them), and the loop's bookkeeping is small beside the model's evaluation."""
    if problem.freezes_at_first_stage:
        final = _locate(problem, ta, tb, y, active, e0, dt_rest=dt_rest,
                        projection=projection)
        return final, _tape(final)
    true = jnp.asarray(True)
    y1, _, (k_first, k_last), _, lam1, vdot1, _ = _stages(
        problem, ta, tb, y, active, e0, true, projection, dt_rest=dt_rest,
        evaluate=jnp.any(active), end=lambda y1: (tb, y1), start=False)
    _, _, _, has_event, _, _ = _monitor(problem, ta, y, tb, y1, active, lam1,
                                        dense=(k_first, k_last, true))

    def plain():
        init = _initial(problem, ta, y, active, e0)
        op = _Op(true, jnp.asarray(False), active, tb, tb, true, true,
                 jnp.asarray(False), jnp.asarray(False), Decision.none(active), vdot1)
        tape = jax.tree.map(lambda buf, x: buf.at[0].set(x), init.tape, op)
        return init._replace(t=tb, y=y1, done=true, substeps=jnp.asarray(1),
                             lam=lam1, ops=jnp.asarray(1), tape=tape)

    final = jax.lax.cond(
        eqxi.unvmap_any(has_event),
        lambda: _locate(problem, ta, tb, y, active, e0, dt_rest=dt_rest,
                        projection=projection),
        plain)
    return final, _tape(final)


def _tape(final: _Carry) -> StepTape:
    """The `StepTape` of the search's loop carry at the step's end."""
    lam = jnp.where(final.done, final.lam, jnp.inf)
    return StepTape(final.ops, final.tape, final.active, lam, final.done,
                    final.infeasible)


def event_rk4_route(problem: Problem, grid_ts, *, steps: int, save_t0: bool,
                    save_steps: bool, save_t1: bool, rows: int, throw: bool,
                    projection=None, forward_mode: bool = False,
                    progress: bool = False) -> Trajectory:
    """Integrate `problem` (whose model is a [`WithUnilateral`][]) on the step times
    `grid_ts` by `event_step` (with `projection` after every sub-step, for
    [`cdiff.Projected`][]): the route of [`cdiff.simulate`][] for a model with
    unilateral rows. `forward_mode`: the steps in a plain `scan` (which `jax.jvp`
    differentiates) instead of the discrete adjoint; `progress`: a progress bar,
    drawn about 20 times during the solve."""
    dt = grid_ts[1] - grid_ts[0]
    # (What the steps differentiate, passed to them rather than closed over: the
    # discrete adjoint then traces the applications only where it is
    # differentiated.)
    args = (problem, projection, dt)

    def body(args, carry, ts, tape=None, replay=None):
        problem, projection, dt = args
        y, active, e0, result, events = carry
        ta, tb = ts
        running = result == RESULTS.successful
        y1, active1, e01, events1, done, tape = event_step(
            problem, ta, tb, y, active, e0, events, dt_rest=dt, projection=projection,
            tape=tape, forward_mode=forward_mode, replay=replay)
        result = RESULTS.where(running & ~done, RESULTS.event_limit, result)
        result = RESULTS.where(running & tape.infeasible, RESULTS.infeasible_contact,
                               result)
        keep = running & done & ~tape.infeasible
        y = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1, y)
        # (A step that ran out of sub-steps, or whose impact was infeasible, ends
        # the solve: its events are kept, and no later step's.)
        events1 = jax.tree.map(lambda a, b: jnp.where(running, a, b), events1, events)
        carry = (y, jnp.where(keep, active1, active), jnp.where(keep, e01, e0), result,
                 events1)
        row = jax.tree.map(lambda x: jnp.where(keep, x, jnp.inf), (tb, y1))
        return carry, (row, jnp.where(keep, active1, False)), tape

    def search(args, carry, ts):
        return body(args, carry, ts)

    def apply(args, carry, ts, tape):
        return body(args, carry, ts, tape)[:2]

    def apply_plain(args, carry, ts, tape):
        return body(args, carry, ts, tape, replay=False)[:2]

    def apply_replay(args, carry, ts, tape):
        return body(args, carry, ts, tape, replay=True)[:2]

    if forward_mode:  # each step searched, then applied with tangents
        def run(init, xs):
            def step(carry, ts):
                # (The trial times carry no derivative: the event time's is the
                # correction's, in `_event_at`.)
                tape = jax.lax.stop_gradient(search(args, carry, ts)[2])
                return apply(args, carry, ts, tape)
            return jax.lax.scan(step, init, xs)
    else:
        def run(init, xs):
            if problem.freezes_at_first_stage:  # (every step by the replay)
                return adjoint_scan(search, init, xs, apply=apply, args=args)
            # (The plain step's VJP or the replay's, chosen outside them.)
            return adjoint_scan(search, init, xs, apply=(apply_plain, apply_replay),
                                choose=lambda args, carry, ts, tape: plain_step(tape),
                                args=args)

    y0 = problem.y0
    active0 = problem.context.model.active
    # (Checked before tracing where the start is concrete, naming the rows.)
    start = start_result(problem, grid_ts[0], y0)
    init = (y0, active0, problem.context.e0, start,
            Events.empty(*problem.coordinates(grid_ts[0], y0), active0.shape[0]))
    xs = (grid_ts[:steps], grid_ts[1:steps + 1])
    if not progress:
        (y, active, _, result, events), (step_rows, step_active) = run(init, xs)
    else:
        (y, active, _, result, events), (step_rows, step_active) = _in_blocks(
            run, init, xs, dt)
    if save_steps and rows > steps:
        def pad(x, fill):
            return jnp.concatenate([x, jnp.full((rows - steps,) + x.shape[1:], fill,
                                                x.dtype)])
        step_rows = jax.tree.map(lambda x: pad(x, jnp.inf), step_rows)
        step_active = pad(step_active, False)

    def row(x):
        return jax.tree.map(lambda a: a[None], x)

    # The active set saved as part of each row's state: (y, active).
    ts, (ys, saved_active) = stack_saved(
        t0=row((grid_ts[0], (y0, active0))) if save_t0 else None,
        steps=(step_rows[0], (step_rows[1], step_active)) if save_steps else None,
        t1=(row((grid_ts[steps], (y, active))) if save_t1 and not save_steps
            else None))
    if throw:
        ts = result.error_if(ts, result != RESULTS.successful)
    taken = jnp.asarray(steps)
    stats = dict(max_steps=rows, num_steps=taken, num_accepted_steps=taken,
                 num_rejected_steps=jnp.zeros_like(taken), events=events)
    return Trajectory(ts, ys, result, stats, active=saved_active)


def _in_blocks(run, init, xs, dt, bars: int = 20):
    """`run(init, xs)` (a scan) over the steps in about `bars` blocks, the progress
    bar drawn after each (a host callback between blocks, none inside the steps,
    whose discrete adjoint would call it again). The last block is filled with
    steps beyond the end (from `t1` on, discarded), so that every block has the
    same length."""
    steps = xs[0].shape[0]
    block = -(-steps // bars)
    blocks = -(-steps // block)
    pad = blocks * block - steps
    ta, tb = xs
    extra = tb[-1] + dt * jnp.arange(pad + 1, dtype=tb.dtype)
    split = [jnp.concatenate([x, e]).reshape(blocks, block)
             for x, e in ((ta, extra[:-1]), (tb, extra[1:]))]
    import tqdm.auto  # noqa: F401  (now, not by the first callback during the run)

    def run_block(carry, block_xs):
        number, ts = block_xs
        carry, out = run(carry, ts)
        jax.debug.callback(_show_progress, (number + 1) / blocks)
        return carry, out

    carry, out = jax.lax.scan(run_block, init, (jnp.arange(blocks), tuple(split)))
    jax.debug.callback(_show_progress, jnp.ones(()), carry[3])
    return carry, jax.tree.map(
        lambda x: x.reshape(blocks * block, *x.shape[2:])[:steps], out)
