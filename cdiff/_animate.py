"""animate(): a GIF or MP4 of a planar model's motion from a Solution."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._model import AbstractModel
from ._sketch import Sketch

#: What is drawn: a [`cdiff.Solution`][] of one trajectory, or a model's exact
#: `cdiff.models.Reference` (not imported: both modules build on this one).
Motion = Any

_SUFFIXES = (".gif", ".mp4")


def animate(
    model: AbstractModel,
    solution: Motion,
    path: str | os.PathLike,
    *,
    fps: int | float = 30,
    max_frames: int = 300,
    trail: int | None = None,
    title: str | None = None,
) -> Path:
    r"""Write an animation of a planar model's motion along `solution`.

    The model's scenery (`model.scenery()`, if it has one) is drawn once, then the
    mechanism (`model.sketch(q)`, see [`cdiff.Sketch`][]) at the saved times, with
    a time label. Rows of `solution` that are not finite (the unused saves of a
    solve with spare `max_steps`, or a diverged run) are skipped, and the rest are
    subsampled evenly (first and last kept) to at most `max_frames` frames. The
    axis limits are fixed, from all frames and the scenery, at equal aspect. The
    figure is drawn on matplotlib's Agg canvas, without pyplot: the global backend
    is not touched.

    **Arguments:**

    - `model`: the model that was simulated, with a `sketch(q)` method (every
      reference model of `cdiff.models` except `RollingSphere`).
    - `solution`: a [`cdiff.Solution`][] of one trajectory (`q` of shape
      `(T, nq)`; index a batched one first), or a reference model's exact
      solution, `model.reference(ts)` (a `cdiff.models.Reference`).
    - `path`: the file to write; its suffix chooses the format: `.gif` (Pillow) or
      `.mp4` (needs `ffmpeg` on the `PATH`). Missing folders are created.
    - `fps`: frames per second of the animation (not tied to the simulated time).
    - `max_frames`: the largest number of frames.
    - `trail`: the index of a sketch point (see the model's `sketch`) whose path
      is drawn up to the current frame; default none.
    - `title`: the figure's title; default: the model's class name.

    **Returns:** the `pathlib.Path` written.

    **Raises:** `ValueError` for a model without a `sketch` (e.g. the
    three-dimensional `RollingSphere`), a suffix other than `.gif` and `.mp4`, a
    batched solution, no finite row, non-positive `fps` or `max_frames`, or a
    `trail` that is not a point index; `RuntimeError` for `.mp4` without
    `ffmpeg`.
    """
    from matplotlib import animation
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    path = check_target(model, path)
    name = type(model).__name__
    if not fps > 0:
        raise ValueError(f"cdiff.animate: fps must be positive, got {fps}")
    if max_frames < 1:
        raise ValueError(
            f"cdiff.animate: max_frames must be positive, got {max_frames}"
        )

    ts, frames = _frames(model, solution, max_frames)
    points = np.asarray(frames.points, dtype=float)  # (F, P, 2)
    links = frames.links
    n_points = points.shape[1]
    if trail is not None and not -n_points <= trail < n_points:
        raise ValueError(
            f"cdiff.animate: trail={trail} is not an index of the {n_points} points "
            f"of {name}'s sketch"
        )
    scenery_fn = getattr(model, "scenery", None)
    scenery = [np.asarray(p, dtype=float).reshape(-1, 2)
               for p in (scenery_fn() if callable(scenery_fn) else [])]

    fig = Figure(figsize=(4.8, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(name if title is None else title, fontsize=10)
    _set_limits(ax, points, scenery)
    for polyline in scenery:
        if len(polyline) == 1:  # a ground pivot
            ax.plot(*polyline.T, marker="^", ms=9, color="0.35", zorder=1)
        else:
            ax.plot(*polyline.T, color="0.6", lw=1.2, zorder=1)
    bars = LineCollection([], colors="C0", linewidths=3, capstyle="round", zorder=2)
    ax.add_collection(bars)
    (joints,) = ax.plot([], [], "o", color="k", ms=4, zorder=3)
    (path_line,) = ax.plot([], [], "-", color="C3", lw=1, alpha=0.8, zorder=1.5)
    label = ax.text(0.03, 0.96, "", transform=ax.transAxes, va="top", fontsize=9)
    # Lay the figure out once: the limits are fixed, so it does not change.
    fig.draw_without_rendering()
    fig.set_layout_engine("none")

    def draw(k):
        p = points[k]
        bars.set_segments([p[[i, j]] for i, j in links])
        joints.set_data(p[:, 0], p[:, 1])
        if trail is not None:
            path_line.set_data(points[: k + 1, trail, 0], points[: k + 1, trail, 1])
        label.set_text(f"t = {ts[k]:.3f} s")

    if path.suffix.lower() == ".gif":
        writer = animation.PillowWriter(fps=fps)
    else:
        writer = animation.FFMpegWriter(fps=fps)
    path.parent.mkdir(parents=True, exist_ok=True)
    with writer.saving(fig, path, dpi=80):
        for k in range(len(ts)):
            draw(k)
            writer.grab_frame()
    return path


def check_target(model, path) -> Path:
    """`path` as a `Path` if `model` can be drawn there; raises as `animate` does
    (`ValueError` for a model without `sketch` or a suffix other than .gif and
    .mp4, `RuntimeError` for .mp4 without ffmpeg). The command line calls it
    before a run."""
    from matplotlib import animation

    if not callable(getattr(model, "sketch", None)):
        raise ValueError(
            f"cdiff.animate: {type(model).__name__} has no `sketch(q)` method, so it "
            "cannot be drawn (only planar models are; see cdiff.Sketch)"
        )
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"cdiff.animate: cannot write {str(path)!r}: the suffix must be .gif or "
            ".mp4"
        )
    if suffix == ".mp4" and not animation.FFMpegWriter.isAvailable():
        raise RuntimeError(
            f"cdiff.animate: writing {str(path)!r} needs ffmpeg, which was not found "
            "on the PATH; install it, or write a .gif instead"
        )
    return path


def _frames(
    model, solution: Motion, max_frames: int
) -> tuple[np.ndarray, Sketch]:
    """The saved times and the sketches (points `(F, P, 2)`) of at most
    `max_frames` finite rows of `solution`, evenly spaced, first and last kept."""
    name = type(model).__name__
    ts = np.asarray(solution.ts, dtype=float)
    q = np.asarray(solution.q)
    if ts.ndim != 1 or q.ndim != 2:
        raise ValueError(
            f"cdiff.animate: expected one trajectory (ts of shape (T,), q of shape "
            f"(T, nq)), got ts of shape {ts.shape} and q of shape {q.shape}; index a "
            "batched Solution first"
        )
    rows = np.flatnonzero(np.isfinite(ts) & np.all(np.isfinite(q), axis=-1))
    if rows.size == 0:
        raise ValueError(f"cdiff.animate: the solution of {name} has no finite row")
    if rows.size > max_frames:
        rows = rows[np.unique(np.round(np.linspace(0, rows.size - 1, max_frames))
                              .astype(int))]
    # Compiled: for a few hundred frames much faster than op-by-op.
    frames = jax.jit(jax.vmap(model.sketch))(jnp.asarray(q[rows]))
    if not isinstance(frames, Sketch):
        raise ValueError(
            f"cdiff.animate: {name}.sketch(q) must return a cdiff.Sketch, got "
            f"{type(frames).__name__}"
        )
    return ts[rows], frames


def _set_limits(ax, points: np.ndarray, scenery: list[np.ndarray]) -> None:
    """Fixed limits round every frame's points and the scenery, equal aspect."""
    xy = np.concatenate([points.reshape(-1, 2), *scenery])
    xy = xy[np.all(np.isfinite(xy), axis=-1)]
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    centre, half = (lo + hi) / 2, (hi - lo).max() / 2
    half = 1.08 * half if half > 0 else 1.0
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_aspect("equal", adjustable="box")
    ax.grid(True, lw=0.4, alpha=0.5)
