"""simulate(): model + formulation + solver -> Solution with diagnostics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from ._formulation.base import AbstractFormulation, Context
from ._formulation.dae import AbstractDAEFormulation
from ._formulation.nullspace import AbstractStateFeedback, NullSpace
from ._kinematics import kinematics
from ._model import AbstractModel, check_model, has_energy
from ._results import DIVERGENCE, RESULTS, solver_errors
from ._solver.base import innermost, replace_innermost
from ._solver.bdf import BDF, bdf_solve
from ._solver.frozen import FrozenStep
from ._solver.grid import UniformGrid
from ._solver.rk4 import RK4, rk4_solve
from ._xla import compute_once


class Solution(eqx.Module):
    r"""The result of [`cdiff.simulate`][].

    Rows are saved times. Where fewer steps were taken than `max_steps` allows
    (for example under `jax.vmap` over step sizes), the unused trailing rows are
    `inf`, as in diffrax.

    **Attributes:**

    - `ts`: saved times, shape `(T,)`.
    - `q`, `v`: coordinates and velocities, shapes `(T, nq)` and `(T, nv)`.
    - `holonomic_residual`: $\Phi_q(t, q)$, shape `(T, m)`.
    - `velocity_residual`: $[\dot\Phi_q; \Phi_v]$, shape `(T, m + p)`.
    - `energy`: $E(t, q, v)$, shape `(T,)`, or `None` if the model defines no energy.
    - `constraint_force`: the generalized constraint force $Q_c$ the formulation
      applies, shape `(T, nv)`, with $M\ddot q = Q + Eu + Q_c$: the multiplier force
      $A_v^T\lambda$ for [`cdiff.Lagrange`][], the ideal force term of eq. 11 for
      [`cdiff.UdwadiaKalaba`][] (the nonideal energy-correction force is not
      included), eq. 32 for [`cdiff.Projection`][].
    - `multipliers`: $\lambda$ with $Q_c = A_v^T\lambda$, shape `(T, m + p)`. It is
      unique only when $A_v$ has full row rank (Aghili, Remark 4); at a singular or
      redundant configuration it is the minimum-norm choice.
    - `state`: the formulation's own state at the saved times (`(q, v)` for most;
      `(q, nu, R)` for [`cdiff.NullSpace`][]).
    - `result`: the result code, a [`cdiff.RESULTS`][] (diffrax's codes, BDF's
      and `diverged`); see [`cdiff.Solution.message`][] and `succeeded` (a
      boolean, per trajectory).
    - `dt`: the step size actually taken by a constant-step solve,
      $T/\lceil T/dt\rceil$, which differs from the requested `dt` when that does
      not divide the horizon $T = t_1 - t_0$. `NaN` for adaptive solves.
    - `stats`: the solver's statistics (numbers of steps; for [`cdiff.BDF`][] also
      `t_stop` and `q_stop`, where the solve ended); `t_diverged`, the first saved
      time that failed the divergence test (`inf` if none).
    """

    ts: Float[Array, " T"]
    q: Float[Array, "T nq"]
    v: Float[Array, "T nv"]
    holonomic_residual: Float[Array, "T m"]
    velocity_residual: Float[Array, "T k"]
    energy: Float[Array, " T"] | None
    constraint_force: Float[Array, "T nv"]
    multipliers: Float[Array, "T k"]
    state: Any
    result: Any
    dt: Float[Array, ""]
    stats: dict[str, Any]

    @property
    def succeeded(self) -> Bool[Array, "*batch"]:
        """Whether the solve reached `t1` (a boolean array, one per trajectory of a
        batched solution; works inside `jit` and `vmap`)."""
        return self.result == RESULTS.successful

    @property
    def message(self) -> str:
        """The result as text ('' on success), with the time and configuration where
        the solve stopped when the solver reports them. Only outside `jit`."""
        text = RESULTS[self.result]
        if np.ndim(self.result._value) or np.ndim(text):  # batched: the codes' texts
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
        r"""$\max_t |E(t) - E(t_0)|$ (`NaN` without an energy)."""
        if self.energy is None:
            return jnp.asarray(jnp.nan)
        return _finite_max(jnp.abs(self.energy - self.energy[..., :1]))

    def animate(self, model: AbstractModel, path, **kwargs) -> Path:
        """Write a GIF or MP4 of the motion: `cdiff.animate(model, self, path,
        **kwargs)` (see [`cdiff.animate`][] for the arguments). Only outside `jit`.

        **Returns:** the `pathlib.Path` written.
        """
        from ._animate import animate  # lazily: _animate imports this module

        return animate(model, self, path, **kwargs)


def _finite_max(x):
    x = jnp.where(jnp.isfinite(x), x, -jnp.inf)
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    return jnp.max(x)


def _is_concrete(x) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


def constant_steps(t0, t1, dt) -> int:
    """The number of steps diffrax's `ConstantStepSize` takes from `t0` to `t1`."""
    return int(math.ceil((float(t1) - float(t0)) / float(np.nextafter(dt, np.inf))))


_BDF_MAX_STEPS = 16_384

# Up to this many constant steps, reverse mode keeps one checkpoint per step (the
# loop state: about 100 bytes for the slider-crank, times the batch under vmap): the
# backward pass then recomputes each step once, where diffrax's default O(sqrt(n))
# checkpoints recompute most steps twice or more.
_CHECKPOINT_EVERY_STEP = 16_384
# Up to this many, cdiff's own RK4 loop keeps every stage's input instead (R2: about
# 830 bytes per step and trajectory): its backward pass recomputes single stages, not
# whole steps (R2, a gradient over 1000 steps: 1.3 times faster).
_KEEP_STAGES = 4096


class _VectorField(eqx.Module):
    formulation: AbstractFormulation

    def __call__(self, t, y, args):
        return compute_once(self._rate)(t, y, args)

    def _rate(self, t, y, args):
        context, frozen = args
        return self.formulation.vector_field(t, y, context, frozen)


def simulate(
    model: AbstractModel,
    formulation: AbstractFormulation,
    q0,
    v0,
    *,
    t1,
    dt,
    t0=0.0,
    solver: diffrax.AbstractSolver | BDF | None = None,
    saveat: diffrax.SaveAt | None = None,
    control=None,
    max_steps: int | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    throw: bool = True,
    progress: bool = False,
    divergence: float | None = DIVERGENCE,
) -> Solution:
    r"""Simulate `model` with `formulation` from `(q0, v0)` at time `t0` to `t1`.

    Composes with `jax.jit`, `jax.vmap` (over `dt`, formulation gains, model fields,
    initial state) and `jax.grad` (over model fields and initial state).

    **Arguments:**

    - `model`: a [`cdiff.AbstractModel`][].
    - `formulation`: e.g. [`cdiff.Lagrange`][] or [`cdiff.UdwadiaKalaba`][].
    - `q0`, `v0`: initial coordinates and velocities, shape `(nq,)`. They need not
      satisfy the constraints (the formulation decides what happens then).
    - `t1`: final time. `t0`: initial time (default 0).
    - `dt`: step size (the initial step size for an adaptive controller). With the
      default constant step size, `ceil((t1 - t0) / dt)` equal steps are taken
      (reported as `Solution.dt`).
    - `solver`: any diffrax solver; default [`cdiff.RK4`][], which cdiff runs in
      its own loop when the step is constant and known before tracing (up to 16384
      steps), `adjoint` and `progress` are left at their defaults and `saveat` asks
      for `t0`, `t1` and/or `steps`: the same results as `diffrax.diffeqsolve`,
      1.06 (one trajectory) to 2 times faster (README, Performance notes). Wrap it in
      [`cdiff.Projected`][] to project onto the constraints after every step. A DAE
      formulation ([`cdiff.GGL`][], [`cdiff.IndexOne`][]) needs [`cdiff.BDF`][],
      which also takes ODE formulations without per-step data; with it `dt` is the
      first step, `saveat` may ask for `t0`, `t1`, `ts` and `steps`, and `adjoint`
      chooses reverse (default) or forward mode (`diffrax.ForwardMode()`).
    - `saveat`: a `cdiff.SaveAt` (= `diffrax.SaveAt`); default: `t0` and every step.
    - `control`: optional callable `u = control(t, q, v)` (e.g. an
      `equinox.Module` controller); its output enters as $E(t, q)u$.
    - `max_steps`: static bound on the number of steps. Computed from `dt` when `dt`
      is a concrete number; **required** when `dt` is traced (e.g. under
      `jax.vmap` over step sizes), where it also fixes the number of saved rows.
      With [`cdiff.BDF`][] (whose steps do not follow `dt`), default 16384,
      rejected steps included.
    - `stepsize_controller`: default `diffrax.ConstantStepSize()`.
    - `adjoint`: default reverse mode, `diffrax.RecursiveCheckpointAdjoint` with one
      checkpoint per step for constant steps up to 16384 of them (memory: the
      loop state, ~100 bytes for R2, per step and per trajectory; pass
      `diffrax.RecursiveCheckpointAdjoint()` for diffrax's $O(\sqrt{n})$
      checkpoints when that is too much), otherwise diffrax's default. cdiff's own
      RK4 loop (see `solver`) stores the four stage inputs of each step up to 4096
      steps (R2: ~830 bytes per step; its backward pass is then 1.3 times faster),
      one state per step up to 16384;
      `diffrax.ForwardMode()` for `jax.jacfwd` (cdiff's own RK4 loop, see `solver`,
      also takes `jax.jacfwd` with the default).
    - `throw`: raise on solver failure (default). With `throw=False` check
      `Solution.result`: a failure is a result code, including the run-time checks
      of the model at the states the solver reaches (a mass matrix that stops being
      symmetric positive definite, NullSpace's basis losing rank), which then end
      the solve with `RESULTS.nonfinite`.
    - `progress`: show a progress bar (diffrax's `TqdmProgressMeter`).
    - `divergence`: the divergence test. A solve whose saved states include a
      coordinate, velocity, position residual $\Phi_q$ or velocity residual larger
      in magnitude than `divergence` $\cdot \max(1, \|q_0\|_\infty,
      \|v_0\|_\infty)$ ends with `cdiff.RESULTS.diverged` (raised with `throw`):
      an explicit integrator above its stability limit grows finite states to
      $10^{80}$ and more before they overflow. Default $10^8$; `None` turns the
      test off. Only saved states are tested: with `saveat` at `t1` alone, a
      blow-up that recovers is not seen (none does in practice).

    **Returns:** a [`cdiff.Solution`][].

    **Raises:** `ValueError` for inconsistent shapes, non-finite initial states or
    parameters, `dt <= 0` or `t1 <= t0` (checked before tracing where concrete, and
    with `eqx.error_if` inside `jit`).
    """
    if not isinstance(formulation, AbstractFormulation):
        raise TypeError(
            f"formulation must be a cdiff formulation (e.g. cdiff.Lagrange()), got "
            f"{type(formulation).__name__}"
        )
    q0 = jnp.asarray(q0)
    if not jnp.issubdtype(q0.dtype, jnp.floating):
        q0 = q0.astype(jnp.result_type(float))
    v0 = jnp.asarray(v0, dtype=q0.dtype)
    nq, m, p = check_model(model, t0, q0, v0)
    dtype = q0.dtype
    solver = RK4() if solver is None else solver
    if isinstance(solver, BDF) and stepsize_controller is not None:
        raise ValueError(
            "cdiff.simulate: cdiff.BDF chooses its own steps (rtol, atol); do not pass "
            "a stepsize_controller with it."
        )
    if stepsize_controller is None:
        stepsize_controller = diffrax.ConstantStepSize()
    constant = isinstance(stepsize_controller, diffrax.ConstantStepSize)
    if max_steps is not None and not (
        isinstance(max_steps, (int, np.integer)) and not isinstance(max_steps, bool)
        and max_steps > 0
    ):
        raise ValueError(
            f"cdiff.simulate: max_steps must be a positive integer, got {max_steps!r}"
        )
    if _is_concrete((t0, t1, dt)):
        if not (float(dt) > 0 and math.isfinite(float(dt))):
            raise ValueError(f"dt must be positive and finite, got dt={float(dt)}")
        if not (math.isfinite(float(t1)) and math.isfinite(float(t0))):
            raise ValueError(f"t0 and t1 must be finite, got t0={t0}, t1={t1}")
        if not float(t1) > float(t0):
            raise ValueError(f"t1 must be greater than t0, got t0={t0}, t1={t1}")
        n = constant_steps(t0, t1, dt)
        if max_steps is not None and constant and not isinstance(solver, BDF) and (
                n > max_steps):
            raise ValueError(
                f"cdiff.simulate: max_steps={max_steps} is fewer than the "
                f"ceil((t1 - t0) / dt) = {n} constant steps from t0={t0} to t1={t1} "
                f"with dt={dt}; raise max_steps or leave it out."
            )
        if constant and not isinstance(solver, BDF):  # else dt is the first step
            _check_size(n, saveat, nq + v0.shape[0], m + p, q0.dtype)
        if max_steps is None:
            if isinstance(solver, BDF):
                max_steps = _BDF_MAX_STEPS  # its steps do not follow dt
            else:
                max_steps = n if constant else max(16 * n, 4096)
    elif max_steps is None and isinstance(solver, BDF):
        max_steps = _BDF_MAX_STEPS
    elif max_steps is None:
        raise ValueError(
            "cdiff.simulate: `dt`, `t0` or `t1` is traced (inside jax.jit, "
            "jax.vmap or jax.grad), so the number of steps is not known when "
            "tracing: pass a static `max_steps=` (for a constant step, at least "
            "ceil((t1 - t0) / dt) for the smallest dt)."
        )
    if control is not None and getattr(formulation, "energy_correction", False):
        raise ValueError(
            "cdiff.simulate: UdwadiaKalaba(energy_correction=True) enforces "
            "E = E(t0) (a conservative system, eq. 18 with zero energy input) and "
            "would cancel the work of `control`; use energy_correction=False with a "
            "controller."
        )
    if isinstance(control, AbstractStateFeedback) and not isinstance(
        formulation, NullSpace
    ):
        raise ValueError(
            f"cdiff.simulate: {type(control).__name__} is state feedback on "
            "Yun-Sarkar's null-space state (q, nu) and needs "
            f"formulation=cdiff.NullSpace(...), got {type(formulation).__name__}."
        )
    if divergence is not None and not (
        isinstance(divergence, (int, float)) and math.isfinite(divergence)
        and divergence > 0
    ):
        raise ValueError(
            "cdiff.simulate: divergence must be a positive finite number (or None "
            f"to turn the divergence test off), got {divergence!r}"
        )
    divergence = jnp.asarray(jnp.inf if divergence is None else divergence, dtype)
    if saveat is None:
        saveat = diffrax.SaveAt(t0=True, steps=True)
    if isinstance(formulation, AbstractDAEFormulation) and not isinstance(solver, BDF):
        raise ValueError(
            f"cdiff.simulate: {type(formulation).__name__} is a DAE formulation; "
            "integrate it with solver=cdiff.BDF(...) (diffrax's solvers take ODEs)."
        )
    if isinstance(solver, BDF):
        return _simulate_with_bdf(
            model, formulation, control, q0, v0, t0, t1, dt, solver=solver,
            saveat=saveat, stepsize_controller=stepsize_controller, adjoint=adjoint,
            max_steps=max_steps, throw=throw, progress=progress, divergence=divergence,
        )
    steps = _own_loop_steps(solver, stepsize_controller, saveat, adjoint, progress,
                            max_steps, (t0, t1, dt))
    if adjoint is None:
        every_step = constant and max_steps <= _CHECKPOINT_EVERY_STEP
        adjoint = diffrax.RecursiveCheckpointAdjoint(
            checkpoints=max_steps if every_step else None
        )
    inner = innermost(solver)
    if isinstance(adjoint, diffrax.ForwardMode) and isinstance(
        inner, diffrax.AbstractRungeKutta
    ):
        # What diffrax.ForwardMode does for a bare Runge-Kutta solver (it cannot see
        # through cdiff's wrappers): stage loops that JAX can differentiate forwards.
        inner = eqx.tree_at(
            lambda s: s.scan_kind, inner, "lax", is_leaf=lambda x: x is None
        )
        solver = replace_innermost(solver, inner)
    # Python floats in modules would be static under jit (one compilation per
    # value); as weakly-typed arrays they are traced, so sweeps reuse compilations.
    model, formulation, control = _floats_to_arrays((model, formulation, control))
    formulation = formulation.bind(model, t0, q0, v0)
    times = tuple(jnp.asarray(x, dtype) for x in (t0, t1, dt))
    try:
        return _simulate(
            model, formulation, control, q0, v0, *times,
            solver=solver, saveat=saveat, stepsize_controller=stepsize_controller,
            adjoint=adjoint, max_steps=max_steps, throw=throw, progress=progress,
            steps=steps, divergence=divergence,
        )
    except TypeError as e:
        if "forward-mode autodiff" not in str(e):
            raise
        raise TypeError(
            "cdiff.simulate: forward-mode differentiation (jax.jvp, jax.jacfwd) "
            "through diffrax's solve needs simulate(..., "
            "adjoint=diffrax.ForwardMode()); the default adjoint is reverse mode "
            f"only. ({e})"
        ) from e


# Saved trajectories larger than this are refused before anything is allocated.
_MAX_SAVED_BYTES = 2**34


def _check_size(n: int, saveat, state: int, rows: int, dtype) -> None:
    """Refuse, before tracing, a constant-step solve of more steps than a loop
    counter holds, or one whose saved rows (every step saved) would not fit in
    memory: both used to fail deep inside XLA."""
    if n >= 2**31:
        raise ValueError(
            f"cdiff.simulate: ceil((t1 - t0) / dt) = {n:.3g} steps is more than a "
            "solve can take (2**31); raise dt."
        )
    if saveat is not None:  # the default saves every step
        sub = _plain_saveat(saveat)
        if sub is None or not sub.steps:
            return
    # Per saved row: the state, q and v again, the residuals and multipliers, the
    # constraint force.
    size = n * (3 * state + 3 * rows) * np.dtype(dtype).itemsize
    if size > _MAX_SAVED_BYTES:
        raise ValueError(
            f"cdiff.simulate: saving all {n:,} steps would take about "
            f"{size / 2**30:,.0f} GiB; raise dt, or save fewer rows "
            "(saveat=cdiff.SaveAt(ts=...) or SaveAt(t1=True))."
        )


def _own_loop_steps(solver, stepsize_controller, saveat, adjoint, progress,
                    max_steps, times) -> int | None:
    """The number of steps when `simulate` runs its own constant-step RK4 loop
    ([`rk4_solve`][]), or None for `diffrax.diffeqsolve`: the default RK4 with a
    constant step known before tracing (at most `_CHECKPOINT_EVERY_STEP` steps), the
    default adjoint, no progress bar, and a `saveat` of `t0`, `t1` and/or
    `steps`."""
    sub = _plain_saveat(saveat)
    if not (
        _OWN_LOOP
        and type(solver) is RK4
        and isinstance(stepsize_controller, diffrax.ConstantStepSize)
        and adjoint is None
        and not progress
        and sub is not None
        and sub.ts is None
        and _is_concrete(times)
    ):
        return None
    steps = constant_steps(*times)
    # Beyond _CHECKPOINT_EVERY_STEP steps reverse mode keeps diffrax's O(sqrt(n))
    # checkpoints (the own loop keeps at least one state per step).
    return steps if steps <= min(max_steps, _CHECKPOINT_EVERY_STEP) else None


# Switch for tests and benchmarks that compare the two loops (read before tracing).
_OWN_LOOP = True


def _floats_to_arrays(tree):
    return jax.tree.map(lambda x: jnp.asarray(x) if type(x) is float else x, tree)


@eqx.filter_jit
def _simulate(
    model, formulation, control, q0, v0, t0, t1, dt, *, solver, saveat,
    stepsize_controller, adjoint, max_steps, throw, progress, steps, divergence,
):
    with solver_errors(throw):
        return _solve(
            model, formulation, control, q0, v0, t0, t1, dt, solver=solver,
            saveat=saveat, stepsize_controller=stepsize_controller, adjoint=adjoint,
            max_steps=max_steps, throw=throw, progress=progress, steps=steps,
            divergence=divergence)


def _solve(
    model, formulation, control, q0, v0, t0, t1, dt, *, solver, saveat,
    stepsize_controller, adjoint, max_steps, throw, progress, steps, divergence,
):
    dtype = q0.dtype
    constant = isinstance(stepsize_controller, diffrax.ConstantStepSize)
    q0, t1, dt, context = _checked_context(model, formulation, control, q0, v0,
                                           t0, t1, dt)
    dt0 = dt
    if constant:
        # Steps of T / ceil(T / dt) to times read from a grid computed once, so
        # that a step recomputed for reverse mode has bit-identical times (see
        # UniformGrid); `dt` becomes the step actually taken.
        stepsize_controller = UniformGrid.build(t0, t1, dt, max_steps + 1)
        dt, dt0 = stepsize_controller.step, None
    y0 = formulation.init_state(t0, q0, v0, context)
    if steps is not None:
        sol = _own_loop(formulation, context, stepsize_controller.ts, y0, steps=steps,
                        saveat=saveat, max_steps=max_steps, throw=throw)
    else:
        sol = _diffeqsolve(formulation, context, t0, t1, dt0, dt, y0, solver=solver,
                           saveat=saveat,
                           stepsize_controller=stepsize_controller, adjoint=adjoint,
                           max_steps=max_steps, throw=throw, progress=progress)
    dt_taken = dt if constant else jnp.asarray(jnp.nan, dtype)
    return _solution(formulation, context, dt, dt_taken, sol.ts, sol.ys, sol.result,
                     sol.stats, (q0, v0), throw=throw, divergence=divergence)


def _solution(formulation, context, dt, dt_taken, ts, ys, result, stats, state0, *,
              throw, divergence) -> Solution:
    """The `Solution` of every route: the diagnostics along the saved states, the
    result promoted to `cdiff.RESULTS`, and the divergence test (see `simulate`),
    raised with `throw`."""
    hol, vel, energy, force, lam, q, v = diagnostics(formulation, context, dt, ts, ys)
    if result._enumeration is not RESULTS:
        result = RESULTS.promote(result)
    stats = dict(stats)
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
    return Solution(ts, q, v, hol, vel, energy, force, lam, ys, result, dt_taken,
                    stats)


class _Solved(eqx.Module):
    ts: Any
    ys: Any
    result: Any
    stats: dict


def _own_loop(formulation, context, grid_ts, y0, *, steps, saveat, max_steps, throw):
    """Constant-step RK4 by [`rk4_solve`][] (see `_own_loop_steps`)."""
    vector_field = _VectorField(formulation)
    sub = _plain_saveat(saveat)
    ts, ys, result, taken = rk4_solve(
        lambda t, y, frozen: vector_field(t, y, (context, frozen)),
        lambda t0, t1, y: compute_once(formulation.freeze)(t0, t1, y, context),
        lambda t, y: formulation.end_step(t, y, context),
        grid_ts, y0, steps=steps, save_t0=bool(sub.t0), save_steps=bool(sub.steps),
        save_t1=bool(sub.t1), rows=max_steps, keep_stages=steps <= _KEEP_STAGES,
    )
    if throw:
        ts = result.error_if(ts, result != diffrax.RESULTS.successful)
    stats = dict(max_steps=max_steps, num_steps=taken, num_accepted_steps=taken,
                 num_rejected_steps=jnp.zeros_like(taken))
    return _Solved(ts, ys, result, stats)


def _diffeqsolve(formulation, context, t0, t1, dt0, dt, y0, *, solver, saveat,
                 stepsize_controller, adjoint, max_steps, throw, progress):
    # A zero placeholder for the per-step data (see FrozenStep).
    frozen0 = jax.tree.map(
        jnp.zeros_like, formulation.freeze(t0, t0 + dt, y0, context)
    )
    return diffrax.diffeqsolve(
        diffrax.ODETerm(_VectorField(formulation)),
        FrozenStep(solver, formulation),
        t0,
        t1,
        dt0,
        y0,
        args=(context, frozen0),
        saveat=saveat,
        stepsize_controller=stepsize_controller,
        adjoint=adjoint,
        max_steps=max_steps,
        throw=throw,
        progress_meter=(
            diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter()
        ),
    )


def _checked_context(model, formulation, control, q0, v0, t0, t1, dt):
    """Run-time checks of the times and the initial state (inside `jit`), and the
    solve's `Context`. **Returns:** `(q0, t1, dt, context)`, the checked values."""
    dtype = q0.dtype
    dt = eqx.error_if(dt, ~((dt > 0) & jnp.isfinite(dt)),
                      "cdiff.simulate: dt must be positive and finite")
    t1 = eqx.error_if(t1, ~(t1 > t0), "cdiff.simulate: t1 must be greater than t0")
    q0 = eqx.error_if(
        q0,
        ~(jnp.all(jnp.isfinite(q0)) & jnp.all(jnp.isfinite(v0))),
        "cdiff.simulate: the initial state (q0, v0) is not finite",
    )
    e0 = (
        jnp.asarray(model.energy(t0, q0, v0), dtype)
        if has_energy(model)
        else jnp.asarray(jnp.nan, dtype)
    )
    aux = formulation.prepare(model, t0, q0, v0)
    return q0, t1, dt, Context(model, control, e0, aux, formulation)


_DIAGNOSTICS_CHUNK = 4096


def diagnostics(formulation: AbstractFormulation, context: Context, dt, ts, ys):
    """Constraint residuals, energy, constraint force, multipliers and `(q, v)`
    along saved states (the formulation's per-step data taken with step `dt` from
    each state); rows of unused saves (inf) stay inf."""
    model = context.model
    valid = jnp.isfinite(ts)

    def one(t, y):
        q, v = formulation.coordinates(t, y, context)
        kin = kinematics(model, t, q, v)
        e = model.energy(t, q, v) if has_energy(model) else None
        frozen = formulation.freeze(t, t + dt, y, context)
        dyn = formulation.dynamics(t, y, context, frozen)
        return kin.phi_q, kin.velocity_residual, e, dyn.force, dyn.multipliers, q, v

    safe_ys = jax.tree.map(
        lambda x: jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0.0), ys
    )
    # In chunks: one vmap over more than 8192 rows containing eqx.error_if's
    # callback deadlocks XLA's CPU runtime (jaxlib 0.10.2). lax.map's chunking
    # fails on outputs of size zero (a model without holonomic rows), so those
    # are made directly.
    args = (jnp.where(valid, ts, 0.0), safe_ys)
    shapes = jax.eval_shape(jax.vmap(lambda a: one(*a)), args)
    empty = [s is not None and s.size == 0 for s in shapes]

    def nonempty(a):
        return tuple(None if e else x for x, e in zip(one(*a), empty))

    out = jax.lax.map(nonempty, args, batch_size=_DIAGNOSTICS_CHUNK)
    out = tuple(jnp.zeros(s.shape, s.dtype) if e else x
                for x, s, e in zip(out, shapes, empty))

    def mask(x):
        if x is None:
            return None
        inf = jnp.asarray(jnp.inf, x.dtype)
        return jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 1)), x, inf)

    return tuple(mask(x) for x in out)


def _plain_saveat(saveat: diffrax.SaveAt) -> diffrax.SubSaveAt | None:
    """The one `SubSaveAt` of a `SaveAt` that saves the state at `t0`, `t1`, `ts`
    and/or `steps` (no nested `SaveAt`, no `fn`, no dense output), else None."""
    subs = jax.tree.leaves(saveat.subs, is_leaf=lambda x: isinstance(x, diffrax.SubSaveAt))
    if len(subs) != 1 or getattr(subs[0].fn, "__name__", "") != "save_y":
        return None
    return None if saveat.dense else subs[0]


def _simulate_with_bdf(
    model, formulation, control, q0, v0, t0, t1, dt, *, solver, saveat,
    stepsize_controller, adjoint, max_steps, throw, progress, divergence,
):
    r"""`simulate` with [`cdiff.BDF`][]: a DAE formulation, or an ODE formulation
    without per-step data posed as $\dot x - f(t, x) = 0$."""
    del stepsize_controller
    if progress:
        raise ValueError("cdiff.simulate: progress=True is not supported with cdiff.BDF")
    if not isinstance(formulation, AbstractDAEFormulation):
        base = AbstractFormulation
        per_step = type(formulation).freeze is not base.freeze or (
            type(formulation).end_step is not base.end_step
        )
        if per_step:
            raise ValueError(
                f"cdiff.BDF: {type(formulation).__name__} needs per-step data "
                "(frozen corrections or an end-of-step map), which a multistep "
                "method cannot provide; use cdiff.RK4 (or another diffrax solver), "
                "or a DAE formulation such as cdiff.GGL."
            )
    sub = _plain_saveat(saveat)
    if sub is None:
        raise ValueError(
            "cdiff.simulate: with cdiff.BDF, saveat supports t0, t1, ts and steps "
            "(no nested SaveAt, no fn, no dense)."
        )
    if sub.steps not in (0, 1, True, False):
        raise ValueError("cdiff.simulate: with cdiff.BDF, saveat.steps must be a bool")
    model, formulation, control, solver = _floats_to_arrays(
        (model, formulation, control, solver)
    )
    formulation = formulation.bind(model, t0, q0, v0)
    dtype = q0.dtype
    times = tuple(jnp.asarray(x, dtype) for x in (t0, t1, dt))
    forward = isinstance(adjoint, diffrax.ForwardMode)
    concrete = _is_concrete((model, formulation, control, q0, v0, times, solver))
    sol = _simulate_bdf(
        model, formulation, control, q0, v0, *times, solver=solver,
        save=(bool(sub.t0), bool(sub.t1), bool(sub.steps)), save_ts=sub.ts,
        max_steps=max_steps, forward=forward, throw=throw and not concrete,
        divergence=divergence, checks=throw,
    )
    if throw and concrete and int(sol.result._value) != 0:
        raise RuntimeError(sol.message)
    return sol


@eqx.filter_jit
def _simulate_bdf(
    model, formulation, control, q0, v0, t0, t1, dt, *, solver, save, save_ts,
    max_steps, forward, throw, divergence, checks,
):
    # `checks`: whether the model checks at reached states raise (simulate's throw;
    # `throw` here is False for concrete inputs, whose failures simulate raises).
    with solver_errors(checks):
        return _solve_bdf(
            model, formulation, control, q0, v0, t0, t1, dt, solver=solver,
            save=save, save_ts=save_ts, max_steps=max_steps, forward=forward,
            throw=throw, divergence=divergence)


def _solve_bdf(
    model, formulation, control, q0, v0, t0, t1, dt, *, solver, save, save_ts,
    max_steps, forward, throw, divergence,
):
    dtype = q0.dtype
    q0, t1, dt, context = _checked_context(model, formulation, control, q0, v0,
                                           t0, t1, dt)
    if isinstance(formulation, AbstractDAEFormulation):
        x0 = formulation.init_state(t0, q0, v0, context)
        unravel = None

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
        y0 = formulation.init_state(t0, q0, v0, context)
        x0, unravel = jax.flatten_util.ravel_pytree(y0)

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
        residual, initial, t0, t1, x0, dt, algebraic=algebraic, solver=solver,
        save_t0=save[0], save_t1=save[1], save_steps=save[2], save_ts=save_ts,
        max_steps=max_steps, monitor=monitor, forward_mode=forward,
    )
    ys = xs if unravel is None else jax.vmap(unravel)(xs)
    x_stop = stats.pop("x_stop")
    y_stop = x_stop if unravel is None else unravel(x_stop)
    stats["q_stop"] = formulation.coordinates(stats["t_stop"], y_stop, context)[0]
    if throw:
        ts = result.error_if(ts, result != RESULTS.successful)
    nan = jnp.asarray(jnp.nan, dtype)
    return _solution(formulation, context, nan, nan, ts, ys, result, stats, (q0, v0),
                     throw=throw, divergence=divergence)
