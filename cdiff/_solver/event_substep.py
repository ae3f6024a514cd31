"""One RK4 sub-step of the event step (cdiff/_solver/event_step.py) and what is
read from it: the stages with a fifth evaluation of the dynamics in one loop
(`_stages`), the monitor of the rows over the sub-step (`_monitor`), and the
event time's first-order correction (`_corrected`)."""

from __future__ import annotations

import functools

import equinox.internal as eqxi
import jax
import jax.numpy as jnp

from .._impact import unilateral_rate
from .._problem import Problem
from .._solution import rates
from .event_rules import _held, _with, held_dynamics
from .rk4 import _axpy, rk4_step


def _gap(model, t, q, active):
    """The monitor of the inactive rows, min g_i (inf if none), and the rows."""
    g = model.unilateral(t, q)
    return jnp.min(jnp.where(active, jnp.inf, g), initial=jnp.inf), g


# Where the rows are also checked inside a sub-step, as fractions of it, on its
# cubic Hermite interpolant: a dip below a row that starts and ends within one
# sub-step (a shallow crossing) is found where it covers one of them.
_INSIDE = (0.25, 0.5, 0.75)


def _monitor(problem: Problem, t0, y0, t1, y1, active, lam, *, dense=None):
    """The monitor over a sub-step from `(t0, y0)` to `(t1, y1)` with the rows
    `active` held, whose held rows' multipliers at its end are `lam` (inf where
    not held; `_stages`'): `(m_start, m_gap, m_end, crossed, t_hi, m_hi)`, the
    inactive rows' minimum at its start and end, the minimum of both at its end,
    whether it crossed zero downwards (an event inside the sub-step), and the end
    of the bracket that holds the first such crossing with the monitor there.
    With `dense = (k_first, k_last, moved)`, the sub-step's first and last RK4 stages, the
    inactive rows are also checked at `_INSIDE` on the coordinates' interpolant
    (diffrax's dense output of RK4): a dip below zero there, with both ends above
    it, is a crossing too, bracketed by the first point below."""
    model = problem.context.model.model
    m_start, _ = _gap(model, t0, problem.coordinates(t0, y0)[0], active)
    m_gap, _ = _gap(model, t1, problem.coordinates(t1, y1)[0], active)
    m_end = jnp.minimum(m_gap, jnp.min(lam, initial=jnp.inf))
    below = jnp.minimum(m_start, 0.0)
    crossed = (m_end < 0) & (m_end < below)
    t_hi, m_hi = t1, m_end
    if dense is not None:
        k_first, k_last, moved = dense
        # The coordinates' cubic Hermite (diffrax's RK4 interpolant: the end states,
        # the first and the last stage) at the fractions s of the sub-step.
        s = jnp.asarray(_INSIDE, t1.dtype)[:, None]
        q = (((2 * s - 3) * s**2 + 1) * y0[0] + ((s - 2) * s + 1) * s * k_first[0]
             + (3 - 2 * s) * s**2 * y1[0] + (s - 1) * s**2 * k_last[0])
        ts = t0 + (t1 - t0) * s[:, 0]
        inside = jax.vmap(lambda t, q: _gap(model, t, q, active)[0])(ts, q)
        dips = moved & (inside < 0) & (inside < below)
        first = jnp.argmax(dips)
        dipped = jnp.any(dips)
        crossed = crossed | dipped
        t_hi = jnp.where(dipped, ts[first], t1)
        m_hi = jnp.where(dipped, inside[first], m_end)
    return m_start, m_gap, m_end, crossed, t_hi, m_hi


def _sub_step(problem: Problem, t, t_step, y, active, e0, moved, projection):
    """An RK4 sub-step from `(t, y)` to `t_step` with the rows `active` held (and
    `projection` after it), or `y` where it has not `moved`: the step applied,
    differentiably (`_replay`, `event_step`)."""
    prob = _with(problem, active, e0)
    y_try, _, _ = rk4_step(
        prob.rate, prob.freeze, prob.end_step, t, t_step, y,
        rate_and_freeze=(prob.rate_and_freeze if problem.freezes_at_first_stage
                         else None))
    if projection is not None:
        y_try = prob.formulation.project(t_step, y_try, prob.context, projection)
    return jax.tree.map(lambda a, b: jnp.where(moved, a, b), y_try, y)


# Classic RK4's nodes and weights, and a fifth evaluation after the stages.
_NODES = (0.0, 0.5, 0.5, 1.0, 0.0)
_WEIGHTS = (1 / 6, 1 / 3, 1 / 3, 1 / 6, 0.0)


def _stages(problem: Problem, t, t_step, y, active, e0, moved, projection, *,
            dt_rest, evaluate, end, monitor: bool = True, start: bool = True):
    """An RK4 sub-step from `(t, y)` to `t_step` with the rows `active` held (and
    `projection` after it; `y` where it has not `moved`), and a fifth evaluation
    of the dynamics at the point `end(y_step) = (t_end, y_end)`, made where some
    trajectory of the batch has `evaluate`: the four stages and the fifth in one
    loop, so that the compiled program holds one copy of the dynamics. The
    search evaluates at the sub-step's end (its monitor); `_replay`, at the
    event's state (the impact's mass matrix and constraints).

    Returns `(y_step, lam_start, (k_first, k_last), (t_end, y_end), lam_end,
    vdot_end, terms_end)`: the held rows' multipliers at the start (read from
    the first stage, whose per-step data are the sub-step's) and at the fifth
    point (inf where not held or not evaluated), the first and last stages'
    increments (for the interpolant), the acceleration at the fifth point (with
    the per-step data of a step of `dt_rest` from there, as `held_dynamics`), and
    the `ImpactTerms` there, read from the same evaluation of the model's terms
    (`None` for a formulation that does not compute its dynamics from them: the
    impact evaluates its own). Differentiable.

    Where the model's terms are not one evaluation of their own (they come by
    autodiff: a small model, quick to compile), the fifth evaluation is made
    apart, after the stages (`_stages_apart`): fewer branches per stage, so a
    faster run. `monitor=False`: the fifth evaluation is for the impact alone
    (none apart); `start=False`: the multipliers at the start are not read (inf,
    apart: the stages compute the rates alone)."""
    if not problem.freezes_at_first_stage:
        return _stages_apart(problem, t, t_step, y, active, e0, moved, projection,
                             dt_rest=dt_rest, evaluate=evaluate if monitor else None,
                             end=end, start=start)
    prob = _with(problem, active, e0)
    h = t_step - t
    dtype = jnp.result_type(h)
    nodes, weights = jnp.array(_NODES, dtype), jnp.array(_WEIGHTS, dtype)
    v = prob.coordinates(t, y)[1]
    # (The per-step data are set at the first evaluation and again at the fifth.)
    frozen = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                          jax.eval_shape(prob.freeze, t, t_step, y))
    t_end0, _ = jax.eval_shape(end, y)
    any_end = eqxi.unvmap_any(evaluate)

    shapes = jax.eval_shape(prob.dynamics_and_terms, t, y, frozen, h,
                            jnp.asarray(True))

    def end_state(total):
        y1 = prob.end_step(t_step, jax.tree.map(jnp.add, y, total))
        if projection is not None:
            y1 = prob.formulation.project(t_step, y1, prob.context, projection)
        y1 = jax.tree.map(lambda a, b: jnp.where(moved, a, b), y1, y)
        return y1, *end(y1)

    def select(which, a, b):
        return jax.tree.map(lambda a, b: jnp.where(which, a, b), a, b)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def body(i, carry):
        k_prev, total, k_first, frozen, lam_start, out = carry
        last = i == 4
        y_step, t_i, y_i = jax.lax.cond(
            last, end_state,
            lambda total: (y, t + nodes[i] * h, _axpy(y, nodes[i], k_prev)), total)
        first = (i == 0) | last
        h_i = jnp.where(last, dt_rest, h)
        dyn, frozen, terms = jax.lax.cond(
            ~last | any_end,
            lambda: prob.dynamics_and_terms(t_i, y_i, frozen, h_i, first),
            lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
        lam = _held(problem, t_i, y_i, active, dyn.multipliers)
        k = jax.tree.map(lambda f: h * f, dyn.rate)
        vdot = jax.lax.cond(
            last & any_end,
            lambda: rates(prob.formulation, prob.context, t_i, y_i, dyn)[1],
            lambda: jnp.zeros_like(v))
        # (The fifth evaluation is no stage: k_last stays the fourth stage's.)
        return (select(last, k_prev, k),
                select(last, total, _axpy(total, weights[i], k)),
                select(i == 0, k, k_first), frozen, jnp.where(i == 0, lam, lam_start),
                select(last, (y_step, t_i, y_i, lam, vdot, terms), out))

    zero = jax.tree.map(jnp.zeros_like, y)
    inf = jnp.full(active.shape, jnp.inf, dtype)
    out = (y, jnp.zeros(t_end0.shape, t_end0.dtype), y, inf, jnp.zeros_like(v),
           jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[2]))
    k_last, _, k_first, _, lam_start, out = jax.lax.fori_loop(
        0, 5, body, (zero, zero, zero, frozen, inf, out))
    y_step, t_end, y_end, lam_end, vdot_end, terms_end = out
    lam_end = jnp.where(evaluate, lam_end, jnp.inf)
    return (y_step, lam_start, (k_first, k_last), (t_end, y_end), lam_end, vdot_end,
            terms_end)


def _stages_apart(problem: Problem, t, t_step, y, active, e0, moved, projection, *,
                  dt_rest, evaluate, end, start):
    """`_stages` with the fifth evaluation after the stages (where `evaluate` is
    not None): the four stages by `rk4_step`, the held rows' multipliers read at
    the first, and no `ImpactTerms`."""
    prob = _with(problem, active, e0)
    inf = jnp.full(active.shape, jnp.inf, jnp.result_type(t_step - t))
    if start:
        frozen = prob.freeze(t, t_step, y)

        def stage(t_i, y_i, lam, h, first):
            dyn = prob.dynamics_with(t_i, y_i, frozen)
            return dyn.rate, jnp.where(first, _held(problem, t_i, y_i, active,
                                                    dyn.multipliers), lam)

        y1, k_first, k_last, lam_start = rk4_step(
            None, prob.freeze, prob.end_step, t, t_step, y, rate_and_freeze=stage,
            carried=inf, keep_first=True)
    else:
        y1, k_first, k_last = rk4_step(prob.rate, prob.freeze, prob.end_step, t,
                                       t_step, y, keep_first=True)
        lam_start = inf
    if projection is not None:
        y1 = prob.formulation.project(t_step, y1, prob.context, projection)
    y1 = jax.tree.map(lambda a, b: jnp.where(moved, a, b), y1, y)
    t_end, y_end = end(y1)
    v = prob.coordinates(t, y)[1]
    lam_end, vdot_end = inf, jnp.zeros_like(v)
    if evaluate is not None:
        lam_end, vdot_end = jax.lax.cond(
            eqxi.unvmap_any(evaluate),
            lambda: held_dynamics(problem, t_end, y_end, active, e0, dt_rest=dt_rest),
            lambda: (inf, jnp.zeros_like(v)))
        lam_end = jnp.where(evaluate, lam_end, jnp.inf)
    return y1, lam_start, (k_first, k_last), (t_end, y_end), lam_end, vdot_end, None


def _corrected(problem: Problem, t_try, y_try, vdot, active, releasing, e0):
    """`(t_e, y_e)`: the event located at the trial `(t_try, y_try)` (acceleration
    `vdot`, the monitor's), corrected to first order to the monitor's root (none
    at a release). The correction is zero in value and carries the event time's
    derivative (the implicit function theorem's): `_replay` applies it, the search
    has no derivatives and leaves it out."""
    model = problem.context.model.model
    prob = _with(problem, active, e0)
    q_try, v_try = prob.coordinates(t_try, y_try)
    m_gap, g_try = _gap(model, t_try, q_try, active)
    i = jnp.argmin(jnp.where(active, jnp.inf, g_try))
    _, gdot, _ = unilateral_rate(model, t_try, q_try, v_try)
    mdot = jnp.where(gdot[i] < 0, gdot[i], -1.0)
    # (None at a release: the constraint force is zero there, so the motion is
    # smooth across it.)
    delta = jnp.where(releasing | ~jnp.isfinite(m_gap), 0.0,
                      -(m_gap - jax.lax.stop_gradient(m_gap)) / mdot)
    # (With delta zero, d(delta * rate) = rate d(delta): the rates' own
    # derivatives would be multiplied by zero, and are left out.)
    qdot, vdot = jax.lax.stop_gradient((model.position_rate(t_try, q_try, v_try), vdot))
    t_e = t_try + delta
    return t_e, prob.restart(t_e, q_try + delta * qdot, v_try + delta * vdot)
