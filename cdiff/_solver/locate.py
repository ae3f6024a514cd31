r"""The one locator of every route's events: Illinois' regula falsi on a bracket.

A bracket $[t_{lo}, t_{hi}]$ holds a zero of a scalar monitor $m$ with
$m(t_{lo}) > 0 \ge m(t_{hi})$ (an event: a row reached, a held row's multiplier
at zero). Each trial is the secant's zero in the bracket; the trial's value
replaces the end of the same sign, and where one end is kept twice in a row its
value is halved (Illinois' modification, which keeps the convergence
superlinear where plain regula falsi stalls on one end).

The routes differ only in where the trials' values come from:

- cdiff's constant-step loop (`events._locate`) integrates an RK4 sub-step to
  each trial;
- diffrax's segments evaluate the monitor on the last step's dense output
  ([`Illinois`][cdiff._solver.event_segments.Illinois], an optimistix root
  finder);
- cdiff's BDF evaluates it on the step's interpolating polynomial (`root_along`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


class Bracket(NamedTuple):
    """`[lo, hi]` with the monitor's (possibly halved) values at its ends, and
    which end the last trial replaced (`side`: 1 the lower, -1 the upper, 0
    none yet)."""

    lo: Float[Array, ""]
    hi: Float[Array, ""]
    m_lo: Float[Array, ""]
    m_hi: Float[Array, ""]
    side: Int[Array, ""]


def trial(b: Bracket) -> Float[Array, ""]:
    """The secant's zero, clipped to the bracket (its middle where the values do
    not decrease across it, which a valid bracket never has)."""
    denominator = b.m_hi - b.m_lo
    decreasing = denominator < 0
    secant = (b.lo * b.m_hi - b.hi * b.m_lo) / jnp.where(decreasing, denominator, -1.0)
    return jnp.where(decreasing, jnp.clip(secant, b.lo, b.hi), 0.5 * (b.lo + b.hi))


def narrow(b: Bracket, t, m, below) -> Bracket:
    """The bracket after a trial at `t` with value `m`: the trial replaces the
    upper end where it is `below` (at or past the event), else the lower end; the
    kept end's value is halved where it was kept the last time too."""
    return Bracket(
        lo=jnp.where(below, b.lo, t),
        hi=jnp.where(below, t, b.hi),
        m_lo=jnp.where(below, jnp.where(b.side == -1, b.m_lo / 2, b.m_lo), m),
        m_hi=jnp.where(below, m, jnp.where(b.side == 1, b.m_hi / 2, b.m_hi)),
        side=jnp.where(below, -1, 1))


# Trials of `root_along`: enough for round-off from any bracket in double
# precision (Illinois' order is about 1.44).
TRIALS = 48


def root_along(f, t_a, t_b, f_a, f_b, *, trials: int = TRIALS):
    """The zero of a cheap scalar function `f` on `[t_a, t_b]` with
    `f_a > 0 >= f_b` (a fixed number of trials, each a call of `f`; the bracket
    stops changing once it is a few round-offs wide): the bracket's upper end, at
    or just past the zero."""
    eps = jnp.finfo(t_a.dtype).eps

    def body(_, b: Bracket) -> Bracket:
        narrow_enough = b.hi - b.lo <= 4 * eps * jnp.maximum(jnp.abs(b.hi), 1.0)
        done = narrow_enough | (b.m_hi == 0)
        t = trial(b)
        m = f(t)
        new = narrow(b, t, m, ~(m > 0))
        return jax.tree.map(lambda old, x: jnp.where(done, old, x), b, new)

    b = jax.lax.fori_loop(0, trials, body,
                          Bracket(t_a, t_b, f_a, f_b, jnp.asarray(0)))
    return b.hi
