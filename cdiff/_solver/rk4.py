"""The classic fourth-order Runge-Kutta method as a diffrax solver."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import diffrax
import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from diffrax._local_interpolation import ThirdOrderHermitePolynomialInterpolation

from .._problem import Problem
from .._solution import Trajectory, stack_saved
from .adjoint import adjoint_scan
from .frozen import all_finite

_rk4_tableau = diffrax.ButcherTableau(
    a_lower=(
        np.array([1 / 2]),
        np.array([0.0, 1 / 2]),
        np.array([0.0, 0.0, 1.0]),
    ),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # Embedded midpoint method (second order): only a rough error estimate.
    b_error=np.array([1 / 6, 1 / 3 - 1, 1 / 3, 1 / 6]),
    c=np.array([1 / 2, 1 / 2, 1.0]),
)


class RK4(diffrax.AbstractERK):
    r"""The classic fourth-order Runge-Kutta method (Kutta, 1901).

    Four stages, not FSAL; the method the papers reproduced by cdiff use with a
    fixed step (diffrax ships none). Use it with a constant step size (the default
    of [`cdiff.simulate`][]). It carries an embedded midpoint method so that
    adaptive controllers accept it, but that error estimate is only second order;
    prefer `diffrax.Tsit5` or `diffrax.Dopri5` for adaptive stepping. Dense output
    is cubic Hermite from the first and last stage, a fourth-order-accurate
    interpolant only at the step ends.

    **Declarations:** `own_loop = True`: [`cdiff.simulate`][] may run it in cdiff's
    own loop (see `fast_paths`). A subclass that changes the step sets it `False`.
    """

    #: cdiff's own constant-step loop may take this solver's steps.
    own_loop: ClassVar[bool] = True
    tableau: ClassVar[diffrax.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[
        Callable[..., ThirdOrderHermitePolynomialInterpolation]
    ] = ThirdOrderHermitePolynomialInterpolation.from_k
    fast_paths: bool = eqx.field(default=True, static=True)
    checkpoint_every_step: int = eqx.field(default=16_384, static=True)
    keep_stages: int = eqx.field(default=4096, static=True)

    def __check_init__(self):
        for name in ("checkpoint_every_step", "keep_stages"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool)
                    and value >= 0):
                raise ValueError(f"RK4: {name} must be an int >= 0, got {value!r}")

    def order(self, terms):
        del terms
        return 4


RK4.__init__.__doc__ = """**Arguments:**

- `fast_paths`: cdiff's fast paths for RK4. With a constant step (and the default
  adjoint and a plain `SaveAt`), [`cdiff.simulate`][] runs RK4 in cdiff's own
  loop, which saves the same rows as `diffrax.diffeqsolve` and differentiates
  with fewer recomputations; and on CPU the vector field evaluates each distinct
  transcendental function once (XLA would recompute it in every consumer). The
  results are the same. `False` takes `diffrax.diffeqsolve` with the vector field
  as written: the plain implementation, to compare the fast paths with.
- `checkpoint_every_step`: up to this many constant steps (default 16384), reverse
  mode keeps one state per step and recomputes each step once in the backward
  pass; beyond, it keeps one state per block of about sqrt(steps) steps and
  recomputes a block's steps from it (memory about 2 sqrt(steps) states, time
  about one more forward pass). On `diffrax.diffeqsolve` (`fast_paths=False`) the
  same bound sets the checkpoints of the default adjoint.
- `keep_stages`: with `adjoint=diffrax.ForwardMode()` on cdiff's loop, up to this
  many steps (default 4096) JAX's reverse mode of the plain scan stores the four
  stage inputs of every step; beyond, one state per step (its stages recomputed).
"""


# Up to this many steps reverse mode keeps (at least) one state per step; beyond,
# one per block of about sqrt(steps) steps.
CHECKPOINT_EVERY_STEP = 16_384


class SavePlan(NamedTuple):
    """Where each time of `SaveAt(ts=...)` falls on a constant-step grid, worked out
    before tracing (`save_plan`): the steps run in `blocks` blocks of `block` steps
    (the last steps padded), each step interpolates up to `per_step.shape[1]` of
    the times, each block keeps `per_block.shape[1]` of those rows, and `where`
    finds each time's row among the blocks' rows. Index `len(ts)` in `per_step`
    is "none"."""

    blocks: int
    block: int
    per_step: np.ndarray  # (blocks * block, r): indices into ts
    per_block: np.ndarray  # (blocks, m): indices into a block's block * r rows
    where: np.ndarray  # (len(ts),): indices into the blocks' blocks * m rows


def blocks_of(steps: int, *, nested: bool) -> tuple[int, int]:
    """`(blocks, block)` for `steps` steps: one block unless `nested`, else about
    sqrt(steps) blocks, sized so that little padding is left (at most 1/16 of the
    steps or one block)."""
    if not nested or steps < 4:
        return 1, steps
    root = math.isqrt(steps)
    best = None
    for block in sorted(range(max(1, root // 2), 2 * root + 1),
                        key=lambda b: abs(b - root)):
        blocks = -(-steps // block)
        pad = blocks * block - steps
        if best is None or pad < best[0]:
            best = (pad, blocks, block)
        if pad == 0:
            break
    return best[1], best[2]


def save_plan(ts, t0: float, t1: float, steps: int, blocks: int,
              block: int) -> SavePlan:
    """The `SavePlan` of the concrete, sorted save times `ts` in `[t0, t1]` on the
    grid of `steps` equal steps: time $t$ is interpolated in the step
    $(t_k, t_{k+1}]$ that holds it (the first step for $t = t_0$), as diffrax's
    `SaveAt(ts=...)` does."""
    ts = np.asarray(ts, np.float64)
    # UniformGrid's times; the step k with t_k < t <= t_k+1, as diffrax decides.
    grid = np.where(np.arange(steps + 1) >= steps, t1,
                    t0 + (t1 - t0) * (np.arange(steps + 1) / steps))
    k = np.clip(np.searchsorted(grid, ts, side="left") - 1, 0, steps - 1)
    total = blocks * block
    counts = np.bincount(k, minlength=total)
    r = max(1, int(counts.max()))
    per_step = np.full((total, r), len(ts), np.int32)
    slot = np.zeros(len(ts), int)
    for i, step in enumerate(k):  # ts is sorted: the slots of a step in order
        slot[i] = i - np.searchsorted(k, step)
        per_step[step, slot[i]] = i
    row = (k % block) * r + slot  # within the block's block * r rows
    per_block_count = np.bincount(k // block, minlength=blocks)
    m = max(1, int(per_block_count.max()))
    per_block = np.zeros((blocks, m), np.int32)
    where = np.zeros(len(ts), np.int32)
    for i in range(len(ts)):
        b = k[i] // block
        j = i - np.searchsorted(k // block, b)
        per_block[b, j] = row[i]
        where[i] = b * m + j
    return SavePlan(blocks, block, per_step, per_block, where)


class _Bar:
    """The progress bar of the running solve (host side)."""

    bar = None


def _show_progress(fraction, *done):
    """Draw `fraction` (0 to 1) on the bar, opened on first use; `done` (passed
    by the last call, after the loop) closes it."""
    from tqdm.auto import tqdm

    if _Bar.bar is None:
        _Bar.bar = tqdm(total=100, unit="%", bar_format=(
            "{percentage:.2f}%|{bar}| [{elapsed}<{remaining}]"))
    _Bar.bar.n = round(100 * float(np.max(fraction)), 2)
    _Bar.bar.refresh()
    if done:
        _Bar.bar.close()
        _Bar.bar = None


def _axpy(y, a, k):
    return jax.tree.map(lambda y, k: y + a * k, y, k)


def rk4_step(rate, freeze, end_step, t0, t1, y, *, rate_and_freeze=None,
             keep_first: bool = False, carried=None):
    """One classic RK4 step from `(t0, y)` to `t1` (the arguments as in
    [`rk4_solve`][]): `(y1, k_first, k_last)`, the state after `end_step` and the
    first and last stages' increments `h * rate` (`k_first` zero unless
    `keep_first`).

    `carried`: with `rate_and_freeze`, the value it receives at the first stage
    and passes on from stage to stage, `rate_and_freeze(t, y, carried, h, first)
    -> (rate, carried)` (default: the per-step data, set by the first stage); when
    given, its value after the last stage is returned too, `(y1, k_first, k_last,
    carried)`."""
    # Classic RK4's stage i reads only stage i - 1, y_i = y + a_i k_{i-1}: a loop
    # over the stages carries k_{i-1} and the weighted sum of the k_i (diffrax
    # keeps a buffer of all stages). Checkpointed stages: reverse mode
    # recomputes each stage for its derivative instead of storing all four
    # (faster; unrolling the stages is not: see benchmarks/HISTORY.md, 2026-11-24).
    h = t1 - t0
    returns_carried = carried is not None
    if rate_and_freeze is None:
        frozen = freeze(t0, t1, y)
    elif carried is None:  # the per-step data, set by the first stage
        carried = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                               jax.eval_shape(freeze, t0, t1, y))
    dtype = jnp.result_type(h)
    a = jnp.array([0.0, 0.5, 0.5, 1.0], dtype)
    weights = jnp.array((1 / 6, 1 / 3, 1 / 3, 1 / 6), dtype)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def stage(i, carry):
        (k_prev, total, k_first), carried = carry
        t, y_i = t0 + a[i] * h, _axpy(y, a[i], k_prev)
        if rate_and_freeze is None:
            f = rate(t, y_i, frozen)
        else:
            f, carried = rate_and_freeze(t, y_i, carried, h, i == 0)
        k = jax.tree.map(lambda f: h * f, f)
        if keep_first:  # the first stage, for the interpolant
            k_first = jax.tree.map(lambda a, b: jnp.where(i == 0, a, b), k, k_first)
        return (k, _axpy(total, weights[i], k), k_first), carried

    zero = jax.tree.map(jnp.zeros_like, y)
    (k_last, increment, k_first), carried = jax.lax.fori_loop(
        0, 4, stage, ((zero, zero, zero), carried))
    y1 = end_step(t1, jax.tree.map(jnp.add, y, increment))
    return (y1, k_first, k_last, carried) if returns_carried else (y1, k_first, k_last)


def rk4_solve(rate, freeze, end_step, ts, y0, *, steps: int, save_t0: bool,
              save_steps: bool, save_t1: bool, rows: int, keep_stages: bool = False,
              save_ts=None, plan: SavePlan | None = None, blocks: int = 1,
              block: int | None = None, progress: bool = False,
              rate_and_freeze=None, forward_mode: bool = False,
              checkpoint_blocks: bool | None = None):
    r"""Constant-step RK4 in `jax.lax.scan`s: what `diffrax.diffeqsolve` does with
    [`RK4`][], `FrozenStep` and a constant step, without its general machinery
    (the buffer of all stages, the adaptive step loop, dense output). Used by
    [`cdiff.simulate`][] for that case (`rk4_route`).

    **Arguments:**

    - `rate(t, y, frozen)`: the vector field; `freeze(t0, t1, y)`: the per-step
      data (see `FrozenStep`); `end_step(t, y)`: the end-of-step map.
    - `rate_and_freeze(t, y, frozen, dt, first)`: when given, called at every
      stage instead of `rate`, returning the rate and the per-step data it used
      (those of a step of size `dt` from the stage's state where `first`): the
      first stage then provides the per-step data, and `freeze` is only traced
      for its structure (`Problem.rate_and_freeze`).
    - `ts`: the step times $t_0 < t_1 < \dots$ (at least `steps + 1` of them).
    - `y0`: the initial state. `steps`: the number of steps (static).
    - `save_t0`, `save_steps`, `save_t1`: what to save, as `diffrax.SaveAt` does;
      `rows`: the number of step rows (at least `steps`; the rest are inf).
    - `save_ts`, `plan`: the times of `SaveAt(ts=...)` and their `SavePlan`. The
      state at a time inside a step is the cubic Hermite interpolant of diffrax's
      RK4 (from the step's two end states and its first and last stage), between
      the states the solve keeps (after the end-of-step map).
    - `blocks`, `block`: the steps run as `blocks` scans of `block` steps (the
      last one padded with steps that change nothing); with `plan`, its blocks.
      With `checkpoint_blocks` (default: beyond `CHECKPOINT_EVERY_STEP` = 16384
      steps) reverse mode keeps one state per block and recomputes a block's
      steps from it (memory: about 2 sqrt(steps) states).
    - `progress`: a progress bar (tqdm, as diffrax's `TqdmProgressMeter` draws
      it), updated between blocks (about 20 times) with the slowest trajectory's
      share of steps, by one host callback for a whole `vmap`ped batch.
    - `forward_mode`: the steps in a plain `jax.lax.scan`, which `jax.jvp`
      differentiates. Otherwise (default) reverse mode is the discrete adjoint
      (`adjoint_scan`): the state kept once per step, each step's VJP taken once
      in a reverse scan.
    - `keep_stages` (with `forward_mode`): what reverse mode of the plain scan
      stores. False: the state once per step, and the backward pass recomputes
      the step's stages (as `diffrax.RecursiveCheckpointAdjoint` with one
      checkpoint per step). True: the four stage inputs of every step.

    A step that ends in a non-finite state stops the solve with
    `RESULTS.nonfinite`, as in diffrax: it and the time it reached are saved (the
    `t1` row and its step row), the later rows are inf, and so are the rows of the
    save times it did not reach.

    **Returns:** `(saved_ts, saved_ys, result, num_steps)`.
    """
    successful = diffrax.RESULTS.successful
    if plan is not None:
        blocks, block = plan.blocks, plan.block
    block = steps if block is None else block
    total = blocks * block
    interpolate = plan is not None
    traced_ts = save_ts is not None and plan is None
    if traced_ts:  # the step that holds each time, as `save_plan` finds it
        save_step = jnp.clip(
            jnp.searchsorted(ts[:steps + 1], save_ts, side="left") - 1, 0,
            steps - 1).astype(jnp.int32)

    step = functools.partial(rk4_step, rate, freeze, end_step,
                             rate_and_freeze=rate_and_freeze,
                             keep_first=interpolate or traced_ts)

    def body(carry, xs):
        y, result, last, taken = carry
        t0, t1, valid, save_index, index = xs
        running = (result == successful) & valid
        y1, k_first, k_last = step(t0, t1, y)
        finite = all_finite(y1)
        result = diffrax.RESULTS.where(running & ~finite, diffrax.RESULTS.nonfinite,
                                       result)
        keep = running & finite
        out = {}
        if save_steps:
            out["steps"] = jax.tree.map(lambda x: jnp.where(running, x, jnp.inf),
                                        (t1, y1))
        if interpolate:
            # A row per save time in this step ("none" rows interpolate at t0).
            t = jnp.where(save_index < save_ts.shape[0],
                          save_ts[jnp.minimum(save_index, save_ts.shape[0] - 1)], t0)
        elif traced_ts:
            # Every save time, and which of them this step holds.
            t = jnp.where(save_step == index, save_ts, t0)
            out["mask"] = (save_step == index) & keep
        if interpolate or traced_ts:
            # diffrax's dense output of RK4 (ThirdOrderHermitePolynomialInterpolation
            # .from_k: the first and last stage), between the states kept.
            dense = ThirdOrderHermitePolynomialInterpolation(
                t0=t0, t1=t1, y0=y, y1=y1, k0=k_first, k1=k_last)
            ys = jax.vmap(dense.evaluate)(t)
            out["ts"] = jax.tree.map(lambda x: jnp.where(keep, x, jnp.inf), (t, ys))
        y = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1, y)
        last = jax.tree.map(lambda a, b: jnp.where(running, a, b), (t1, y1), last)
        taken = taken + running.astype(taken.dtype)
        return (y, result, last, taken), out

    long = (steps > CHECKPOINT_EVERY_STEP if checkpoint_blocks is None
            else checkpoint_blocks)
    if forward_mode and not keep_stages:
        body = jax.checkpoint(body, prevent_cse=False)
    scan = jax.lax.scan if forward_mode else adjoint_scan

    # Step times, padded with copies of the last step (finite work whose results
    # are discarded), and what each step saves.
    t_start = jnp.concatenate([ts[:steps], jnp.broadcast_to(ts[steps - 1],
                                                            (total - steps,))])
    t_end = jnp.concatenate([ts[1:steps + 1], jnp.broadcast_to(ts[steps],
                                                               (total - steps,))])
    valid = np.arange(total) < steps
    save_index = (jnp.asarray(plan.per_step) if interpolate
                  else jnp.zeros((total, 0), jnp.int32))
    xs = (t_start, t_end, valid, save_index, jnp.arange(total, dtype=jnp.int32))
    init = (y0, successful, (ts[0], y0), jnp.zeros((), jnp.int32))
    # Traced save times: their rows, kept from block to block.
    saved = None
    if traced_ts:
        saved = jax.tree.map(
            lambda x: jnp.full((save_ts.shape[0],) + x.shape, jnp.inf, x.dtype),
            (ts[0], y0))

    if blocks == 1 and not progress and not interpolate and not traced_ts:
        carry, out = scan(body, init, xs)
        out = jax.tree.map(lambda x: x[None], out)
    else:
        def run_block(carry, block_xs):
            carry, saved = carry
            (step_xs, select), number = block_xs
            carry, out = scan(body, carry, step_xs)
            if interpolate:  # the block's rows of save times
                out["ts"] = jax.tree.map(
                    lambda x: x.reshape(block * x.shape[1], *x.shape[2:])[select],
                    out["ts"])
            if traced_ts:  # each time is held by one step at most
                mask = out.pop("mask")
                held = jnp.any(mask, axis=0)

                def pick(rows, old):
                    m = mask.reshape(mask.shape + (1,) * (rows.ndim - 2))
                    new = jnp.sum(jnp.where(m, rows, 0), axis=0)
                    return jnp.where(held.reshape(held.shape + (1,) * (new.ndim - 1)),
                                     new, old)

                saved = jax.tree.map(pick, out.pop("ts"), saved)
            if progress:  # every `refresh` blocks, for the slowest trajectory
                fraction = -eqxi.unvmap_max(-carry[3]) / steps
                jax.lax.cond(number % refresh == refresh - 1,
                             lambda f: jax.debug.callback(_show_progress, f),
                             lambda f: None, fraction)
            return (carry, saved), out

        if long:  # one state per block; a block's steps recomputed in reverse mode
            run_block = jax.checkpoint(run_block, prevent_cse=False)
        # About 20 refreshes of the bar, each a host callback (no state carried
        # through the loop: an io_callback's token made R2's 30000 steps 30% slower).
        refresh = max(1, -(-blocks // 20))
        if progress:  # imported now, not by the first callback during the run
            import tqdm.auto  # noqa: F401
        select = (jnp.asarray(plan.per_block) if interpolate
                  else jnp.zeros((blocks, 0), jnp.int32))
        split = jax.tree.map(lambda x: x.reshape(blocks, block, *x.shape[1:]), xs)
        (carry, saved), out = jax.lax.scan(
            run_block, (init, saved), ((split, select), jnp.arange(blocks)))
        if progress:  # closes the bar, after the loop (it reads its result)
            jax.debug.callback(_show_progress, jnp.ones((), jnp.float32),
                               eqxi.unvmap_max(carry[3]))
    _, result, last, taken = carry

    def row(x):
        return jax.tree.map(lambda a: a[None], x)

    step_rows = ts_rows = None
    if save_steps:
        pad = rows - steps
        step_rows = jax.tree.map(
            lambda x: jnp.concatenate([x.reshape(total, *x.shape[2:])[:steps],
                                       jnp.full((pad,) + x.shape[2:], jnp.inf,
                                                x.dtype)]), out["steps"])
    if interpolate:
        where = jnp.asarray(plan.where)
        ts_rows = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:])[where],
                               out["ts"])
    elif traced_ts:
        ts_rows = saved
    # The t1 row is the last step row when every step is saved.
    saved_ts, saved_ys = stack_saved(
        t0=row((ts[0], y0)) if save_t0 else None,
        ts=ts_rows,
        steps=step_rows,
        t1=row(last) if save_t1 and not save_steps else None)
    return saved_ts, saved_ys, result, taken


def rk4_route(problem: Problem, grid_ts, *, steps: int, save_t0: bool,
              save_steps: bool, save_t1: bool, rows: int, keep_stages: bool,
              throw: bool, save_ts=None, plan: SavePlan | None = None,
              blocks: int = 1, block: int | None = None,
              progress: bool = False, forward_mode: bool = False,
              checkpoint_blocks: bool | None = None) -> Trajectory:
    """Integrate `problem` by [`rk4_solve`][] on the step times `grid_ts`: the route
    of [`cdiff.simulate`][] for constant-step RK4 known before tracing."""
    ts, ys, result, taken = rk4_solve(
        problem.rate, problem.freeze, problem.end_step, grid_ts, problem.y0,
        steps=steps, save_t0=save_t0, save_steps=save_steps, save_t1=save_t1,
        rows=rows, keep_stages=keep_stages, save_ts=save_ts, plan=plan,
        blocks=blocks, block=block, progress=progress,
        rate_and_freeze=(problem.rate_and_freeze
                         if problem.freezes_at_first_stage else None),
        forward_mode=forward_mode, checkpoint_blocks=checkpoint_blocks,
    )
    if throw:
        ts = result.error_if(ts, result != diffrax.RESULTS.successful)
    stats = dict(max_steps=rows, num_steps=taken, num_accepted_steps=taken,
                 num_rejected_steps=jnp.zeros_like(taken))
    return Trajectory(ts, ys, result, stats)
