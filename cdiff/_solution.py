"""The result of a solve: `Solution`, and how every route builds it (one module
over 600 lines: the class's docstring is the reference of every attribute, and
its lazily evaluated dynamics are built here, where the solution is)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ._animate import animate
from ._formulation.base import AbstractFormulation, Context, applied_forces
from ._formulation.controller import ControllerState
from ._mass import mass_factor
from ._impact import WithUnilateral
from ._model import AbstractModel
from ._results import RESULTS, is_concrete
from ._results import message as result_message


class Solution(eqx.Module):
    r"""The result of [`cdiff.simulate`][].

    Rows are saved times. Where fewer steps were taken than `max_steps` allows
    (for example under `jax.vmap` over step sizes), the unused trailing rows are
    `inf`, as in diffrax.

    **Attributes:**

    - `ts`: saved times, shape `(T,)`.
    - `q`, `v`: coordinates and velocities, shapes `(T, nq)` and `(T, nv)`.
    - `qdot`, `vdot`: their time derivatives, shapes `(T, nq)` and `(T, nv)`: the
      coordinate rate ($T(q)v$, or the formulation's corrected velocity, e.g. eq. 16
      of [`cdiff.UdwadiaKalaba`][]) and the acceleration $\dot v$ of the
      formulation's vector field at each saved state (with the step's frozen data
      of a step starting there), mapped to $(q, v)$ when the formulation's state is
      not $(q, v)$ ([`cdiff.NullSpace`][]: the derivative of $v = S\nu + \eta$
      along the flow). A DAE formulation ([`cdiff.GGL`][], [`cdiff.IndexOne`][])
      has no explicit rate: there $\dot q = T(q)v$ and
      $\dot v = M^{-1}(Q + Eu + Q_c)$ with the DAE's multipliers. Used by
      [`cdiff.Solution.evaluate`][].

        `qdot`, `vdot`, `constraint_force` and `multipliers` evaluate the
        formulation's dynamics at the saved states, and are computed when read
        (inside `jit`, in line; outside, by a compiled function kept for the next
        solution of the same kind): a solve whose caller reads only the states,
        residuals and energy (a loss, a gradient) neither traces nor compiles them.

    - `holonomic_residual`: $\Phi_q(t, q)$, shape `(T, m)`.
    - `velocity_residual`: $[\dot\Phi_q; \Phi_v]$, shape `(T, m + p)`.
    - `energy`: $E(t, q, v)$, shape `(T,)`, or `None` if the model defines no energy.
    - `constraint_force`: the generalized constraint force $Q_c$ the formulation
      applies, shape `(T, nv)`, with $M\ddot q = Q + Eu + Q_c$: the multiplier force
      $A_v^T\lambda$ for [`cdiff.Lagrange`][], the ideal force term of eq. 11 for
      [`cdiff.UdwadiaKalaba`][] (the nonideal energy-correction force is not
      included), eq. 32 for [`cdiff.Projection`][].
    - `multipliers`: $\lambda$ with $Q_c = A_v^T\lambda$, shape `(T, m + p)`. It is
      unique only when $A_v$ has full row rank (Aghili, Remark 4). At a singular or
      redundant configuration its part in the range of $A_v$ is the minimum-norm
      choice; the damped pseudoinverse adds round-off, amplified by the damping,
      along the null space of $A_v^T$, which $A_v^T\lambda$ does not see (on
      random three-row Jacobians of rank one or two: up to 4e-3 for multipliers
      of size 1).
    - `unilateral`, `active`: for a model with unilateral rows
      ([`cdiff.AbstractModel.unilateral`][]), the rows $g(t, q)$ at the saved
      states, shape `(T, r)`, and which of them were held as equalities there
      (boolean, `(T, r)`); `None` without unilateral rows. The held rows' forces
      are part of `constraint_force`, and `multipliers` then has `m + r + p`
      columns: the holonomic rows', the unilateral rows' (zero where a row is not
      held; see `unilateral_multipliers`), the nonholonomic rows'. The impacts
      between saved rows are in `stats["events"]`. `max_penetration` is the
      deepest $-g_i$.
    - `contact_mode`: for a model with friction
      ([`cdiff.AbstractModel.friction`][]), each row's mode at the saved states,
      shape `(T, r)`: 0 open, 1 stick, 2 slip (`cdiff.CONTACT_MODES` names
      them); `None` without friction. The multipliers then have `m + r + p + r d`
      columns: the last `r d` are the friction forces of the rows that stick
      (zero elsewhere), in the directions of `slip`. `friction_force` gives
      every row's, the slipping rows' included, shape `(T, r, d)`.
    - `state`: the formulation's own state at the saved times (`(q, v)` for most;
      `(q, nu, R)` for [`cdiff.NullSpace`][]).
    - `controller_state`: the state $z$ of a
      [`cdiff.control.AbstractStatefulController`][] at the saved times (its
      `init_state`'s structure, each leaf with a leading row axis), integrated
      with the mechanical state; `None` without a stateful controller.
    - `result`: the result code, a [`cdiff.RESULTS`][] (diffrax's codes, BDF's
      and `diverged`); see [`cdiff.Solution.message`][] and `succeeded` (a
      boolean, per trajectory).
    - `dt`: the step size actually taken by a constant-step solve,
      $T/\lceil T/dt\rceil$, which differs from the requested `dt` when that does
      not divide the horizon $T = t_1 - t_0$. `NaN` for adaptive solves.
    - `stats`: the solver's statistics (numbers of steps; for [`cdiff.BDF`][] also
      `t_stop` and `q_stop`, where the solve ended); `t_diverged`, the first saved
      time that failed the divergence test (`inf` if none).
    - `energy0`: $E(t_0, q_0, v_0)$, the energy of the initial state (`None` if the
      model defines no energy).
    """

    ts: Float[Array, " T"]
    q: Float[Array, "T nq"]
    v: Float[Array, "T nv"]
    holonomic_residual: Float[Array, "T m"]
    velocity_residual: Float[Array, "T k"]
    energy: Float[Array, " T"] | None
    state: Any
    result: Any
    dt: Float[Array, ""]
    stats: dict[str, Any]
    energy0: Float[Array, ""] | None = None
    controller_state: Any = None
    unilateral: Float[Array, "T r"] | None = None
    active: Bool[Array, "T r"] | None = None
    contact_mode: Int[Array, "T r"] | None = None
    # The slip's direction of each row at the saved states, with friction.
    _sliding: Any = None
    # What the dynamics at the saved states need (see `_dynamics`): the solve's
    # context (its formulation included) split into its arrays and the rest (a
    # static field, so that the solution stays a pytree of arrays for `jax.jit`
    # and `jax.vmap` whatever the model and controller hold), and the step of the
    # per-step data.
    _context_arrays: Any = None
    _context_static: _Static | None = eqx.field(static=True, default=None)
    _dt_frozen: Any = None

    def __repr__(self) -> str:
        """A summary, not the fields: the model inside a solution (a loaded MuJoCo
        model holds hundreds of arrays) would fill a screen."""
        shape = lambda x: "x".join(map(str, jnp.shape(x)))  # noqa: E731
        fields = [f"ts {shape(self.ts)}", f"q {shape(self.q)}", f"v {shape(self.v)}"]
        concrete = is_concrete(self.ts, self.result, self.q)
        if concrete and np.ndim(self.result._value) == 0:
            fields.insert(0, _result_name(self.result))
            ts = np.asarray(self.ts)
            finite = ts[np.isfinite(ts)]
            if finite.size:
                fields.insert(1, f"t {finite[0]:.6g} to {finite[-1]:.6g}")
            if self.holonomic_residual.shape[-1]:
                fields.append(f"max |Phi_q| {float(self.max_constraint_error):.2g}")
            if self.velocity_residual.shape[-1]:
                fields.append(f"max velocity residual "
                              f"{float(self.max_velocity_error):.2g}")
            if self.energy is not None:
                fields.append(f"max energy error {float(self.max_energy_error):.2g}")
            if self.unilateral is not None:
                fields.append(f"{int(self.stats['events'].count)} impacts, max "
                              f"penetration {float(self.max_penetration):.2g}")
        elif concrete:
            ok = int(np.sum(np.asarray(self.result._value) == 0))
            fields.insert(0, f"{ok} of {np.size(self.result._value)} successful")
        return f"Solution({', '.join(fields)})"

    @property
    def qdot(self) -> Float[Array, "*batch T nq"]:
        """The coordinate rate at the saved states (see the attributes)."""
        return self._dynamics()[2]

    @property
    def vdot(self) -> Float[Array, "*batch T nv"]:
        r"""The acceleration $\dot v$ at the saved states (see the attributes)."""
        return self._dynamics()[3]

    @property
    def constraint_force(self) -> Float[Array, "*batch T nv"]:
        """The generalized constraint force $Q_c$ at the saved states (see the
        attributes)."""
        return self._dynamics()[0]

    @property
    def multipliers(self) -> Float[Array, "*batch T k"]:
        r"""The multipliers $\lambda$ at the saved states (see the attributes)."""
        return self._dynamics()[1]

    @property
    def friction_force(self) -> Float[Array, "*batch T r d"] | None:
        r"""With friction, each row's friction force $f_i$ at the saved states,
        shape `(T, r, d)`, in the directions of `slip` (its generalized force is
        $W_i^T f_i$, $W_i$ the slip's Jacobian): the force that holds a row that
        sticks ($\|f_i\| \le \mu_i\lambda_{N,i}$), Coulomb's
        $-\mu_i\lambda_{N,i}\hat s_i$ on one that slips, zero on an open row.
        The normal force $\lambda_N$ is `unilateral_multipliers`. `None` without
        friction."""
        return self._dynamics()[4]

    def _dynamics(self):
        """`(constraint_force, multipliers, qdot, vdot, friction_force)`,
        computed from the saved states when asked for (one compilation per kind
        of solution outside `jit`, in line inside it)."""
        return _dynamics_of_solution(self)

    @property
    def succeeded(self) -> Bool[Array, "*batch"]:
        """Whether the solve reached `t1` (a boolean array, one per trajectory of a
        batched solution; works inside `jit` and `vmap`)."""
        return self.result == RESULTS.successful

    @property
    def message(self) -> str:
        """The result as text ('' on success), with the time and configuration where
        the solve stopped when the solver reports them. Only outside `jit`."""
        text = result_message(self.result)
        if np.ndim(self.result._value):  # batched: the codes' texts
            return text
        if self.result == RESULTS.diverged:
            text += f" First at t = {float(self.stats['t_diverged']):.9g} s."
        elif text and "t_stop" in self.stats:
            q = np.array2string(np.asarray(self.stats["q_stop"]), precision=6)
            text += (
                f" Stopped at t = {float(self.stats['t_stop']):.9g} s, q = {q}."
            )
        return text

    @property
    def max_constraint_error(self) -> Float[Array, ""]:
        r"""$\max_t \|\Phi_q\|_\infty$ over the saved (finite) rows."""
        return _finite_max(jnp.abs(self.holonomic_residual))

    @property
    def max_energy_error(self) -> Float[Array, ""]:
        r"""$\max_t |E(t) - E(t_0)|$ over the saved rows, against the initial
        state's energy (also when `t0` is not saved; `NaN` without an energy)."""
        if self.energy is None:
            return jnp.asarray(jnp.nan)
        e0 = (self.energy[..., :1] if self.energy0 is None
              else jnp.expand_dims(self.energy0, -1))
        return _finite_max(jnp.abs(self.energy - e0))

    @property
    def max_penetration(self) -> Float[Array, ""]:
        r"""$\max_t \max_i (-g_i)$ over the saved (finite) rows: how deep a
        unilateral row was passed, 0 if none was, and without unilateral rows.

        At the located events, and for held rows at rest, it is round-off. A held
        row that moves along its limit carries the integrator's per-step error
        instead (a rod riding its ball joint's cone, [`cdiff.UdwadiaKalaba`][] with
        [`cdiff.RK4`][]: 2.2e-8 at `dt=1e-3`, 2.6e-5 at `dt=1e-2`);
        `cdiff.Projected(..., cdiff.NewtonProjection())` brings it back to
        round-off."""
        if self.unilateral is None:
            return jnp.zeros((), self.ts.dtype)
        return jnp.maximum(_finite_max(-self.unilateral), 0.0)

    @property
    def unilateral_multipliers(self) -> Float[Array, "*batch T r"]:
        r"""The multipliers of the unilateral rows at the saved states, shape
        `(T, r)`: the force with which each held row pushes (Aghili's condition
        $\lambda_i \ge 0$; a row is released where its multiplier reaches zero),
        zero where a row is not held. Empty without unilateral
        rows."""
        m = self.holonomic_residual.shape[-1]
        r = 0 if self.active is None else self.active.shape[-1]
        return self.multipliers[..., m:m + r]

    @property
    def max_velocity_error(self) -> Float[Array, ""]:
        r"""$\max_t \|[\dot\Phi_q; \Phi_v]\|_\infty$ (`velocity_residual`) over the
        saved (finite) rows."""
        return _finite_max(jnp.abs(self.velocity_residual))

    def evaluate(self, t) -> tuple[Float[Array, "*t nq"], Float[Array, "*t nv"]]:
        r"""Dense output: `(q, v)` at time(s) `t` between the saved rows, as
        diffrax's `Solution.evaluate`.

        On each interval $[t_i, t_{i+1}]$ between consecutive saved times, $q$ and
        $v$ are the cubic Hermite polynomials through the two saved rows and their
        derivatives `qdot`, `vdot`: fourth-order accurate in the interval's length
        (the order of [`cdiff.RK4`][]), exact at the saved times, continuously
        differentiable in `t`. Its error is set by the spacing of the saved
        times, not by the solver's step: save every step (the default
        `SaveAt(t0=True, steps=True)`) for RK4's accuracy between the steps. From
        `SaveAt(t0=True, t1=True)` there is a single interval, and the cubic
        through its two ends is only as good as that interval is short.

        An interval that holds an impact (`stats["events"]` of a model with
        unilateral rows) has a velocity jump inside, which no cubic follows: there
        the dense output is only as good as the step is short.

        Works inside `jax.jit` and `jax.vmap`, and is differentiable with respect
        to `t` and (through the solve) to anything the solution depends on. For a
        batched solution (leading axes of `ts`), the same times are evaluated on
        every trajectory.

        **Arguments:**

        - `t`: a time or an array of times, within the saved times
          $[t_0, t_\text{last}]$ (the first and the last finite `ts`).

        **Returns:** `(q, v)`, shapes `(*batch, *t.shape, nq)` and
        `(*batch, *t.shape, nv)`.

        **Raises:** an error (`eqx.error_if`, also inside `jit`) for a time outside
        the saved times or not finite (no extrapolation), or a solution with fewer
        than two distinct saved times.

        !!! warning

            Coordinates that hold unit quaternions (MuJoCo's ball and free
            joints) are interpolated componentwise like any other: between the
            saved rows they are unit only to the interpolation error (of order
            $dt^4$); normalise them if you need exact rotations.
        """
        fn = _hermite
        for _ in range(jnp.ndim(self.ts) - 1):
            fn = jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, None))
        _, _, qdot, vdot, _ = self._dynamics()
        return fn(self.ts, self.q, self.v, qdot, vdot, t)

    def animate(self, model: AbstractModel, path, **kwargs) -> Path:
        """Write a GIF or MP4 of the motion: `cdiff.animate(model, self, path,
        **kwargs)` (see [`cdiff.animate`][] for the arguments). Only outside `jit`.

        **Returns:** the `pathlib.Path` written.
        """
        return animate(model, self, path, **kwargs)


def _hermite(ts, q, v, qdot, vdot, t):
    """`(q, v)` at times `t` by the cubic Hermite polynomial of each interval
    between the saved times `ts` (unused rows `inf`, at the end)."""
    t = jnp.asarray(t, ts.dtype)
    first = ts[0]
    last = jnp.max(jnp.where(jnp.isfinite(ts), ts, -jnp.inf))
    t = eqx.error_if(
        t, ~(last > first),
        "cdiff.Solution.evaluate: the solution has fewer than two distinct saved "
        "times; save the steps (SaveAt(t0=True, steps=True)) or t0 and t1.",
    )
    t = eqx.error_if(
        t, ~((t >= first) & (t <= last)),
        "cdiff.Solution.evaluate: t is outside the saved times [ts[0], last finite "
        "ts] (or not finite); the solution is not extrapolated.",
    )
    flat = t.reshape(-1)
    # The interval t_i < t <= t_{i+1}, or at the first saved time the interval
    # that starts there: never one of zero length (a time saved twice, e.g. t1 by
    # both `steps` and `t1`).
    i = jnp.searchsorted(ts, flat, side="left") - 1
    i = jnp.where(i >= 0, i, jnp.searchsorted(ts, flat, side="right") - 1)
    i = jnp.clip(i, 0, ts.shape[0] - 2)
    t0, t1 = ts[i], ts[i + 1]
    h = t1 - t0
    s = ((flat - t0) / h)[:, None]
    h = h[:, None]
    s2 = s * s
    s3 = s2 * s
    # The cubic Hermite basis on [0, 1].
    h00 = 2 * s3 - 3 * s2 + 1
    h10 = s3 - 2 * s2 + s
    h01 = 3 * s2 - 2 * s3
    h11 = s3 - s2

    def cubic(y, dy):
        return h00 * y[i] + h01 * y[i + 1] + h * (h10 * dy[i] + h11 * dy[i + 1])

    q_t, v_t = cubic(q, qdot), cubic(v, vdot)
    return (q_t.reshape(t.shape + q.shape[1:]), v_t.reshape(t.shape + v.shape[1:]))


def _finite_max(x):
    x = jnp.where(jnp.isfinite(x), x, -jnp.inf)
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    return jnp.max(x)


#: The modes of `Solution.contact_mode`, by their number.
CONTACT_MODES = ("open", "stick", "slip")


class Trajectory(eqx.Module):
    """What an integration route returns: the saved times `ts` (`inf` in unused
    rows), the formulation's states `ys` at them, the solver's `result` and
    `stats`; the route adds the step its per-step data were frozen for (`dt`)
    and the constant step taken (`dt_taken`, NaN for adaptive steps)."""

    ts: Any
    ys: Any
    result: Any
    stats: dict
    dt: Any = None
    dt_taken: Any = None
    active: Any = None  # the active unilateral rows at the saved times (events)
    # With friction: `(stuck, sliding)` of the rows at the saved times.
    modes: Any = None


_DIAGNOSTICS_CHUNK = 4096
# Up to this many saved rows, the diagnostics are evaluated row by row.
_DIAGNOSTICS_LOOP = 16


def rates(formulation: AbstractFormulation, context: Context, t, y, dyn):
    r"""`(qdot, vdot)`: the time derivative of `(q, v)` at the state `y`, whose
    formulation's dynamics are `dyn`. The state's rate mapped through
    `formulation.coordinates` (forward mode: the rate itself for a state `(q, v)`);
    for a formulation without an explicit rate (a DAE), $\dot q = T(q)v$ and
    $\dot v = M^{-1}(Q + Eu + Q_c)$ with its constraint force."""
    if dyn.rate is None:
        q, v = formulation.coordinates(t, y, context)
        model = context.model
        mf = mass_factor(model, t, q, throw=context.throw)
        vdot = mf.solve(applied_forces(context, t, q, v) + dyn.force)
        return model.position_rate(t, q, v), vdot
    t = jnp.asarray(t)
    _, (qdot, vdot) = jax.jvp(lambda t, y: formulation.coordinates(t, y, context),
                              (t, y), (jnp.ones_like(t), dyn.rate))
    return qdot, vdot


def _along(one, ts, ys, empty=None):
    """`one(t, y)` (a tuple of arrays or `None`) at every saved row; the rows of
    unused saves (`ts` inf) are evaluated at a zero state and come out inf.
    `empty[i]`: output `i` has no entries (default: from `jax.eval_shape`, one
    more trace of `one`)."""
    valid = jnp.isfinite(ts)
    safe_ys = jax.tree.map(
        lambda x: jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x,
                            jnp.zeros((), x.dtype)), ys
    )
    args = (jnp.where(valid, ts, 0.0), safe_ys)

    rows = ts.shape[0]

    def shapes():  # one row's outputs, with a leading axis of `rows`
        single = jax.eval_shape(one, *jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), args))
        return [None if s is None else jax.ShapeDtypeStruct((rows,) + s.shape, s.dtype)
                for s in single]

    if empty is None:
        empty = [s is not None and s.size == 0 for s in shapes()]

    def nonempty(a):
        return tuple(None if e else x for x, e in zip(one(*a), empty))

    # A few rows in a loop: `one` is traced once, not also batched (batching a
    # loaded model's MJX program is slow to trace). More in chunks, which
    # bound the memory of the diagnostics of long solves. lax.map's chunking fails
    # on outputs of size zero (a model without holonomic rows), so those are made
    # directly.
    batch = None if rows <= _DIAGNOSTICS_LOOP else _DIAGNOSTICS_CHUNK
    out = jax.lax.map(nonempty, args, batch_size=batch)
    if any(empty):
        out = tuple(jnp.zeros(s.shape, s.dtype) if e else x
                    for x, s, e in zip(out, shapes(), empty))

    def mask(x):
        if x is None:
            return None
        inf = jnp.asarray(jnp.inf, x.dtype)
        return jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 1)), x, inf)

    return tuple(mask(x) for x in out)


def _result_name(result) -> str:
    """The name of a (concrete, scalar) result code: `successful`, `diverged`, ..."""
    for name in RESULTS._name_to_item:
        if bool(result == getattr(RESULTS, name)):
            return name
    return str(result)


def diagnostics(formulation: AbstractFormulation, context: Context, ts, ys):
    """Constraint residuals, energy, `(q, v)` and the unilateral rows (`None`
    without) along saved states. The residuals are the model's own rows, not the
    held unilateral rows a `WithUnilateral` appends."""
    model = context.model
    base = model.model if isinstance(model, WithUnilateral) else model

    def one(t, y):
        # From one `terms`: a loaded model evaluates MJX once for all three.
        q, v = formulation.coordinates(t, y, context)
        terms = base.terms(t, q, v)
        hol, vel = terms.residuals
        gaps = base.unilateral(t, q) if base is not model else None
        return hol, vel, terms.energy, q, v, gaps

    return _along(one, ts, ys)


def dynamics_along(formulation: AbstractFormulation, context: Context, dt, ts, ys,
                   *, rows: int, active=None):
    """The constraint force, multipliers, `(qdot, vdot)` (see `rates`) and, with
    friction, each row's friction force (see `WithUnilateral.friction_of`; None
    without) along saved states, the formulation's per-step data taken with step `dt` from each
    state, and with the unilateral rows `active` at each (a `WithUnilateral`
    model). The model's run-time checks turn a failing row into NaN (they held at
    these states during the solve)."""

    context = dataclasses.replace(context, throw=False)
    if active is not None:
        ys = (ys, active)

    def one(t, y):
        ctx = context
        if active is not None:
            # The unilateral rows held at this row (`_along` zeroed unused rows),
            # with friction their modes too.
            y, held = y
            if isinstance(held, tuple):
                ctx = eqx.tree_at(lambda c: (c.model.active, c.model.stuck,
                                             c.model.sliding), ctx, held)
            else:
                ctx = eqx.tree_at(lambda c: c.model.active, ctx, held)
        dyn = formulation.dynamics_and_freeze(t, y, ctx, None, dt, True)[0]
        qdot, vdot = rates(formulation, ctx, t, y, dyn)
        friction = None
        if active is not None and isinstance(held, tuple):
            q, v = formulation.coordinates(t, y, ctx)
            friction = ctx.model.friction_of(t, q, v, dyn.multipliers)
        return dyn.force, dyn.multipliers, qdot, vdot, friction

    return _along(one, ts, ys, (False, rows == 0, False, False, False))


def _dynamics_of_solution(sol: Solution):
    """`dynamics_along` a solution's saved rows, for each trajectory of a batched
    solution (`jax.vmap` gives every array of its output, the context's included,
    the batch axes that lead `ts`)."""
    if sol._context_static is None:
        raise ValueError("cdiff.Solution: this solution carries no context to "
                         "evaluate the dynamics at its states")
    batch, rows = sol.ts.shape[:-1], sol.ts.shape
    leaves = jax.tree.leaves((sol._context_arrays, sol._dt_frozen))
    states = jax.tree.leaves((sol.state, sol.controller_state, sol.active))
    if (any(jnp.shape(x)[:len(batch)] != batch for x in leaves)
            or any(jnp.shape(x)[:len(rows)] != rows for x in states)):
        raise ValueError(
            "cdiff.Solution: the solution's arrays do not share the batch axes "
            f"{batch} that lead `ts` (a jax.vmap with out_axes other than 0?), so "
            "its constraint force, multipliers and rates cannot be computed; "
            "read them inside the vmap instead.")
    context = eqx.combine(sol._context_arrays, sol._context_static.value)
    controlled = isinstance(context.formulation, ControllerState)
    ys = (sol.state, sol.controller_state) if controlled else sol.state
    rows = sol.velocity_residual.shape[-1]
    if sol.active is not None:
        rows += sol.active.shape[-1]
    active = sol.active
    if sol.contact_mode is not None:
        active = (active, sol.contact_mode == CONTACT_MODES.index("stick"),
                  sol._sliding)
    return _batched_dynamics(context, sol._dt_frozen, sol.ts, ys, active,
                             rows=rows, batch=len(batch))


class _Static:
    """The non-array part of a pytree, as a static field: compared by value
    (`equinox.tree_equal`), so that equal solutions share `jit` compilations, and
    hashed by type only (its parts need not be hashable)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return (isinstance(other, _Static)
                and bool(eqx.tree_equal(self.value, other.value)))

    def __hash__(self):
        return hash(type(self.value))


@eqx.filter_jit
def _batched_dynamics(context, dt, ts, ys, active, *, rows: int, batch: int):
    def one_solution(context, dt, ts, ys, active):
        return dynamics_along(context.formulation, context, dt, ts, ys, rows=rows,
                              active=active)

    fn = one_solution
    for _ in range(batch):
        fn = eqx.filter_vmap(fn)
    return fn(context, dt, ts, ys, active)


def build_solution(formulation: AbstractFormulation, context: Context,
                   trajectory: Trajectory, state0, *, dt, dt_taken, throw: bool,
                   divergence, controller_state: bool = False) -> Solution:
    """The `Solution` of every route: the diagnostics along the saved states (the
    per-step data taken with step `dt`), the result promoted to `cdiff.RESULTS`,
    and the divergence test (see `cdiff.simulate`), raised with `throw`.
    `state0` is the user's `(q0, v0)`, the scale of the test. With
    `controller_state`, the saved states are `(y, z)` (a formulation wrapped with
    a stateful controller's state `z`), saved apart."""
    ts, ys, result = trajectory.ts, trajectory.ys, trajectory.result
    hol, vel, energy, q, v, gaps = diagnostics(formulation, context, ts, ys)
    if result._enumeration is not RESULTS:
        result = RESULTS.promote(result)
    stats = dict(trajectory.stats)
    # `divergence` is traced (inf: no test), so that its values share a compilation.
    scale = jnp.maximum(1.0, jnp.maximum(jnp.abs(state0[0]).max(),
                                         jnp.abs(state0[1]).max()))
    size = jnp.stack([jnp.abs(x).max(axis=-1, initial=0.0)
                      for x in (q, v, hol, vel)], axis=-1).max(axis=-1)
    # Unused rows (t = inf) are not tested; non-finite rows fail.
    bad = jnp.isfinite(ts) & ~(size <= divergence * scale)
    stats["t_diverged"] = jnp.min(jnp.where(bad, ts, jnp.inf), initial=jnp.inf)
    result = RESULTS.where((result == RESULTS.successful) & jnp.any(bad),
                           RESULTS.diverged, result)
    if throw:
        ts = result.error_if(ts, result == RESULTS.diverged)
    ys, zs = ys if controller_state else (ys, None)
    contact_mode = sliding = None
    if trajectory.modes is not None:
        stuck, sliding = trajectory.modes
        contact_mode = jnp.where(trajectory.active,
                                 jnp.where(stuck, CONTACT_MODES.index("stick"),
                                           CONTACT_MODES.index("slip")),
                                 CONTACT_MODES.index("open")).astype(jnp.int32)
    arrays, static = eqx.partition(context, eqx.is_array)
    return Solution(ts, q, v, hol, vel, energy, ys, result, dt_taken, stats,
                    energy0=None if energy is None else context.e0,
                    controller_state=zs, unilateral=gaps, active=trajectory.active,
                    contact_mode=contact_mode, _sliding=sliding,
                    _context_arrays=arrays, _context_static=_Static(static),
                    _dt_frozen=jnp.asarray(dt, ts.dtype))


def stack_saved(t0=None, ts=None, steps=None, t1=None):
    """The saved rows of a solve in diffrax's order, `t0`, `ts`, `steps`, `t1`:
    each part `None` (not asked for) or `(times, states)` with a leading row axis
    (unused rows `inf`). **Returns:** `(times, states)`, concatenated."""
    parts = [p for p in (t0, ts, steps, t1) if p is not None]
    return jax.tree.map(lambda *x: jnp.concatenate(x), *parts)


def plain_saveat(saveat: diffrax.SaveAt) -> diffrax.SubSaveAt | None:
    """The one `SubSaveAt` of a `SaveAt` that saves the state at `t0`, `t1`, `ts`
    and/or `steps` (no nested `SaveAt`, no `fn`, no dense output), else None."""
    subs = jax.tree.leaves(saveat.subs,
                           is_leaf=lambda x: isinstance(x, diffrax.SubSaveAt))
    if len(subs) != 1 or getattr(subs[0].fn, "__name__", "") != "save_y":
        return None
    return None if saveat.dense else subs[0]
