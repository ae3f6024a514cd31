"""The classic fourth-order Runge-Kutta method as a diffrax solver."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from diffrax._local_interpolation import ThirdOrderHermitePolynomialInterpolation

from .._problem import Problem
from .._solution import Trajectory, stack_saved
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
    """

    tableau: ClassVar[diffrax.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[
        Callable[..., ThirdOrderHermitePolynomialInterpolation]
    ] = ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        del terms
        return 4


RK4.__init__.__doc__ = """**Arguments:** None"""


def rk4_solve(rate, freeze, end_step, ts, y0, *, steps: int, save_t0: bool,
              save_steps: bool, save_t1: bool, rows: int, keep_stages: bool = False):
    r"""Constant-step RK4 in a `jax.lax.scan`: what `diffrax.diffeqsolve` does with
    [`RK4`][], `FrozenStep` and a constant step, without its general machinery
    (the buffer of all stages, the adaptive step loop, dense output). Used by
    [`cdiff.simulate`][] for that case (`rk4_route`).

    **Arguments:**

    - `rate(t, y, frozen)`: the vector field; `freeze(t0, t1, y)`: the per-step
      data (see `FrozenStep`); `end_step(t, y)`: the end-of-step map.
    - `ts`: the step times $t_0 < t_1 < \dots$ (at least `steps + 1` of them).
    - `y0`: the initial state. `steps`: the number of steps (static).
    - `save_t0`, `save_steps`, `save_t1`: what to save, as `diffrax.SaveAt` does;
      `rows`: the number of step rows (at least `steps`; the rest are inf).
    - `keep_stages`: what reverse mode stores. False: the state once per step, and
      the backward pass recomputes the step's stages (as
      `diffrax.RecursiveCheckpointAdjoint` with one checkpoint per step). True: the
      four stage inputs of every step (R2: about 830 bytes per step against 290),
      and it recomputes only each stage for its derivative, not whole steps.

    A step that ends in a non-finite state stops the solve with
    `RESULTS.nonfinite`, as in diffrax: it and the time it reached are saved (the
    `t1` row and its step row), the later rows are inf.

    **Returns:** `(saved_ts, saved_ys, result, num_steps)`.
    """
    successful = diffrax.RESULTS.successful
    b = (1 / 6, 1 / 3, 1 / 3, 1 / 6)

    def axpy(y, a, k):
        return jax.tree.map(lambda y, k: y + a * k, y, k)

    def step(t0, t1, y):
        # Classic RK4's stage i reads only stage i - 1, y_i = y + a_i k_{i-1}: a loop
        # over the stages carries k_{i-1} and the weighted sum of the k_i (diffrax
        # keeps a buffer of all stages). Checkpointed stages: reverse mode
        # recomputes each stage for its derivative instead of storing all four
        # (faster; unrolling the stages is not: see benchmarks/RESULTS.md).
        h = t1 - t0
        frozen = freeze(t0, t1, y)
        dtype = jnp.result_type(h)
        a = jnp.array([0.0, 0.5, 0.5, 1.0], dtype)
        weights = jnp.array(b, dtype)

        @functools.partial(jax.checkpoint, prevent_cse=False)
        def stage(i, carry):
            k_prev, total = carry
            f = rate(t0 + a[i] * h, axpy(y, a[i], k_prev), frozen)
            k = jax.tree.map(lambda f: h * f, f)
            return k, axpy(total, weights[i], k)

        zero = jax.tree.map(jnp.zeros_like, y)
        _, increment = jax.lax.fori_loop(0, 4, stage, (zero, zero))
        return end_step(t1, jax.tree.map(jnp.add, y, increment))

    def body(carry, times):
        y, result, last, taken = carry
        t0, t1 = times
        running = result == successful
        y1 = step(t0, t1, y)
        finite = all_finite(y1)
        result = diffrax.RESULTS.where(running & ~finite, diffrax.RESULTS.nonfinite,
                                       result)
        keep = running & finite
        y = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1, y)
        last = jax.tree.map(lambda a, b: jnp.where(running, a, b), (t1, y1), last)
        taken = taken + running.astype(taken.dtype)
        row = jax.tree.map(lambda x: jnp.where(running, x, jnp.inf), (t1, y1))
        return (y, result, last, taken), (row if save_steps else None)

    if not keep_stages:
        body = jax.checkpoint(body, prevent_cse=False)
    times = (ts[:steps], ts[1:steps + 1])
    init = (y0, successful, (ts[0], y0), jnp.zeros((), jnp.int32))
    (_, result, last, taken), step_rows = jax.lax.scan(body, init, times)
    def row(x):
        return jax.tree.map(lambda a: a[None], x)

    if save_steps:
        pad = rows - steps
        step_rows = jax.tree.map(
            lambda x: jnp.concatenate([x, jnp.full((pad,) + x.shape[1:], jnp.inf,
                                                   x.dtype)]), step_rows)
    # The t1 row is the last step row when every step is saved.
    saved_ts, saved_ys = stack_saved(
        t0=row((ts[0], y0)) if save_t0 else None,
        steps=step_rows if save_steps else None,
        t1=row(last) if save_t1 and not save_steps else None)
    return saved_ts, saved_ys, result, taken



def rk4_route(problem: Problem, grid_ts, *, steps: int, save_t0: bool,
              save_steps: bool, save_t1: bool, rows: int, keep_stages: bool,
              throw: bool) -> Trajectory:
    """Integrate `problem` by [`rk4_solve`][] on the step times `grid_ts`: the route
    of [`cdiff.simulate`][] for constant-step RK4 known before tracing."""
    ts, ys, result, taken = rk4_solve(
        problem.rate, problem.freeze, problem.end_step, grid_ts, problem.y0,
        steps=steps, save_t0=save_t0, save_steps=save_steps, save_t1=save_t1,
        rows=rows, keep_stages=keep_stages,
    )
    if throw:
        ts = result.error_if(ts, result != diffrax.RESULTS.successful)
    stats = dict(max_steps=rows, num_steps=taken, num_accepted_steps=taken,
                 num_rejected_steps=jnp.zeros_like(taken))
    return Trajectory(ts, ys, result, stats)
