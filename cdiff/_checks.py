"""Checks before tracing: `simulate`'s arguments, each refused with a message
naming what is wrong and what to do, before anything is traced or compiled.
(The checks of values that may be traced run inside the solve: `Problem.build`.)"""

from __future__ import annotations

import math
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._formulation.base import AbstractFormulation
from ._formulation.controller import AbstractStatefulController, check_controller
from ._formulation.dae import AbstractDAEFormulation
from ._formulation.nullspace import AbstractStateFeedback
from ._coulomb import check_friction as _slip_dimension
from ._impact import check_restitution
from ._model import has_energy
from ._results import is_concrete
from ._routes import constant_steps
from ._solution import plain_saveat
from ._solver.base import declares
from ._solver.events import start_tolerance


def _declaring(base: type, capability: str) -> list[str]:
    """The names of cdiff's public concrete subclasses of `base` that declare
    `capability` (for messages)."""
    found, stack = set(), [base]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if (cls.__module__.startswith("cdiff.") and not cls.__name__.startswith(
                ("_", "Abstract")) and getattr(cls, capability, False) is True):
            found.add(cls.__name__)
    return sorted(found)


def check_formulation(formulation) -> None:
    if not isinstance(formulation, AbstractFormulation):
        raise TypeError(
            f"formulation must be a cdiff formulation (e.g. cdiff.Lagrange()), got "
            f"{type(formulation).__name__}"
        )


def initial_state(q0, v0):
    """`(q0, v0)` as arrays of one floating dtype, float32 or float64 (integers
    become JAX's default float)."""
    q0 = jnp.asarray(q0)
    if not jnp.issubdtype(q0.dtype, jnp.floating):
        q0 = q0.astype(jnp.result_type(float))
    if q0.dtype not in (jnp.float32, jnp.float64):
        raise ValueError(
            f"cdiff.simulate: q0 has dtype {q0.dtype}; cdiff simulates in float32 or "
            "float64 (its linear algebra has no half-precision kernels, and float16's "
            "round-off, 1e-3, is above most constraint tolerances): pass "
            "q0.astype(jnp.float32)")
    _note_float32(q0.dtype)
    return q0, jnp.asarray(v0, dtype=q0.dtype)


_BDF_MAX_STEPS = 16_384
# diffrax's default bound, where the saved rows do not depend on it.
_TRACED_MAX_STEPS = 4096


_FLOAT32_NOTED = False


def _note_float32(dtype) -> None:
    """Say once per process that a solve runs in float32 because JAX's 64-bit mode
    is off (JAX's default): its constraint errors near 1e-7 are round-off, not a
    fault of the model or the method."""
    global _FLOAT32_NOTED
    if _FLOAT32_NOTED or dtype != jnp.float32 or jax.config.jax_enable_x64:
        return
    _FLOAT32_NOTED = True
    warnings.warn(
        "cdiff.simulate: simulating in float32, JAX's default: constraint and "
        "energy errors of about 1e-7 relative are float32's round-off. For float64 "
        "call jax.config.update('jax_enable_x64', True) before any JAX computation "
        "(to keep float32 and silence this: warnings.filterwarnings('ignore', "
        "'cdiff.simulate: simulating in float32')).", stacklevel=3)


def check_time_resolution(t0, t1, dt, dtype) -> None:
    """A step `dt` that the times between `t0` and `t1` cannot resolve in `dtype`
    (representable times there at least `dt / 2` apart: a step's end rounds onto
    its start, or a step doubles) is refused, naming the resolution."""
    for t in (t0, t1):
        spacing = float(np.spacing(np.abs(np.asarray(t, dtype))))
        if spacing >= float(dt) / 2:
            raise ValueError(
                f"cdiff.simulate: dt = {float(dt):g} is below the time resolution of "
                f"{np.dtype(dtype).name} at t = {float(t):g}, where representable "
                f"times are {spacing:g} apart, so steps of dt cannot be represented "
                "(some would vanish). Measure time from a nearer origin (t0 = 0), "
                "take a larger dt, or simulate in float64 (jax_enable_x64)."
            )


def check_max_steps(max_steps, t0, t1, dt, *, saveat, bdf: bool, constant: bool,
                    sizes, dtype) -> int:
    """The static bound on the number of steps, checked: `max_steps` or its default
    (see `simulate`)."""
    if max_steps is not None and not (
        isinstance(max_steps, (int, np.integer)) and not isinstance(max_steps, bool)
        and max_steps > 0
    ):
        raise ValueError(
            f"cdiff.simulate: max_steps must be a positive integer, got {max_steps!r}"
        )
    if not is_concrete(t0, t1, dt):
        if max_steps is not None:
            return max_steps
        if bdf:
            return _BDF_MAX_STEPS
        if _saves_steps(saveat):
            raise ValueError(
                "cdiff.simulate: `dt`, `t0` or `t1` is traced (inside jax.jit, "
                "jax.vmap or jax.grad) and every step is saved, so the number of "
                "saved rows is not known when tracing: pass a static `max_steps=` "
                "(for a constant step, at least ceil((t1 - t0) / dt) for the "
                "smallest dt), or save at given times (SaveAt(ts=...) or "
                "SaveAt(t1=True))."
            )
        return _TRACED_MAX_STEPS
    if not (float(dt) > 0 and math.isfinite(float(dt))):
        raise ValueError(f"dt must be positive and finite, got dt={float(dt)}")
    if not (math.isfinite(float(t1)) and math.isfinite(float(t0))):
        raise ValueError(f"t0 and t1 must be finite, got t0={t0}, t1={t1}")
    if not float(t1) > float(t0):
        raise ValueError(f"t1 must be greater than t0, got t0={t0}, t1={t1}")
    check_time_resolution(t0, t1, dt, dtype)
    if bdf:  # dt is the first step; its steps do not follow it
        return _BDF_MAX_STEPS if max_steps is None else max_steps
    n = constant_steps(t0, t1, dt)
    if constant:
        if max_steps is not None and n > max_steps:
            raise ValueError(
                f"cdiff.simulate: max_steps={max_steps} is fewer than the "
                f"ceil((t1 - t0) / dt) = {n} constant steps from t0={t0} to t1={t1} "
                f"with dt={dt}; raise max_steps or leave it out."
            )
        _check_size(n, saveat, *sizes, dtype)
    if max_steps is not None:
        return max_steps
    return n if constant else max(16 * n, 4096)


def check_solver(formulation, solver, stepsize_controller) -> None:
    """Refuse, before tracing, a formulation and a solver that do not go together."""
    name = type(formulation).__name__
    dae_solver = declares(solver, "integrates_dae")
    if dae_solver and stepsize_controller is not None:
        raise ValueError(
            "cdiff.simulate: cdiff.BDF chooses its own steps (rtol, atol); do not pass "
            "a stepsize_controller with it."
        )
    if isinstance(formulation, AbstractDAEFormulation) and not dae_solver:
        raise ValueError(
            f"cdiff.simulate: {name} is a DAE formulation; integrate it with "
            "solver=cdiff.BDF(...) (diffrax's solvers take ODEs)."
        )
    if dae_solver and formulation.stepwise:
        raise ValueError(
            f"cdiff.BDF: {name} needs per-step data (frozen corrections or an "
            "end-of-step map), which a multistep method cannot provide; use "
            "cdiff.RK4 (or another diffrax solver), or a DAE formulation such "
            "as cdiff.GGL."
        )


def check_divergence(divergence, dtype):
    """The divergence bound as a traced array (`inf`: no test), so that its values
    share a compilation."""
    if divergence is not None and not (
        isinstance(divergence, (int, float)) and math.isfinite(divergence)
        and divergence > 0
    ):
        raise ValueError(
            "cdiff.simulate: divergence must be a positive finite number (or None "
            f"to turn the divergence test off), got {divergence!r}"
        )
    return jnp.asarray(jnp.inf if divergence is None else divergence, dtype)


# Saved trajectories larger than this are refused before anything is allocated.
_MAX_SAVED_BYTES = 2**34


def _saves_steps(saveat) -> bool:
    sub = plain_saveat(saveat)
    return sub is None or bool(sub.steps)


def _check_size(n: int, saveat, state: int, rows: int, dtype) -> None:
    """Refuse, before tracing, a constant-step solve of more steps than a loop
    counter holds, or one whose saved rows (every step saved) would not fit in
    memory: both would otherwise fail deep inside XLA."""
    if n >= 2**31:
        raise ValueError(
            f"cdiff.simulate: ceil((t1 - t0) / dt) = {n:.3g} steps is more than a "
            "solve can take (2**31); raise dt."
        )
    if not _saves_steps(saveat):
        return
    # Per saved row: the state, q and v again with their rates, the residuals and
    # multipliers, the constraint force.
    size = n * (4 * state + 3 * rows) * np.dtype(dtype).itemsize
    if size > _MAX_SAVED_BYTES:
        raise ValueError(
            f"cdiff.simulate: saving all {n:,} steps would take about "
            f"{size / 2**30:,.0f} GiB; raise dt, or save fewer rows "
            "(saveat=cdiff.SaveAt(ts=...) or SaveAt(t1=True))."
        )


def check_save_times(saveat, t0, t1) -> None:
    """Refuse, before tracing, save times that are not sorted or not in [t0, t1]."""
    sub = plain_saveat(saveat)
    if sub is None or sub.ts is None or not is_concrete(sub.ts, t0, t1):
        return
    ts = np.asarray(sub.ts, np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError("cdiff.simulate: saveat.ts must be a non-empty 1-D array of "
                         f"times, got shape {ts.shape}")
    if not np.all(np.isfinite(ts)):
        raise ValueError("cdiff.simulate: saveat.ts has a non-finite time")
    if np.any(np.diff(ts) < 0):
        i = int(np.argmax(np.diff(ts) < 0))
        raise ValueError("cdiff.simulate: saveat.ts must be sorted; "
                         f"ts[{i}] = {ts[i]} > ts[{i + 1}] = {ts[i + 1]}")
    if ts[0] < float(t0) or ts[-1] > float(t1):
        raise ValueError(f"cdiff.simulate: saveat.ts must lie in [t0, t1] = "
                         f"[{float(t0)}, {float(t1)}]; got [{ts[0]}, {ts[-1]}]")


def check_unilateral(model, formulation, solver, stepsize_controller, saveat, adjoint,
                     control, t0, q0) -> int:
    """The number of unilateral rows of `model`; where it has any, checked that the
    solve can enforce them: a formulation that declares `supports_unilateral` (an
    ODE one with a diffrax solver, cdiff.RK4, Projected or any of diffrax's; a DAE
    one with cdiff.BDF), the default adjoint (or `diffrax.ForwardMode()`, which
    `choose_route` takes only on cdiff's own RK4 loop), and a `SaveAt` of `t0`, `t1`,
    `steps` or `ts` (not both of the last two). (A start behind a row ends the
    solve with `RESULTS.penetrating_start`; `penetration_message` names the rows.)"""
    r = jax.eval_shape(model.unilateral, jnp.asarray(t0, q0.dtype), q0).shape
    if len(r) != 1:
        raise ValueError(f"{type(model).__name__}.unilateral(t, q) must return a "
                         f"vector, got shape {r}")
    if r[0] == 0:
        return 0
    name = type(model).__name__
    check_restitution(model.restitution, r[0], f"{name}.restitution")
    unsupported = []
    dae = isinstance(formulation, AbstractDAEFormulation)
    if not formulation.supports_unilateral:
        unsupported.append(
            f"the formulation {type(formulation).__name__}, which does not declare "
            "supports_unilateral (cdiff's that do: "
            + ", ".join(_declaring(AbstractFormulation, "supports_unilateral")) + ")")
    if control is not None and isinstance(control, AbstractStatefulController):
        unsupported.append("a stateful controller")
    if declares(solver, "integrates_dae") and not dae:
        unsupported.append(f"{type(solver).__name__} with an ODE formulation (it "
                           "takes DAE formulations, such as GGL and IndexOne; the "
                           "ODE formulations take diffrax's solvers)")
    if adjoint is not None and not isinstance(adjoint, diffrax.ForwardMode):
        unsupported.append("an adjoint other than the default or "
                           "diffrax.ForwardMode()")
    sub = plain_saveat(saveat)
    if (sub is None or sub.steps not in (0, 1, True, False)
            or (sub.ts is not None and sub.steps)):
        unsupported.append("this saveat (supported: SaveAt(t0=, t1=, steps=) or "
                           "SaveAt(t0=, t1=, ts=))")
    if unsupported:
        raise ValueError(
            f"cdiff.simulate: {name} has {r[0]} unilateral row(s) (unilateral(t, "
            "q)), whose events and impacts cdiff integrates with an ODE formulation "
            "and a diffrax solver, or GGL or IndexOne with cdiff.BDF; not with "
            + "; ".join(unsupported) + ".")
    return r[0]


def check_friction(model, rows: int, t0, q0, v0, formulation, solver) -> int:
    """The dimension of `model`'s slip where it has friction (0 where it has
    none), checked before tracing: its `friction` and `slip` (see
    `cdiff._coulomb.check_friction`), and a solve that can simulate it: a
    formulation that does not hold the energy (friction dissipates it) and a
    diffrax solver (the segments between events; cdiff's BDF and its RK4 loop
    do not take friction yet: `choose_route` refuses the latter)."""
    d = _slip_dimension(model, rows, t0, q0, v0)
    if not d:
        return 0
    name = type(model).__name__
    if formulation.corrects_energy:
        raise ValueError(f"cdiff.simulate: {name} has friction, which dissipates "
                         f"energy; {type(formulation).__name__} holds the energy at "
                         "its initial value. Use it without the energy correction.")
    if declares(solver, "integrates_dae"):
        raise ValueError(f"cdiff.simulate: {name} has friction, which cdiff.BDF does "
                         "not simulate yet; use an ODE formulation (cdiff.Lagrange, "
                         "cdiff.NullSpace, ...) with a diffrax solver, e.g. "
                         "diffrax.Tsit5() and a diffrax.PIDController.")
    return d


def penetration_message(model, t0, q0) -> str | None:
    """The rows of `model` behind which `q0` starts at `t0`, named with their
    values (None if there are none): what a solve that would end with
    `RESULTS.penetrating_start` says, before tracing where the start is
    concrete."""
    # (A model is a pytree of arrays: its method is not a hashable function for
    # `jax.jit`, so the model goes in as an argument.)
    g = np.asarray(eqx.filter_jit(lambda m, t, q: m.unilateral(t, q))(
        model, jnp.asarray(t0, q0.dtype), q0))
    rows = np.flatnonzero(g < -np.asarray(start_tolerance(q0)))
    if rows.size == 0:
        return None
    labels = getattr(model, "unilateral_labels", None)
    named = ""
    if labels is not None:
        labels = labels()
        named = " (" + ", ".join(labels[i] for i in rows) + ")"
    return (f"cdiff.simulate: the initial state violates {type(model).__name__}'s "
            f"unilateral row(s) {rows.tolist()}{named}: g(t0, q0) = "
            f"{g[rows].tolist()}, which must be >= 0 (a row at contact starts at 0). "
            "Start inside the limits: move q0 onto or inside them.")


def check_combination(model, formulation, control, q0, v0, t0) -> None:
    """Refuse, before tracing, a model, formulation and controller that do not go
    together: energy correction without a conservative model's energy or with a
    controller, state feedback on a formulation without its state, a stateful
    controller on a DAE formulation or whose state, rate and input do not fit
    (`check_controller`)."""
    name = type(formulation).__name__
    if formulation.corrects_energy:
        name = f"{name} (corrects_energy: e.g. energy_correction=True)"
        if not has_energy(model, t0, q0, v0):
            raise ValueError(
                f"cdiff: {name} holds the energy at its initial value, but "
                f"{type(model).__name__} defines no energy(t, q, v)."
            )
        if not model.conservative:
            raise ValueError(
                f"cdiff: {name} holds the energy at its initial value, but "
                f"{type(model).__name__} is not conservative (its forces change the "
                "energy); turn the energy correction off."
            )
        if control is not None:
            raise ValueError(
                f"cdiff: {name} holds the energy at its initial value "
                "(a conservative system, eq. 18 with zero energy input) and would "
                "cancel the work of `control`; turn the energy correction off with "
                "a controller."
            )
    if (isinstance(control, AbstractStateFeedback)
            and not formulation.state_feedback):
        raise ValueError(
            f"cdiff: {type(control).__name__} is state feedback on "
            "Yun-Sarkar's null-space state (q, nu) and needs "
            f"formulation=cdiff.NullSpace(...), got {name}."
        )
    if isinstance(control, AbstractStatefulController):
        if isinstance(formulation, AbstractDAEFormulation):
            raise ValueError(
                f"cdiff: {type(control).__name__} is a controller with state, which "
                f"{name} cannot carry: a DAE formulation's state is the DAE's own "
                "variables. Use an ODE formulation (e.g. cdiff.Lagrange(), "
                "cdiff.UdwadiaKalaba(), cdiff.NullSpace()), with cdiff.BDF if the "
                "problem is stiff, or cdiff.RK4 / a diffrax solver."
            )
        check_controller(control, model, t0, q0, v0)
