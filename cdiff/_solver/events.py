"""The route of [`cdiff.simulate`][] for a model with unilateral rows at a
constant step (`event_rk4_route`): the steps of the grid by `event_step`, whose
module (cdiff/_solver/event_step.py) describes the step (events located inside
it, impacts, the active set), in the discrete adjoint or a plain scan.

The event engine's other rooms: `event_rules` (the record of the impacts and the
rules every route applies at an event), `event_substep` (one RK4 sub-step and what
is read from it) and `event_step` (the step: the search's loop of sub-steps and
its replay). The names other modules import are also here, where they were
(`cdiff/_solver/event_segments.py`, `cdiff/_checks.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._problem import Problem
from .._results import RESULTS
from .._solution import Trajectory, stack_saved
from .adjoint import adjoint_scan
from .event_rules import (
    MAX_EVENTS,
    Decision,
    Events,
    _with,
    held_multipliers,
    release,
    released_rows,
    start_result,
    start_tolerance,
    take_event,
)
from .event_step import event_step, plain_step
from .rk4 import _show_progress

#: This module's route, and the names other modules import from here.
__all__ = ["MAX_EVENTS", "Decision", "Events", "_with", "event_rk4_route",
           "held_multipliers", "release", "released_rows", "start_result",
           "start_tolerance", "take_event"]


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
