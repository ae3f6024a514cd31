"""`cdiff run MODEL`: its steps in order (see `cdiff.cli` for what it prints and
writes): set up, compile and solve (`_solve`), compare with the reference,
summarise (`_report`), write the figure, the npz and the animation (`_outputs`),
then print the table."""

from __future__ import annotations

from pathlib import Path

from cdiff.cli._outputs import keep_rows, write_animation, write_data, write_figure
from cdiff.cli._phases import Phases
from cdiff.cli._report import figure_title, print_report, settings, summary, table
from cdiff.cli._solve import SetUp, Solved, compare, set_up, solve


def run(args, parser, phases: Phases | None = None) -> int:
    """`cdiff run`: simulate, compare with the reference, report, write files;
    says on stderr what it is doing as each phase starts."""
    phases = Phases() if phases is None else phases
    setup = set_up(args, parser, phases)
    solved = solve(args, setup, phases)
    npz_path = args.out / f"{setup.case.name}.npz"
    png_path = args.out / f"{setup.case.name}.png"
    if solved.ts.size:
        keep_rows(phases, npz_path, solved.data, solved.ts.size)
    names = compare(setup.case, solved, phases)
    errors = summary(setup, solved)
    rows = table(args, setup, solved, errors, names, phases.times["run"])
    saved = settings(args, setup, solved, errors, names, phases)
    written = _write_files(args, setup, solved, saved, names, phases, png_path,
                           npz_path)
    phases.stop()
    return print_report(rows, written, solved, npz_path, phases)


def _write_files(args, setup: SetUp, solved: Solved, saved: dict,
                 names: tuple[str, ...], phases: Phases, png_path: Path,
                 npz_path: Path) -> list[Path]:
    """The "plotting", "writing" and "animation" phases, for a solve with rows:
    the figure, the npz and (`--animate`) the animation. Returns the paths
    written, in order."""
    written: list[Path] = []
    if not solved.ts.size:
        return written
    write_figure(phases, png_path, npz_path, solved.data, saved,
                 figure_title(setup, solved), names, setup.case.observable_names,
                 written)
    write_data(phases, npz_path, solved.data, saved, written)
    if setup.animation_path is not None:
        write_animation(phases, setup.animation_path, setup.model, solved.sol,
                        solved.valid, f"{setup.case.name}, {args.formulation}",
                        written)
    return written
