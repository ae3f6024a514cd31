"""The figure of `cdiff run`: one quantity with one unit per panel, readable at any
horizon."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np


#: The most observables `plot` draws against time (the error panels cover all).
PLOTTED = 4
#: Above this many oscillations over the run, the observables are shown in two
#: windows, the first and the last `PERIODS` periods.
MOST_OSCILLATIONS = 8
PERIODS = 3
#: The log panels against time show the maximum over this many equal bins
#: (their upper envelope) once there are more than twice as many saved rows.
BINS = 400

#: The residual panels: the saved field, its label, colour and unit.
_RESIDUALS = {
    "position residual": ("holonomic_residual", r"$\max_i |\Phi_{q,i}|$", "C0",
                          r"[unit of $\Phi_q$]"),
    "velocity residual": ("velocity_residual", r"$\max_i |[\dot\Phi_q; \Phi_v]_i|$",
                          "C1", r"[unit of $\Phi_q$ / s]"),
}


def plot(path: Path, data: dict, names: tuple[str, ...], title: str,
          coordinate_names: tuple[str, ...] = ()) -> None:
    """Write `figure(...)` to `path` as a PNG (Agg canvas; pyplot is not
    touched)."""
    figure(data, names, title, coordinate_names).savefig(path, dpi=110)


def figure(data: dict, names: tuple[str, ...], title: str,
            coordinate_names: tuple[str, ...] = ()):
    """The figure of `cdiff run`, one quantity with one unit per panel:

    - the observables with their reference (without a reference: the
      coordinates that move, the `PLOTTED` that move most), one row per unit;
      over a run of many oscillations, two windows of the first and the last few
      periods side by side (the whole run would be a solid block), so the drift
      of phase and amplitude shows;
    - the observable error |y - y_ref|, one panel per unit, a line per observable
      (their maximum for more than `PLOTTED`);
    - the position-level constraint residual max |Phi_q| and the velocity-level
      one max |[dPhi_q/dt; Phi_v]|, separately;
    - the energy error |E - E0| (its change, for a model that is not
      conservative); with impacts, |E - E0 + E_lost|, what the impacts took so
      far left out (`energy_lost_so_far`), their times marked.

    The error panels are log scales against the whole run; over a long run each
    point is the maximum over a bin of 1/`BINS` of it (the upper envelope, which
    is what an error bound needs). Non-finite values are left out (gaps); a line
    that is exactly 0 throughout is named as such. Each axes has a `gid` naming
    its panel ("observable[m]", "observable[m]:last", "error[rad]", "position
    residual", ...)."""
    from matplotlib.figure import Figure

    settings = data.get("settings")
    conservative = (True if settings is None
                    else json.loads(str(settings)).get("conservative", True))
    data = {k: _finite(v) for k, v in data.items() if k != "settings"}
    ts = data["ts"]
    if "observable" in data:
        shown, reference = data["observable"], data["reference_observable"]
        labels = names or tuple(f"observable {i}" for i in range(shown.shape[1]))
    else:
        shown, reference = data["q"], None
        labels = (coordinate_names if len(coordinate_names) == shown.shape[1]
                  else tuple(f"q[{i}]" for i in range(shown.shape[1])))
        # The coordinates that move (a limb on its limit, a fixed base do not).
        moving = _moving(shown)
        if moving.size:
            shown, labels = shown[:, moving], tuple(labels[i] for i in moving)
    plotted = _by_unit(labels[:PLOTTED])
    errors = _by_unit(labels) if reference is not None else {}
    window = _window(ts, shown[:, :PLOTTED])
    rows = [("observable", unit) for unit in plotted]
    rows += [("error", unit) for unit in errors]
    n_holonomic = data["holonomic_residual"].shape[-1]
    n_velocity = data["velocity_residual"].shape[-1]
    rows += [("position residual", None)] if n_holonomic else []
    rows += [("velocity residual", None)] if n_velocity else []
    rows += [("no constraints", None)] if not (n_holonomic or n_velocity) else []
    rows += [("energy", None)] if "energy" in data else []

    fig = Figure(figsize=(8.5, 0.6 + 1.9 * len(rows)), layout="constrained")
    fig.suptitle(title, fontsize=9)
    grid = fig.add_gridspec(len(rows), 2)
    colours = [f"C{i}" for i in range(10)]
    time_axes = []
    bins, noted = _bin_note(ts), False
    for r, (kind, unit) in enumerate(rows):
        if kind == "observable":
            columns = plotted[unit]
            ylabel = _with_unit("coordinates" if reference is None else
                                "observables", unit)
            if window is None:
                axs = [fig.add_subplot(grid[r, :])]
                spans = [(ts[0], ts[-1])] if ts.size else [(0, 1)]
                time_axes.append(axs[0])
                axs[0].set_gid(f"observable[{unit}]")
            else:
                axs = [fig.add_subplot(grid[r, 0])]
                axs.append(fig.add_subplot(grid[r, 1], sharey=axs[0]))
                spans = [(ts[0], ts[0] + window), (ts[-1] - window, ts[-1])]
                axs[0].set_gid(f"observable[{unit}]:first")
                axs[1].set_gid(f"observable[{unit}]:last")
                axs[0].set_title(f"first {window:.3g} s", fontsize=8, loc="left")
                axs[1].set_title(f"last {window:.3g} s (of {ts[-1] - ts[0]:g} s)",
                                 fontsize=8, loc="left")
                axs[1].tick_params(labelleft=False)
                for ax in axs:
                    ax.set_xlabel("t [s]", fontsize=8)
            for ax, (a, b) in zip(axs, spans):
                inside = (ts >= a) & (ts <= b)
                for k, (i, label) in enumerate(columns):
                    colour = colours[k % len(colours)]
                    if reference is not None:
                        ax.plot(ts[inside], reference[inside, i], color=colour,
                                lw=4, alpha=0.3, solid_capstyle="butt",
                                label=f"{label}, reference")
                    ax.plot(ts[inside], shown[inside, i], color=colour, lw=1,
                            label=label)
            axs[0].set_ylabel(ylabel, fontsize=8)
            # Headroom above the curves for the legend, one row per 4 entries.
            low, high = axs[0].get_ylim()
            legend_rows = (-(-len(columns) * (1 + (reference is not None)) // 4)
                           + (reference is not None or len(labels) > PLOTTED))
            axs[0].set_ylim(low, high + (0.1 + 0.13 * legend_rows) * (high - low))
            notes = (["pale: reference"] if reference is not None else []) + (
                [f"the first {PLOTTED} of {len(labels)}"]
                if len(labels) > PLOTTED else [])
            axs[-1].legend(fontsize=7, loc="upper right", framealpha=0.8,
                           ncol=min(4, len(columns) * (1 + (reference is not None))),
                           title="; ".join(notes) or None, title_fontsize=7)
            continue
        ax = fig.add_subplot(grid[r, :])
        time_axes.append(ax)
        if kind == "error":
            ax.set_gid(f"error[{unit}]")
            columns = errors[unit]
            diff = np.abs(shown[:, [i for i, _ in columns]]
                          - reference[:, [i for i, _ in columns]])
            if len(columns) > PLOTTED:
                diff = np.max(diff, axis=-1, keepdims=True)
                columns = [(None, f"max over the {len(columns)} observables")]
            for k, (_, label) in enumerate(columns):
                _log_line(ax, ts, diff[:, k], label, colours[k % len(colours)])
            ax.set_ylabel(_with_unit("observable error\n$|y - y_\\mathrm{ref}|$", unit),
                          fontsize=8)
            ax.legend(fontsize=7, loc="lower right", framealpha=0.8)
        elif kind in _RESIDUALS:
            ax.set_gid(kind)
            key, label, colour, unit = _RESIDUALS[kind]
            _log_line(ax, ts, np.max(np.abs(data[key]), axis=-1), label, colour,
                      alone=True)
            ax.set_ylabel(f"{kind}\n{label}\n{unit}", fontsize=8)
        elif kind == "no constraints":
            ax.set_gid(kind)
            ax.text(0.5, 0.5, "no constraints", transform=ax.transAxes,
                    ha="center", va="center")
            ax.set_yticks([])
        else:
            ax.set_gid(kind)
            energy = data["energy"]
            if "energy_lost_so_far" in data:  # impacts: their losses left out
                label = r"$|E - E_0 + E_\mathrm{lost}|$"
                _log_line(ax, ts, energy - energy[0] + data["energy_lost_so_far"],
                          label, "C2", alone=True)
                for t in data.get("impact_t", ()):
                    ax.axvline(t, color="0.6", lw=0.5, zorder=0)
                ax.set_ylabel("energy error\n(less impacts' losses,\ngrey: impacts)"
                              + "\n" + label + " [J]", fontsize=8)
            else:
                _log_line(ax, ts, energy - energy[0], r"$|E - E_0|$", "C2",
                          alone=True)
                ax.set_ylabel(("energy error" if conservative else
                               "energy change\n(not conservative)")
                              + "\n" r"$|E - E_0|$ [J]", fontsize=8)
        if bins and not noted and kind != "no constraints":
            ax.set_title(bins, fontsize=7, loc="right", color="0.35")
            noted = True
    full = time_axes
    for ax in full[1:]:
        ax.sharex(full[0])
    for ax in full[:-1]:
        ax.tick_params(labelbottom=False)
    if full:
        full[-1].set_xlabel("t [s]", fontsize=8)
    for ax in fig.axes:
        ax.tick_params(which="both", labelsize=7)
    return fig


def _moving(q: np.ndarray) -> np.ndarray:
    """The columns of `q` that move over the run (their range above round-off of
    their size), the `PLOTTED` that move most where more do, in order."""
    if q.shape[0] < 2:
        return np.arange(0)
    with warnings.catch_warnings():  # (all-NaN columns: not moving)
        warnings.simplefilter("ignore", RuntimeWarning)
        span = np.nan_to_num(np.nanmax(q, axis=0) - np.nanmin(q, axis=0))
        size = np.nan_to_num(np.nanmax(np.abs(q), axis=0))
    moving = np.flatnonzero(span > 1e-9 * np.maximum(1.0, size))
    if moving.size > PLOTTED:
        moving = np.sort(moving[np.argsort(-span[moving], kind="stable")[:PLOTTED]])
    return moving


def _with_unit(text: str, unit: str | None) -> str:
    return text if unit is None else f"{text} [{unit}]"


def _by_unit(names) -> dict:
    """`{unit: [(column, name without unit), ...]}` for names like `x3 [m]`, in
    order; names without a unit go under None."""
    groups: dict = {}
    for i, name in enumerate(names):
        match = re.fullmatch(r"\s*(.*?)\s*\[([^\]]*)\]\s*", name)
        label, unit = (match.group(1), match.group(2)) if match else (name, None)
        groups.setdefault(unit, []).append((i, label))
    return groups


def _window(ts: np.ndarray, y: np.ndarray) -> float | None:
    """The width of the windows in which to show `y` against `ts`: about
    `PERIODS` periods of its fastest component when it oscillates more than
    `MOST_OSCILLATIONS` times over the run (a curve through the whole run would
    fill its panel), else None (the whole run). Oscillations are counted as
    crossings of the middle of the range by more than a tenth of it."""
    if ts.size < 3:
        return None
    span = float(ts[-1] - ts[0])
    most = 0.0
    for column in np.atleast_2d(y.T):
        ok = np.isfinite(column)
        if np.count_nonzero(ok) < 3:
            continue
        low, high = np.min(column[ok]), np.max(column[ok])
        if not high > low:
            continue
        centred = column[ok] - (low + high) / 2
        side = np.sign(centred[np.abs(centred) > 0.1 * (high - low)])
        most = max(most, np.count_nonzero(np.diff(side)) / 2)
    if most <= MOST_OSCILLATIONS:
        return None
    return span * PERIODS / most


def _bin_note(ts: np.ndarray) -> str:
    """The note on a log panel whose points are bin maxima ('' if not)."""
    if ts.size <= 2 * BINS:
        return ""
    width = (ts[-1] - ts[0]) / BINS
    return f"log scales; each point: the maximum over {width:.3g} s"


def _log_line(ax, ts, y, label: str, colour: str, alone: bool = False) -> None:
    """|y| against `ts` on a log scale: its upper envelope over `BINS` bins for a
    long run; a line that is exactly 0 throughout is named in the legend (or, for
    the only line of a panel, in the panel) instead of vanishing."""
    y = np.abs(np.asarray(y, dtype=float))
    ax.set_yscale("log")
    if not np.any(np.isfinite(y) & (y > 0)):
        what = ("exactly 0 throughout" if np.any(y == 0)
                else "no finite value")
        if alone:
            ax.text(0.5, 0.5, f"{label}: {what}", transform=ax.transAxes,
                    ha="center", va="center", color=colour)
        else:
            ax.plot([], [], color=colour, ls="none", marker="o",
                    label=f"{label}: {what} (not drawn)")
        return
    if ts.size > 2 * BINS:
        edges = np.linspace(0, ts.size, BINS + 1).astype(int)
        with warnings.catch_warnings():  # (all-NaN bins: NaN, a gap)
            warnings.simplefilter("ignore", RuntimeWarning)
            y = np.array([np.nanmax(y[a:b]) for a, b in zip(edges[:-1], edges[1:])])
            ts = np.array([ts[a:b].mean() for a, b in zip(edges[:-1], edges[1:])])
    # Values exactly 0 (round-off that cancels) leave gaps: points show what is
    # left between them, and the legend says what the gaps are.
    gaps = np.count_nonzero(y[1:] == 0) > 0.05 * y.size
    ax.plot(ts, np.where(y > 0, y, np.nan), color=colour, lw=1,
            marker="." if gaps else None, ms=2,
            label=label + ("; gaps: exactly 0" if gaps else ""))
    if gaps and alone:
        ax.legend(fontsize=7, loc="lower right", framealpha=0.8)


def _finite(x: np.ndarray) -> np.ndarray:
    """`x` with its non-finite values, and those too large for a log axis, NaN
    (matplotlib leaves NaN out; inf, or a huge value, breaks its tick
    locators)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return x
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(x) & (np.abs(x) < 1e150), x, np.nan)
