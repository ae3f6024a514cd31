r"""Unilateral rows through `diffrax.diffeqsolve` (any diffrax solver and step-size
controller, save times) and through cdiff's BDF (the DAE formulations).

The solve is a loop of segments (`equinox.internal.while_loop`, reverse-mode
differentiable). Each segment is one solve from the last event towards `t1`, with
the active rows held as equalities, ended at the first zero of the *monitor*

$$m(t) = \min\Big(\min_{i\ \text{inactive}} \frac{g_i}{s_q},\
\min_{i\ \text{held}} \frac{\lambda_i}{s_\lambda}\Big) + c,$$

the rows' gaps in units of the configuration's size $s_q = \max(1, \|q\|_\infty)$
and the held rows' multipliers in units of their size at the segment's start,
shifted by $c$ (round-off) so that it starts positive.

- `diffrax.diffeqsolve` ends the segment with a `diffrax.Event` on $m$
  (`direction=False`), located on the last step's dense output by Illinois' regula
  falsi ([`Illinois`][], an optimistix root finder) to round-off in $m$; the event
  time's derivative is the implicit function theorem's (optimistix's implicit
  adjoint).
- cdiff's BDF (`bdf_solve(..., event=)`) locates it on the step's interpolating
  polynomial and corrects it to first order; every segment restarts BDF at order 1
  from the DAE's consistent state.

There the event is taken as by cdiff's own loop
(`take_event`: impacts, the rest rule, the rows held from there, a release), and
the next segment starts. A row that would pull at a segment's start is released
there.

The rest rule's time is the solve's `dt` (the first step of an adaptive solve).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import diffrax
import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import optimistix as optx
from jaxtyping import Array, Bool, Float

from .._problem import Problem
from .._results import RESULTS
from .._solution import Trajectory, stack_saved
from .bdf import BDF, bdf_solve
from .event_friction import admissible, contact, modes_after, set_modes, unstick
from .event_rules import EVENT_KINDS
from .events import (MAX_EVENTS, Decision, Events, _with, held_multipliers,
                     release, released_rows, start_result, take_event)
from .frozen import diffrax_problem, stepsize_tolerances
from .locate import Bracket, narrow, trial
from .projected import Projected
from .rk4 import _show_progress

# Events per solve by default (`simulate(..., max_events=)`): one segment each,
# plus the last.
MAX_SEGMENTS = 256
_STEPS = ("num_steps", "num_accepted_steps", "num_rejected_steps")


class _IllinoisState(eqx.Module):
    bracket: Bracket
    error: Float[Array, ""]
    step: Array


class Illinois(optx.AbstractRootFinder):
    """Illinois' regula falsi (the one locator, `locate`) as an optimistix root
    finder, on a bracket `[lower, upper]` (optimistix `options`) of a scalar
    function positive at `lower` and not positive at `upper`, as diffrax's events
    pass it. Ends where `|f| <= atol` or the bracket is narrower than `rtol`
    times its end."""

    rtol: float
    atol: float
    norm: ClassVar = jnp.abs

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        del y, aux_struct, tags
        lower = jnp.asarray(options["lower"], f_struct.dtype)
        upper = jnp.asarray(options["upper"], f_struct.dtype)
        f_lower, _ = fn(lower, args)
        return _IllinoisState(
            Bracket(lower, upper, f_lower, jnp.zeros_like(f_lower), jnp.asarray(0)),
            jnp.asarray(jnp.inf, f_struct.dtype), jnp.asarray(0))

    def step(self, fn, y, args, options, state: _IllinoisState, tags):
        del options, tags
        # (The first trial is diffrax's `upper`, the end of the step.)
        f, aux = fn(y, args)
        bracket = narrow(state.bracket, y, f, ~(f > 0))
        return trial(bracket), _IllinoisState(bracket, f, state.step + 1), aux

    def terminate(self, fn, y, args, options, state: _IllinoisState, tags):
        del fn, y, args, options, tags
        upper = state.bracket.hi
        done = (state.step > 0) & ((jnp.abs(state.error) <= self.atol)
                                   | (upper - state.bracket.lo
                                      <= self.rtol * jnp.abs(upper)))
        return done, optx.RESULTS.successful

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


class _Monitor(eqx.Module):
    """The segment's monitor `m(t)` (see the module), a diffrax event function.
    With friction, also the stuck rows' cone margins (in the multipliers' unit)
    and the slipping rows' slip monitors (in `v_scale`, the velocities' size at
    the segment's start), see `event_friction`."""

    problem: Problem  # with the segment's active rows
    lam_scale: Float[Array, ""]
    offset: Float[Array, ""]
    dt_rest: Float[Array, ""]
    v_scale: Float[Array, ""] | None = None

    def values(self, t, y):
        """The rows' gaps (inf where held), held multipliers (inf where not
        held) and, with friction, the friction monitors and the `Contact` (None
        and None without), each in its unit."""
        problem = self.problem
        wrapped = problem.context.model
        active = wrapped.active
        q, _ = problem.coordinates(t, y)
        scale = jnp.maximum(1.0, jnp.max(jnp.abs(q)))
        gap = jnp.where(active, jnp.inf, wrapped.unilateral(t, q) / scale)
        if wrapped.stuck is not None:
            c = contact(problem, t, y, active, problem.context.e0,
                        dt_rest=self.dt_rest)
            friction = jnp.concatenate([c.margin / self.lam_scale,
                                        c.slip_monitor / self.v_scale])
            return gap, c.lam_n / self.lam_scale, friction, c
        lam = jax.lax.cond(
            eqxi.unvmap_any(jnp.any(active)),
            lambda: held_multipliers(problem, t, y, active, problem.context.e0,
                                     dt_rest=self.dt_rest),
            lambda: jnp.full(active.shape, jnp.inf, q.dtype))
        return gap, lam / self.lam_scale, None, None

    def __call__(self, t, y, args, **kwargs):
        del args, kwargs
        gap, lam, friction, _ = self.values(t, y)
        m = jnp.minimum(jnp.min(gap, initial=jnp.inf), jnp.min(lam, initial=jnp.inf))
        if friction is not None:
            m = jnp.minimum(m, jnp.min(friction))
        return m + self.offset


class _Carry(NamedTuple):
    t: Float[Array, ""]
    y: Any
    active: Bool[Array, " r"]
    e0: Float[Array, ""]
    result: Any
    events: Events
    # With friction (None without): the held rows that stick, the slip's
    # direction of those that slip (see `event_friction`).
    stuck: Any
    sliding: Any
    steps: tuple  # (taken, accepted, rejected)
    ts: Float[Array, " n"]  # the saved rows (save times or steps)
    ys: Any
    saved_active: Any  # (n, r) booleans; with friction, and the modes
    filled: Array  # rows of steps written
    done: Bool[Array, ""]


class _Segment(NamedTuple):
    """A segment's solve: where it ended (`t`, `y`), whether at an event, its
    result, its saved rows (save times or steps) and its step counts."""

    t: Float[Array, ""]
    y: Any
    event: Bool[Array, ""]
    result: Any
    ts: Float[Array, " n"]
    ys: Any
    steps: tuple


class _SegmentProgress(diffrax.AbstractProgressMeter):
    """A segment's progress drawn on the solve's bar (`_show_progress`) as a
    fraction of the whole solve, from `start` (the segment's start) over `span`
    (what is left of the solve), every 2 % of it."""

    start: Array
    span: Array

    def init(self):
        return self.start

    def step(self, state, progress):
        fraction = self.start + self.span * progress

        def draw():
            jax.debug.callback(_show_progress, fraction)
            return fraction

        # (Under vmap, drawn where every trajectory has moved on by 2 %.)
        moved = eqxi.unvmap_all(fraction - state >= 0.02)
        return jax.lax.cond(eqxi.nonbatchable(moved), draw, lambda: state)

    def close(self, state):
        del state  # (the route closes the bar after the last segment)


def _diffrax_segment(solver, stepsize_controller, *, max_steps: int,
                     save_steps: bool, progress: bool = False):
    """A segment by `diffrax.diffeqsolve`, ended by a `diffrax.Event` on the
    monitor (with the solve's progress bar where `progress`)."""
    solver = stepsize_tolerances(solver, stepsize_controller)

    def segment(prob: Problem, t, y, monitor: _Monitor, save_ts) -> _Segment:
        meter = diffrax.NoProgressMeter()
        if progress:
            length = prob.t1 - prob.t0
            meter = _SegmentProgress((t - prob.t0) / length, (prob.t1 - t) / length)
        eps = jnp.finfo(t.dtype).eps
        event = diffrax.Event(monitor, Illinois(rtol=4 * eps, atol=8 * eps),
                              direction=False)
        terms, fsolver, args = diffrax_problem(prob, solver, prob.dt)
        subs = [diffrax.SubSaveAt(t1=True)]
        if save_ts is not None:
            subs.append(diffrax.SubSaveAt(ts=save_ts))
        elif save_steps:
            subs.append(diffrax.SubSaveAt(steps=True))
        sol = diffrax.diffeqsolve(
            terms, fsolver, t, prob.t1, prob.dt, y, args=args,
            saveat=diffrax.SaveAt(subs=subs), stepsize_controller=stepsize_controller,
            event=event, max_steps=max_steps, throw=False, progress_meter=meter)
        hit = sol.result == diffrax.RESULTS.event_occurred
        ok = hit | (sol.result == diffrax.RESULTS.successful)
        saved = (sol.ts[1], sol.ys[1]) if len(subs) > 1 else (None, None)
        return _Segment(sol.ts[0][-1], jax.tree.map(lambda x: x[-1], sol.ys[0]), hit,
                        RESULTS.where(ok, RESULTS.successful,
                                      RESULTS.promote(sol.result)),
                        *saved, tuple(sol.stats[k] for k in _STEPS))

    return segment


def _bdf_segment(solver: BDF, *, max_steps: int, save_steps: bool):
    """A segment by cdiff's BDF (a DAE formulation), restarted at order 1 from a
    consistent state and ended where the monitor falls to zero."""

    def segment(prob: Problem, t, y, monitor: _Monitor, save_ts) -> _Segment:
        formulation, context = prob.formulation, prob.context

        def singular(t, x):
            return formulation.monitor(t, x, context)

        ts, xs, result, stats = bdf_solve(
            lambda t, x, xdot: formulation.residual(t, x, xdot, context),
            lambda t, x: formulation.consistent(t, x, context), t, prob.t1, y, prob.dt,
            algebraic=formulation.algebraic, solver=solver, save_t0=False,
            save_t1=save_ts is None and not save_steps, save_steps=save_steps,
            save_ts=save_ts, max_steps=max_steps,
            monitor=singular if formulation.sizes[2] else None,
            event=lambda t, x: monitor(t, x, None))
        return _Segment(stats["t_stop"], stats["x_stop"], stats["event"], result, ts,
                        xs, tuple(stats[k] for k in _STEPS))

    return segment


def event_diffrax_route(problem: Problem, solver, *, stepsize_controller,
                        save: tuple[bool, bool, bool], save_ts, max_steps: int,
                        throw: bool, progress: bool = False,
                        max_events: int = MAX_SEGMENTS) -> Trajectory:
    """Integrate `problem` (whose model is a [`WithUnilateral`][]) by segments of
    `diffrax.diffeqsolve` between events (see the module): the route of
    [`cdiff.simulate`][] for a model with unilateral rows and a diffrax solver,
    an adaptive step or save times. `save`: `(t0, t1, steps)`; `save_ts`: the save
    times or None; `progress`: a progress bar over the whole solve; `max_events`:
    the most events, after which the solve ends with `RESULTS.too_many_events`."""
    segment = _diffrax_segment(solver, stepsize_controller, max_steps=max_steps,
                               save_steps=save[2], progress=progress)
    projection = solver.projection if type(solver) is Projected else None
    trajectory = _segments(problem, segment, save=save, save_ts=save_ts,
                           max_steps=max_steps, throw=throw, projection=projection,
                           max_events=max_events)
    if progress:  # closes the bar, after the loop (it reads its result)
        jax.debug.callback(_show_progress, jnp.ones(()), trajectory.ts[-1:])
    return trajectory


def event_bdf_route(problem: Problem, solver: BDF, *, save: tuple[bool, bool, bool],
                    save_ts, max_steps: int, throw: bool,
                    max_events: int = MAX_SEGMENTS) -> Trajectory:
    """Integrate `problem` (a DAE formulation, whose model is a
    [`WithUnilateral`][]) by segments of cdiff's BDF between events: the route of
    [`cdiff.simulate`][] for a model with unilateral rows and [`cdiff.BDF`][]."""
    segment = _bdf_segment(solver, max_steps=max_steps, save_steps=save[2])
    return _segments(problem, segment, save=save, save_ts=save_ts,
                     max_steps=max_steps, throw=throw, projection=None,
                     max_events=max_events)


def _segments(problem: Problem, segment, *, save: tuple[bool, bool, bool], save_ts,
              max_steps: int, throw: bool, projection,
              max_events: int = MAX_SEGMENTS) -> Trajectory:
    """The loop of segments (see the module), each solved by `segment`: at most
    `max_events` events (the segment after the last of them included)."""
    save_t0, save_t1, save_steps = save
    t0, t1, dt = problem.t0, problem.t1, problem.dt
    y0 = problem.y0
    dtype = t0.dtype
    eps = jnp.finfo(dtype).eps
    active0 = problem.context.model.active
    r = active0.shape[0]
    friction = problem.context.model.stuck is not None
    modes0 = (problem.context.model.stuck, problem.context.model.sliding)

    def _modes(active, stuck, sliding):
        """What is saved of the rows at a state: `active`, with friction the
        modes too."""
        return (active, stuck, sliding) if friction else active

    # The saved rows beyond t0 and t1: save times, or every step (each event adds
    # a row: the step that ends there, saved with the state after the event, as a
    # save time there is).
    n = (save_ts.shape[0] if save_ts is not None
         else max_steps + MAX_EVENTS if save_steps else 0)

    def body(c: _Carry) -> _Carry:
        if friction:
            # A held row that would pull at the segment's start is released
            # there, and a row that sticks outside its cone slips.
            base = set_modes(problem, c.stuck, c.sliding)
            at_start = contact(base, c.t, c.y, c.active, c.e0, dt_rest=dt)
            lam = at_start.lam_n
            active = c.active & ~(lam < 0)
            stuck, sliding = unstick(_with(base, c.active, c.e0), at_start)
            fproblem = set_modes(problem, stuck, sliding)
            changed = jnp.any(active != c.active) | jnp.any(stuck != c.stuck)
            restarted = _with(fproblem, active, c.e0).restart(
                c.t, *problem.coordinates(c.t, c.y))
            y = jax.tree.map(lambda a, b: jnp.where(changed, a, b), restarted, c.y)
            v_scale = jax.lax.stop_gradient(jnp.maximum(1.0, jnp.max(jnp.abs(
                problem.coordinates(c.t, y)[1]))))
        else:
            fproblem, stuck, sliding, v_scale = problem, None, None, None
            # A held row that would pull at the segment's start is released there.
            lam = jax.lax.cond(
                eqxi.unvmap_any(jnp.any(c.active)),
                lambda: held_multipliers(problem, c.t, c.y, c.active, c.e0,
                                         dt_rest=dt),
                lambda: jnp.full(r, jnp.inf, dtype))
            active, y = jax.lax.cond(
                eqxi.unvmap_any(jnp.any(c.active & (lam < 0))),
                lambda: release(problem, c.t, c.y, c.active, c.e0, lam),
                lambda: (c.active, c.y))
        prob = _with(fproblem, active, c.e0)
        held = jnp.where(active & (lam >= 0), lam, 0.0)
        lam_scale = jnp.maximum(jnp.max(held, initial=0.0), jnp.finfo(dtype).tiny)
        lam_scale = jax.lax.stop_gradient(lam_scale)
        raw = _Monitor(prob, lam_scale, jnp.zeros((), dtype), dt, v_scale)(c.t, y, None)
        offset = jax.lax.stop_gradient(
            jnp.where(jnp.isfinite(raw), jnp.maximum(-raw, 0.0), 0.0) + 8 * eps)
        monitor = _Monitor(prob, lam_scale, offset, dt, v_scale)
        # (Save times before the segment are saved at its start, and not taken.)
        seg = segment(prob, c.t, y, monitor,
                      None if save_ts is None else jnp.clip(save_ts, c.t, t1))
        t_end, y_end, hit = seg.t, seg.y, seg.event
        ok = seg.result == RESULTS.successful
        result = RESULTS.where(ok, c.result, seg.result)
        if friction:
            # A segment that stopped where a sliding contact has no consistent
            # normal force (Painleve's check turned its steps into NaN) says so:
            # at its end, or at its start (under `vmap` a member that failed may
            # end on its NaN state).
            paradox = jax.lax.cond(
                eqxi.unvmap_any(~ok),
                lambda: (prob.formulation.paradox(t_end, y_end, prob.context, dt)
                         | prob.formulation.paradox(c.t, y, prob.context, dt)),
                lambda: jnp.zeros((), bool))
            result = RESULTS.where(~ok & paradox, RESULTS.painleve, result)

        # The saved rows this segment wrote.
        ts_out, ys_out, saved_active, filled = c.ts, c.ys, c.saved_active, c.filled
        row_modes = _modes(active, stuck, sliding)
        if save_ts is not None:
            # [t, t_end) of an event's segment, [t, t_end] of the last: a save time
            # at an event has the state after its impact.
            take = ok & (save_ts >= c.t) & ((save_ts < t_end)
                                            | (~hit & (save_ts <= t_end)))
            ts_out = jnp.where(take, save_ts, ts_out)
            ys_out = jax.tree.map(
                lambda new, old: jnp.where(_rows(take, new), new, old), seg.ys, ys_out)
            saved_active = jax.tree.map(
                lambda new, old: jnp.where(_rows(take, old), new, old), row_modes,
                saved_active)
        elif save_steps:
            # Appended after the rows written so far (overflow ends the solve
            # with max_steps_reached).
            valid = ok & jnp.isfinite(seg.ts)
            count = jnp.sum(valid)
            index = jnp.where(valid, filled + jnp.arange(max_steps), n)
            ts_out = ts_out.at[index].set(seg.ts, mode="drop")
            ys_out = jax.tree.map(lambda out, new: out.at[index].set(new, mode="drop"),
                                  ys_out, seg.ys)
            saved_active = jax.tree.map(
                lambda out, new: out.at[index].set(new, mode="drop"), saved_active,
                row_modes)
            result = RESULTS.where(filled + count > n,
                                   RESULTS.max_steps_reached, result)
            filled = filled + count

        def take_it():
            gap, lam_e, friction_e, contact_e = monitor.values(t_end, y_end)
            q_e, v_e = prob.coordinates(t_end, y_end)
            if projection is not None:
                # The event state is the dense output's: projected like every
                # step's end, its position with the rows at contact held (their
                # velocities are the impact's).
                throw = prob.context.throw
                at_contact = _with(problem, active | (gap <= eps ** 0.75), c.e0)
                q_e = projection.position(at_contact.context.model, t_end, q_e,
                                          throw=throw)
                v_e = projection.velocity(prob.context.model, t_end, q_e, v_e,
                                          throw=throw)
            # (The monitor is located to a few round-offs: 16 eps in its units.
            # A friction monitor that attains it releases no row.)
            other = jnp.min(gap, initial=jnp.inf)
            if friction:
                other = jnp.minimum(other, jnp.min(friction_e))
            released = released_rows(other, lam_e, active, 16 * eps)
            y_next, held_next, e0_next, events, decided = take_event(
                fproblem, t_end, q_e, v_e, active, released, c.e0, c.events,
                record=hit, dt_rest=dt)
            if not friction:
                return y_next, held_next, e0_next, events, decided, None, None
            # The modes from here (a row that stops sticks if its cone allows,
            # else slips on against the force that sticking needed), restarted
            # with them.
            q_n, v_n = prob.coordinates(t_end, y_next)
            stuck_n, sliding_n = modes_after(
                prob, contact_e, prob.context.model.slip(t_end, q_n, v_n), held_next,
                speed_tol=jnp.sqrt(eps) * v_scale, cone_tol=16 * eps * lam_scale)
            tried = set_modes(problem, stuck_n, sliding_n)
            v_n = admissible(_with(tried, held_next, e0_next), t_end, q_n, v_n)
            y_next = _with(tried, held_next, e0_next).restart(t_end, q_n, v_n)
            cone = contact(tried, t_end, y_next, held_next, e0_next, dt_rest=dt)
            stuck_n, sliding_n = unstick(_with(tried, held_next, e0_next), cone)
            y_next = _with(set_modes(problem, stuck_n, sliding_n), held_next,
                           e0_next).restart(t_end, q_n, v_n)
            # Recorded: the rows that start to stick, and those that start to
            # slip or turn their slip back.
            model = prob.context.model
            friction_rows = held_next & (model.mu > 0)
            was_stuck = model.stuck & active
            now_stuck = stuck_n & friction_rows
            turned = jnp.sum(sliding_n * model.sliding, axis=-1) <= -0.5
            slips = friction_rows & ~now_stuck & (was_stuck | ~active | turned)
            none = jnp.zeros(r, dtype)
            for kind, rows in (("stick", now_stuck & ~was_stuck), ("slip", slips)):
                events = events.add(hit & jnp.any(rows), t_end, q_n, v_e, v_n, none,
                                    rows, jnp.zeros(r, bool), jnp.zeros(r, bool),
                                    kind=EVENT_KINDS.index(kind))
            return y_next, held_next, e0_next, events, decided, stuck_n, sliding_n

        y_next, held_next, e0_next, events, decided, stuck_next, sliding_next = (
            jax.lax.cond(eqxi.unvmap_any(hit), take_it,
                         lambda: (y_end, active, c.e0, c.events,
                                  Decision.none(active), stuck, sliding)))
        # (An impact that cannot meet its conditions ends the solve at its event.)
        result = RESULTS.where(hit & decided.infeasible, RESULTS.infeasible_contact,
                               result)
        running = result == RESULTS.successful
        keep = running & hit
        if save_steps and save_ts is None:
            # The step that ends at an event is saved with the state after it.
            last = jnp.where(keep, filled - 1, n)
            ys_out = jax.tree.map(lambda out, x: out.at[last].set(x, mode="drop"),
                                  ys_out, y_next)
            saved_active = jax.tree.map(
                lambda out, new: out.at[last].set(new, mode="drop"), saved_active,
                _modes(held_next, stuck_next, sliding_next))
        return _Carry(
            t=jnp.where(running, t_end, c.t),
            y=jax.tree.map(lambda a, b: jnp.where(running, a, b),
                           jax.tree.map(lambda a, b: jnp.where(hit, a, b), y_next,
                                        y_end), c.y),
            active=jnp.where(keep, held_next, active),
            e0=jnp.where(keep, e0_next, c.e0), result=result, events=events,
            stuck=None if not friction else jnp.where(keep, stuck_next, stuck),
            sliding=(None if not friction
                     else jnp.where(keep, sliding_next, sliding)),
            steps=tuple(a + b for a, b in zip(c.steps, seg.steps)),
            ts=ts_out, ys=ys_out,
            saved_active=saved_active, filled=filled,
            done=~running | ~hit | (t_end >= t1))

    start = start_result(problem, t0, y0)
    inf = jnp.asarray(jnp.inf, dtype)
    init = _Carry(
        t=t0, y=y0, active=active0, e0=problem.context.e0, result=start,
        events=Events.empty(*problem.coordinates(t0, y0), r, kinds=friction),
        stuck=modes0[0], sliding=modes0[1],
        steps=(jnp.asarray(0),) * 3, ts=jnp.full((n,), inf),
        ys=jax.tree.map(lambda x: jnp.full((n,) + x.shape, inf, x.dtype), y0),
        saved_active=jax.tree.map(lambda x: jnp.zeros((n,) + x.shape, x.dtype),
                                  _modes(active0, *modes0)),
        filled=jnp.asarray(0),
        done=start != RESULTS.successful)
    final = eqxi.while_loop(lambda c: ~c.done, body, init, max_steps=max_events + 1,
                            kind="checkpointed")
    result = RESULTS.where((final.result == RESULTS.successful) & ~final.done,
                           RESULTS.too_many_events, final.result)
    ended = result == RESULTS.successful

    def row(t, y, active):
        return (t[None], jax.tree.map(lambda x: x[None], (y, active)))

    final_row = jax.tree.map(lambda x: jnp.where(ended, x, jnp.inf),
                             (final.t, final.y))
    ts, (ys, saved_active) = stack_saved(
        t0=row(t0, y0, _modes(active0, *modes0)) if save_t0 else None,
        ts=(final.ts, (final.ys, final.saved_active)) if n else None,
        t1=(row(*final_row, _modes(final.active, final.stuck, final.sliding))
            if save_t1 and not save_steps else None))
    if throw:
        ts = result.error_if(ts, result != RESULTS.successful)
    stats = dict(zip(_STEPS, final.steps), max_steps=max_steps, events=final.events)
    if friction:
        saved_active, modes = saved_active[0], saved_active[1:]
    else:
        modes = None
    return Trajectory(ts, ys, result, stats, active=saved_active, modes=modes)


def _rows(mask, x):
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))
