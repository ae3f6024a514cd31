"""The `cdiff` command line: list the reference models, run one, write figure and data.

```
cdiff list
cdiff run slider-crank [--formulation udwadia-kalaba|lagrange|...] [--dt DT] [--t1 T] ...
cdiff run iftomm-a02-n-four-bar            # a shipped MJCF mechanism
cdiff run path/to/model.xml [--t1 T --dt DT]   # any MJCF or URDF file
cdiff run planar-arm-on-curve --formulation ggl [--rtol R --atol A]
cdiff study step-size slider-crank [--dts DT ...] [--t1 T] [--out DIR]
cdiff study gains slider-crank [--formulation lagrange|null-space] [--alphas A ...]
```

`cdiff run` simulates a reference model from its paper's initial state, compares it
with the model's exact reference solution, prints a table of errors and timings and
writes `DIR/MODEL.png` and `DIR/MODEL.npz`. A MuJoCo file (MJCF or URDF) runs from
its first keyframe (or `qpos0`) projected onto its constraints, with the constraint
and energy errors but no reference. A model that is not conservative (its
`conservative` is False, e.g. the snakeboard) reports its energy change over the
run instead of an energy error, and refuses `--energy-correction`; errors that do
not apply (no holonomic constraints, no energy, no reference) print as `n/a` and
are `null` in the summary saved in the npz (`settings`).

As each phase starts (set-up, compilation, the run, the reference solution,
plotting, writing) `cdiff run` says so on stderr, with the seconds since the
command started; its table's wall time is the whole command, phase by phase. The
figure has one quantity with one unit per panel: the observables against their
reference (over a long run, the first and the last few periods side by side),
the observable error per unit, the position-level and the velocity-level
constraint residuals, and the energy error; over a long run the log panels show
the maximum over each of 400 bins of the run.

User errors (unknown names, bad numbers, options that do not go together, an
`--out` that is a file or cannot be written) print `cdiff: error: ...` and exit
with status 2, before any work. A solve that fails (it diverges, or stops early)
prints `cdiff: error: ...` with the time it failed, writes what is meaningful (the
rows before the failure; nothing if there are none) and exits with status 1.

The `cdiff` console script is `cdiff_cli_entry.main`, outside the package: it builds
the parser (`_parser` is its), parses and checks the arguments before `cdiff` and
JAX are imported (so `--help` and the argument errors answer at once), stops with
one line and status 130 on a Ctrl-C during the imports, and then calls `main` with
the parsed arguments and its start time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import math
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import cdiff
import cdiff_cli_entry as _entry
from cdiff.cli import _figure
from cdiff.cli import _plain_text as _text
from cdiff.cli import _study
from cdiff._animate import check_target as check_animation_target
from cdiff._cache import cli_compilation_cache
from cdiff.cli._interrupt import Interrupt
from cdiff._model import check_model
from cdiff._model import has_energy as model_has_energy
from cdiff.models import MJCF_LIBRARY, MODELS

#: Command-line names of the formulations.
FORMULATIONS = {
    "udwadia-kalaba": cdiff.UdwadiaKalaba,
    "lagrange": cdiff.Lagrange,
    "projection": cdiff.Projection,
    "null-space": cdiff.NullSpace,
    "regularized": cdiff.Regularized,
    "ggl": cdiff.GGL,
    "ggl-no-inverse": cdiff.GGL,
    "index-one": cdiff.IndexOne,
}

#: Formulations that are DAEs, integrated by `cdiff.BDF`.
DAE_FORMULATIONS = _entry.DAE_FORMULATIONS

#: Post-step projections (`--projection`), wrapped around RK4 by `cdiff.Projected`.
PROJECTIONS = {
    "newton": cdiff.NewtonProjection(),
    "newton-weighted": cdiff.NewtonProjection(mass_weighted=True),
    "gradient": cdiff.GradientProjection(),
    "gradient-second": cdiff.GradientProjection(partition="second"),
}


def _option_notes(obj, siblings) -> list[str]:
    """What tells `obj` apart from `siblings` (instances of its class listed under
    other names): for each field whose value differs, the text of its docstring
    on that value (a list item or sentence naming `field=value`), else on the
    argument (a list item naming `field`), else the value itself."""
    doc = inspect.getdoc(type(obj)) or ""
    notes = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if all(_same(value, getattr(s, field.name)) for s in siblings):
            continue
        shown = (f'{field.name}="{value}"' if isinstance(value, str)
                 else f"{field.name}={value!r}")
        notes.append(_value_note(doc, field, value, shown))
    return notes


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # arrays: not an option of a listed entry
        return a is b


def _value_note(doc: str, field, value, shown: str) -> str:
    """The docstring's words on `shown` (`field=value`), in plain text."""
    # A list item that starts with the value: "- `variant="mass"` (eqs. ...): ..."
    for item in _text.list_items(doc):
        if item.startswith(f"`{shown}`"):
            return _text.plain(item)
    # A sentence that names it: "With `mass_weighted=True` both corrections ..."
    for block in doc.split("\n\n"):
        k = block.find(f"`{shown}`")
        if k >= 0:
            start = max(block.rfind(". ", 0, k) + 2, 0) if ". " in block[:k] else 0
            return _text.plain(block[start:][:_text.sentence_end(block[start:])])
    if field.default is not dataclasses.MISSING and _same(value, field.default):
        return f"{shown} (the default)"
    for item in _text.list_items(doc):  # the argument's item: "- `partition`: ..."
        if item.startswith(f"`{field.name}`:"):
            body = item[len(field.name) + 3:].strip()
            body = _text.plain(body[:_text.sentence_end(body)]).rstrip(".")
            return f"{shown} ({field.name}: {body})"
    return shown


def _listed(entries: dict) -> list[tuple[str, str, Any]]:
    """`(name, description, obj)` for `{name: instance}`: the summary of the
    class, and for a class listed under several names, what tells each apart (the
    later ones as "as FIRST, with ...")."""
    rows, first = [], {}
    for name, obj in entries.items():
        siblings = [o for n, o in entries.items()
                    if n != name and type(o) is type(obj)]
        notes = _option_notes(obj, siblings) if siblings else []
        if type(obj) in first:
            text = f"As {first[type(obj)]}, except: " + " ".join(
                note if note.endswith(".") else note + "." for note in notes)
        else:
            first[type(obj)] = name
            text = " ".join([_text.summary(type(obj)), *notes])
        rows.append((name, text if text.endswith(".") else text + ".", obj))
    return rows


def _parser() -> argparse.ArgumentParser:
    """The `cdiff` parser (built by `cdiff_cli_entry`, which parses before `cdiff`
    is imported)."""
    return _entry.build_parser()


def _formulation(args, parser):
    """The formulation the options ask for; `parser.error` on options that do not
    belong to it."""
    _entry.check_formulation(args, parser)
    if args.formulation == "regularized":
        return cdiff.Regularized(
            eps=1e-8 if args.eps is None else args.eps,
            h=1e-2 if args.horizon is None else args.horizon,
        )
    if args.formulation == "index-one":
        return cdiff.IndexOne()
    if args.formulation in ("ggl", "ggl-no-inverse"):
        return cdiff.GGL("no_inverse" if args.formulation == "ggl-no-inverse"
                         else "mass")
    if args.formulation == "lagrange":
        alpha = 0.0 if args.alpha is None else args.alpha
        beta = alpha if args.beta is None else args.beta
        return cdiff.Lagrange(alpha=alpha, beta=beta)
    if args.formulation == "projection":
        return cdiff.Projection(inertia=args.inertia or "Mc")
    if args.formulation == "null-space":
        return cdiff.NullSpace(alpha=0.0 if args.alpha is None else args.alpha)
    return cdiff.UdwadiaKalaba(
        constraint_correction=not args.no_constraint_correction,
        energy_correction=args.energy_correction,
    )


def _list() -> int:
    """`cdiff list`: every model, shipped MJCF mechanism, formulation and
    projection, with a plain-text description wrapped to the terminal."""
    width = max(60, shutil.get_terminal_size((100, 24)).columns - 1)
    print("models:")
    for name, cls in MODELS.items():
        _item(name, _text.summary(cls), width,
              f"default --t1 {cls.default_t1:g} --dt {cls.default_dt:g}")
    print("MJCF mechanisms (cdiff/models/mjcf/; or run any MJCF or URDF file by path):")
    for name, entry in MJCF_LIBRARY.items():
        _item(name, _text.plain(entry.source), width,
              f"reference: {entry.reference_kind}; default --t1 {entry.t1:g} "
              f"--dt {entry.dt:g}")
    print("formulations (DAEs, integrated by cdiff.BDF: "
          + ", ".join(DAE_FORMULATIONS) + "):")
    parser = _parser()
    built = {name: _formulation(parser.parse_args(["run", "-", "--formulation",
                                                   name]), parser)
             for name in FORMULATIONS}
    for name, text, obj in _listed(built):
        _item(name, text, width, f"cdiff.{obj!r}")
    print("projections (--projection; RK4 wrapped by cdiff.Projected):")
    for name, text, obj in _listed(PROJECTIONS):
        _item(name, text, width, f"cdiff.{obj!r}")
    return 0


#: The width of the name column of `cdiff list`.
_NAME_WIDTH = 22


def _item(name: str, text: str, width: int, detail: str) -> None:
    """One entry of `cdiff list`: the name, then `text` and `detail` wrapped in
    the column after it (from the next line if the name is too long)."""
    indent = " " * (_NAME_WIDTH + 2)
    wrap = functools.partial(textwrap.wrap, width=width - len(indent),
                             break_on_hyphens=False)
    lines = wrap(text) or [""]
    lines += wrap(detail)
    head = f"  {name:<{_NAME_WIDTH}}"
    if len(name) >= _NAME_WIDTH:
        print(f"  {name}")
        head = indent
    print(head + lines[0])
    for line in lines[1:]:
        print(indent + line)


class _Case(NamedTuple):
    """What `cdiff run` simulates: a model, its start, its default horizon and step,
    and its reference (`reference(ts) -> Reference` and `observable(q)`, or None)."""

    name: str
    model: cdiff.AbstractModel
    q0: np.ndarray
    v0: np.ndarray
    t1: float
    dt: float
    reference: Any
    observable: Any
    observable_names: tuple[str, ...]


def _mujoco_case(name: str, path: Path, entry) -> _Case:
    """A MuJoCo file (a shipped mechanism when `entry` is given) as a `_Case`: from
    its first keyframe or `qpos0`, projected onto the constraints."""
    model = cdiff.models.from_mujoco(path)
    q0, v0 = cdiff.consistent_state(model, *model.initial_state())
    names = _qpos_names(model, q0.shape[0])
    if entry is None:
        return _Case(name, model, q0, v0, 10.0, 1e-3, None, None, names)
    reference = entry.reference
    return _Case(name, model, q0, v0, entry.t1, entry.dt, reference,
                 None if reference is None else (lambda q: q), names)


#: The units of the qpos entries of MuJoCo's joint types (free, ball, slide,
#: hinge): positions in metres, angles in radians, quaternions without unit.
_JOINT_UNITS = {0: ("m",) * 3 + ("-",) * 4, 1: ("-",) * 4, 2: ("m",), 3: ("rad",)}


def _qpos_names(model, nq: int) -> tuple[str, ...]:
    """`name [unit]` for each coordinate of a MuJoCo model: its joint's name (with
    `[k]` for a ball or free joint's k-th entry; `qpos[i]` for an unnamed joint),
    the unit from the joint's type (no unit where it is not known)."""
    labels = {i: f"qpos[{i}]" for i in range(nq)}
    units: dict[int, str] = {}
    names = getattr(model, "joint_names", ())
    for j, joint in enumerate(getattr(model, "joints", ())):
        size = len(_JOINT_UNITS.get(int(joint.type), ()))
        for k, unit in enumerate(_JOINT_UNITS.get(int(joint.type), ())):
            units[joint.qposadr + k] = unit
            if j < len(names) and names[j]:
                labels[joint.qposadr + k] = names[j] + (f"[{k}]" if size > 1 else "")
    return tuple(labels[i] + (f" [{units[i]}]" if i in units else "")
                 for i in range(nq))


def _case(args, parser) -> _Case:
    """The model `cdiff run MODEL` names: a reference model, a shipped MJCF
    mechanism or a MuJoCo file; `parser.error` for anything else."""
    _entry.check_model(args, parser, MODELS, MJCF_LIBRARY)
    if args.model in MODELS:
        model = MODELS[args.model](*(() if args.curve is None else (args.curve,)))
        q0, v0 = model.initial_state()
        names = tuple(getattr(model, "observable_names", ()))
        return _Case(args.model, model, q0, v0, model.default_t1, model.default_dt,
                     getattr(model, "reference", None),
                     getattr(model, "observable", None), names)
    if args.model in MJCF_LIBRARY:
        entry = MJCF_LIBRARY[args.model]
        return _mujoco_case(args.model, entry.path, entry)
    path = Path(args.model)  # (an existing MuJoCo file: check_model says so)
    return _mujoco_case(path.stem, path, None)


class _Phases:
    """The phases of `cdiff run`: `start` says on stderr what begins (with the
    time since the command started) and ends the phase before; `times` holds the
    seconds of each."""

    #: How an interrupt names each phase.
    NAMES = {"set-up": "set-up", "compile": "compilation", "run": "the solve",
             "reference": "the reference solution", "plotting": "plotting",
             "writing": "writing", "animation": "the animation"}

    def __init__(self, before: float = 0.0, interrupt: Interrupt | None = None):
        self.started = time.perf_counter()
        self.before = before  # seconds before `main` (Python and JAX start-up)
        self.times: dict[str, float] = {}
        self._current: tuple[str, float] | None = None
        self.interrupt = Interrupt() if interrupt is None else interrupt

    def start(self, key: str, message: str) -> None:
        now = self.stop()
        self._current = (key, now)
        self.interrupt.during = self.NAMES.get(key, key)
        print(f"[{self.before + now - self.started:6.1f} s] {message} ...",
              file=sys.stderr, flush=True)

    def stop(self) -> float:
        now = time.perf_counter()
        if self._current is not None:
            key, then = self._current
            self.times[key] = self.times.get(key, 0.0) + now - then
            self._current = None
        return now

    def total(self) -> float:
        return self.before + time.perf_counter() - self.started


def _startup_time() -> float:
    """Seconds from the creation of this process until now (Linux's /proc; 0
    where it cannot be read): the start-up of `python -m cdiff.cli`, which
    imports `cdiff` before any code of the command runs. (The creation is the
    fork, not the exec: whatever the process did before it ran Python counts too.
    The console script measures from its own first statement instead,
    `cdiff_cli_entry.STARTED`.)"""
    try:
        with open("/proc/self/stat") as f:
            started = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _run(args, parser, phases: _Phases | None = None) -> int:
    """`cdiff run`: simulate, compare with the reference, report, write files;
    says on stderr what it is doing as each phase starts."""
    phases = _Phases() if phases is None else phases
    phases.start("set-up", f"setting up {args.model}: building the model and "
                 "checking it at its initial state")
    case = _case(args, parser)
    model = case.model
    animation_path = _animation_path(args, parser, model, case.name)
    formulation = _formulation(args, parser)
    t1 = case.t1 if args.t1 is None else args.t1
    dt = case.dt if args.dt is None else args.dt
    dtype = jnp.float32 if args.float32 else jnp.float64
    q0, v0 = (jnp.asarray(x, dtype) for x in (case.q0, case.v0))
    # The model's shapes (a ValueError naming the method), then what it declares.
    _, n_holonomic, n_nonholonomic = check_model(model, jnp.zeros((), dtype), q0, v0)
    has_energy = model_has_energy(model, jnp.zeros((), dtype), q0, v0)
    conservative = bool(model.conservative)
    if args.energy_correction and not has_energy:
        parser.error(f"{case.name} defines no energy: --energy-correction needs one")
    if args.energy_correction and not conservative:
        parser.error(
            f"--energy-correction: {case.name} is not conservative (its applied "
            "forces do work on it, so its energy is meant to change); the energy "
            "correction would drive it back to its initial energy and remove that "
            "work"
        )
    created = phases.interrupt.created
    created += _check_out(parser, "--out", args.out,
                          [f"{case.name}.png", f"{case.name}.npz"])
    if animation_path is not None:
        created += _check_out(parser, "--animate", animation_path.parent,
                              [animation_path.name])
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
    if dae:
        rtol = 1e-8 if args.rtol is None else args.rtol
        atol = 1e-8 if args.atol is None else args.atol
        solver = cdiff.BDF(rtol, atol, jump_ts=release)
        progress = False  # BDF has no progress meter
    elif args.projection is not None:
        solver = cdiff.Projected(cdiff.RK4(), PROJECTIONS[args.projection])
    else:
        solver = None
    formulation = formulation.bind(model, t0, q0, v0)
    # With the compilation cache on, a later run of the same model and settings
    # loads the traced program as well as XLA's (cdiff.cached_jit); a progress bar
    # is a host callback, which only a plain jit can compile.
    simulate = cdiff.cached_jit(
        functools.partial(cdiff.simulate, t0=t0, t1=t1, dt=dt, progress=progress,
                          throw=False, solver=solver),
        compiler_options=cdiff.compiler_options())
    method = (f"BDF, rtol {solver.rtol:g}, atol {solver.atol:g}" if dae
              else f"{'RK4' if solver is None else solver}, dt {dt:g} s")
    phases.start("compile", f"compiling the solve ({args.formulation}, {method}; "
                 "JAX compiles once per run)")
    compiled = simulate.compile(model, formulation, q0, v0)
    phases.start("run", f"running from t = {t0:g} to {t1:g} s" + (
        " (adaptive steps)" if dae else
        f" ({math.ceil((t1 - t0) / dt - 1e-9):,} steps)"))
    sol = jax.block_until_ready(compiled(model, formulation, q0, v0))
    phases.stop()
    run_time = phases.times["run"]
    compile_time = phases.times["compile"]

    # The meaningful rows: saved (a solve that stops early leaves trailing inf
    # rows), finite, and before the divergence of a solve that blew up (those rows
    # are huge, then inf or NaN).
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
    impacts = _impacts(model, sol, ts) if sol.unilateral is not None else None
    if impacts is not None:
        data.update(unilateral=np.asarray(sol.unilateral)[valid],
                    active=np.asarray(sol.active)[valid],
                    **{k: v for k, v in impacts.items() if isinstance(v, np.ndarray)})
    npz_path = args.out / f"{case.name}.npz"
    png_path = args.out / f"{case.name}.png"
    interrupt = phases.interrupt
    if ts.size:
        def keep():  # the solve's rows, if stopped before they are written
            np.savez(npz_path, **data)
            return (f"wrote the solve's {ts.size:,} saved states to {npz_path} "
                    "(no figure)")
        interrupt.keep = keep
    if ts.size and case.reference is not None:
        phases.start("reference", f"computing the reference solution at the "
                     f"{ts.size:,} saved times")
        ref = case.reference(ts)
        obs = np.asarray(case.observable(sol.q[valid]), np.float64)
        ref_obs = np.asarray(case.observable(ref.q), np.float64)
        obs_error = np.max(np.abs(obs - ref_obs), axis=-1)
        names = case.observable_names or tuple(
            f"observable {i}" for i in range(obs.shape[-1])
        )
        phases.stop()
    else:
        ref = obs = ref_obs = obs_error = None
        names = ()
    if ref is not None:
        data.update(reference_q=np.asarray(ref.q), reference_v=np.asarray(ref.v),
                    observable=obs, reference_observable=ref_obs,
                    observable_error=obs_error)
    summary = _errors(data, n_holonomic, n_nonholonomic, conservative)
    if impacts is not None:
        summary.update(impacts=impacts["count"],
                       impacts_recorded=impacts["recorded"],
                       energy_lost_at_impacts=impacts["energy_lost"],
                       unilateral_rows=int(data["active"].shape[-1]),
                       rows_ever_active=[int(i) for i in np.flatnonzero(
                           np.any(data["active"], axis=0))],
                       rows_active_at_end=[int(i) for i in np.flatnonzero(
                           data["active"][-1])] if ts.size else [])

    dt_taken = float(sol.dt)
    if dae:
        dt_row = (f"adaptive, {int(sol.stats['num_accepted_steps'])} accepted and "
                  f"{int(sol.stats['num_rejected_steps'])} rejected (first {dt:g} s)")
    else:
        asked = "" if math.isclose(dt_taken, dt, rel_tol=1e-6) else f" (asked {dt:g})"
        dt_row = f"{dt_taken:.6g} s{asked}"
    if ts.size == 0:
        na = "n/a (no row before the failure)"
        constraint_row = velocity_row = energy_row = obs_row = na
    else:
        constraint_row = _value(summary["max_constraint_error"], "(|Phi_q|)",
                                "n/a (no holonomic constraints)")
        velocity_row = _value(summary["max_velocity_constraint_error"],
                              "(|[dPhi_q/dt; Phi_v]|)", "n/a (no constraints)")
        energy_row = _value(summary["max_energy_error"], "(|E - E0|, J)" if (
            impacts is None or "energy_lost_so_far" not in data) else
            "(|E - E0 + lost at impacts so far|, J)",
            "n/a (the model defines no energy)")
        obs_row = _value(summary["max_observable_error"],
                         f"({_names_summary(names)})",
                         "n/a (no reference solution)")
    energy_key = "max energy error"
    if has_energy and not conservative:
        energy_key = "energy change over the run"
        if ts.size:
            energy_row = (f"{summary['energy_change']:.3e} J  (E(t_end) - E0; the "
                          "model is not conservative)")
    rows = [
        ("model", args.model if case.name == args.model else
         f"{case.name} ({args.model})"),
        ("formulation", f"{args.formulation}: {formulation}"),
        ("solver", "RK4" if solver is None else str(solver)),
        ("precision", np.dtype(dtype).name),
        ("t0", f"{t0:g} s" + ("" if t0 == 0 else " (at rest before: the release)")),
        ("t1", f"{t1:g} s"),
        ("dt", dt_row),
        ("steps", f"{steps}"),
        ("max constraint error", constraint_row),
        ("max velocity constraint error", velocity_row),
        (energy_key, energy_row),
        ("max observable error", obs_row),
        ("steps/s", f"{steps / run_time:,.0f}  (run only)"),
    ]
    if impacts is not None:
        rows[11:11] = _impact_rows(summary, impacts)
    if sol.message:
        rows.insert(8, ("result", "diverged" if diverged else "stopped early"))

    settings = {
        "model": case.name,
        "source": args.model,
        "curve": args.curve,
        "formulation": args.formulation,
        "formulation_repr": repr(formulation),
        "projection": args.projection,
        "alpha": getattr(formulation, "alpha", None),
        "beta": getattr(formulation, "beta", None),
        "constraint_correction": getattr(formulation, "constraint_correction", None),
        "energy_correction": getattr(formulation, "energy_correction", None),
        "t0": t0,
        "t1": t1,
        "solver": "RK4" if solver is None else repr(solver),
        "dt_requested": dt,
        "dt": dt_taken,
        "dtype": np.dtype(dtype).name,
        "steps": steps,
        "compile_time_s": compile_time,
        # Where the compiled solve came from: "disk" (the cache: nothing traced
        # or compiled), "exported" (traced now and stored) or "jit" (not stored).
        "program_source": compiled.source,
        "run_time_s": run_time,
        "reference_time_s": phases.times.get("reference"),
        "result": sol.message,
        "t_diverged": t_diverged if diverged else None,
        "conservative": conservative,
        # The errors over the saved rows (those before a failure); null where
        # they do not apply (printed as n/a).
        **summary,
        "observable_names": list(names),
        "cdiff_version": cdiff.__version__,
    }
    written = []
    if ts.size:
        phases.start("plotting", f"plotting {png_path}")
        step = f"BDF rtol={solver.rtol:g}" if dae else f"dt={dt_taken:g}"
        title = f"{case.name}, {formulation}, {step}"
        if diverged:
            title += f" (diverged at t = {t_diverged:g} s)"
        data["settings"] = np.asarray(json.dumps(settings))
        with interrupt.writing(), np.errstate(all="ignore"):
            _figure.plot(png_path, data, names, title,
                             coordinate_names=case.observable_names)
            written.append(png_path)

            def keep():  # the figure is written: the rows still to write
                np.savez(npz_path, **data)
                return (f"wrote {png_path}; wrote the solve's {ts.size:,} saved "
                        f"states to {npz_path}")
            interrupt.keep = keep
        phases.start("writing", f"writing {npz_path}")
        settings["plot_time_s"] = phases.times["plotting"]
        settings["wall_time_s"] = phases.total()  # (up to this write)
        data["settings"] = np.asarray(json.dumps(settings))
        with interrupt.writing():
            np.savez(npz_path, **data)
            written.append(npz_path)
            interrupt.keep = lambda: "wrote " + ", ".join(map(str, written))
        if animation_path is not None:
            phases.start("animation", f"animating the motion into {animation_path}")

            def keep():  # an animation cut short is not kept
                animation_path.unlink(missing_ok=True)
                return "wrote " + ", ".join(map(str, written))
            interrupt.keep = keep
            # The meaningful rows only (a diverged run's last rows are huge):
            # animate skips rows whose time is not finite.
            title = f"{case.name}, {args.formulation}"
            motion = eqx.tree_at(lambda s: s.ts, sol,
                                 jnp.where(jnp.asarray(valid), sol.ts, jnp.inf))
            written.append(cdiff.animate(model, motion, animation_path, title=title))
    phases.stop()
    total, breakdown = _wall_time(phases)
    rows[-1:-1] = [("wall time", total)] + [
        ("", line) for line in textwrap.wrap(breakdown, 64)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for path in written:
        print(f"wrote {path}")
    if not ts.size:
        print("wrote nothing: no saved state before the failure")
    if sol.message:
        if diverged:
            what = f"diverged at t = {t_diverged:g} s"
        else:
            what = "stopped early" + (f" after t = {ts[-1]:g} s" if ts.size else "")
        kept = (f"; the {ts.size} saved states before it are in {npz_path}"
                if ts.size else "")
        print(f"cdiff: error: the solve {what}{kept}. {sol.message}",
              file=sys.stderr)
        return 1
    return 0


def _wall_time(phases: _Phases) -> tuple[str, str]:
    """The table's wall time: the whole command, and each phase."""
    names = {"start-up": "start-up (Python, JAX imports)"}
    times = ({"start-up": phases.before} if phases.before else {}) | phases.times
    total = phases.total()
    # (The rest, outside every phase: parsing, the errors and the table.)
    times["other"] = max(0.0, total - sum(times.values()))
    parts = [f"{names.get(key, key)} {seconds:.2f} s"
             for key, seconds in times.items()]
    return f"{total:.2f} s, the whole command:", ", ".join(parts)


def _value(x, unit: str, missing: str) -> str:
    """A table entry: `x` in scientific notation with its unit, `missing` for None."""
    return missing if x is None else f"{x:.3e}  {unit}"


def _errors(data: dict, n_holonomic: int, n_nonholonomic: int,
            conservative: bool) -> dict:
    """The largest errors over the rows of `data`, as Python floats, `None` where
    one does not apply: no holonomic constraints, no constraints at all, no energy
    (or, for the energy *error*, a model that is not conservative: its energy
    change instead), no reference, or no rows. With impacts
    (`energy_lost_so_far`), the energy error leaves out what they took (the
    model's dissipation); `energy_change` is the whole change."""
    def largest(key, applies=True):
        x = data.get(key)
        if not applies or x is None or x.size == 0:
            return None
        return float(np.max(np.abs(x)))

    energy = data.get("energy")
    change = (None if energy is None or energy.size == 0
              else float(energy[-1] - energy[0]))
    if energy is not None and "energy_lost_so_far" in data:
        # What the impacts took is the model's dissipation: the error is the rest.
        energy = energy + data["energy_lost_so_far"]
    return {
        "max_constraint_error": largest("holonomic_residual", n_holonomic > 0),
        "max_velocity_constraint_error": largest(
            "velocity_residual", n_holonomic + n_nonholonomic > 0),
        "max_energy_error": (None if energy is None or not conservative
                             or energy.size == 0
                             else float(np.max(np.abs(energy - energy[0])))),
        "energy_change": change,
        "max_observable_error": largest("observable_error"),
    }


def _impacts(model, sol, ts: np.ndarray) -> dict:
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


def _impact_rows(summary: dict, impacts: dict) -> list[tuple[str, str]]:
    """The table's rows on the impacts and the held unilateral rows."""
    count, recorded = impacts["count"], impacts["recorded"]
    if count == 0:
        hits = "none"
    else:
        lost = ("" if impacts["energy_lost"] is None else
                f"; energy lost at them {impacts['energy_lost']:.3e} J")
        more = (f" (the first {recorded} recorded)" if recorded < count else "")
        hits = f"{count}{more}{lost}"
    held = summary["rows_ever_active"]
    at_end = summary["rows_active_at_end"]
    return [("impacts", hits),
            ("unilateral rows", f"{summary['unilateral_rows']}; held at some saved "
             f"state: {_row_list(held)}; at the end: {_row_list(at_end)}")]


def _row_list(rows: list[int]) -> str:
    return "none" if not rows else ", ".join(map(str, rows))


def _check_out(parser, option: str, directory: Path, names) -> list[Path]:
    """`parser.error`, before the run, unless `directory` is (or can be created as)
    a writable folder in which the files `names` can be written; creates it.
    Returns the folders it created, outermost first."""
    if directory.exists() and not directory.is_dir():
        parser.error(f"{option} {directory}: exists and is not a directory")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        parser.error(f"{option} {directory}: cannot create it, {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        parser.error(f"{option} {directory}: cannot write in {existing} (permission "
                     "denied)")
    for name in names:
        target = directory / name
        if target.is_dir():
            parser.error(f"{option} {directory}: cannot write {target}, a directory "
                         "of that name is in the way")
        if target.exists() and not os.access(target, os.W_OK):
            parser.error(f"{option} {directory}: cannot overwrite {target} "
                         "(permission denied)")
    created = [p for p in [directory, *directory.parents] if not p.exists()][::-1]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"{option} {directory}: cannot create it ({e.strerror or e})")
    return created


def _animation_path(args, parser, model, name: str | None = None) -> Path | None:
    """Where `--animate` asks for the animation (`None` without it): DIR/MODEL.gif,
    or the path given; `parser.error` before the run for a model without a sketch,
    another suffix than .gif or .mp4, or .mp4 without ffmpeg."""
    if args.animate is None:
        return None
    name = args.model if name is None else name
    path = args.out / f"{name}.gif" if args.animate is True else args.animate
    try:
        return check_animation_target(model, path)
    except (ValueError, RuntimeError) as e:
        parser.error(f"--animate ({name}): {e}")


def _names_summary(names: tuple[str, ...], most: int = 4) -> str:
    """`names` joined, the first `most` of a long list and a count of the rest."""
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f" and {len(names) - most} more"


def main(argv: list[str] | None = None, *, args: argparse.Namespace | None = None,
         started: float | None = None) -> int:
    """Run the `cdiff` command line with `argv` (default `sys.argv[1:]`).

    The console script (`cdiff_cli_entry.main`) parses and checks the command
    line before it imports `cdiff`, and passes the result as `args`, with
    `started`, the `time.perf_counter()` at which the command started: the
    start-up phase of `cdiff run` counts from there.

    **Returns:** the exit status: 0 on success, 1 if the solve failed (diverged
    or stopped early; the message says when).

    **Raises:** `SystemExit(2)` on user errors (unknown names, bad numbers, options
    that do not go together, an `--out` that is a file or cannot be written),
    before any work, after printing `cdiff: error: ...` to stderr.
    """
    command = argv is None  # the command (not a call from Python with its argv)
    if started is not None:
        before = time.perf_counter() - started
    elif command and args is None:  # `python -m cdiff.cli`: its process's age
        before = _startup_time()
    else:
        before = 0.0
    # The command stops at once on Ctrl-C (this handler replaces the console
    # script's, which knows of nothing to keep).
    interrupt = Interrupt().install() if command else None
    if interrupt is not None:
        interrupt.during = "start-up"
    phases = _Phases(before, interrupt)
    if args is None:
        args = _parser().parse_args(argv)
        if command:  # (`python -m cdiff.cli`: the console script's checks too)
            _entry.check(args)
    if args.command == "list":
        return _list()
    # The references are float64; --float32 only casts the simulated state.
    jax.config.update("jax_enable_x64", True)
    try:
        # A later run of the same model and settings loads its compiled programs
        # (a CDIFF_COMPILATION_CACHE that cannot be used is a user error).
        cli_compilation_cache()
        if args.command == "study":
            _entry.check_study(args, args.parser)
            phases.interrupt.created += _check_out(args.parser, "--out", args.out,
                                                   _study.outputs(args))
            return _study.run(args, phases.interrupt)
        return _run(args, args.parser, phases)
    except ValueError as e:
        print(f"cdiff: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
