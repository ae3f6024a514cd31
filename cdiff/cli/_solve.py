"""`cdiff run`'s computation, step by step: settle the arguments into what to
simulate (`set_up`), compile and run the solve (`solve`), keep its meaningful
rows (`saved_rows`, with the impacts of a model with unilateral rows), and
compare them with the reference solution (`compare`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import cdiff
from cdiff._model import check_model
from cdiff._model import has_energy as model_has_energy
from cdiff.cli._cases import DAE_FORMULATIONS, Case, case, formulation, solver
from cdiff.cli._outputs import animation_path, check_out
from cdiff.cli._phases import Phases


@dataclasses.dataclass
class SetUp:
    """`cdiff run`'s arguments settled: the case, the formulation (bound to the
    model at the start) and the solver (None: RK4), the times, the precision and
    initial state, what the model declares, and the options for the solve."""

    case: Case
    formulation: Any
    solver: Any
    dae: bool  # a DAE formulation, integrated by BDF
    t0: float
    t1: float
    dt: float
    dtype: Any
    q0: jax.Array
    v0: jax.Array
    n_holonomic: int
    n_nonholonomic: int
    has_energy: bool
    conservative: bool
    progress: bool
    animation_path: Path | None

    @property
    def model(self) -> cdiff.AbstractModel:
        return self.case.model


@dataclasses.dataclass
class Solved:
    """The solve and its meaningful rows: `valid` marks the saved rows that are
    finite and before a divergence, `ts` their times, `data` the arrays of the npz
    (those rows), `impacts` what `impacts` makes of a model with unilateral rows
    (None without)."""

    sol: Any
    source: str  # where the compiled solve came from (`cdiff.cached_jit`)
    steps: int
    t_diverged: float
    diverged: bool
    valid: np.ndarray
    ts: np.ndarray
    data: dict
    impacts: dict | None


def set_up(args, parser, phases: Phases) -> SetUp:
    """The "set-up" phase: the case, the formulation and the solver from the
    arguments, checked at the initial state; `parser.error` (before any work) for
    what does not go together and for outputs that cannot be written."""
    phases.start("set-up", f"setting up {args.model}: building the model and "
                 "checking it at its initial state")
    the_case = case(args, parser)
    model = the_case.model
    animation = animation_path(args, parser, model, the_case.name)
    the_formulation = formulation(args, parser)
    t1 = the_case.t1 if args.t1 is None else args.t1
    dt = the_case.dt if args.dt is None else args.dt
    dtype = jnp.float32 if args.float32 else jnp.float64
    q0, v0 = (jnp.asarray(x, dtype) for x in (the_case.q0, the_case.v0))
    # The model's shapes (a ValueError naming the method), then what it declares.
    _, n_holonomic, n_nonholonomic = check_model(model, jnp.zeros((), dtype), q0, v0)
    has_energy = model_has_energy(model, jnp.zeros((), dtype), q0, v0)
    conservative = bool(model.conservative)
    _check_energy_correction(args, parser, the_case.name, has_energy, conservative)
    created = phases.interrupt.created
    created += check_out(parser, "--out", args.out,
                         [f"{the_case.name}.png", f"{the_case.name}.npz"])
    if animation is not None:
        created += check_out(parser, "--animate", animation.parent, [animation.name])
    progress = not args.no_progress and sys.stderr.isatty()

    # Settle static choices (NullSpace's dof) from the concrete initial state, then
    # compile ahead of time, so that compilation and run are timed separately.
    # A model whose forces jump (R8's release of the holding torques, attribute
    # `t_release`): BDF steps to the jump and restarts there; a fixed-step
    # Runge-Kutta step cannot resolve it, so those runs start at the jump from the
    # (held, exact) initial state.
    release = getattr(model, "t_release", None)
    dae = args.formulation in DAE_FORMULATIONS
    t0 = 0.0 if release is None or dae else float(release)
    the_solver = solver(args, release)
    if dae:
        progress = False  # BDF has no progress meter
    the_formulation = the_formulation.bind(model, t0, q0, v0)
    return SetUp(the_case, the_formulation, the_solver, dae, t0, t1, dt, dtype, q0,
                 v0, n_holonomic, n_nonholonomic, has_energy, conservative, progress,
                 animation)


def _check_energy_correction(args, parser, name: str, has_energy: bool,
                             conservative: bool) -> None:
    """`parser.error` for `--energy-correction` on a model without an energy, or
    on one that is not conservative."""
    if args.energy_correction and not has_energy:
        parser.error(f"{name} defines no energy: --energy-correction needs one")
    if args.energy_correction and not conservative:
        parser.error(
            f"--energy-correction: {name} is not conservative (its applied "
            "forces do work on it, so its energy is meant to change); the energy "
            "correction would drive it back to its initial energy and remove that "
            "work"
        )


def solve(args, setup: SetUp, phases: Phases) -> Solved:
    """The "compile" and "run" phases, timed apart (the solve is compiled ahead of
    time), then the solve's meaningful rows (`saved_rows`)."""
    s = setup
    # With the compilation cache on, a later run of the same model and settings
    # loads the traced program as well as XLA's (cdiff.cached_jit); a progress bar
    # is a host callback, which only a plain jit can compile.
    simulate = cdiff.cached_jit(
        functools.partial(cdiff.simulate, t0=s.t0, t1=s.t1, dt=s.dt,
                          progress=s.progress, throw=False, solver=s.solver),
        compiler_options=cdiff.compiler_options())
    method = (f"BDF, rtol {s.solver.rtol:g}, atol {s.solver.atol:g}" if s.dae
              else f"{'RK4' if s.solver is None else s.solver}, dt {s.dt:g} s")
    phases.start("compile", f"compiling the solve ({args.formulation}, {method}; "
                 "JAX compiles once per run)")
    compiled = simulate.compile(s.model, s.formulation, s.q0, s.v0)
    phases.start("run", f"running from t = {s.t0:g} to {s.t1:g} s" + (
        " (adaptive steps)" if s.dae else
        f" ({math.ceil((s.t1 - s.t0) / s.dt - 1e-9):,} steps)"))
    sol = jax.block_until_ready(compiled(s.model, s.formulation, s.q0, s.v0))
    phases.stop()
    return saved_rows(s.model, sol, compiled.source)


def saved_rows(model, sol, source: str) -> Solved:
    """The meaningful rows of `sol`: saved (a solve that stops early leaves
    trailing inf rows), finite, and before the divergence of a solve that blew up
    (those rows are huge, then inf or NaN); and the arrays of the npz."""
    steps = int(sol.stats["num_steps"])
    ts_all = np.asarray(sol.ts)
    t_diverged = float(sol.stats.get("t_diverged", np.inf))
    # (A solve stopped by a non-finite step fails the divergence test too.)
    diverged = bool(sol.result == cdiff.RESULTS.diverged) or (
        bool(sol.message) and math.isfinite(t_diverged))
    valid = (np.isfinite(ts_all) & (ts_all < t_diverged)
             & np.all(np.isfinite(np.asarray(sol.q)), axis=-1)
             & np.all(np.isfinite(np.asarray(sol.v)), axis=-1))
    ts = ts_all[valid]
    data = {
        "ts": ts,
        "q": np.asarray(sol.q)[valid],
        "v": np.asarray(sol.v)[valid],
        "holonomic_residual": np.asarray(sol.holonomic_residual)[valid],
        "velocity_residual": np.asarray(sol.velocity_residual)[valid],
    }
    if sol.energy is not None:
        data["energy"] = np.asarray(sol.energy)[valid]
    found = impacts(model, sol, ts) if sol.unilateral is not None else None
    if found is not None:
        data.update(unilateral=np.asarray(sol.unilateral)[valid],
                    active=np.asarray(sol.active)[valid],
                    **{k: v for k, v in found.items() if isinstance(v, np.ndarray)})
    return Solved(sol, source, steps, t_diverged, diverged, valid, ts, data, found)


def impacts(model, sol, ts: np.ndarray) -> dict:
    """A model with unilateral rows: its impacts (`sol.stats["events"]`) as the
    npz's `impact_*` arrays (the recorded ones, in order: time, state, velocities
    before and after, impulse per row, the rows hit and those stopped by the rest
    rule, and the energy each took, E before - E after), their `count` (all of
    them; the first `recorded` are kept), the total `energy_lost` (J; None
    without an energy) and `energy_lost_so_far`, the energy the impacts took up
    to each saved time: a plastic impact's loss is the model's dissipation, not
    an integration error."""
    events = sol.stats["events"]
    count = int(events.count)
    n = min(count, int(events.t.shape[0]))
    out = {"count": count, "recorded": n, "energy_lost": None,
           "impact_t": np.asarray(events.t)[:n],
           "impact_q": np.asarray(events.q)[:n],
           "impact_v_before": np.asarray(events.v_before)[:n],
           "impact_v_after": np.asarray(events.v_after)[:n],
           "impact_impulse": np.asarray(events.impulse)[:n],
           "impact_rows": np.asarray(events.rows)[:n],
           "impact_rest": np.asarray(events.rest)[:n]}
    if sol.energy is not None:
        energy = eqx.filter_jit(jax.vmap(type(model).energy, (None, 0, 0, 0)))
        t, q = events.t[:n], events.q[:n]
        lost = np.asarray(energy(model, t, q, events.v_before[:n])
                          - energy(model, t, q, events.v_after[:n]), np.float64)
        out["impact_energy_lost"] = lost
        out["energy_lost"] = float(np.sum(lost))
        # (An impact at a saved time is in that row's state: it counts there.)
        out["energy_lost_so_far"] = np.array(
            [np.sum(lost[out["impact_t"] <= t]) for t in ts])
    return out


def compare(the_case: Case, solved: Solved, phases: Phases) -> tuple[str, ...]:
    """The "reference" phase, for a case with a reference and a solve with rows:
    the reference solution at the saved times and the observables' errors, added
    to `solved.data`. Returns the observables' names (none without a
    reference)."""
    ts, data = solved.ts, solved.data
    if not (ts.size and the_case.reference is not None):
        return ()
    phases.start("reference", f"computing the reference solution at the "
                 f"{ts.size:,} saved times")
    ref = the_case.reference(ts)
    obs = np.asarray(the_case.observable(solved.sol.q[solved.valid]), np.float64)
    ref_obs = np.asarray(the_case.observable(ref.q), np.float64)
    obs_error = np.max(np.abs(obs - ref_obs), axis=-1)
    names = the_case.observable_names or tuple(
        f"observable {i}" for i in range(obs.shape[-1])
    )
    phases.stop()
    data.update(reference_q=np.asarray(ref.q), reference_v=np.asarray(ref.v),
                observable=obs, reference_observable=ref_obs,
                observable_error=obs_error)
    return names
