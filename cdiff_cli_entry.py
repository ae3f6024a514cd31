"""The `cdiff` console script: the command line is read before JAX is imported.

`import cdiff` imports JAX, diffrax and the models, seconds of work, and Python
runs `cdiff/__init__.py` before any module of the package, `cdiff.cli` included.
This module therefore lives outside the package and imports the standard library
only. Its `main`:

1. takes the command's start time (`STARTED`, the first statement of the
   module, before any import: the interpreter's own start-up, some tens of
   milliseconds, is before it; whatever ran in the process before Python did,
   a shell's `sleep 2; exec cdiff ...` for instance, is not counted);
2. takes over Ctrl-C: from here on an interrupt ends the process at once with
   one line, `cdiff: interrupted during start-up; nothing written`, and the
   shell's status for an interrupt (130), never a traceback, wherever the
   import is (`cdiff.cli` takes over with its own handler, which keeps what a
   command has finished, once it is imported);
3. builds the parser and parses, so that `--help` and the user errors argparse
   and `check` can find (unknown names, bad numbers, options that do not go
   together, a model file that is not there) answer at once, exit status 2;
4. only then imports `cdiff.cli` and runs the command (`cdiff.cli.main`).

The parser needs the names of the models, the MJCF mechanisms, the
formulations and the projections without importing them: they are listed here
(`MODELS`, `MJCF_MECHANISMS`, `FORMULATIONS`, `PROJECTIONS`), and
tests/cli/test_cli.py checks that they are the names `cdiff.cli` and `cdiff.models`
offer. `cdiff.cli` builds its parser here too (`cdiff.cli._parser`), so there is
one parser.
"""

import time

#: `time.perf_counter()` when the command started: the first thing it does.
STARTED = time.perf_counter()

import argparse
import math
import os
import signal
import socket
import sys
import threading
from pathlib import Path

#: The reference models (`cdiff.models.MODELS`), in its order.
MODELS = ("particle-on-circle", "slider-crank", "slider-crank-joint",
          "double-four-bar", "two-link-on-circle", "rolling-sphere", "snakeboard",
          "planar-arm-on-curve")

#: The shipped MJCF mechanisms (`cdiff.models.MJCF_LIBRARY`), in its order.
MJCF_MECHANISMS = ("slider-crank-mjcf", "double-four-bar-mjcf",
                   "iftomm-a01-simple-pendulum", "iftomm-a02-n-four-bar",
                   "iftomm-a03-andrews-squeezer", "iftomm-a04-bricard",
                   "iftomm-a05-flyball-governor")

#: The formulations' command-line names (`cdiff.cli.FORMULATIONS`).
FORMULATIONS = ("udwadia-kalaba", "lagrange", "projection", "null-space",
                "regularized", "ggl", "ggl-no-inverse", "index-one")

#: The formulations that are DAEs, integrated by `cdiff.BDF`.
DAE_FORMULATIONS = ("ggl", "ggl-no-inverse", "index-one")

#: The post-step projections' command-line names (`cdiff.cli.PROJECTIONS`).
PROJECTIONS = ("newton", "newton-weighted", "gradient", "gradient-second")

#: The suffixes of the MuJoCo files `cdiff run PATH` loads.
MUJOCO_SUFFIXES = (".xml", ".urdf", ".mjcf")

#: `cdiff study`'s default step sizes (`cdiff.cli._study.DEFAULT_DTS`): eight from
#: 1e-3 to 1e-1, all dividing 0.1 s, so that the errors measured every 0.1 s fall
#: on the step grid of every one of them; and its default gains.
DEFAULT_DTS = (1e-3, 2e-3, 4e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1)
DEFAULT_GAINS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)

#: The most saved rows a study takes (each study holds the reference and every
#: solve's states at them: 10**6 rows of the slider-crank are tens of MB).
MAX_STUDY_ROWS = 10**6

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT).
INTERRUPTED = 128 + signal.SIGINT


def main(argv: list[str] | None = None) -> int:
    """The `cdiff` command with `argv` (default `sys.argv[1:]`): parse and check
    the arguments, then import `cdiff.cli` and run it. Returns the exit status
    (`SystemExit(2)` on a user error, `SystemExit(0)` after `--help`)."""
    _stop_on_interrupt()
    parser = build_parser()
    args = parser.parse_args(argv)
    check(args)
    from cdiff import cli  # JAX, diffrax, the models: the seconds of start-up

    return cli.main(args=args, started=STARTED)


def _stop_on_interrupt() -> None:
    """Ctrl-C during start-up: one line and exit status 130, at once.

    As `cdiff.cli._interrupt.Interrupt` does (which replaces this once
    `cdiff.cli` is imported): the interpreter's C-level handler writes the signal
    to a socket (`signal.set_wakeup_fd`) that a watcher thread reads, so an
    interrupt ends the process even where Python would not run a handler, or
    would raise `KeyboardInterrupt` into code that swallows it or prints a
    traceback (an import of JAX). The Python-level handler does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return  # (signals are for the main thread: a caller's, not the command's)
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    _SOCKETS.append((reader, writer))  # kept open for the process's life
    threading.Thread(target=_watch, args=(reader,), daemon=True,
                     name="cdiff-start-up-interrupt").start()


_SOCKETS: list[tuple[socket.socket, socket.socket]] = []


def _watch(reader: socket.socket) -> None:
    try:
        while signal.SIGINT not in reader.recv(64):
            pass
    except OSError:  # (the socket closed: nothing to watch)
        return
    os.write(2, b"\ncdiff: interrupted during start-up; nothing written\n")
    os._exit(INTERRUPTED)


def number(*, positive: bool):
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


def build_parser() -> argparse.ArgumentParser:
    """The `cdiff` parser: `list`, `run` and `study` (`step-size`, `gains`). The
    parsed arguments of `run` and of each study carry their sub-parser as
    `parser`, for the errors found later."""
    parser = argparse.ArgumentParser(
        prog="cdiff",
        description="Simulate constrained mechanical systems (reference models).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list the reference models and the formulations")
    _add_run(sub)
    _add_study(sub)
    return parser


def _add_run(sub) -> None:
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
                     "MJCF mechanism (" + ", ".join(MJCF_MECHANISMS) + ") or the path "
                     "of an MJCF (.xml) or URDF (.urdf) file")
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
    run.add_argument("--alpha", type=number(positive=False), metavar="A",
                     help="lagrange: Baumgarte velocity gain (1/s), default 0; "
                     "null-space: holonomic gain of Yun-Sarkar eq. 17, default 0")
    run.add_argument("--inertia", choices=["Mc", "Mc_sym", "Mc_gamma"],
                     help="projection: Aghili's constraint inertia matrix "
                     "(eq. 23, 28 or 29), default Mc")
    run.add_argument("--beta", type=number(positive=False), metavar="B",
                     help="lagrange: Baumgarte position gain (1/s), default A")
    run.add_argument("--projection", choices=list(PROJECTIONS),
                     help="project onto the constraints after every step: Aghili's "
                     "Newton projection (eq. 37; -weighted: in the kinetic metric) or "
                     "Terze's gradient-projective partitioning (-second: the "
                     "next-best partition); default: none")
    run.add_argument("--eps", type=number(positive=True), metavar="E",
                     help="regularized: the regularisation epsilon (eq. 35), "
                     "default 1e-8")
    run.add_argument("--horizon", type=number(positive=True), metavar="H",
                     help="regularized: the prediction horizon h (s) of eq. 34, "
                     "default 1e-2")
    run.add_argument("--rtol", type=number(positive=True), metavar="R",
                     help="ggl, ggl-no-inverse, index-one: BDF's relative "
                     "tolerance, default 1e-8")
    run.add_argument("--atol", type=number(positive=True), metavar="A",
                     help="ggl, ggl-no-inverse, index-one: BDF's absolute "
                     "tolerance, default 1e-8")
    run.add_argument("--dt", type=number(positive=True), metavar="DT",
                     help="step size (s), default: the model's (with BDF: the first "
                     "step)")
    run.add_argument("--t1", type=number(positive=True), metavar="T",
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


def _add_study(sub) -> None:
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


def check(args: argparse.Namespace) -> None:
    """The checks of the parsed arguments that argparse cannot express and that
    need neither JAX nor a model: `parser.error` (exit status 2) on the first
    that fails. (`cdiff.cli` makes the same checks where it uses the arguments,
    and those that need the model.)"""
    if args.command == "run":
        check_model(args, args.parser)
        check_formulation(args, args.parser)
    elif args.command == "study":
        check_study(args, args.parser)


def check_model(args, parser, models=MODELS, mechanisms=MJCF_MECHANISMS) -> None:
    """`cdiff run MODEL`: `parser.error` unless MODEL is one of `models`, one of
    `mechanisms` or the path of a MuJoCo file that exists; and for a `--curve`
    given to another model than planar-arm-on-curve."""
    if args.curve is not None and args.model != "planar-arm-on-curve":
        parser.error("--curve applies to planar-arm-on-curve only")
    if args.model in models or args.model in mechanisms:
        return
    path = Path(args.model)
    if path.suffix.lower() in MUJOCO_SUFFIXES:
        if not path.is_file():
            parser.error(f"no such file: {path}")
        return
    parser.error(
        f"unknown MODEL {args.model!r}: choose a reference model ("
        + ", ".join(models) + "), a shipped MJCF mechanism ("
        + ", ".join(mechanisms) + ") or give the path of an .xml or .urdf file"
    )


def check_formulation(args, parser) -> None:
    """`cdiff run`: `parser.error` on options that do not belong to
    `--formulation` (`cdiff.cli._cases.formulation` builds it)."""
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
        return
    if (args.energy_correction or args.no_constraint_correction) and (
        args.formulation != "udwadia-kalaba"
    ):
        parser.error(
            "--energy-correction and --no-constraint-correction apply to "
            "--formulation udwadia-kalaba only"
        )
    if args.inertia is not None and args.formulation != "projection":
        parser.error("--inertia applies to --formulation projection only")
    if args.formulation == "lagrange":
        return
    if args.beta is not None or (
        args.alpha is not None and args.formulation != "null-space"
    ):
        parser.error(
            "--alpha and --beta are Baumgarte gains of --formulation lagrange "
            "(--alpha alone also for null-space); "
            f"{args.formulation} does not take them"
        )


def check_study(args, parser) -> None:
    """`cdiff study`: the checks of the step sizes, the horizon, the saved rows
    and the gains that argparse cannot express."""
    if any(dt > args.t1 for dt in args.dts):
        parser.error(f"every --dts value must be at most --t1 = {args.t1}")
    if len({round(dt, 15) for dt in args.dts}) != len(args.dts):
        parser.error("--dts values must be distinct")
    if args.n_save is not None and args.n_save < 1:
        parser.error("--n-save must be a positive integer")
    steps = math.ceil(args.t1 / min(args.dts) - 1e-9)
    if steps >= 2**31:
        parser.error(f"--t1 {args.t1:g} takes {steps:.3g} steps of the smallest --dts "
                     f"({min(args.dts):g}), more than a solve can take (2**31)")
    rows = args.n_save if args.n_save is not None else max(1, round(args.t1 / 0.1))
    if rows > MAX_STUDY_ROWS:
        parser.error(f"--t1 {args.t1:g} saves {rows:.3g} rows per solve (one every "
                     f"0.1 s unless --n-save says otherwise), more than "
                     f"{MAX_STUDY_ROWS:,}: pass a smaller --n-save")
    if (args.study == "gains" and args.formulation == "null-space"
            and args.betas is not None):
        parser.error("--betas apply to --formulation lagrange only")


if __name__ == "__main__":
    sys.exit(main())
