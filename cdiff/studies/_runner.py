r"""The studies' shared runner: one trajectory of a formulation (or of the
model's minimal-coordinate ODE, `Minimal`) reduced to its four error measures,
the jitted programs over a batch of step sizes (vmapped) or one step size, and
`_run`, which compiles and times them for [`cdiff.studies.step_size_study`][];
[`cdiff.studies.gain_sweep`][] maps the same trajectory functions over its grid.

When every measurement time ends a step of every step size,
`_trajectory_on_grid` runs `simulate`'s driver on `GridRoute` (the loop on the
step grid, which carries only the state under `vmap`; the minimal ODE on its
`grid_solve` directly); otherwise `_trajectory` calls `cdiff.simulate` (or
`diffrax.diffeqsolve` for the minimal ODE) with `SaveAt(ts)`."""

from __future__ import annotations

import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._compiler import compiler_options, tracing_for
from .._kinematics import kinematics
from .._model import AbstractModel
from .._results import DIVERGENCE
from .._routes import GridRoute, constant_steps
from .._simulate import run_route, simulate
from .._solver.grid import UniformGrid, grid_solve

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
        # simulate's driver on the grid route, the model's checks raising as in
        # `simulate(throw=True)`; a finite blow-up fails the trajectory (its
        # divergence test).
        dt = t1 / jnp.asarray(k * n_save, t1.dtype)
        sol = run_route(GridRoute(solver, k, ts), model, formulation, None, q0, v0,
                        t0, t1, dt, throw=False, checks=True, checked=False,
                        divergence=jnp.asarray(DIVERGENCE, t1.dtype))
        ok = jnp.isfinite(sol.ts) & sol.succeeded
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


def _compile(fn, args):
    """`fn` compiled for `args` with `cdiff.compiler_options()`."""
    options = compiler_options()
    with tracing_for(options):
        lowered = fn.lower(*args)
    return lowered.compile(options)


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
        single = _compile(one, single_args(0))
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
    compiled = _compile(batch, args)
    compile_time = time.perf_counter() - start
    batch_time = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        measures = np.asarray(_block(compiled(*args)))
        batch_time = min(batch_time, time.perf_counter() - start)
    each = np.full(n, np.nan)
    if time_each:
        # dt or k is traced: one compilation for all, with the batch's options.
        single = _compile(one, single_args(0))
        for i in range(n):
            for _ in range(repeat):
                start = time.perf_counter()
                _block(single(*single_args(i)))
                each[i] = np.fmin(each[i], time.perf_counter() - start)
    return measures, compile_time, batch_time, each

