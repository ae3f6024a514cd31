r"""Stabilisation gains and step sizes swept together
([`cdiff.studies.gain_sweep`][]) and its table, [`cdiff.studies.GainSweep`][]:
`_GainRun` (one run reduced to its measures by `_runner`'s trajectory
functions) mapped over the grid in resumable chunks by `_chunked._sweep`."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_combination
from .._formulation.base import AbstractFormulation
from .._model import AbstractModel
from .._routes import constant_steps
from .._solver.rk4 import RK4
from ._chunked import _sweep
from ._plots import _finish, _log_points
from ._runner import (
    _METRICS,
    _check_dts,
    _measures,
    _Setup,
    _setup,
    _steps_per_save,
    _trajectory,
    _trajectory_on_grid,
)
from ._table import Table


class _GainRun(eqx.Module):
    """One run of a gain sweep, reduced to its four measures: the function of one
    item (`{"step": k or dt, "gains": {name: value}}`) that `gain_sweep` maps
    over its grid. `max_steps` is `None` on the step grid (`step` is then the
    number of steps per measurement interval, `_trajectory_on_grid`), else the
    static bound of `_trajectory` (`step` is the step size)."""

    model: AbstractModel
    formulation: AbstractFormulation
    solver: diffrax.AbstractSolver
    setup: _Setup
    names: tuple[str, ...] = eqx.field(static=True)
    max_steps: int | None = eqx.field(static=True)

    def __call__(self, item):
        form, s = self.formulation, self.setup
        for name in self.names:
            form = eqx.tree_at(lambda f, n=name: getattr(f, n), form,
                               item["gains"][name], is_leaf=lambda x: x is None)
        if self.max_steps is None:
            traj = _trajectory_on_grid(self.model, form, self.solver, s.q0, s.v0, s.t1,
                                       item["step"], s.ts)
        else:
            traj = _trajectory(self.model, form, self.solver, s.q0, s.v0, s.t1,
                               item["step"], s.ts, self.max_steps)
        return _measures(self.model, *traj, s.e0, s.obs_ref)


class GainSweep(Table):
    """The table of [`cdiff.studies.gain_sweep`][]: one row per step size and gain
    combination; `best` holds the best row of each step size and
    `best_formulation()` the formulation with those gains, one per step size."""

    def __init__(self, columns, meta, title, formulation, gains, metric):
        super().__init__(columns, meta, title)
        object.__setattr__(self, "_formulation", formulation)
        object.__setattr__(self, "_gains", tuple(gains))
        object.__setattr__(self, "_metric", metric)

    @property
    def best(self) -> Table:
        """The row with the smallest `metric` for each step size (the first among
        equals; a step size where every run failed keeps its first row, `inf`)."""
        keep = []
        for dt in dict.fromkeys(self["dt"]):
            idx = np.flatnonzero(self["dt"] == dt)
            values = np.where(np.isfinite(self[self._metric][idx]),
                              self[self._metric][idx], np.inf)
            keep.append(idx[int(np.argmin(values))])
        return Table({k: v[keep] for k, v in self.columns.items()}, self.meta,
                     f"best gains by {self._metric}")

    def best_formulation(self):
        """The swept formulation with its gain fields set to the best values, one
        per step size (arrays in the order of `dts`): pass it to
        [`cdiff.studies.step_size_study`][] with the same `dts`."""
        best = self.best
        form = self._formulation
        for name in self._gains:
            form = eqx.tree_at(lambda f, n=name: getattr(f, n), form,
                               jnp.asarray(best[name]), is_leaf=lambda x: x is None)
        return form

    def plot(self, path=None):
        """The metric against the first gain, one panel per step size (lines for
        the other gains' combinations). Writes `path` when given; returns the
        figure."""
        from matplotlib.figure import Figure

        dts = list(dict.fromkeys(self["dt"]))
        first, others = self._gains[0], self._gains[1:]
        cols = min(4, len(dts))
        rows_n = -(-len(dts) // cols)
        fig = Figure(figsize=(3.2 * cols, 2.6 * rows_n), layout="constrained")
        axs = np.atleast_1d(fig.subplots(rows_n, cols, squeeze=False)).ravel()
        for ax, dt in zip(axs, dts):
            rows = self.where(dt=dt)
            combos = (list(dict.fromkeys(zip(*(rows[g] for g in others))))
                      if others else [()])
            marked = []
            for k, combo in enumerate(combos):
                sel = np.ones(len(rows), bool)
                for g, value in zip(others, combo):
                    sel &= rows[g] == value
                label = ", ".join(f"{g}={v:g}" for g, v in zip(others, combo))
                marked += _log_points(ax, rows[first][sel], rows[self._metric][sel],
                                      label or None, f"C{k % 10}")
            if marked and (ax is not axs[0] or not others):
                ax.legend(handles=marked, fontsize=6)
            ax.set_title(f"dt = {dt:g}", fontsize=8)
            ax.set_xlabel(first, fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
        axs[0].set_ylabel(self._metric, fontsize=8)
        if others:
            axs[0].legend(fontsize=6)
        for ax in axs[len(dts):]:
            ax.set_visible(False)
        return _finish(fig, self.title, path)


def gain_sweep(
    model: AbstractModel,
    formulation: AbstractFormulation,
    gains: Mapping[str, Any],
    dts: Any,
    t1: Any,
    *,
    metric: str = "max_error",
    solver: diffrax.AbstractSolver | None = None,
    n_save: int = 1000,
    initial_state=None,
    chunk_size: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    progress: bool = False,
) -> GainSweep:
    r"""Sweep stabilisation gains and step sizes together in **`jax.vmap`ped
    calls** (resumable chunks): every combination of the `gains` values (a
    grid) at every step size, measured as in [`cdiff.studies.step_size_study`][],
    and the best gains per step size (the "optimal parameters" of the papers'
    Baumgarte baseline).

    **Arguments:**

    - `formulation`: the formulation whose fields are swept, e.g.
      `cdiff.Lagrange()` or `cdiff.NullSpace()`.
    - `gains`: `{field name: values}`, e.g. `{"alpha": [1, 5, 10], "beta": [1, 5,
      10]}` (Baumgarte) or `{"alpha": [...]}` (`NullSpace`).
    - `dts`, `t1`, `solver`, `n_save`, `initial_state`: as for `step_size_study`.
    - `metric`: the column that ranks the gains (`"max_error"` by default;
      `"max_constraint_error"` for a model without a reference).
    - `chunk_size`, `checkpoint`: run the grid in chunks of `chunk_size`
      combinations (default: all in one call; on CPU one chunk per step size, the
      gains of a step size in one call, since a vmapped call costs its longest
      run times its width), split over the local devices, and
      save each finished chunk in the directory `checkpoint`, so that a rerun with
      the same arguments resumes where an interrupted one stopped (with other
      arguments it raises a `ValueError`); see [`cdiff.studies.map_batches`][].
      The numbers do not depend on the chunking beyond round-off.
    - `progress`: a progress bar over the runs.

    **Returns:** a [`cdiff.studies.GainSweep`][] with columns `dt`, one per gain,
    the four error maxima; `.best` (a table) and `.best_formulation()`. Its
    `meta` holds `batch_time` (s, the computed chunks) and `compile_time` (s),
    both 0 for a sweep loaded whole from its checkpoint.
    """
    if not isinstance(formulation, AbstractFormulation):
        raise TypeError(f"formulation must be a cdiff formulation, got {formulation!r}")
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {_METRICS}, got {metric!r}")
    if not gains:
        raise ValueError("gains must name at least one field of the formulation")
    for name in gains:
        if not hasattr(formulation, name):
            raise ValueError(f"{type(formulation).__name__} has no field '{name}'")
    dts = _check_dts(dts, float(t1))
    setup = _setup(model, t1, n_save, initial_state)
    check_combination(model, formulation, None, setup.q0, setup.v0, 0.0)
    # Static choices from the initial state, as simulate makes them (NullSpace's
    # number of degrees of freedom; a DAE's independent rows).
    formulation = formulation.bind(model, 0.0, setup.q0, setup.v0)
    solver = RK4() if solver is None else solver
    names = list(gains)
    grid = list(itertools.product(*(np.atleast_1d(np.asarray(gains[n], float))
                                    for n in names)))
    combos = [(dt, *g) for dt in dts for g in grid]
    batch = len(combos)
    dt_column = np.asarray([c[0] for c in combos])
    ks = _steps_per_save(dt_column, float(t1), n_save)
    max_steps = (None if ks is not None else
                 max(constant_steps(0.0, float(t1), dt) for dt in dts))
    inputs = {"step": dt_column if ks is None else ks,
              "gains": {name: np.asarray([c[1 + k] for c in combos])
                        for k, name in enumerate(names)}}
    # What the checkpoint checks besides the inputs and the arrays of _GainRun
    # (the model's, the initial state, ...): the static settings.
    if chunk_size is None and len(dts) > 1 and jax.default_backend() == "cpu":
        # A chunk per step size (the combinations run step size by step size): on
        # CPU a vmapped call costs its longest run times its width.
        chunk_size = len(grid)
    description = (f"gain_sweep {model!r} {formulation!r} {solver!r} "
                   f"t1={float(t1)!r} n_save={n_save}")
    measures, report = _sweep(
        _GainRun(model, formulation, solver, setup, tuple(names), max_steps), inputs,
        chunk_size=chunk_size, checkpoint=checkpoint, key=description,
        progress=progress, name="cdiff.studies.gain_sweep")
    batch_time, compile_time = report.run_time, report.compile_time
    columns: dict[str, Any] = {"dt": [c[0] for c in combos]}
    for k, name in enumerate(names):
        columns[name] = [c[1 + k] for c in combos]
    for k, key in enumerate(_METRICS):
        columns[key] = measures[:, k]
    meta = {"model": repr(model), "t1": float(t1), "n_save": n_save,
            "solver": type(solver).__name__, "batch": batch,
            "batch_time": batch_time, "compile_time": compile_time,
            "chunk_size": report.chunk_size, "chunks": report.chunks,
            "chunks_loaded": len(report.loaded)}
    calls = ("one call" if report.chunks == 1 else
             f"{report.chunks} chunks of {report.chunk_size}")
    title = (f"{type(model).__name__}: {type(formulation).__name__} gains, "
             f"t1 = {float(t1):g} s, {batch} runs in {calls} ({batch_time:.2f} s)")
    return GainSweep(columns, meta, title, formulation, names, metric)
