"""Tight-tolerance solves of the minimal-coordinate ODEs used as exact references."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


class Reference(eqx.Module):
    """A reference trajectory in the model's own coordinates."""

    ts: Float[Array, " T"]
    q: Float[Array, "T nq"]
    v: Float[Array, "T nq"]


class MinimalODE(eqx.Module):
    r"""A model's motion as an ODE in minimal coordinates, $\dot y$ =
    `rhs(t, y, args)` from `y0`, with `state(y) -> (q, v)` mapping a minimal state
    back to the model's coordinates. Returned by the `minimal_ode()` method of the
    reference models that have one (the ODE their exact reference solves);
    [`cdiff.studies.step_size_study`][] integrates it with the same solver and
    steps as the constrained formulations (Braun-Goldfarb Fig. 4(d)'s baseline).
    """

    rhs: Callable = eqx.field(static=True)
    y0: Float[Array, " k"]
    args: Any
    state: Callable


def _require_x64(what: str) -> None:
    if not jax.config.jax_enable_x64:
        raise ValueError(
            f"{what}: reference solutions are computed in float64; enable it with "
            "jax.config.update('jax_enable_x64', True) before creating arrays."
        )


_MAX_STEPS = 2**20


@eqx.filter_jit
def _solve(rhs, y0, ts, args, rtol, atol, max_steps):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        diffrax.Dopri8(),
        ts[0],
        ts[-1],
        None,
        y0,
        args=args,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
    )
    return sol.ys


def solve_minimal(rhs, y0, ts, args=None, *, rtol=1e-12, atol=1e-12, t0=0.0):
    """Integrate the minimal-coordinate ODE `dy/dt = rhs(t, y, args)` from `t0` with
    diffrax's 8th-order Dormand-Prince at `rtol = atol = 1e-12`, in float64, and
    return `y` at the times `ts` (which must be >= t0).

    `rhs` should be a module-level function (parameters go in `args`): the solve
    is compiled once per `rhs` and shape of `ts`, and reused."""
    _require_x64("reference")
    ts = jnp.asarray(ts, dtype=jnp.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"ts must be a non-empty 1-D array, got shape {ts.shape}")
    if not bool(jnp.all(jnp.isfinite(ts))) or bool(jnp.any(ts < t0)):
        raise ValueError(
            "reference(ts): ts must be finite and >= t0 (drop the inf rows that a "
            "solve with unused max_steps leaves at the end)"
        )
    grid = jnp.concatenate([jnp.asarray([t0], jnp.float64), ts])
    args = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), args)
    ys = _solve(rhs, y0, grid, args, rtol, atol, _MAX_STEPS)
    return jax.tree.map(lambda y: y[1:], ys)
