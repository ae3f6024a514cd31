"""Constant steps on a precomputed time grid, and a loop that saves on it."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


class UniformGrid(diffrax.AbstractStepSizeController):
    r"""Constant steps $h = T/n$, $n = \lceil T/\Delta t\rceil$, to the times
    $t_k = t_0 + T\,k/n$ read from an array computed once, before the solve.

    The same steps as `diffrax.ConstantStepSize`, which computes the same
    $t_k$ inside the loop. Reading them makes every step time bit-identical
    when `diffrax.RecursiveCheckpointAdjoint` recomputes a step for the backward
    pass; computed in the loop, XLA compiled the forward and the recomputed
    step differently and their step times could differ in the last bit. A
    `SaveAt(ts)` time within round-off of a step end was then saved from one step
    going forward and from the other going backward, and reverse-mode gradients
    came out wrong (by up to tens of percent). Unlike
    `diffrax.StepTo` the grid may be longer than the number of steps (its tail
    holds $t_1$), so `dt` may be traced (a `jax.vmap` over step sizes).
    """

    ts: Float[Array, " N"]
    step: Float[Array, ""]

    @classmethod
    def build(cls, t0, t1, dt, length: int) -> "UniformGrid":
        """The grid of $n = \\lceil (t_1 - t_0)/dt\\rceil$ steps of
        `step` $= (t_1 - t_0)/n$, padded with $t_1$ to `length` times (`length - 1`
        at least the number of steps)."""
        n = jnp.ceil((t1 - t0) / jnp.nextafter(dt, jnp.inf))
        k = jnp.arange(length, dtype=jnp.result_type(t0, t1, dt))
        return cls(jnp.where(k >= n, t1, t0 + (t1 - t0) * (k / n)), (t1 - t0) / n)

    def wrap(self, direction):
        return self

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        del terms, y0, dt0, args, func, error_order
        # A grid shorter than the number of steps (too small a max_steps for a
        # traced dt) ends before t1: the solve then stops at max_steps and reports it.
        ts = eqx.error_if(self.ts, self.ts[0] != t0, "cdiff: UniformGrid must start "
                          "at t0")
        return ts[1], jnp.asarray(2, jnp.int32)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order,
                        controller_state):
        del t0, y0, y1_candidate, args, y_error, error_order
        tnext = self.ts[jnp.minimum(controller_state, self.ts.shape[0] - 1)]
        return (True, t1, tnext, False, controller_state + 1,
                diffrax.RESULTS.successful)


def grid_solve(terms, solver, y0, args, t1, k, n_save: int):
    r"""States after every `k` steps of $h = t_1/(k\,n_\text{save})$ from $t = 0$
    (the steps [`cdiff.simulate`][] takes), and whether each was reached by
    successful steps: the step-size studies' integrator on the step grid.

    One `lax.scan` over the measurement times holds a loop of `k` steps, so every
    measured state is a scan output: under `jax.vmap` over step sizes (a traced
    `k` per trajectory) nothing is written to a per-trajectory row of a save
    buffer, and the loop carries the state only. Per step it does what
    `diffeqsolve` does with [`cdiff.simulate`][]'s `UniformGrid`; a trajectory
    that fails keeps stepping from its initial state, and its later rows are
    marked unreached, so that no model function sees a non-finite state.
    """
    n = k * n_save
    dtype = jnp.result_type(t1)
    ok0 = jnp.asarray(True)

    def step(i, carry):
        y, state, ok = carry
        ta = t1 * (jnp.asarray(i, dtype) / jnp.asarray(n, dtype))
        tb = jnp.where(i + 1 == n, t1,
                       t1 * (jnp.asarray(i + 1, dtype) / jnp.asarray(n, dtype)))
        y_in = jax.tree.map(lambda a, b: jnp.where(ok, a, b), y, y0)
        y1, _, _, state, result = solver.step(terms, ta, tb, y_in, args, state, False)
        ok = ok & (result == diffrax.RESULTS.successful)
        return jax.tree.map(lambda a, b: jnp.where(ok, a, b), y1, y), state, ok

    def interval(carry, j):
        carry = jax.lax.fori_loop(j * k, (j + 1) * k, step, carry)
        return carry, (carry[0], carry[2])

    state0 = solver.init(terms, jnp.zeros_like(t1), t1 / jnp.asarray(n, dtype), y0, args)
    _, (ys, ok) = jax.lax.scan(interval, (y0, state0, ok0), jnp.arange(n_save))
    return ys, ok
