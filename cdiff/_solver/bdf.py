r"""A variable-step, variable-order BDF solver for implicit DAEs $F(t, x, \dot x) = 0$.

diffrax has no DAE solver and SUNDIALS IDA assumes index 1; this one integrates the
semi-explicit DAEs of index up to 2 that cdiff's DAE formulations ([`cdiff.GGL`][],
[`cdiff.IndexOne`][]) produce, in JAX, so that it `jit`s, `vmap`s and
differentiates.

**The method** (DASSL's BDF formulas, Brenan, Campbell & Petzold 1989, in the
quasi-constant step-size form of Shampine & Reichelt's `ode15s` and SciPy's `BDF`).
The solution history is held as backward differences $D$ on an equidistant grid of
the current step $h$; when $h$ changes, $D$ is re-interpolated onto the new grid.
A step of order $k \le 5$ predicts $x^{(0)} = \sum_{j\le k} D_j$ and solves the
corrector $F(t_{n+1}, x^{(0)} + d, (\psi + d)/c) = 0$ for $d$, with
$c = h/\gamma_k$, $\gamma_k = \sum_{j\le k} 1/j$ and
$\psi = \sum_{j=1}^k \gamma_j D_j/\gamma_k$, by simplified Newton iterations whose
matrix $\partial F/\partial x + c^{-1}\partial F/\partial\dot x$ comes from JAX
autodiff (one Jacobian and one LU factorisation per step). The local error is
$d/(k+1)$, measured in the weighted RMS norm with weights
$\text{atol} + \text{rtol}\,|x|$ over the *differential* components only: the
algebraic ones (multipliers) of an index-2 DAE are excluded from the error test, as
DASSL's and IDA's `suppressalg` do. The order and the step change as in SciPy's BDF
(after $k+1$ steps of equal size, the order among $k-1, k, k+1$ that allows the
largest step).

**Failures** are reported, never returned as NaN: a step whose Newton iteration
does not converge (or is not finite) is retried with half the step; below the
smallest representable step the solve stops with
`RESULTS.step_size_too_small`, the last accepted state is kept, and
[`cdiff.Solution.message`][] names the time and the configuration. For a mechanical
DAE this happens where the reduction index matrix $G M^{-1} G^T$ is singular
(Costa-Castello Proposition 1), where the DAE has no index and no continuation.

**Differentiation.** The step loop is `equinox.internal.while_loop` with
`kind="checkpointed"` (recursive checkpointing, as diffrax's
`RecursiveCheckpointAdjoint`), and the Newton iterations are a fixed number of
iterations, so `jax.grad` differentiates the discrete solve
(discretise-then-optimise). The step sizes and orders are treated as constants
(`stop_gradient` on the error estimates that choose them), so the derivative is
that of the numerical solution on the chosen grid, which converges to the exact
derivative with the tolerance. With `adjoint=diffrax.ForwardMode()` the loop is a
`lax.while_loop` and `jax.jacfwd` works instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.flatten_util
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float

from .._formulation.dae import AbstractDAEFormulation
from .._problem import Problem
from .._results import RESULTS
from .._solution import Trajectory, stack_saved
from .locate import root_along


class BDF(eqx.Module):
    r"""Variable-step, variable-order BDF for DAEs of index $\le 2$ (module docs).

    Use it with a DAE formulation ([`cdiff.GGL`][], [`cdiff.IndexOne`][]) through
    [`cdiff.simulate`][], whose `dt` is the first step. It also integrates ODE
    formulations without per-step data ([`cdiff.Lagrange`][],
    [`cdiff.Projection`][], [`cdiff.Regularized`][]), e.g. stiff ones.

    **Arguments:**

    - `rtol`, `atol`: relative and absolute tolerances of the local error test
      (differential components).
    - `max_order`: highest BDF order, 1 to 5 (static, default 5).
    - `newton_iterations`: simplified Newton iterations per step (static, default 4;
      a step whose iteration has not converged after them is retried with half the
      step).
    - `jump_ts`: times where the equations jump (e.g. a torque switched off): a
      step ends just before each (so it sees the left limit) and the method restarts
      just after it at order 1, from a state made consistent with the new equations
      (as diffrax's `jump_ts`).

    **Declarations:** `integrates_dae = True`: not a diffrax solver; `simulate`
    integrates with it by its own route.
    """

    integrates_dae: ClassVar[bool] = True

    rtol: float | Float[Array, ""] = 1e-6
    atol: float | Float[Array, ""] = 1e-6
    max_order: int = eqx.field(static=True, default=5)
    newton_iterations: int = eqx.field(static=True, default=4)
    jump_ts: Any = None

    def __check_init__(self):
        if not (isinstance(self.max_order, int) and 1 <= self.max_order <= 5):
            raise ValueError(f"BDF: max_order must be 1 to 5, got {self.max_order!r}")
        if not (isinstance(self.newton_iterations, int) and self.newton_iterations >= 1):
            raise ValueError(
                f"BDF: newton_iterations must be a positive int, got "
                f"{self.newton_iterations!r}"
            )
        for name in ("rtol", "atol"):
            x = getattr(self, name)
            if not isinstance(x, jax.core.Tracer) and not np.all(np.asarray(x) > 0):
                raise ValueError(f"BDF: {name} must be positive, got {x}")


class _Carry(eqx.Module):
    t: Array
    h: Array
    order: Array
    n_equal: Array
    D: Array
    jump: Array
    result: Any
    accepted: Array
    rejected: Array
    newton_failures: Array
    t_sing: Array
    x_sing: Array
    stopped: Array  # at the event's root
    x_end: Array  # the state there
    save_index: Array
    ts_steps: Any  # loop buffers (equinox.internal.while_loop)
    xs_steps: Any
    xs_dense: Array


def _constants(K, dtype):
    gamma = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, K + 1))])
    error_const = 1.0 / np.arange(1, K + 3)  # error_const[k] = 1 / (k + 1)
    return jnp.asarray(gamma, dtype), jnp.asarray(error_const, dtype)


def _compute_R(K, factor, dtype):
    """SciPy's `compute_R` on the full (K+1) x (K+1) grid (the leading blocks are
    those of every lower order)."""
    i = jnp.arange(1, K + 1, dtype=dtype)[:, None]
    j = jnp.arange(1, K + 1, dtype=dtype)[None, :]
    M = jnp.zeros((K + 1, K + 1), dtype)
    M = M.at[1:, 1:].set((i - 1 - factor * j) / i)
    M = M.at[0].set(1.0)
    return jnp.cumprod(M, axis=0)


def _change_D(D, order, factor, K):
    """Re-interpolate the differences of order `order` onto steps `factor` times as
    long (rows above `order` are left alone)."""
    dtype = D.dtype
    RU = _compute_R(K, factor, dtype) @ _compute_R(K, jnp.asarray(1.0, dtype), dtype)
    idx = jnp.arange(K + 1)
    inside = (idx[:, None] <= order) & (idx[None, :] <= order)
    RU = jnp.where(inside, RU, jnp.eye(K + 1, dtype=dtype))
    return D.at[: K + 1].set(RU.T @ D[: K + 1])


def _dense(D, h, order, t_new, tau, K):
    """The interpolating polynomial of the last step (SciPy's `BdfDenseOutput`)."""
    kk = jnp.arange(K, dtype=D.dtype)
    z = (jnp.asarray(tau)[..., None] - (t_new - h * kk)) / (h * (1 + kk))
    p = jnp.where(jnp.arange(K) < order, jnp.cumprod(z, axis=-1), 0.0)
    return D[0] + p @ D[1 : K + 1]


_SAMPLES = 8
_GOLDEN = 30


def _minimum_along(f, t_a, t_b):
    r"""`(f_min, t_min)`: the minimum of a scalar function on `[t_a, t_b]`, sampled
    at `_SAMPLES + 1` points and refined by golden-section search around the
    smallest sample (so a root of a function that touches zero inside the step,
    like $\sigma_{min}^2$ of the reduction index matrix through a singular
    configuration, is found to about 1e-6 of the step)."""
    taus = t_a + (t_b - t_a) * jnp.linspace(0.0, 1.0, _SAMPLES + 1, dtype=t_a.dtype)
    values = jax.vmap(f)(taus)
    i = jnp.argmin(values)
    lo = taus[jnp.maximum(i - 1, 0)]
    hi = taus[jnp.minimum(i + 1, _SAMPLES)]
    r = (np.sqrt(5.0) - 1) / 2

    def golden(_, bracket):
        lo, hi = bracket
        a, b = hi - r * (hi - lo), lo + r * (hi - lo)
        left = f(a) < f(b)
        return jnp.where(left, lo, a), jnp.where(left, b, hi)

    lo, hi = jax.lax.fori_loop(0, _GOLDEN, golden, (lo, hi))
    t_min = 0.5 * (lo + hi)
    f_min = f(t_min)
    better = f_min < values[i]
    return jnp.where(better, f_min, values[i]), jnp.where(better, t_min, taus[i])


def bdf_solve(
    residual: Callable,
    initial: Callable,
    t0,
    t1,
    x0,
    h0,
    *,
    algebraic: np.ndarray,
    solver: BDF,
    save_t0: bool,
    save_t1: bool,
    save_steps: bool,
    save_ts,
    max_steps: int,
    monitor: Callable | None = None,
    event: Callable | None = None,
    forward_mode: bool = False,
):
    """Integrate $F(t, x, \\dot x) = 0$ from `t0` to `t1`.

    - `residual(t, x, xdot)`: the DAE residual, shape `(n,)`.
    - `initial(t, x)`: a consistent `(x, xdot)` from `x` (at `t0` and after each jump).
    - `algebraic`: static boolean mask of the components left out of the error test.
    - `monitor(t, x)`: optional; the solve stops with `RESULTS.singular_configuration` where it
      falls below 1 along a step (its minimum over the step is located on the
      interpolating polynomial; see `_minimum_along`).
    - `event(t, x)`: optional, positive at `t0`; the solve ends successfully where
      it first falls to zero, located on the interpolating polynomial of the step
      (`locate.root_along`) and corrected to first order, so that the end time's
      derivative is the implicit function theorem's (`stats["event"]`: whether it
      ended there; the state there is the last saved step's, and `x_stop`).

    **Returns:** `(ts, xs, result, stats)`: saved times and states (`t0`, `save_ts`,
    accepted steps, `t1`, in that order; unused rows are `inf`), the result code,
    and statistics including the time and state where the solve stopped.
    """
    K = solver.max_order
    dtype = x0.dtype
    n = x0.shape[0]
    gamma, error_const = _constants(K, dtype)
    rtol = jnp.asarray(solver.rtol, dtype)
    atol = jnp.asarray(solver.atol, dtype)
    eps = jnp.finfo(dtype).eps
    newton_tol = 0.33  # IDA's epcon, in units of the error test's norm
    differential = jnp.asarray(~np.asarray(algebraic, bool))
    n_diff = max(int(np.sum(~np.asarray(algebraic, bool))), 1)
    jumps = (
        jnp.zeros((0,), dtype)
        if solver.jump_ts is None
        else jnp.sort(jnp.atleast_1d(jnp.asarray(solver.jump_ts, dtype)))
    )
    # Jumps outside (t0, t1) are never reached; they are moved past t1.
    t_first = jnp.nextafter(jnp.nextafter(jax.lax.stop_gradient(jnp.asarray(t0, dtype)),
                                          jnp.inf), jnp.inf)
    jumps = jnp.where((jumps > t_first) & (jumps < t1), jumps, jnp.inf)
    jumps = jnp.sort(jumps)
    n_jumps = jumps.shape[0]
    save_ts = None if save_ts is None else jnp.asarray(save_ts, dtype)
    rows = max_steps if save_steps else 0
    iterations = solver.newton_iterations

    def diff_norm(e, scale):
        return jnp.sqrt(jnp.sum(jnp.where(differential, (e / scale) ** 2, 0.0)) / n_diff)

    def next_stop(jump):
        if not n_jumps:
            return t1
        ahead = jumps[jnp.minimum(jump, n_jumps - 1)]
        return jnp.where(jump < n_jumps, jnp.minimum(ahead, t1), t1)

    def restart(t, x, h):
        x, xdot = initial(t, x)
        return jnp.zeros((K + 3, n), dtype).at[0].set(x).at[1].set(h * xdot)

    def newton(t_new, x_pred, psi, c, scale, h_step):
        """Simplified Newton on the corrector (SciPy's BDF convergence test):
        `(d, converged)`."""

        def F(d):
            return residual(t_new, x_pred + d, (psi + d) / c)

        lu = jsl.lu_factor(jax.jacfwd(F)(jnp.zeros_like(x_pred)))
        # The algebraic (index-2) variables are only determined to O(1/h) times
        # the round-off of the others: their Newton increments are weighted by h
        # (Brenan, Campbell & Petzold 1989, §5.4; Hairer & Wanner VII.3).
        weight = jnp.where(differential, 1.0, jax.lax.stop_gradient(h_step))

        def body(carry, k):
            d, norm_first, converged, failed = carry
            active = ~(converged | failed)
            dx = -jsl.lu_solve(lu, F(d))
            norm = jnp.sqrt(jnp.mean((dx * weight / scale) ** 2))
            # IDA's test: the rate is measured against the first increment.
            later = (k > 0) & (norm_first > 0)
            ratio = norm / jnp.where(later, norm_first, 1.0)
            rate = jnp.where(later, ratio ** (1 / jnp.maximum(k, 1).astype(dtype)), 0.0)
            bad = ~jnp.isfinite(norm) | (later & (rate > 0.9))
            done = jnp.where(
                later,
                rate / (1 - jnp.minimum(rate, 0.9)) * norm <= newton_tol,
                norm <= 1e-4 * newton_tol,
            )
            failed = failed | (active & bad)
            converged = converged | (active & ~bad & done)
            d = jnp.where(active & ~bad, d + dx, d)
            norm_first = jnp.where(k == 0, norm, norm_first)
            return (d, norm_first, converged, failed), None

        init = (jnp.zeros_like(x_pred), jnp.zeros((), dtype), jnp.asarray(False),
                jnp.asarray(False))
        (d, _, converged, failed), _ = jax.lax.scan(
            body, init, jnp.arange(iterations)
        )
        return d, converged & ~failed & jnp.all(jnp.isfinite(d))

    def body(c: _Carry) -> _Carry:
        t, order, D = c.t, c.order, c.D
        stop = next_stop(c.jump)
        # The step, cut so as to land on the next jump or t1.
        # A step ends just before a jump (so its equations are the left limit) and
        # the next starts just after it, as diffrax's `jump_ts`.
        is_jump = (c.jump < n_jumps) & (stop < t1)
        t_land = jnp.where(is_jump, jnp.nextafter(stop, -jnp.inf), stop)
        lands = t_land - t <= 1.01 * c.h
        # Under jax.vmap the loop body also runs for the trajectories that have
        # finished; keep their (discarded) step well-defined.
        active = (t < t1) & (c.result == RESULTS.successful)
        h = jnp.where(lands & active, t_land - t, c.h)
        clipped = h != c.h
        # (The landing step's length is differentiated: it moves with a start time
        # that does, after an event.)
        D = jnp.where(clipped, _change_D(D, order, h / c.h, K), D)
        t_new = jnp.where(lands, t_land, t + h)
        rows_k = jnp.arange(K + 3)
        upto = (rows_k <= order)[:, None]
        x_pred = jnp.sum(jnp.where(upto, D, 0.0), axis=0)
        w = jnp.where((rows_k >= 1) & (rows_k <= order), gamma[jnp.minimum(rows_k, K)],
                      0.0)
        psi = (w @ D) / gamma[order]
        cc = h / gamma[order]
        scale = atol + rtol * jnp.abs(x_pred)
        d, converged = newton(t_new, x_pred, psi, cc, scale, h)
        x_new = x_pred + d
        scale_new = atol + rtol * jnp.abs(x_new)
        error_norm = jax.lax.stop_gradient(diff_norm(error_const[order] * d, scale_new))
        safety = 0.9
        accept = active & converged & (error_norm <= 1)
        # Rejected: shrink (halve on Newton failure, else by the error).
        shrink = jnp.where(
            converged,
            jnp.maximum(0.2, safety * error_norm ** (-1 / (order + 1).astype(dtype))),
            0.5,
        )
        # Accepted: update the differences (SciPy's BDF).
        D_acc = D.at[order + 2].set(d - D[order + 1]).at[order + 1].set(d)
        tail = jnp.where((rows_k <= order + 1)[:, None], D_acc, 0.0)
        cums = jnp.flip(jnp.cumsum(jnp.flip(tail, 0), 0), 0)
        D_acc = jnp.where(upto, cums, D_acc)
        n_equal = jnp.where(clipped, 0, c.n_equal) + 1
        may_change = n_equal >= order + 1
        err_m = jnp.where(
            order > 1,
            diff_norm(error_const[order - 1] * D_acc[order], scale_new),
            jnp.inf,
        )
        err_p = jnp.where(
            order < K,
            diff_norm(error_const[jnp.minimum(order + 1, K + 1)] * D_acc[
                jnp.minimum(order + 2, K + 2)], scale_new),
            jnp.inf,
        )
        norms = jax.lax.stop_gradient(jnp.stack([err_m, error_norm, err_p]))
        exps = -1.0 / (order + jnp.arange(3)).astype(dtype)
        factors = jnp.where(norms > 0, norms ** exps, jnp.inf)
        best = jnp.argmax(factors)
        grow = jnp.minimum(10.0, safety * factors[best])
        new_order = jnp.where(may_change, order + best - 1, order)
        grow = jnp.where(may_change, grow, 1.0)
        D_acc = _change_D(D_acc, new_order, grow, K)
        h_acc = h * grow
        at_jump = accept & lands & is_jump
        t_after = jnp.where(at_jump, jnp.nextafter(stop, jnp.inf), t_new)
        # Dense output on (t, t_new] (up to the jump) for the requested save times.
        xs_dense = c.xs_dense
        if monitor is not None:
            # Stop where the monitor dips below 1 inside the step; the step is
            # not accepted, so the solution ends at its start.
            D_fixed = jax.lax.stop_gradient(jnp.where(accept, D_acc, D))

            def along(tau):
                return monitor(tau, _dense(D_fixed, h_acc, new_order, t_new, tau, K))

            m_min, t_sing = _minimum_along(along, t, t_new)
            singular = accept & ~(m_min >= 1)
            x_sing = _dense(D_acc, h_acc, new_order, t_new, t_sing, K)
            accept = accept & ~singular
            at_jump = at_jump & ~singular
            t_after = jnp.where(singular, t_new, t_after)
        else:
            singular = jnp.asarray(False)
            t_sing, x_sing = c.t_sing, c.x_sing
        stopped = jnp.asarray(False)
        x_end = x_new
        if event is not None:
            def along_event(tau):
                return event(tau, _dense(D_acc, h_acc, new_order, t_new, tau, K))

            f_new = jax.lax.stop_gradient(along_event(t_new))
            stopped = accept & (f_new <= 0)

            def locate():
                D_f, h_f = jax.lax.stop_gradient((D_acc, h_acc))

                def along(tau):
                    return event(tau, _dense(D_f, h_f, new_order, t_new, tau, K))

                root = jax.lax.stop_gradient(root_along(along, t, t_new, along(t),
                                                         f_new))
                # (The root's value corrected to first order: zero in value, the
                # implicit function theorem's derivative.)
                value, rate = jax.jvp(along_event, (root,), (jnp.ones_like(root),))
                rate = jnp.where(rate < 0, rate, -1.0)
                t_event = root - (value - jax.lax.stop_gradient(value)) / rate
                return t_event, _dense(D_acc, h_acc, new_order, t_new, t_event, K)

            t_event, x_event = jax.lax.cond(eqxi.unvmap_any(stopped), locate,
                                            lambda: (t_new, x_new))
            t_after = jnp.where(stopped, t_event, t_after)
            x_end = jnp.where(stopped, x_event, x_new)
            at_jump = at_jump & ~stopped
        if save_ts is not None:
            dense = _dense(D_acc, h_acc, new_order, t_new, save_ts, K)
            inside = accept & (save_ts > t) & (save_ts <= t_after)
            xs_dense = jnp.where(inside[:, None], dense, xs_dense)
        # Past a jump: restart at order 1 from a state consistent with the new
        # equations.
        if n_jumps:
            D_acc = jax.lax.cond(at_jump, lambda: restart(t_after, D_acc[0], h_acc),
                                 lambda: D_acc)
        new_order = jnp.where(at_jump, 1, new_order)
        n_equal = jnp.where(at_jump | may_change, 0, n_equal)
        # Rejected or accepted.
        h_rej = h * shrink
        D_rej = _change_D(D, order, shrink, K)
        h_next = jnp.where(accept, h_acc, h_rej)
        too_small = ~accept & (h_rej < 4 * eps * jnp.maximum(jnp.abs(t), 1.0))
        result = RESULTS.where(too_small, RESULTS.step_size_too_small, c.result)
        result = RESULTS.where(singular, RESULTS.singular_configuration, result)
        ts_steps, xs_steps, save_index = c.ts_steps, c.xs_steps, c.save_index
        if save_steps:
            # Write-once buffers of the loop (no copies of the saved rows per step).
            i = jnp.minimum(save_index, rows - 1)
            ts_steps = eqxi.buffer_at_set(ts_steps, i, t_after, pred=accept)
            xs_steps = eqxi.buffer_at_set(xs_steps, i, x_end, pred=accept)
            save_index = save_index + accept.astype(save_index.dtype)
        return _Carry(
            t=jnp.where(accept, t_after, t),
            h=h_next,
            order=jnp.where(accept, new_order, order),
            n_equal=jnp.where(accept, n_equal, 0),
            D=jnp.where(accept, D_acc, D_rej),
            jump=c.jump + at_jump.astype(c.jump.dtype),
            result=result,
            accepted=c.accepted + accept.astype(c.accepted.dtype),
            rejected=c.rejected + (~accept).astype(c.rejected.dtype),
            newton_failures=c.newton_failures + (~converged).astype(c.rejected.dtype),
            t_sing=jnp.where(singular, t_sing, c.t_sing),
            x_sing=jnp.where(singular, x_sing, c.x_sing),
            stopped=stopped,
            x_end=jnp.where(stopped, x_end, c.x_end),
            save_index=save_index,
            ts_steps=ts_steps,
            xs_steps=xs_steps,
            xs_dense=xs_dense,
        )

    def cond(c: _Carry):
        return (c.t < t1) & (c.result == RESULTS.successful) & ~c.stopped

    t0 = jnp.asarray(t0, dtype)
    t1 = jnp.asarray(t1, dtype)
    h0 = jnp.minimum(jnp.asarray(h0, dtype), t1 - t0)
    x0, _ = initial(t0, x0)
    init = _Carry(
        t=t0,
        h=h0,
        order=jnp.asarray(1),
        n_equal=jnp.asarray(0),
        D=restart(t0, x0, h0),
        jump=jnp.asarray(0),
        result=RESULTS.successful,
        accepted=jnp.asarray(0),
        rejected=jnp.asarray(0),
        newton_failures=jnp.asarray(0),
        t_sing=t0,
        x_sing=x0,
        stopped=jnp.asarray(False),
        x_end=x0,
        save_index=jnp.asarray(0),
        ts_steps=jnp.full((rows,), jnp.inf, dtype),
        xs_steps=jnp.full((rows, n), jnp.inf, dtype),
        xs_dense=(
            jnp.zeros((0, n), dtype)
            if save_ts is None
            else jnp.where((save_ts == t0)[:, None], x0, jnp.inf)
        ),
    )
    final = eqxi.while_loop(
        cond, body, init, max_steps=max_steps,
        buffers=lambda c: (c.ts_steps, c.xs_steps),
        kind="lax" if forward_mode else "checkpointed",
    )
    result = RESULTS.where(
        (final.result == RESULTS.successful) & (final.t < t1) & ~final.stopped,
        RESULTS.max_steps_reached,
        final.result,
    )
    stopped_singular = final.result == RESULTS.singular_configuration
    x_stop = jnp.where(stopped_singular, final.x_sing, final.D[0])
    if event is not None:
        x_stop = jnp.where(final.stopped, final.x_end, x_stop)
    dense = steps = last = None
    if save_ts is not None:
        ok = jnp.all(jnp.isfinite(final.xs_dense), axis=1)
        dense = jnp.where(ok, save_ts, jnp.inf), final.xs_dense
    if save_steps:
        steps = final.ts_steps, final.xs_steps
    if save_t1:
        done = final.t >= t1
        last = (jnp.where(done, t1, jnp.inf)[None],
                jnp.where(done, x_stop, jnp.inf)[None])
    saved_ts, saved_xs = stack_saved(
        t0=(t0[None], x0[None]) if save_t0 else None, ts=dense, steps=steps, t1=last)
    stats = {
        "num_steps": final.accepted + final.rejected,
        "num_accepted_steps": final.accepted,
        "num_rejected_steps": final.rejected,
        "num_newton_failures": final.newton_failures,
        "max_steps": max_steps,
        "t_stop": jnp.where(stopped_singular, final.t_sing, final.t),
        "x_stop": x_stop,
        "event": final.stopped,
    }
    return saved_ts, saved_xs, result, stats


def bdf_route(problem: Problem, solver: BDF, *, save: tuple[bool, bool, bool],
              save_ts, max_steps: int, forward: bool, throw: bool) -> Trajectory:
    r"""Integrate `problem` by [`bdf_solve`][]: the route of [`cdiff.simulate`][]
    with [`BDF`][]. A DAE formulation gives its residual, consistent initial state
    and algebraic variables; an ODE formulation (without per-step data) is posed
    as $\dot x - f(t, x) = 0$ on its flattened state. `save` is `(t0, t1,
    steps)`; `stats` gain `q_stop`, the coordinates where the solve ended."""
    formulation, context = problem.formulation, problem.context
    t0 = problem.t0
    if isinstance(formulation, AbstractDAEFormulation):
        x0, unravel = problem.y0, None

        def residual(t, x, xdot):
            return formulation.residual(t, x, xdot, context)

        def initial(t, x):
            return formulation.consistent(t, x, context)

        algebraic = formulation.algebraic
        monitor = None
        if formulation.sizes[2]:
            def monitor(t, x):
                return formulation.monitor(t, x, context)
    else:
        x0, unravel = jax.flatten_util.ravel_pytree(problem.y0)

        def rate(t, x):
            f = formulation.vector_field(t, unravel(x), context, None)
            return jax.flatten_util.ravel_pytree(f)[0]

        def residual(t, x, xdot):
            return xdot - rate(t, x)

        def initial(t, x):
            return x, rate(t, x)

        algebraic = np.zeros(x0.shape[0], bool)
        monitor = None
    ts, xs, result, stats = bdf_solve(
        residual, initial, t0, problem.t1, x0, problem.dt, algebraic=algebraic,
        solver=solver, save_t0=save[0], save_t1=save[1], save_steps=save[2],
        save_ts=save_ts, max_steps=max_steps, monitor=monitor, forward_mode=forward,
    )
    ys = xs if unravel is None else jax.vmap(unravel)(xs)
    x_stop = stats.pop("x_stop")
    y_stop = x_stop if unravel is None else unravel(x_stop)
    stats["q_stop"] = formulation.coordinates(stats["t_stop"], y_stop, context)[0]
    if throw:
        ts = result.error_if(ts, result != RESULTS.successful)
    return Trajectory(ts, ys, result, stats)

