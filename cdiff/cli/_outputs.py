"""The files `cdiff run` writes: where (`--out`, `--animate`), checked before the
run, and the writing after it (the figure, the npz, the animation), each as a
phase that a Ctrl-C does not cut in half (`Interrupt.writing`, `Interrupt.keep`).
`check_out` serves `cdiff study` too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import equinox as eqx
import jax.numpy as jnp
import numpy as np

import cdiff
from cdiff._animate import check_target as check_animation_target
from cdiff.cli._figure import plot
from cdiff.cli._phases import Phases


def check_out(parser, option: str, directory: Path, names) -> list[Path]:
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


def animation_path(args, parser, model, name: str | None = None) -> Path | None:
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


def keep_rows(phases: Phases, npz_path: Path, data: dict, count: int) -> None:
    """Until the figure is written, a Ctrl-C writes the solve's `count` saved rows
    (`data`, as it is then) to `npz_path`, and says so."""

    def keep():  # the solve's rows, if stopped before they are written
        np.savez(npz_path, **data)
        return (f"wrote the solve's {count:,} saved states to {npz_path} "
                "(no figure)")
    phases.interrupt.keep = keep


def write_figure(phases: Phases, png_path: Path, npz_path: Path, data: dict,
                 settings: dict, title: str, names, coordinate_names,
                 written: list) -> None:
    """The "plotting" phase: the figure to `png_path` (appended to `written`);
    from then on a Ctrl-C writes the rows (`data`, with `settings`) to
    `npz_path`."""
    interrupt = phases.interrupt
    phases.start("plotting", f"plotting {png_path}")
    data["settings"] = np.asarray(json.dumps(settings))
    with interrupt.writing(), np.errstate(all="ignore"):
        plot(png_path, data, names, title, coordinate_names=coordinate_names)
        written.append(png_path)

        def keep():  # the figure is written: the rows still to write
            np.savez(npz_path, **data)
            return (f"wrote {png_path}; wrote the solve's {data['ts'].size:,} saved "
                    f"states to {npz_path}")
        interrupt.keep = keep


def write_data(phases: Phases, npz_path: Path, data: dict, settings: dict,
               written: list) -> None:
    """The "writing" phase: `data`, with `settings` (to which it adds the plotting
    time and the wall time so far), to `npz_path` (appended to `written`)."""
    interrupt = phases.interrupt
    phases.start("writing", f"writing {npz_path}")
    settings["plot_time_s"] = phases.times["plotting"]
    settings["wall_time_s"] = phases.total()  # (up to this write)
    data["settings"] = np.asarray(json.dumps(settings))
    with interrupt.writing():
        np.savez(npz_path, **data)
        written.append(npz_path)
        interrupt.keep = lambda: "wrote " + ", ".join(map(str, written))


def write_animation(phases: Phases, path: Path, model, sol, valid: np.ndarray,
                    title: str, written: list) -> None:
    """The "animation" phase: the motion of the `valid` rows of `sol` to `path`
    (appended to `written`); a Ctrl-C removes an animation cut short."""
    interrupt = phases.interrupt
    phases.start("animation", f"animating the motion into {path}")

    def keep():  # an animation cut short is not kept
        path.unlink(missing_ok=True)
        return "wrote " + ", ".join(map(str, written))
    interrupt.keep = keep
    # The meaningful rows only (a diverged run's last rows are huge):
    # animate skips rows whose time is not finite.
    motion = eqx.tree_at(lambda s: s.ts, sol,
                         jnp.where(jnp.asarray(valid), sol.ts, jnp.inf))
    written.append(cdiff.animate(model, motion, path, title=title))
