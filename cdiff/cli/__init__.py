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
import sys
import time
from pathlib import Path as Path  # (read here as `cdiff.cli.Path`)

import jax

import cdiff_cli_entry as _entry
from cdiff._cache import cli_compilation_cache
from cdiff._compiler import configure_xla_flags
from cdiff.cli import _cases, _options, _outputs, _phases, _run, _study
from cdiff.cli._interrupt import Interrupt
from cdiff.models import MJCF_LIBRARY as MJCF_LIBRARY
from cdiff.models import MODELS as MODELS

# The command line's modules, each one job (none imports this one):
#   _options     the parser (cdiff_cli_entry's) and `cdiff list`
#   _cases       from the arguments: the case, the formulation, the solver
#   _phases      the phases of `cdiff run`, timed and announced
#   _outputs     the files of `cdiff run`: checked before, written after
#   _solve       `cdiff run`'s set-up, solve, saved rows and reference
#   _report      the errors, the table, the npz's settings
#   _run         `cdiff run`, step by step
#   _study       `cdiff study`
#   _figure, _plain_text, _interrupt: the figure, docstrings as text, Ctrl-C

#: Command-line names of the formulations.
FORMULATIONS = _cases.FORMULATIONS
#: Formulations that are DAEs, integrated by `cdiff.BDF`.
DAE_FORMULATIONS = _cases.DAE_FORMULATIONS
#: Post-step projections (`--projection`), wrapped around RK4 by `cdiff.Projected`.
PROJECTIONS = _cases.PROJECTIONS

# The names the tests read here (where they are defined: the modules above).
_parser = _options.parser
_Case = _cases.Case
_qpos_names = _cases.qpos_names
_Phases = _phases.Phases
_animation_path = _outputs.animation_path


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
        before = _phases.startup_time()
    else:
        before = 0.0
    # The command stops at once on Ctrl-C (this handler replaces the console
    # script's, which knows of nothing to keep).
    if command:
        # The command's own process: XLA's CPU option for every program it
        # compiles, before its first JAX computation (`cdiff.configure_xla_flags`).
        configure_xla_flags(warn=False)
        interrupt = Interrupt().install()
        interrupt.during = "start-up"
    else:
        interrupt = Interrupt()  # (a call from Python: no handler taken over)
    phases = _phases.Phases(before, interrupt)
    if args is None:
        args = _parser().parse_args(argv)
        if command:  # (`python -m cdiff.cli`: the console script's checks too)
            _entry.check(args)
    if args.command == "list":
        return _options.list_all()
    # The references are float64; --float32 only casts the simulated state.
    jax.config.update("jax_enable_x64", True)
    try:
        # A later run of the same model and settings loads its compiled programs
        # (a CDIFF_COMPILATION_CACHE that cannot be used is a user error).
        cli_compilation_cache()
        if args.command == "study":
            _entry.check_study(args, args.parser)
            phases.interrupt.created += _outputs.check_out(
                args.parser, "--out", args.out, _study.outputs(args))
            return _study.run(args, phases.interrupt)
        return _run.run(args, args.parser, phases)
    except ValueError as e:
        print(f"cdiff: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
