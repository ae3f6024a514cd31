"""`cdiff study step-size MODEL` and `cdiff study gains MODEL` (see `cdiff.cli`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

import cdiff
from cdiff.cli._interrupt import Interrupt
from cdiff._model import has_energy
from cdiff.models import MODELS
from cdiff.studies._table import with_extension

#: Default step sizes: eight from 1e-3 to 1e-1, all dividing 0.1 s, so that the
#: errors measured every 0.1 s fall on the step grid of every one of them.
DEFAULT_DTS = (1e-3, 2e-3, 4e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1)
DEFAULT_GAINS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)


def add_parser(sub, number) -> None:
    """Add the `study` sub-command to the `cdiff` parser's sub-parsers."""
    study = sub.add_parser(
        "study",
        help="batched accuracy studies: step sizes, stabilisation gains",
        description="Batched accuracy studies of a reference model (every step size "
        "of a formulation through one compiled program); writes a table (CSV, npz) and a "
        "figure to --out.",
    )
    kinds = study.add_subparsers(dest="study", required=True, metavar="STUDY")
    step = kinds.add_parser(
        "step-size",
        help="errors and cost against the step size (Braun-Goldfarb Fig. 4)",
        description="Max constraint, energy and overall error and the cost against "
        "the step size for Baumgarte at its best gains (from a gain sweep), "
        "Udwadia-Kalaba with and without energy correction (with it only for a "
        "conservative model with an energy) and RK4 on the minimal ODE (where the "
        "model has one). Writes DIR/MODEL-step-size.{csv,npz,png}.",
    )
    gains = kinds.add_parser(
        "gains",
        help="sweep Baumgarte (or NullSpace) gains; best gains per step size",
        description="Every combination of the gains at every step size in vmapped "
        "calls; prints and writes the best gains per step size. Writes "
        "DIR/MODEL-gains.{csv,npz,png} and DIR/MODEL-gains-best.csv.",
    )
    for p in (step, gains):
        p.set_defaults(parser=p)
        p.add_argument("model", choices=list(MODELS), metavar="MODEL",
                       help="reference model: " + ", ".join(MODELS))
        p.add_argument("--dts", type=number(positive=True), nargs="+",
                       default=list(DEFAULT_DTS), metavar="DT",
                       help="step sizes (default: eight from 1e-3 to 1e-1)")
        p.add_argument("--t1", type=number(positive=True), default=10.0, metavar="T",
                       help="horizon in seconds (default 10)")
        p.add_argument("--n-save", type=int, default=None, metavar="N",
                       help="times at which errors are measured (default: every "
                       "0.1 s)")
        p.add_argument("--out", type=Path, default=Path("out"), metavar="DIR",
                       help="output directory (default: out)")
    step.add_argument("--no-time-each", action="store_true",
                      help="skip timing each step size alone (Fig. 4(e))")
    gains.add_argument("--formulation", choices=["lagrange", "null-space"],
                       default="lagrange",
                       help="lagrange (alpha, beta) or null-space (alpha)")
    gains.add_argument("--alphas", type=number(positive=False), nargs="+",
                       default=list(DEFAULT_GAINS), metavar="A")
    gains.add_argument("--betas", type=number(positive=False), nargs="+",
                       default=None, metavar="B",
                       help="Baumgarte beta values (default: the alphas)")


# The most saved rows a study takes (each study holds the reference and every
# solve's states at them: 10**6 rows of the slider-crank are tens of MB).
_MAX_ROWS = 10**6


def _n_save(args) -> int:
    if args.n_save is not None:
        if args.n_save < 1:
            args.parser.error("--n-save must be a positive integer")
        return args.n_save
    return max(1, int(round(args.t1 / 0.1)))


def _sweep(model, args, formulation=None, alphas=None, betas=None):
    formulation = cdiff.Lagrange() if formulation is None else formulation
    alphas = list(DEFAULT_GAINS) if alphas is None else alphas
    gains = {"alpha": alphas}
    if isinstance(formulation, cdiff.Lagrange):
        gains["beta"] = alphas if betas is None else betas
    metric = "max_error" if hasattr(model, "reference") else "max_constraint_error"
    return cdiff.studies.gain_sweep(model, formulation, gains, args.dts, args.t1,
                                    metric=metric, n_save=_n_save(args))


def _write(table, stem: Path) -> None:
    csv, npz = table.save(stem)
    png = with_extension(stem, ".png")
    table.plot(png)
    print(f"wrote {csv}, {npz}, {png}")


def run(args, interrupt: Interrupt | None = None) -> int:
    """Run `cdiff study ...` with parsed `args`; returns the exit status.
    `interrupt` learns what is running and what a Ctrl-C keeps."""
    interrupt = Interrupt() if interrupt is None else interrupt
    model = MODELS[args.model]()
    interrupt.during = ("the gain sweep" if args.study == "gains" else
                        "the gain sweep for the Baumgarte baseline")
    if args.study == "gains":
        formulation = (cdiff.NullSpace() if args.formulation == "null-space"
                       else cdiff.Lagrange())
        sweep = _sweep(model, args, formulation, args.alphas, args.betas)
        print(sweep.best)
        with interrupt.writing():
            _write(sweep, args.out / f"{args.model}-gains")
            path = sweep.best.to_csv(args.out / f"{args.model}-gains-best.csv")
            print(f"wrote {path}")
            interrupt.keep = lambda: "wrote the whole sweep"
        return 0
    print("gain sweep for the Baumgarte baseline ...")
    best = _sweep(model, args).best_formulation()
    formulations = {"Baumgarte (best gains)": best,
                    "UK, constraint correction": cdiff.UdwadiaKalaba()}
    energy_row = "UK, constraint + energy correction"
    if not has_energy(model, 0.0, *model.initial_state()):
        print(f"leaving out {energy_row!r}: {args.model} defines no energy")
    elif not getattr(model, "conservative", True):
        print(f"leaving out {energy_row!r}: {args.model} is not conservative (its "
              "applied forces do work on it), so there is no energy to keep")
    else:
        formulations[energy_row] = cdiff.UdwadiaKalaba(energy_correction=True)
    if hasattr(model, "minimal_ode"):
        formulations["RK4 on the minimal ODE"] = cdiff.studies.Minimal()
    stem = args.out / f"{args.model}-step-size"
    interrupt.during = "the step-size study"

    def finished(table):  # what a Ctrl-C keeps: the formulations done
        def keep():
            csv, npz = table.save(stem)
            done = ", ".join(dict.fromkeys(table["formulation"]))
            return (f"wrote the {len(table)} rows finished ({done}) to {csv} and "
                    f"{npz}")
        interrupt.keep = keep

    study = cdiff.studies.step_size_study(
        model, formulations, args.dts, args.t1, n_save=_n_save(args),
        time_each=not args.no_time_each, on_formulation=finished)
    print(study)
    with interrupt.writing():
        _write(study, stem)
        interrupt.keep = lambda: "wrote the whole study"
    return 0


def outputs(args) -> list[str]:
    """The names of the files `run(args)` writes in `args.out`."""
    stem = f"{args.model}-{'gains' if args.study == 'gains' else 'step-size'}"
    names = [f"{stem}{suffix}" for suffix in (".csv", ".npz", ".png")]
    if args.study == "gains":
        names.append(f"{args.model}-gains-best.csv")
    return names


def check(args, parser: argparse.ArgumentParser) -> None:
    """Argument checks that argparse cannot express."""
    if any(dt > args.t1 for dt in args.dts):
        parser.error(f"every --dts value must be at most --t1 = {args.t1}")
    if len(set(np.round(args.dts, 15))) != len(args.dts):
        parser.error("--dts values must be distinct")
    if args.n_save is not None and args.n_save < 1:
        parser.error("--n-save must be a positive integer")
    steps = math.ceil(args.t1 / min(args.dts) - 1e-9)
    if steps >= 2**31:
        parser.error(f"--t1 {args.t1:g} takes {steps:.3g} steps of the smallest --dts "
                     f"({min(args.dts):g}), more than a solve can take (2**31)")
    rows = args.n_save if args.n_save is not None else max(1, round(args.t1 / 0.1))
    if rows > _MAX_ROWS:
        parser.error(f"--t1 {args.t1:g} saves {rows:.3g} rows per solve (one every "
                     f"0.1 s unless --n-save says otherwise), more than {_MAX_ROWS:,}: "
                     "pass a smaller --n-save")
    if (args.study == "gains" and args.formulation == "null-space"
            and args.betas is not None):
        parser.error("--betas apply to --formulation lagrange only")
