r"""Batched accuracy studies: all step sizes (and gains) of a formulation in one
`jax.vmap`ped call (Braun & Goldfarb, Fig. 4; the "optimal parameters" of the
Baumgarte baseline)."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._formulation.base import AbstractFormulation
from .._kinematics import kinematics
from .._model import AbstractModel
from .._checks import check_combination
from .._problem import Problem
from .._results import DIVERGENCE, RESULTS
from .._routes import constant_steps
from .._simulate import simulate
from .._solution import Trajectory
from .._solver.frozen import diffrax_problem
from .._solver.grid import UniformGrid, grid_solve
from .._solver.rk4 import RK4
from .._compiler import compiler_options
from ._chunked import _sweep
from ._table import Table

_METRICS = ("max_constraint_error", "max_velocity_error", "max_energy_error",
            "max_error")


class Minimal(eqx.Module):
    r"""Stands in a study for a formulation: the model's minimal-coordinate ODE
    (`model.minimal_ode()`, e.g. eq. 24 of Braun & Goldfarb for the
    slider-crank) integrated with the same solver and step sizes, the
    "unconstrained formulation" of Fig. 4(d). Only for models with a
    `minimal_ode` method ([`cdiff.models.SliderCrank`][],
    [`cdiff.models.DoubleFourBar`][])."""

    def __repr__(self):
        return "Minimal()"


# ---------------------------------------------------------------------------
# One trajectory, reduced to its error measures (inside jit/vmap).
# ---------------------------------------------------------------------------


def _trajectory(model, formulation, solver, q0, v0, t1, dt, ts, max_steps):
    """`(q, v, phi_q, phi_v, energy)` at `ts`: the states (non-finite where the
    solve failed), the holonomic and velocity-level residuals and the energy
    (`None` without one)."""
    if isinstance(formulation, Minimal):
        ode = model.minimal_ode()
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(ode.rhs), solver, 0.0, t1, None, ode.y0, args=ode.args,
            stepsize_controller=UniformGrid.build(jnp.zeros_like(t1), t1, dt,
                                                  max_steps + 1),
            saveat=diffrax.SaveAt(ts=ts), max_steps=max_steps, throw=False,
        )
        q, v = ode.state(jnp.where(sol.result == diffrax.RESULTS.successful,
                                   sol.ys, jnp.nan))

        def residuals(t, q, v):
            kin = kinematics(model, t, q, v)
            energy = model.energy(t, q, v)
            return kin.phi_q, kin.velocity_residual, energy

        return q, v, *jax.vmap(residuals)(ts, q, v)
    # simulate's diagnostics already hold the residuals and the energy.
    sol = simulate(model, formulation, q0, v0, t1=t1, dt=dt, solver=solver,
                   saveat=diffrax.SaveAt(ts=ts), max_steps=max_steps, throw=False)
    return (jnp.where(sol.succeeded, sol.q, jnp.nan),
            jnp.where(sol.succeeded, sol.v, jnp.nan),
            sol.holonomic_residual, sol.velocity_residual, sol.energy)


def _steps_per_save(dts, t1: float, n_save: int) -> np.ndarray | None:
    """Steps between two measurement times for every step size, when every
    measurement time is the end of a step for all of them (else `None`)."""
    n = np.array([constant_steps(0.0, t1, dt) for dt in dts])
    k = n // n_save
    return k if np.all(k * n_save == n) else None


def _trajectory_on_grid(model, formulation, solver, q0, v0, t1, k, ts):
    """`_trajectory` for measurement times on every step grid (`grid_solve`)."""
    n_save = ts.shape[0]
    t0 = jnp.zeros_like(t1)
    if isinstance(formulation, Minimal):
        ode = model.minimal_ode()
        ys, ok = grid_solve(diffrax.ODETerm(ode.rhs), solver, ode.y0, ode.args, t1,
                            k, n_save)
        q, v = ode.state(ys)

        def residuals(t, q, v):
            kin = kinematics(model, t, q, v)
            energy = model.energy(t, q, v)
            return kin.phi_q, kin.velocity_residual, energy

        phi_q, phi_v, energy = jax.vmap(residuals)(ts, q, v)
    else:
        dt = t1 / jnp.asarray(k * n_save, t1.dtype)
        problem = Problem.build(model, formulation, None, q0, v0, t0, t1, dt)
        terms, stepper, args = diffrax_problem(problem, solver, problem.dt)
        ys, ok = grid_solve(terms, stepper, problem.y0, args, problem.t1, k, n_save)
        # The divergence test of simulate on the reached rows: a finite blow-up
        # fails the trajectory.
        result = RESULTS.where(jnp.all(ok), RESULTS.successful, RESULTS.nonfinite)
        sol = problem.solution(Trajectory(jnp.where(ok, ts, jnp.inf), ys, result, {}),
                               dt=problem.dt, dt_taken=problem.dt, throw=False,
                               divergence=jnp.asarray(DIVERGENCE, t1.dtype))
        ok = ok & sol.succeeded
        q, v, phi_q, phi_v, energy = (sol.q, sol.v, sol.holonomic_residual,
                                      sol.velocity_residual, sol.energy)
    nan = jnp.asarray(jnp.nan, q.dtype)
    return (jnp.where(ok[:, None], q, nan), jnp.where(ok[:, None], v, nan), phi_q,
            phi_v, energy)


def _measures(model, q, v, phi_q, phi_v, energy, e0, obs_ref):
    """The four maxima over the saved rows; all `inf` if any row is not finite."""
    def amax(x):
        return jnp.max(jnp.abs(x)) if x.size else jnp.zeros((), q.dtype)

    nan = jnp.asarray(jnp.nan, q.dtype)
    out = [amax(phi_q), amax(phi_v), nan if energy is None else amax(energy - e0)]
    if obs_ref is None:
        out.append(nan)
    else:
        diff = model.observable(q) - obs_ref
        out.append(jnp.max(jnp.sqrt(jnp.sum(diff**2, axis=-1))))
    finite = jnp.all(jnp.isfinite(q)) & jnp.all(jnp.isfinite(v))
    return jnp.where(finite, jnp.stack(out), jnp.inf)


def _axes(formulation, batch: int):
    """vmap axes of a formulation: array leaves with a leading axis of `batch`
    are mapped (one value per trajectory), the others shared."""
    return jax.tree.map(
        lambda x: 0 if eqx.is_array(x) and x.ndim >= 1 and x.shape[0] == batch
        else None,
        formulation,
    )


def _index(formulation, axes, i):
    return jax.tree.map(lambda x, a: x if a is None else x[i], formulation, axes)


@eqx.filter_jit
def _batch(model, formulation, axes, solver, q0, v0, t1, dts, ts, max_steps, e0,
           obs_ref):
    def one(dt, form):
        return _measures(model, *_trajectory(model, form, solver, q0, v0, t1, dt,
                                             ts, max_steps), e0, obs_ref)

    return eqx.filter_vmap(one, in_axes=(0, axes))(dts, formulation)


@eqx.filter_jit
def _single(model, formulation, solver, q0, v0, t1, dt, ts, max_steps, e0, obs_ref):
    return _measures(model, *_trajectory(model, formulation, solver, q0, v0, t1, dt,
                                         ts, max_steps), e0, obs_ref)


@eqx.filter_jit
def _batch_on_grid(model, formulation, axes, solver, q0, v0, t1, ks, ts, e0,
                   obs_ref):
    def one(k, form):
        return _measures(model, *_trajectory_on_grid(model, form, solver, q0, v0, t1,
                                                     k, ts), e0, obs_ref)

    return eqx.filter_vmap(one, in_axes=(0, axes))(ks, formulation)


@eqx.filter_jit
def _single_on_grid(model, formulation, solver, q0, v0, t1, k, ts, e0, obs_ref):
    return _measures(model, *_trajectory_on_grid(model, formulation, solver, q0, v0,
                                                 t1, k, ts), e0, obs_ref)


def _block(x):
    return jax.block_until_ready(x)


class _Setup(eqx.Module):
    q0: jax.Array
    v0: jax.Array
    t1: jax.Array
    ts: jax.Array
    e0: jax.Array
    obs_ref: jax.Array | None


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


def _setup(model: AbstractModel, t1, n_save: int, initial_state) -> _Setup:
    if not isinstance(model, AbstractModel):
        raise TypeError(f"model must be a cdiff.AbstractModel, got {type(model)}")
    if not (isinstance(n_save, int) and n_save >= 1):
        raise ValueError(f"n_save must be a positive int, got {n_save!r}")
    t1 = float(t1)
    if not t1 > 0:
        raise ValueError(f"t1 must be positive, got {t1}")
    q0, v0 = model.initial_state() if initial_state is None else initial_state
    q0, v0 = jnp.asarray(q0, float), jnp.asarray(v0, float)
    ts = jnp.linspace(0.0, t1, n_save + 1)[1:]
    e0 = model.energy(0.0, q0, v0)
    e0 = jnp.asarray(jnp.nan if e0 is None else e0)
    obs_ref = None
    if hasattr(model, "reference") and hasattr(model, "observable"):
        obs_ref = model.observable(model.reference(ts).q)
    return _Setup(q0, v0, jnp.asarray(t1), ts, e0, obs_ref)


def _check_dts(dts, t1) -> np.ndarray:
    dts = np.atleast_1d(np.asarray(dts, float))
    if dts.ndim != 1 or dts.size == 0 or not np.all(np.isfinite(dts)) \
            or not np.all(dts > 0):
        raise ValueError(f"dts must be a non-empty 1-D array of positive step sizes, "
                         f"got {dts!r}")
    if np.any(dts > t1):
        raise ValueError(f"every step size must be at most t1 = {t1}, got {dts}")
    return dts


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


def _run(model, formulation, solver, setup: _Setup, dts, time_each: bool,
         repeat: int = 1, vmap: bool | None = None):
    """The measures of every step size (rows of `dts`) and their timings: on CPU
    one step size after another through one compiled program (the step size
    traced), elsewhere in one vmapped call. When every measurement time ends a
    step of every step size the study's own loop on the step grid runs
    (`grid_solve`), else `diffeqsolve` with `SaveAt(ts)` (interpolating between
    steps)."""
    n = len(dts)
    axes = _axes(formulation, n)
    ks = _steps_per_save(dts, float(setup.t1), int(setup.ts.shape[0]))
    if ks is not None:
        args = (model, formulation, axes, solver, setup.q0, setup.v0, setup.t1,
                jnp.asarray(ks), setup.ts, setup.e0, setup.obs_ref)
        batch, one = _batch_on_grid, _single_on_grid

        def single_args(i):
            return (model, _index(formulation, axes, i), solver, setup.q0, setup.v0,
                    setup.t1, jnp.asarray(ks[i]), setup.ts, setup.e0, setup.obs_ref)
    else:
        max_steps = max(constant_steps(0.0, float(setup.t1), dt) for dt in dts)
        args = (model, formulation, axes, solver, setup.q0, setup.v0, setup.t1,
                jnp.asarray(dts), setup.ts, max_steps, setup.e0, setup.obs_ref)
        batch, one = _batch, _single

        def single_args(i):
            return (model, _index(formulation, axes, i), solver, setup.q0, setup.v0,
                    setup.t1, jnp.asarray(dts[i]), setup.ts, max_steps, setup.e0,
                    setup.obs_ref)

    if vmap is None:
        vmap = jax.default_backend() != "cpu"
    if not vmap:
        # One step size after another through the single-trajectory program: on
        # CPU a vmapped batch costs its longest run times a width factor, one
        # after another about the sum of the runs (benchmarks/studies.py).
        start = time.perf_counter()
        single = one.lower(*single_args(0)).compile(compiler_options())
        compile_time = time.perf_counter() - start
        measures = np.zeros((n, len(_METRICS)))
        each = np.full(n, np.inf)
        batch_time = np.inf
        for _ in range(repeat):
            total = 0.0
            for i in range(n):
                start = time.perf_counter()
                measures[i] = np.asarray(_block(single(*single_args(i))))
                elapsed = time.perf_counter() - start
                each[i], total = min(each[i], elapsed), total + elapsed
            batch_time = min(batch_time, total)
        return (measures, compile_time, batch_time,
                each if time_each else np.full(n, np.nan))
    start = time.perf_counter()
    compiled = batch.lower(*args).compile(compiler_options())
    compile_time = time.perf_counter() - start
    batch_time = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        measures = np.asarray(_block(compiled(*args)))
        batch_time = min(batch_time, time.perf_counter() - start)
    each = np.full(n, np.nan)
    if time_each:
        # dt or k is traced: one compilation for all, with the batch's options.
        single = one.lower(*single_args(0)).compile(compiler_options())
        for i in range(n):
            for _ in range(repeat):
                start = time.perf_counter()
                _block(single(*single_args(i)))
                each[i] = np.fmin(each[i], time.perf_counter() - start)
    return measures, compile_time, batch_time, each



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


def _finish(fig, title: str, path):
    """Title the figure and write it to `path` (when given)."""
    fig.suptitle(title, fontsize=9)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


# ---------------------------------------------------------------------------
# Step-size study.
# ---------------------------------------------------------------------------


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
        measures, compile_time, batch_time, each = _run(
            model, named[name], solver, setup, dts, time_each, repeat, vmap)
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


# ---------------------------------------------------------------------------
# Gain sweep.
# ---------------------------------------------------------------------------


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
