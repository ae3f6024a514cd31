"""`cdiff study step-size MODEL` and `cdiff study gains MODEL` (see `cdiff.cli`)."""

from __future__ import annotations

from pathlib import Path

import cdiff
from cdiff.cli._interrupt import Interrupt
from cdiff._model import has_energy
from cdiff.models import MODELS
from cdiff.studies._table import with_extension

#: Default step sizes: eight from 1e-3 to 1e-1, all dividing 0.1 s, so that the
#: errors measured every 0.1 s fall on the step grid of every one of them.
DEFAULT_DTS = (1e-3, 2e-3, 4e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1)
DEFAULT_GAINS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)


# The most saved rows a study takes (each study holds the reference and every
# solve's states at them: 10**6 rows of the slider-crank are tens of MB); the
# command line checks it (cdiff_cli_entry.py).
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
