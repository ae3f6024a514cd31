"""The log-log drawing that the studies' tables share: `_log_points` (values
that a log axis cannot show marked on its edges) and `_finish` (title, file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _finish(fig, title: str, path):
    """Title the figure and write it to `path` (when given)."""
    fig.suptitle(title, fontsize=9)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig

def _log_points(ax, x, values, label, colour, **style) -> list:
    """`values` against `x` on log axes, `o-` in `colour`: the positive finite
    values as a line; those exactly 0 (which a log axis leaves out) as hollow
    triangles on the bottom edge and failed ones (inf) as crosses on the top
    edge, labelled so that a legend names them. Returns those edge markers."""
    from matplotlib.transforms import blended_transform_factory

    x, values = np.asarray(x, float), np.asarray(values, float)
    shown = np.where(np.isfinite(values) & (values > 0), values, np.nan)
    ax.loglog(x, shown, "o-", ms=3, color=colour, label=label, **style)
    edge = blended_transform_factory(ax.transData, ax.transAxes)
    markers = []
    for where, height, marker, what in [(values == 0, 0.03, "v", "exactly 0"),
                                        (np.isinf(values), 0.97, "x", "failed (inf)")]:
        if np.any(where):
            markers += ax.plot(x[where], np.full(np.count_nonzero(where), height),
                               marker, ms=6, mfc="none", color=colour,
                               transform=edge, clip_on=False, ls="none",
                               label=f"{label}: {what}" if label else what)
    return markers

