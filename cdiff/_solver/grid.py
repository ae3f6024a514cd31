"""Constant steps on a precomputed time grid."""

from __future__ import annotations

import diffrax
import equinox as eqx
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
    came out wrong (by 1% to 27% in `tests/test_transformations.py`). Unlike
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
