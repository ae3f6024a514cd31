"""The shipped MJCF mechanisms through MuJoCo's own solver and through cdiff, in one run.

    python benchmarks/against_mujoco.py [--mechanisms NAME ...] [--t1 T] [--dt DT]
        [--mujoco-dt DT ...] [--save-dt 0.1] [--batch 64] [--repeats 2]
        [--energy-correction] [--quick] [--xla-options {default,cdiff}]
        [--cpu-devices N] [--record]

The same file (`cdiff/models/mjcf/*.xml`, started from its first keyframe) for
every mechanism of `cdiff.models.MJCF_LIBRARY` that has a reference (by default
R2 slider-crank, R4 double four-bar, IFToMM A01 and A03; A02, whose 81
coordinates and 120 constraint rows make cdiff's run long, when named),
simulated by:

1. MuJoCo's C engine, `mujoco.mj_step` on an `MjModel` loaded from the file,
   one trajectory, contacts disabled, at `--mujoco-dt` (default: the file's
   timestep). Integrators RK4 and implicitfast, each with the file's
   `solref`/`solimp` on the equality constraints (MuJoCo's defaults, 0.02 s
   critically damped and 0.9-0.95, where the file sets none) and with the
   stiffest that MuJoCo accepts: `solref = (2 timestep, 1)`, since MuJoCo raises
   any smaller time constant to 2 timestep (`refsafe`), and `solimp = (0.9999,
   0.9999, 0.001, 0.5, 2)`, since it clips the impedance to [mjMINIMP,
   mjMAXIMP] = [0.0001, 0.9999] (engine_core_constraint.c; MJX clamps the
   same way). A file without equality constraints (A01) gets one row per
   integrator.
2. cdiff on the same file: `cdiff.models.from_mujoco(file)` (MJX dynamics,
   exact equality constraints), `cdiff.simulate(model, UdwadiaKalaba(), q0, v0,
   t1=..., dt=...)` with RK4 (the default) at `--dt` (default: the registry's
   step), one trajectory (every step saved, only `q` returned, so that XLA
   drops the unused diagnostics) and a `jax.vmap`ped batch of
   `--batch` trajectories (final state only), each from the keyframe moved by up
   to 1e-6 along every velocity direction and projected with
   `cdiff.consistent_state` (the first one unmoved: it must end where the single
   trajectory does). Each is compiled once ahead of time with
   `cdiff.compiler_options()` (`--xla-options`), as `cdiff run` does; only the
   run is timed.
3. For R2 and R4, cdiff's hand-written models (`cdiff.models.SliderCrank`,
   `cdiff.models.DoubleFourBar`) the same way, so that the cost per RK4 step of
   the MJCF model can be read as a ratio to the hand-written one.

Measured per method, on the save grid t = 0, `--save-dt`, ..., t1 (A03: its
published reference exists at t1 = 0.03 s only, so 0 and t1):

- **max abs(Φ)**: the largest equality-constraint residual over the grid. For
  MuJoCo and cdiff on the file, MuJoCo's own `efc_pos` rows of the equality
  constraints (`mj_fwdPosition` on the saved `qpos`: the same function for
  both, in m); for the hand-written models their own `holonomic` residuals (R2:
  positions, m; R4: squared lengths, m²).
- **max observable error**: the largest error against the mechanism's reference
  (`MJCF_LIBRARY[name].reference`) of one observable, the same for every method,
  computed by MuJoCo's kinematics (`mj_kinematics`) from `qpos` for MuJoCo,
  cdiff on the file and the reference alike: R2 the slider's x (site
  `slider`), R4 joint 3 (site `joint3`, x and y), A01 point P1, A02 point B0
  (x and y), A03 the seven angles. The hand-written models give the same
  quantity through their `observable` (R2: slider x_s; R4: joint 3).
- **time/traj**: best wall time of `--repeats` calls after a first one, per
  trajectory (a batch: the call's time divided by the batch); compile time
  apart (cdiff). **steps/s** counts all trajectories. **÷ hand-written**: the MJCF model's cost per step
  over the hand-written model's, for one trajectory and for the batch.

Progress goes to stderr, a line per configuration; the table to stdout, and with
`--record` in benchmarks/RESULTS.md and HISTORY.md. `--quick` is a smoke run (R2 and R4 unless
`--mechanisms` says otherwise, 1 s, batch 4, one repeat). MuJoCo's `mj_step`
runs on one core; XLA may use every core. Needs `mujoco` and `mujoco-mjx`
(`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

_spec = importlib.util.find_spec("mujoco")
if _spec is None:
    raise SystemExit('benchmarks/against_mujoco.py needs mujoco and mujoco-mjx: '
                     'pip install -e ".[bench]"')

import _config
import mujoco
from _record import record
from compare import timed

import cdiff
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from cdiff.models import MJCF_LIBRARY

#: The observable of each mechanism: (site, coordinates of its world position),
#: or None for `qpos` itself.
OBSERVABLES = {
    "slider-crank-mjcf": ("slider", (0,)),
    "double-four-bar-mjcf": ("joint3", (0, 1)),
    "iftomm-a01-simple-pendulum": ("P1", (0, 1)),
    "iftomm-a02-n-four-bar": ("B0", (0, 1)),
    "iftomm-a03-andrews-squeezer": None,
}
#: cdiff's hand-written models of the same mechanisms.
HAND_WRITTEN = {
    "slider-crank-mjcf": cdiff.models.SliderCrank,
    "double-four-bar-mjcf": cdiff.models.DoubleFourBar,
}
INTEGRATORS = {"RK4": mujoco.mjtIntegrator.mjINT_RK4,
               "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST}
STIFF_SOLIMP = (mujoco.mjMAXIMP, mujoco.mjMAXIMP, 0.001, 0.5, 2.0)
PERTURBATION = 1e-6  # the largest move of a batch's start along each direction
#: Run only when named: 81 coordinates and 120 constraint rows make cdiff's run
#: long at the default horizon (20 s) and batch.
ON_REQUEST = ("iftomm-a02-n-four-bar",)
QUICK = {"mechanisms": ["slider-crank-mjcf", "double-four-bar-mjcf"], "t1": 1.0, "batch": 4,
         "repeats": 1}


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# The problem: save grid, reference, and the measures shared by every method
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """One mechanism over [0, t1]: its file, save grid, the reference
    observable on the grid rows `rows`, and MuJoCo's kinematics to measure
    `qpos` with."""

    name: str
    path: Path
    t1: float
    save_dt: float
    ts: np.ndarray
    rows: np.ndarray
    reference: np.ndarray  # the reference observable at ts[rows], (len(rows), k)
    kinematics: mujoco.MjModel

    @classmethod
    def build(cls, name: str, t1: float | None, save_dt: float) -> Case:
        entry = MJCF_LIBRARY[name]
        if entry.reference_kind == "published":
            # Published values exist at fixed times: the horizon is the entry's.
            ref = entry.reference()
            if t1 is not None and t1 != entry.t1:
                _progress(f"{name}: --t1 ignored, the published reference is at "
                          f"t = {entry.t1:g} s")
            t1 = save_dt = entry.t1
        else:
            t1 = entry.t1 if t1 is None else t1
            save_dt = min(save_dt, t1)
            ref = None
        n = _divide(t1, save_dt, f"{name}: t1 = {t1:g} s", "--save-dt")
        ts = np.linspace(0.0, t1, n + 1)
        if ref is None:
            ref = entry.reference(jnp.asarray(ts))
        rows = np.array([int(np.argmin(np.abs(ts - t))) for t in np.asarray(ref.ts)])
        if not np.allclose(ts[rows], np.asarray(ref.ts), rtol=0.0, atol=1e-12):
            raise SystemExit(f"{name}: the reference's times {ref.ts} are not on "
                             f"the save grid")
        kinematics = mujoco.MjModel.from_xml_path(str(entry.path))
        kinematics.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
        case = cls(name, entry.path, t1, save_dt, ts, rows, np.empty(0), kinematics)
        case.reference = case.observe(np.asarray(ref.q))
        return case

    def steps(self, dt: float) -> int:
        return _divide(self.t1, dt, f"{self.name}: t1 = {self.t1:g} s", "dt")

    def every(self, dt: float) -> int:
        """Steps of size `dt` between two save times."""
        return _divide(self.save_dt, dt, f"{self.name}: save interval "
                       f"{self.save_dt:g} s", "dt")

    def observe(self, qpos) -> np.ndarray:
        """The observable of each row of `qpos` (non-finite rows: NaN), by
        MuJoCo's `mj_kinematics`."""
        qpos = np.asarray(qpos, dtype=float)
        spec = OBSERVABLES[self.name]
        if spec is None:
            return qpos.copy()
        site, axes = spec
        m = self.kinematics
        d = mujoco.MjData(m)
        out = np.full((len(qpos), len(axes)), np.nan)
        sid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, site)
        for k, q in enumerate(qpos):
            if np.all(np.isfinite(q)):
                d.qpos[:] = q
                mujoco.mj_kinematics(m, d)
                out[k] = d.site_xpos[sid, list(axes)]
        return out

    def equality_error(self, qpos) -> float:
        """The largest |efc_pos| of the equality constraints over the finite rows
        of `qpos` (MuJoCo's `mj_fwdPosition`); NaN for a file without any."""
        m = self.kinematics
        if m.neq == 0:
            return math.nan
        d = mujoco.MjData(m)
        worst = 0.0
        for q in np.asarray(qpos, dtype=float):
            if np.all(np.isfinite(q)):
                d.qpos[:] = q
                mujoco.mj_fwdPosition(m, d)
                rows = d.efc_type == mujoco.mjtConstraint.mjCNSTR_EQUALITY
                worst = max(worst, float(np.abs(d.efc_pos[rows]).max(initial=0.0)))
        return worst

    def error(self, observed) -> float:
        """max |observable - reference| over the reference's rows; inf if any of
        them is missing (a failed run)."""
        diff = np.abs(np.asarray(observed)[self.rows] - self.reference)
        return float(diff.max()) if np.all(np.isfinite(diff)) else math.inf


def _divide(total: float, step: float, what: str, flag: str) -> int:
    n = round(total / step)
    if n < 1 or abs(n * step - total) > 1e-9 * total:
        raise SystemExit(f"{what} is not a whole number of steps of {step:g} s "
                         f"(change {flag})")
    return n


@dataclasses.dataclass
class Row:
    """One method on one mechanism."""

    mechanism: str
    method: str
    dt: float
    steps: int  # per trajectory
    trajectories: int
    constraint: float  # max abs(Phi) on the grid; NaN: no constraint
    error: float  # max observable error against the reference; inf: failed
    compile: float  # seconds; NaN: nothing compiled
    seconds: float  # best wall time of one call (all its trajectories)
    ratio: float = math.nan  # cost per step over the hand-written model's

    @property
    def per_trajectory(self) -> float:
        return self.seconds / self.trajectories

    @property
    def steps_per_second(self) -> float:
        return self.trajectories * self.steps / self.seconds


# ---------------------------------------------------------------------------
# 1. MuJoCo's C engine
# ---------------------------------------------------------------------------


def mujoco_model(path: Path, integrator: str, dt: float, stiff: bool):
    """The file's `MjModel` at `timestep = dt` with `integrator`, contacts off,
    and with `stiff` the stiffest equality `solref`/`solimp` MuJoCo accepts."""
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.timestep = dt
    m.opt.integrator = INTEGRATORS[integrator]
    m.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    if stiff:
        m.eq_solref[:] = (2 * dt, 1.0)
        m.eq_solimp[:] = STIFF_SOLIMP
    return m


def mujoco_trajectory(m, case: Case) -> np.ndarray:
    """`qpos` on the save grid from the first keyframe, `mj_step(nstep)` from
    save time to save time; NaN rows after an instability (MuJoCo's bad-qacc
    warning, upon which it resets the state)."""
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, 0)
    mujoco.mj_forward(m, d)
    every = case.every(m.opt.timestep)
    out = np.full((len(case.ts), m.nq), np.nan)
    out[0] = d.qpos
    for k in range(1, len(case.ts)):
        mujoco.mj_step(m, d, nstep=every)
        if (not np.all(np.isfinite(d.qpos))
                or d.warning[mujoco.mjtWarning.mjWARN_BADQACC].number):
            break
        out[k] = d.qpos
    return out


def mujoco_rows(case: Case, dt: float, repeats: int) -> list[Row]:
    """MuJoCo C, RK4 and implicitfast, with the file's and the stiffest
    solref/solimp, one trajectory at timestep `dt`, timed with the saving."""
    probe = mujoco_model(case.path, "RK4", dt, stiff=False)
    settings = [(False, "file solref/solimp " + _solparams(probe))]
    if probe.neq:
        settings.append((True, "stiff solref/solimp " + _solparams(
            mujoco_model(case.path, "RK4", dt, stiff=True))))
    rows = []
    for integrator in INTEGRATORS:
        for stiff, label in settings:
            method = f"MuJoCo C {integrator}, {label}" if probe.neq else \
                f"MuJoCo C {integrator} (no equality constraints)"
            _progress(f"  {case.name}: {method}, dt = {dt:g}")
            m = mujoco_model(case.path, integrator, dt, stiff)
            _, best, qpos = timed(lambda m=m: mujoco_trajectory(m, case), repeats)
            rows.append(Row(case.name, method, dt, case.steps(dt), 1,
                            case.equality_error(qpos), case.error(case.observe(qpos)),
                            math.nan, best))
    return rows


def _solparams(m) -> str:
    """`solref` and `solimp` of the equality constraints, e.g. `(0.02, 1), (0.9,
    0.95, 0.001, 0.5, 2)`; 'per constraint' where they differ."""
    ref, imp = np.unique(m.eq_solref, axis=0), np.unique(m.eq_solimp, axis=0)
    if len(ref) != 1 or len(imp) != 1:
        return "(per constraint)"
    return f"({', '.join(f'{x:g}' for x in ref[0])}), ({', '.join(f'{x:g}' for x in imp[0])})"


# ---------------------------------------------------------------------------
# 2-3. cdiff: the file through MJX, and the hand-written models
# ---------------------------------------------------------------------------


def starts(model, q0, v0, batch: int):
    """`batch` consistent starts: `q0` moved by `s` along every velocity
    direction, `s` from 0 to PERTURBATION, projected with
    `cdiff.consistent_state` (the first is `q0, v0` unchanged)."""

    def one(s):
        q = model.integrate_position(q0, jnp.full(v0.shape, s, dtype=v0.dtype))
        return cdiff.consistent_state(model, q, v0)

    shifts = jnp.linspace(0.0, PERTURBATION, batch, dtype=q0.dtype)
    return jax.jit(jax.vmap(one))(shifts)


def cdiff_rows(case: Case, label: str, model, formulation, dt: float, batch: int,
               repeats: int, options: dict, observe, constraint) -> list[Row]:
    """cdiff on `model`: one trajectory (every step saved: the errors) and a
    vmapped batch (final state only), each compiled once ahead of time with
    `options`, only the run timed. `observe(q)` maps the saved `q` to the
    observable, `constraint(q)` to the largest constraint residual."""
    steps, every = case.steps(dt), case.every(dt)
    q0, v0 = (jnp.asarray(x, jnp.float64) for x in model.initial_state())
    formulation = formulation.bind(model, 0.0, q0, v0)

    def single(model, formulation, q0, v0):
        return cdiff.simulate(model, formulation, q0, v0, t1=case.t1, dt=dt,
                              throw=False).q

    def batched(model, formulation, q0s, v0s):
        def one(q0, v0):
            return cdiff.simulate(model, formulation, q0, v0, t1=case.t1, dt=dt,
                                  saveat=cdiff.SaveAt(t1=True), throw=False).q[-1]
        return jax.vmap(one)(q0s, v0s)

    rows = []
    _progress(f"  {case.name}: {label}, 1 trajectory, {steps} steps of {dt:g}: "
              "compiling")
    start = time.perf_counter()
    run = eqx.filter_jit(single).lower(model, formulation, q0, v0).compile(options)
    compiled = time.perf_counter() - start
    _, best, q = timed(lambda: run(model, formulation, q0, v0), repeats)
    grid = np.asarray(q)[::every]
    rows.append(Row(case.name, f"{label}, 1 trajectory", dt, steps, 1,
                    constraint(grid), case.error(observe(grid)), compiled, best))
    if batch < 1:
        return rows

    _progress(f"  {case.name}: {label}, batch {batch}: projecting the starts, "
              "compiling")
    q0s, v0s = _config.shard(starts(model, q0, v0, batch))
    start = time.perf_counter()
    run = eqx.filter_jit(batched).lower(model, formulation, q0s, v0s).compile(options)
    compiled = time.perf_counter() - start
    _, best, finals = timed(lambda: run(model, formulation, q0s, v0s), repeats)
    finals = np.asarray(finals)
    gap = float(np.max(np.abs(finals[0] - np.asarray(q)[-1])))
    if not gap <= 1e-9:
        _progress(f"  WARNING {case.name} {label}: the batch's unmoved trajectory "
                  f"ends {gap:.2e} from the single one")
    # The batch's errors are the single trajectory's (its unmoved first member);
    # a non-finite final state marks the batch failed.
    error = rows[0].error if np.all(np.isfinite(finals)) else math.inf
    rows.append(Row(case.name, f"{label}, batch {batch}", dt, steps, batch,
                    rows[0].constraint, error, compiled, best))
    return rows


def mjcf_rows(case: Case, formulation, dt, batch, repeats, options) -> list[Row]:
    """cdiff on the file (`cdiff.models.from_mujoco`)."""
    model = cdiff.models.from_mujoco(case.path)
    return cdiff_rows(case, "cdiff on the file (MJX)", model, formulation, dt, batch,
                      repeats, options, case.observe, case.equality_error)


def hand_written_rows(case: Case, formulation, dt, batch, repeats,
                      options) -> list[Row]:
    """cdiff on the hand-written model of the same mechanism (R2, R4)."""
    model = HAND_WRITTEN[case.name]()
    holonomic = jax.jit(jax.vmap(lambda q: model.holonomic(0.0, q)))

    def constraint(q):
        residual = np.abs(np.asarray(holonomic(jnp.asarray(q))))
        residual = residual[np.all(np.isfinite(residual), axis=-1)]
        return float(residual.max()) if residual.size else math.nan

    def observe(q):
        return np.asarray(model.observable(jnp.asarray(q)))

    return cdiff_rows(case, f"cdiff hand-written {type(model).__name__}", model,
                      formulation, dt, batch, repeats, options, observe, constraint)


def add_ratios(rows: list[Row]) -> None:
    """The cost per step of cdiff on the file over the hand-written model's,
    for the same mechanism and number of trajectories."""
    for row in rows:
        if not row.method.startswith("cdiff on the file"):
            continue
        for base in rows:
            if (base.mechanism == row.mechanism and base.trajectories == row.trajectories
                    and base.method.startswith("cdiff hand-written")):
                row.ratio = ((row.per_trajectory / row.steps)
                             / (base.per_trajectory / base.steps))


# ---------------------------------------------------------------------------
# Table and main
# ---------------------------------------------------------------------------


def _fmt(x: float, spec: str = ".3g") -> str:
    if math.isnan(x):
        return "—"
    if math.isinf(x):
        return "failed"
    return format(x, spec)


def table(rows: list[Row]) -> str:
    header = ("| mechanism | method | dt [s] | steps/traj | trajectories | max abs(Φ) | "
              "max observable error | compile [s] | time/traj [s] | steps/s | "
              "cost/step ÷ hand-written |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r.mechanism} | {r.method} | {r.dt:g} | {r.steps} | {r.trajectories} "
            f"| {_fmt(r.constraint, '.2e')} | {_fmt(r.error, '.2e')} "
            f"| {_fmt(r.compile, '.1f')} | {r.per_trajectory:.3g} "
            f"| {r.steps_per_second:,.0f} | {_fmt(r.ratio, '.2f')} |")
    return "\n".join(lines)


def parse(argv=None):
    with_reference = [n for n, e in MJCF_LIBRARY.items() if e.reference is not None
                      and n in OBSERVABLES]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = [n for n in with_reference if n not in ON_REQUEST]
    parser.add_argument("--mechanisms", nargs="+", choices=with_reference,
                        metavar="NAME", help="any of " + ", ".join(with_reference)
                        + " (default: " + ", ".join(default) + "; --quick: R2 and R4)")
    parser.add_argument("--t1", type=float, default=None,
                        help="horizon [s] (default: each mechanism's, MJCF_LIBRARY; "
                        "--quick 1)")
    parser.add_argument("--dt", type=float, default=None,
                        help="cdiff's RK4 step [s] (default: each mechanism's)")
    parser.add_argument("--mujoco-dt", type=float, nargs="+", default=None,
                        help="MuJoCo's timestep(s) [s] (default: the file's)")
    parser.add_argument("--save-dt", type=float, default=0.1,
                        help="interval of the grid the errors are measured on [s]")
    parser.add_argument("--batch", type=int, default=None,
                        help="cdiff's vmapped batch (default 64; --quick 4; 0: none)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per method after a first one, best kept "
                        "(default 2; --quick 1)")
    parser.add_argument("--energy-correction", action="store_true",
                        help="UdwadiaKalaba(energy_correction=True)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    _config.add_arguments(parser)
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    args = parser.parse_args(argv)
    quick = QUICK if args.quick else {"mechanisms": default, "t1": None,
                                      "batch": 64, "repeats": 2}
    for key, value in quick.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse(argv)
    _config.apply(args)
    options = _config.options(args.xla_options)
    formulation = cdiff.UdwadiaKalaba(energy_correction=args.energy_correction)
    device = jax.devices()[0]
    _progress(f"device: {device.platform} ({device.device_kind}), jax {jax.__version__}, "
              f"mujoco {mujoco.__version__}")
    start = time.perf_counter()
    rows, horizons = [], []
    for i, name in enumerate(args.mechanisms, 1):
        case = Case.build(name, args.t1, args.save_dt)
        entry = MJCF_LIBRARY[name]
        dt = entry.dt if args.dt is None else args.dt
        horizons.append(f"{name} {case.t1:g} s")
        _progress(f"[{i}/{len(args.mechanisms)}] {name}: t1 = {case.t1:g} s, "
                  f"save grid {case.save_dt:g} s")
        for mujoco_dt in args.mujoco_dt or [case.kinematics.opt.timestep]:
            rows += mujoco_rows(case, mujoco_dt, args.repeats)
        rows += mjcf_rows(case, formulation, dt, args.batch, args.repeats, options)
        if name in HAND_WRITTEN:
            rows += hand_written_rows(case, formulation, dt, args.batch, args.repeats,
                                      options)
    add_ratios(rows)
    text = table(rows)
    print()
    print(text)
    _progress(f"total {time.perf_counter() - start:.0f} s")
    if args.record:
        uk = "UdwadiaKalaba(energy_correction=True)" if args.energy_correction \
            else "UdwadiaKalaba()"
        record("against_mujoco.py",
               "The shipped MJCF files through MuJoCo C (`mj_step`, one trajectory, "
               "contacts off, from the first keyframe) and through cdiff "
               f"(`from_mujoco`, {uk}, RK4), and cdiff's hand-written R2/R4, "
               f"float64. Horizons: {', '.join(horizons)}. Stiff MuJoCo: solref = "
               "(2 timestep, 1) (refsafe's limit), solimp = (0.9999, 0.9999, 0.001, "
               "0.5, 2) (mjMAXIMP). Errors on the save grid (every "
               f"{args.save_dt:g} s; A03 at 0.03 s): max abs(Φ) is MuJoCo's equality "
               "efc_pos for the file's rows, the model's own residuals for the "
               "hand-written ones; the observable (R2 slider x, R4 joint 3, A01 P1, "
               "A02 B0, A03 the angles) against MJCF_LIBRARY's reference. Time: "
               f"best of {args.repeats}, per trajectory, compile apart; the batch "
               f"({args.batch}) is vmapped over starts projected with "
               "consistent_state, final state only. ÷ hand-written: cost per step "
               "of cdiff on the file over the hand-written model's. mj_step on one "
               f"core, XLA on all. {_config.describe(args)}", text)


if __name__ == "__main__":
    main()
