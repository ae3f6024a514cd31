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

from typing import NamedTuple

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._problem import Problem
from .adjoint import adjoint_loop
from .event_rules import Decision, Events, _with, release, released_rows, take_event
from .event_substep import _corrected, _monitor, _stages, _sub_step
from .locate import Bracket, narrow, trial

# Sub-steps (detection, location trials, sub-steps after events) within one step.
MAX_SUBSTEPS = 64
# Illinois trials before the event is taken where the bracket stands.
_MAX_TRIALS = 48
# Events recorded per step of the grid (the sub-steps' record, merged into the
# solve's after the step).
_STEP_EVENTS = 4


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
