r"""Accuracy against step size ([`cdiff.studies.step_size_study`][], Braun &
Goldfarb Fig. 4) and its table, [`cdiff.studies.StepSizeStudy`][]; each
formulation's step sizes run through `_runner._run`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import diffrax
import numpy as np

from .._checks import check_combination
from .._formulation.base import AbstractFormulation
from .._model import AbstractModel
from .._routes import constant_steps
from .._solver.rk4 import RK4
from ._plots import _finish, _log_points
from ._runner import _METRICS, Minimal, _check_dts, _run, _Setup, _setup
from ._table import Table


def _named(formulations) -> dict[str, Any]:
    if isinstance(formulations, Mapping):
        return dict(formulations)
    if isinstance(formulations, (AbstractFormulation, Minimal)):
        formulations = [formulations]
    return {repr(f): f for f in formulations}


def _progress(items, progress: bool, desc: str):
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc)


def _check_formulation(model, name, formulation, setup: _Setup):
    if isinstance(formulation, Minimal):
        if not hasattr(model, "minimal_ode"):
            raise ValueError(
                f"cdiff.studies: {type(model).__name__} has no minimal_ode(), so "
                f"'{name}' (Minimal()) cannot run; drop it for this model"
            )
    elif not isinstance(formulation, AbstractFormulation):
        raise TypeError(f"cdiff.studies: '{name}' is not a cdiff formulation: "
                        f"{formulation!r}")
    else:
        check_combination(model, formulation, None, setup.q0, setup.v0, 0.0)


class StepSizeStudy(Table):
    """The table of [`cdiff.studies.step_size_study`][]: one row per formulation
    and step size, with `plot()` for the log-log figure of Braun & Goldfarb Fig. 4."""

    def plot(self, path=None):
        """Log-log panels against the step size, one line per formulation:
        (a) max |Φ_q|, (b) max |Φ̇_q, Φ_v|, (c) max |E − E₀|, (d) max overall error
        against the reference, (e) wall time per trajectory (when measured, else
        the number of steps). A value of exactly 0 (e.g. the constraint error of
        the minimal ODE), which a log axis cannot show, is a hollow triangle on
        the panel's bottom edge, and a failed run (inf) a cross on its top edge,
        both named in the panel's legend. Writes `path` when given; returns the
        figure."""
        from matplotlib.figure import Figure

        cost = "time" if np.any(np.isfinite(self["time"])) else "steps"
        panels = [*_METRICS, cost]
        labels = ["(a) max constraint error", "(b) max velocity constraint error",
                  "(c) max energy error [J]", "(d) max overall error",
                  "(e) wall time per run [s]" if cost == "time" else "(e) steps"]
        fig = Figure(figsize=(6.5, 2.2 * len(panels)), layout="constrained")
        axs = fig.subplots(len(panels), 1, sharex=True)
        edges: dict = {}
        for k, name in enumerate(dict.fromkeys(self["formulation"])):
            rows = self.where(formulation=name)
            for ax, key in zip(axs, panels):
                edges.setdefault(ax, []).extend(_log_points(
                    ax, rows["dt"], rows[key], name, f"C{k % 10}"))
        for ax, label in zip(axs, labels):
            ax.set_ylabel(label, fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
            if ax is not axs[0] and edges[ax]:
                ax.legend(handles=edges[ax], fontsize=7)
        axs[-1].set_xlabel("step size dt [s]")
        axs[0].legend(fontsize=7)
        return _finish(fig, self.title, path)


def step_size_study(
    model: AbstractModel,
    formulations,
    dts: Any,
    t1: Any,
    *,
    solver: diffrax.AbstractSolver | None = None,
    n_save: int = 1000,
    time_each: bool = True,
    repeat: int = 1,
    initial_state=None,
    progress: bool = True,
    on_formulation: Callable[[StepSizeStudy], Any] | None = None,
    vmap: bool | None = None,
) -> StepSizeStudy:
    r"""Accuracy against step size, every step size of a formulation through **one
    compiled program** (Braun & Goldfarb Fig. 4 (a)-(e)): on CPU run once per step
    size (the cost is about the sum of the runs, less than one vmapped call, which
    on CPU costs its longest run times the batch's width), on GPUs one
    `jax.vmap`ped call over the step sizes (its cost is the longest run's); see
    `vmap`.

    For each formulation and step size: the maximum constraint error
    $\max|\Phi_q|$, velocity-constraint error $\max|[\dot\Phi_q; \Phi_v]|$,
    energy error $\max|E - E_0|$ and overall error $\max\|y - y_{ref}\|_2$ of the
    model's `observable` against its exact `reference`, all over `n_save`
    equally spaced times in $(0, t_1]$; and the cost. A solve that fails or turns
    non-finite gives `inf` in its row (it does not stop the study).

    **Arguments:**

    - `model`: a cdiff model with `initial_state()` (or pass `initial_state`).
    - `formulations`: a mapping `{name: formulation}` (or a sequence, named by
      `repr`). A formulation's array fields with a leading axis of `len(dts)`
      are taken one per step size (e.g. `GainSweep.best_formulation()`, the best
      Baumgarte gains of each step size). [`cdiff.studies.Minimal`][]`()` runs the
      model's minimal-coordinate ODE with the same solver.
    - `dts`: the step sizes. `simulate` takes the uniform step
      $T/\lceil T/dt\rceil$; the table's `dt` column holds the requested ones.
    - `t1`: the horizon (from $t_0 = 0$).
    - `solver`: default [`cdiff.RK4`][].
    - `n_save`: number of times at which the errors are measured. Choose
      `t1 / n_save` a multiple of every `dt` (the default step sizes of
      `cdiff study` are): the errors are then measured at step ends, and the
      study runs its own loop on the step grid, which carries only the state
      under `vmap` (faster than `diffeqsolve` with `SaveAt(ts)`, which it uses
      otherwise, interpolating between steps: third order for RK4).
    - `time_each`: also time each step size alone (same compilation; the `time`
      column, Fig. 4(e)). Otherwise `time` is `NaN`.
    - `repeat`: run each timed call this many times and keep the fastest.
    - `initial_state`: `(q0, v0)`, default `model.initial_state()`.
    - `progress`: a progress bar over the formulations.
    - `on_formulation`: called with the table so far after each formulation
      (e.g. to save a long study's finished rows as they come).
    - `vmap`: how a formulation's step sizes run: `True` in one `jax.vmap`ped
      call, `False` one after another through one compiled program; default
      one after another on CPU, vmapped elsewhere.

    **Returns:** a [`cdiff.studies.StepSizeStudy`][] table with columns
    `formulation`, `dt`, `steps`, the four error maxima, `time` (s per run),
    `batch_time` (s for all the formulation's step sizes: the vmapped call, or
    on CPU the sum of the runs one after another) and
    `compile_time` (s, its compilation; near zero when JAX reused a compilation
    from earlier in the process).
    """
    named = _named(formulations)
    dts = _check_dts(dts, float(t1))
    setup = _setup(model, t1, n_save, initial_state)
    for name, formulation in named.items():
        _check_formulation(model, name, formulation, setup)
    solver = RK4() if solver is None else solver
    rows: dict[str, list] = {k: [] for k in ("formulation", "dt", "steps", *_METRICS,
                                             "time", "batch_time", "compile_time")}
    meta = {"model": repr(model), "t1": float(t1), "n_save": n_save,
            "solver": type(solver).__name__}
    title = (f"{type(model).__name__}: accuracy vs step size, t1 = {float(t1):g} s, "
             f"{type(solver).__name__}")
    for name in _progress(list(named), progress, "step-size study"):
        formulation = named[name]
        if isinstance(formulation, AbstractFormulation):  # static choices, as simulate
            formulation = formulation.bind(model, 0.0, setup.q0, setup.v0)
        measures, compile_time, batch_time, each = _run(
            model, formulation, solver, setup, dts, time_each, repeat, vmap)
        for i, dt in enumerate(dts):
            rows["formulation"].append(name)
            rows["dt"].append(dt)
            rows["steps"].append(constant_steps(0.0, float(t1), dt))
            for k, key in enumerate(_METRICS):
                rows[key].append(measures[i, k])
            rows["time"].append(each[i])
            rows["batch_time"].append(batch_time)
            rows["compile_time"].append(compile_time)
        if on_formulation is not None:
            on_formulation(StepSizeStudy(rows, dict(meta), title))
    return StepSizeStudy(rows, meta, title)
