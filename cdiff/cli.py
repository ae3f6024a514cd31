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

User errors (unknown names, bad numbers, options that do not go together, an
`--out` that is a file or cannot be written) print `cdiff: error: ...` and exit
with status 2, before any work. A solve that fails (it diverges, or stops early)
prints `cdiff: error: ...` with the time it failed, writes what is meaningful (the
rows before the failure; nothing if there are none) and exits with status 1.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import cdiff
from cdiff import _cli_study
from cdiff._animate import check_target as check_animation_target
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
DAE_FORMULATIONS = ("ggl", "ggl-no-inverse", "index-one")

#: Post-step projections (`--projection`), wrapped around RK4 by `cdiff.Projected`.
PROJECTIONS = {
    "newton": cdiff.NewtonProjection(),
    "newton-weighted": cdiff.NewtonProjection(mass_weighted=True),
    "gradient": cdiff.GradientProjection(),
    "gradient-second": cdiff.GradientProjection(partition="second"),
}


def _summary(obj) -> str:
    """The first paragraph of `obj`'s docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _number(*, positive: bool):
    """An argparse `type`: a finite float, > 0 if `positive` else >= 0."""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(x) or x < 0 or (positive and x == 0):
            need = "a positive" if positive else "a non-negative"
            raise argparse.ArgumentTypeError(
                f"must be {need} finite number, got {text}"
            )
        return x

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdiff",
        description="Simulate constrained mechanical systems (reference models).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list the reference models and the formulations")
    run = sub.add_parser(
        "run",
        help="simulate a reference model and compare it with its exact solution",
        description=(
            "Simulate MODEL from its paper's initial state, print errors against the "
            "exact reference and timings, and write DIR/MODEL.png and DIR/MODEL.npz."
        ),
    )
    run.set_defaults(parser=run)
    run.add_argument("model", metavar="MODEL",
                     help="a reference model (" + ", ".join(MODELS) + "), a shipped "
                     "MJCF mechanism (" + ", ".join(MJCF_LIBRARY) + ") or the path of "
                     "an MJCF (.xml) or URDF (.urdf) file")
    run.add_argument("--curve", choices=["line_x1", "line_x0", "circle"],
                     help="planar-arm-on-curve: the curve of the end effector "
                     "(default line_x1)")
    run.add_argument("--formulation", choices=list(FORMULATIONS),
                     default="udwadia-kalaba",
                     help="default: udwadia-kalaba (with constraint correction)")
    run.add_argument("--energy-correction", action="store_true",
                     help="udwadia-kalaba: add Braun-Goldfarb's energy correction")
    run.add_argument("--no-constraint-correction", action="store_true",
                     help="udwadia-kalaba: the plain equation, without the Delta terms")
    run.add_argument("--alpha", type=_number(positive=False), metavar="A",
                     help="lagrange: Baumgarte velocity gain (1/s), default 0; "
                     "null-space: holonomic gain of Yun-Sarkar eq. 17, default 0")
    run.add_argument("--inertia", choices=["Mc", "Mc_sym", "Mc_gamma"],
                     help="projection: Aghili's constraint inertia matrix "
                     "(eq. 23, 28 or 29), default Mc")
    run.add_argument("--beta", type=_number(positive=False), metavar="B",
                     help="lagrange: Baumgarte position gain (1/s), default A")
    run.add_argument("--projection", choices=list(PROJECTIONS),
                     help="project onto the constraints after every step: Aghili's "
                     "Newton projection (eq. 37; -weighted: in the kinetic metric) or "
                     "Terze's gradient-projective partitioning (-second: the "
                     "next-best partition); default: none")
    run.add_argument("--eps", type=_number(positive=True), metavar="E",
                     help="regularized: the regularisation epsilon (eq. 35), "
                     "default 1e-8")
    run.add_argument("--horizon", type=_number(positive=True), metavar="H",
                     help="regularized: the prediction horizon h (s) of eq. 34, "
                     "default 1e-2")
    run.add_argument("--rtol", type=_number(positive=True), metavar="R",
                     help="ggl, ggl-no-inverse, index-one: BDF's relative "
                     "tolerance, default 1e-8")
    run.add_argument("--atol", type=_number(positive=True), metavar="A",
                     help="ggl, ggl-no-inverse, index-one: BDF's absolute "
                     "tolerance, default 1e-8")
    run.add_argument("--dt", type=_number(positive=True), metavar="DT",
                     help="step size (s), default: the model's (with BDF: the first "
                     "step)")
    run.add_argument("--t1", type=_number(positive=True), metavar="T",
                     help="final time (s), default: the model's")
    run.add_argument("--out", type=Path, default=Path("out"), metavar="DIR",
                     help="output folder (default: ./out)")
    run.add_argument("--float32", action="store_true",
                     help="simulate in float32 (the reference stays in float64)")
    run.add_argument("--no-progress", action="store_true",
                     help="no progress bar (shown by default when stderr is a terminal)")
    run.add_argument("--animate", nargs="?", const=True, metavar="PATH",
                     help="also write an animation of the motion: DIR/MODEL.gif, or "
                     "PATH (.gif or .mp4, which needs ffmpeg); planar models only")
    _cli_study.add_parser(sub, _number)
    return parser


def _formulation(args, parser):
    """The formulation the options ask for; `parser.error` on options that do not
    belong to it."""
    dae = args.formulation in DAE_FORMULATIONS
    if (args.rtol is not None or args.atol is not None) and not dae:
        parser.error("--rtol and --atol apply to the DAE formulations ("
                     + ", ".join(DAE_FORMULATIONS) + ") only")
    if (args.eps is not None or args.horizon is not None) and (
        args.formulation != "regularized"
    ):
        parser.error("--eps and --horizon apply to --formulation regularized only")
    if dae or args.formulation == "regularized":
        others = [
            flag for flag, given in [
                ("--alpha", args.alpha is not None), ("--beta", args.beta is not None),
                ("--inertia", args.inertia is not None),
                ("--energy-correction", args.energy_correction),
                ("--no-constraint-correction", args.no_constraint_correction),
                ("--projection", args.projection is not None and dae),
            ] if given
        ]
        if others:
            parser.error(f"{', '.join(others)} do not apply to --formulation "
                         f"{args.formulation}")
        if args.formulation == "regularized":
            return cdiff.Regularized(
                eps=1e-8 if args.eps is None else args.eps,
                h=1e-2 if args.horizon is None else args.horizon,
            )
        if args.formulation == "index-one":
            return cdiff.IndexOne()
        return cdiff.GGL("no_inverse" if args.formulation == "ggl-no-inverse"
                         else "mass")
    if args.formulation == "lagrange":
        if args.energy_correction or args.no_constraint_correction:
            parser.error(
                "--energy-correction and --no-constraint-correction apply to "
                "--formulation udwadia-kalaba only"
            )
        alpha = 0.0 if args.alpha is None else args.alpha
        beta = alpha if args.beta is None else args.beta
        return cdiff.Lagrange(alpha=alpha, beta=beta)
    uk_only = args.energy_correction or args.no_constraint_correction
    if args.formulation != "udwadia-kalaba" and uk_only:
        parser.error(
            "--energy-correction and --no-constraint-correction apply to "
            "--formulation udwadia-kalaba only"
        )
    if args.inertia is not None and args.formulation != "projection":
        parser.error("--inertia applies to --formulation projection only")
    if args.beta is not None or (
        args.alpha is not None and args.formulation != "null-space"
    ):
        parser.error(
            "--alpha and --beta are Baumgarte gains of --formulation lagrange "
            "(--alpha alone also for null-space); "
            f"{args.formulation} does not take them"
        )
    if args.formulation == "projection":
        return cdiff.Projection(inertia=args.inertia or "Mc")
    if args.formulation == "null-space":
        return cdiff.NullSpace(alpha=0.0 if args.alpha is None else args.alpha)
    return cdiff.UdwadiaKalaba(
        constraint_correction=not args.no_constraint_correction,
        energy_correction=args.energy_correction,
    )


def _list() -> int:
    print("models:")
    for name, cls in MODELS.items():
        print(f"  {name:<20} {_summary(cls)}")
        print(f"  {'':<20} default --t1 {cls.default_t1:g} --dt {cls.default_dt:g}")
    print("MJCF mechanisms (cdiff/models/mjcf/; or run any MJCF or URDF file by path):")
    for name, entry in MJCF_LIBRARY.items():
        print(f"  {name:<20} {entry.source}")
        print(f"  {'':<20} reference: {entry.reference_kind}; default --t1 "
              f"{entry.t1:g} --dt {entry.dt:g}")
    print("formulations (DAEs, integrated by cdiff.BDF: "
          + ", ".join(DAE_FORMULATIONS) + "):")
    for name, cls in FORMULATIONS.items():
        print(f"  {name:<20} {_summary(cls)}")
    print("projections (--projection):")
    for name, projection in PROJECTIONS.items():
        print(f"  {name:<20} {projection}")
    return 0


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
    names = tuple(f"qpos[{i}]" for i in range(q0.shape[0]))
    if entry is None:
        return _Case(name, model, q0, v0, 10.0, 1e-3, None, None, ())
    reference = entry.reference
    return _Case(name, model, q0, v0, entry.t1, entry.dt, reference,
                 None if reference is None else (lambda q: q), names)


def _case(args, parser) -> _Case:
    """The model `cdiff run MODEL` names: a reference model, a shipped MJCF
    mechanism or a MuJoCo file; `parser.error` for anything else."""
    if args.curve is not None and args.model != "planar-arm-on-curve":
        parser.error("--curve applies to planar-arm-on-curve only")
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
    path = Path(args.model)
    if path.suffix.lower() in (".xml", ".urdf", ".mjcf"):
        if not path.is_file():
            parser.error(f"no such file: {path}")
        return _mujoco_case(path.stem, path, None)
    parser.error(
        f"unknown MODEL {args.model!r}: choose a reference model ("
        + ", ".join(MODELS) + "), a shipped MJCF mechanism ("
        + ", ".join(MJCF_LIBRARY) + ") or give the path of an .xml or .urdf file"
    )


def _run(args, parser) -> int:
    """`cdiff run`: simulate, compare with the reference, report, write files."""
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
    _check_out(parser, "--out", args.out, [f"{case.name}.png", f"{case.name}.npz"])
    if animation_path is not None:
        _check_out(parser, "--animate", animation_path.parent,
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
    simulate = eqx.filter_jit(
        functools.partial(cdiff.simulate, t0=t0, t1=t1, dt=dt, progress=progress,
                          throw=False, solver=solver)
    )
    start = time.perf_counter()
    compiled = simulate.lower(model, formulation, q0, v0).compile(
        cdiff.compiler_options())
    compiled_at = time.perf_counter()
    sol = jax.block_until_ready(compiled(model, formulation, q0, v0))
    run_time = time.perf_counter() - compiled_at
    compile_time = compiled_at - start

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
    if ts.size and case.reference is not None:
        ref = case.reference(ts)
        obs = np.asarray(case.observable(sol.q[valid]), np.float64)
        ref_obs = np.asarray(case.observable(ref.q), np.float64)
        obs_error = np.max(np.abs(obs - ref_obs), axis=-1)
        names = case.observable_names or tuple(
            f"observable {i}" for i in range(obs.shape[-1])
        )
    else:
        ref = obs = ref_obs = obs_error = None
        names = ()
    data = {
        "ts": ts,
        "q": np.asarray(sol.q)[valid],
        "v": np.asarray(sol.v)[valid],
        "holonomic_residual": np.asarray(sol.holonomic_residual)[valid],
        "velocity_residual": np.asarray(sol.velocity_residual)[valid],
    }
    if ref is not None:
        data.update(reference_q=np.asarray(ref.q), reference_v=np.asarray(ref.v),
                    observable=obs, reference_observable=ref_obs,
                    observable_error=obs_error)
    if sol.energy is not None:
        data["energy"] = np.asarray(sol.energy)[valid]
    summary = _errors(data, n_holonomic, n_nonholonomic, conservative)

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
        energy_row = _value(summary["max_energy_error"], "(|E - E0|, J)",
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
        (
            "wall time",
            f"{compile_time + run_time:.2f} s "
            f"(compile {compile_time:.2f} s, run {run_time:.2f} s)",
        ),
        ("steps/s", f"{steps / run_time:,.0f}  (run only)"),
    ]
    if sol.message:
        rows.insert(8, ("result", "diverged" if diverged else "stopped early"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")

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
        "run_time_s": run_time,
        "result": sol.message,
        "t_diverged": t_diverged if diverged else None,
        "conservative": conservative,
        # The errors over the saved rows (those before a failure); null where
        # they do not apply (printed as n/a).
        **summary,
        "observable_names": list(names),
        "cdiff_version": cdiff.__version__,
    }
    data["settings"] = np.asarray(json.dumps(settings))

    npz_path = args.out / f"{case.name}.npz"
    png_path = args.out / f"{case.name}.png"
    if ts.size:
        np.savez(npz_path, **data)
        step = f"BDF rtol={solver.rtol:g}" if dae else f"dt={dt_taken:g}"
        title = f"{case.name}, {formulation}, {step}"
        if diverged:
            title += f" (diverged at t = {t_diverged:g} s)"
        with np.errstate(all="ignore"):
            _plot(png_path, data, names, title)
        print(f"wrote {png_path}")
        print(f"wrote {npz_path}")
        if animation_path is not None:
            # The meaningful rows only (a diverged run's last rows are huge):
            # animate skips rows whose time is not finite.
            title = f"{case.name}, {args.formulation}"
            motion = eqx.tree_at(lambda s: s.ts, sol,
                                 jnp.where(jnp.asarray(valid), sol.ts, jnp.inf))
            print(f"wrote {cdiff.animate(model, motion, animation_path, title=title)}")
    else:
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


def _value(x, unit: str, missing: str) -> str:
    """A table entry: `x` in scientific notation with its unit, `missing` for None."""
    return missing if x is None else f"{x:.3e}  {unit}"


def _errors(data: dict, n_holonomic: int, n_nonholonomic: int,
            conservative: bool) -> dict:
    """The largest errors over the rows of `data`, as Python floats, `None` where
    one does not apply: no holonomic constraints, no constraints at all, no energy
    (or, for the energy *error*, a model that is not conservative: its energy
    change instead), no reference, or no rows."""
    def largest(key, applies=True):
        x = data.get(key)
        if not applies or x is None or x.size == 0:
            return None
        return float(np.max(np.abs(x)))

    energy = data.get("energy")
    change = (None if energy is None or energy.size == 0
              else float(energy[-1] - energy[0]))
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


def _check_out(parser, option: str, directory: Path, names) -> None:
    """`parser.error`, before the run, unless `directory` is (or can be created as)
    a writable folder in which the files `names` can be written; creates it."""
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
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"{option} {directory}: cannot create it ({e.strerror or e})")


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


#: The most observables `_plot` draws (the error panel covers all of them).
_PLOTTED = 4


def _plot(path: Path, data: dict, names: tuple[str, ...], title: str) -> None:
    """Observable with reference (without a reference: the coordinates), constraint
    residuals, energy error and observable error against time, stacked, in one PNG
    (Agg canvas; pyplot is not touched). Non-finite values are left out (gaps)."""
    from matplotlib.figure import Figure

    data = {k: _finite(v) for k, v in data.items() if k != "settings"}
    ts = data["ts"]
    has_reference = "observable" in data
    panels = 2 + ("energy" in data) + has_reference
    fig = Figure(figsize=(8, 2.3 * panels), layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True)
    fig.suptitle(title, fontsize=9)
    ax = axes[0]
    if has_reference:
        for i, name in enumerate(names[:_PLOTTED]):
            ax.plot(ts, data["observable"][:, i], label=name)
            ax.plot(ts, data["reference_observable"][:, i], "k--", lw=0.8,
                    label=f"{name}, reference")
        if len(names) > _PLOTTED:
            ax.set_title(f"the first {_PLOTTED} of {len(names)} observables "
                         "(errors below: all)", fontsize=8)
    else:
        for i in range(min(_PLOTTED, data["q"].shape[1])):
            ax.plot(ts, data["q"][:, i], label=f"qpos[{i}]")
        ax.set_ylabel("coordinates")
    ax.legend(fontsize=8)
    ax = axes[1]
    for key, label in [("holonomic_residual", r"$\max_i |\Phi_q|$"),
                       ("velocity_residual", r"$\max_i |[\dot\Phi_q; \Phi_v]|$")]:
        if data[key].shape[-1]:
            ax.semilogy(ts, np.max(np.abs(data[key]), axis=-1), label=label)
    ax.set_ylabel("constraint residual")
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no constraints", transform=ax.transAxes, ha="center")
    if "energy" in data:
        axes[2].semilogy(ts, np.abs(data["energy"] - data["energy"][0]))
        axes[2].set_ylabel(r"$|E - E_0|$ (J)")
    if has_reference:
        axes[-1].semilogy(ts, data["observable_error"])
        axes[-1].set_ylabel("observable error")
    axes[-1].set_xlabel("t (s)")
    fig.savefig(path, dpi=110)


def _finite(x: np.ndarray) -> np.ndarray:
    """`x` with its non-finite values, and those too large for a log axis, NaN
    (matplotlib leaves NaN out; inf, or a huge value, breaks its tick
    locators)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return x
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(x) & (np.abs(x) < 1e150), x, np.nan)


def main(argv: list[str] | None = None) -> int:
    """Run the `cdiff` command line with `argv` (default `sys.argv[1:]`).

    **Returns:** the exit status: 0 on success, 1 if the solve failed (diverged
    or stopped early; the message says when).

    **Raises:** `SystemExit(2)` on user errors (unknown names, bad numbers, options
    that do not go together, an `--out` that is a file or cannot be written),
    before any work, after printing `cdiff: error: ...` to stderr.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list()
    # The references are float64; --float32 only casts the simulated state.
    jax.config.update("jax_enable_x64", True)
    try:
        if args.command == "study":
            _cli_study.check(args, args.parser)
            _check_out(args.parser, "--out", args.out, _cli_study.outputs(args))
            return _cli_study.run(args)
        return _run(args, args.parser)
    except ValueError as e:
        print(f"cdiff: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    sys.exit(main())
