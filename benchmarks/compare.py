"""cdiff side by side with NumPy, SciPy, SUNDIALS IDA and MuJoCo on R2, in one run.

    python benchmarks/compare.py [--batch 4096] [--pareto-batch 256] [--t1 10]
        [--quick] [--only cdiff numpy scipy ida mujoco mjx] [--repeats 2]
        [--xla-options cdiff] [--cpu-devices N] [--out DIR] [--record]

The problem, for every tool: R2, the slider-crank of Braun & Goldfarb (2012,
Sec. 4.1) with l = m = 1, g = 9.81, from theta1 = pi/4 at rest, over
t in [0, t1] (default 10 s), float64. Every tool starts from the same state and
is compared with the same exact reference (`SliderCrank.reference`: eq. 24
solved by diffrax's Dopri8 at rtol = atol = 1e-12).

**Accuracy** of one run: the crank angle error
`max_k |theta1(t_k) - theta1_ref(t_k)|` (rad) over the save grid
t_k = 0, 0.1, ..., t1 (every tool saves there, on a step end for the fixed-step
ones), and, where the state has absolute coordinates, the position-constraint
residual `max_k ||Phi_q(q(t_k))||_inf` (m) of eq. 22, evaluated on the state in
R2's absolute coordinates (for MuJoCo its joint state mapped to them).
**Cost**: wall time per trajectory, best of `--repeats`, compile time reported
apart (JAX: first call minus the best later call, `jax.block_until_ready`).

Tools and settings (`--only` picks among the names in brackets):

1. [cdiff] `UdwadiaKalaba(constraint_correction=True, energy_correction=True)`
   with `cdiff.RK4`: throughput at dt = 1e-2 over t1 (final state only, as
   benchmarks/throughput.py) for a vmapped batch (`--batch`, every trajectory
   from theta1 = pi/4 + up to 1e-6, mapped consistently onto the constraints)
   and for one trajectory; and the accuracy-cost sweep over dt for UK (c+e),
   `Lagrange(10, 10)` (Baumgarte) and RK4 on the minimal ODE (24), each for one
   trajectory and per trajectory of a batch of `--pareto-batch`.
2. [numpy] The same UK (c+e) equations and RK4 in plain NumPy, one trajectory
   at a time in a Python loop, the correction terms frozen per step as cdiff
   does (hand-written R2 Jacobians, `np.linalg.pinv` for the constraint rows),
   as the papers' MATLAB codes run. Checked against cdiff at dt = 1e-2: the
   script stops if any coordinate differs by more than 1e-6.
3. [scipy] `scipy.integrate.solve_ivp` (RK45, DOP853, LSODA) on the minimal
   ODE (24) at rtol = atol from 1e-3 to 1e-12; RHS evaluations reported.
4. [ida] SUNDIALS IDA (scikit-sundae, BDF, dense LU with finite-difference
   Jacobian) on the index-1 DAE of R2, unknowns (q, v, lambda):
   q' = v, M v' = Q + Phi_q^T lambda, Phi_q v' = -(Phi_q v)_q v, lambda
   algebraic; and on eq. 24 written as an implicit ODE, at several rtol = atol.
   Index 1 enforces the constraints at acceleration level only (the position
   residual drifts), and its KKT matrix is singular at theta1 = -pi/2.
5. [mujoco] MuJoCo (C, `mj_step` with `nstep`, one trajectory at a time) on R2
   in MJCF: slider body on a slide joint along x, rod hinged to it, crank hinged
   to the rod's far end, and the crank's free end pinned to the origin by an
   equality `connect`; gravity along -y, so MuJoCo's x-y plane is the paper's.
   The slider body has mass 1e-9 (MuJoCo refuses moving bodies without mass).
   Constraints are soft in MuJoCo: the stiff setting is solimp = 0.9999 (the
   largest allowed) and solref time constant 2 * timestep (the smallest that
   `refsafe` allows); RK4 and implicitfast, and RK4 with the default
   solref/solimp. A small table sweeps solimp's impedance at one timestep.
   Also `mujoco.rollout` over a batch on 2 threads (throughput).
   [mjx] MuJoCo MJX (JAX) on the same model: one trajectory over t1 at two
   timesteps, and a vmapped batch (`--mjx-batch`) for throughput.

Output: markdown tables (throughput, every accuracy/cost point, the cost per
trajectory to reach a theta1 error of 1e-6, interpolated in log-log between the
two settings around it), the Pareto figure `pareto.png` and its data
`pareto.csv` in `--out` (default benchmarks/out). `--record` records the tables
in benchmarks/RESULTS.md and HISTORY.md. A tool whose package is missing is skipped ("not
installed"). The JAX programs (cdiff, MJX) are compiled with
`cdiff.compiler_options()` (`--xla-options default`: JAX's defaults);
`--cpu-devices N` splits the CPU into N JAX devices and shards the vmapped
batches over them (see benchmarks/throughput.py).

NumPy, SciPy, IDA and MuJoCo's `mj_step` run on one core; XLA (cdiff, MJX) and
`mujoco.rollout` may use every core. Optional packages: `scipy`,
`scikit-sundae`, `mujoco<4` (4.0 on PyPI is a stub needing `mujoco-core`),
`mujoco-mjx` of the same version, `matplotlib`.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import diffrax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

import _config  # noqa: E402
import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402

TOOLS = ("cdiff", "numpy", "scipy", "ida", "mujoco", "mjx")
TARGET = 1e-6  # the overall theta1 error of issue 7's acceptance (rad)
SAVE_DT = 0.1  # the save grid every tool is compared on (s)
THROUGHPUT_DT = 1e-2
UK = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
MODEL = cdiff.models.SliderCrank()
L, MASS, G = float(MODEL.l), float(MODEL.m), float(MODEL.g)
H = L / 2
M_DIAG = np.array([MASS, MASS, MASS * L**2 / 12] * 2)
Q_FORCE = np.array([0.0, -MASS * G, 0.0, 0.0, -MASS * G, 0.0])

# Sweeps: (full, --quick).
CDIFF_DTS = ([0.05, 0.02, 0.01, 5e-3, 2e-3, 1e-3], [0.02, 0.01, 5e-3])
SCIPY_RTOLS = ([10.0**-k for k in range(3, 13)], [1e-4, 1e-6, 1e-8])
IDA_RTOLS = ([10.0**-k for k in range(3, 13)], [1e-4, 1e-6, 1e-8])
MUJOCO_DTS = ([1e-2, 5e-3, 2e-3, 1e-3, 5e-4, 2e-4, 1e-4, 5e-5], [2e-3, 1e-3, 5e-4])
MJX_DTS = ([1e-3, 2e-4], [1e-3])
IDA_DEADLINE_S = 30.0  # a failing IDA solve can spin for minutes near the singularity


# ---------------------------------------------------------------------------
# The problem, the error measures and the timing helper
# ---------------------------------------------------------------------------


@dataclass
class Problem:
    """R2 over [0, t1]: the save grid, the exact theta1 there, the start."""

    t1: float
    ts: np.ndarray
    theta_ref: np.ndarray
    q0: np.ndarray
    v0: np.ndarray

    @classmethod
    def build(cls, t1: float) -> "Problem":
        n = round(t1 / SAVE_DT)
        if abs(n * SAVE_DT - t1) > 1e-9 or n < 1:
            raise SystemExit(f"--t1 must be a multiple of {SAVE_DT} s")
        ts = np.linspace(0.0, t1, n + 1)
        ref = MODEL.reference(jnp.asarray(ts))
        q0, v0 = MODEL.initial_state()
        return cls(t1, ts, np.asarray(ref.q[:, 2]), np.asarray(q0), np.asarray(v0))


@dataclass
class Point:
    """One accuracy/cost measurement: a setting of one tool (a series)."""

    series: str
    setting: str
    cost: float  # wall time per trajectory (s)
    error: float  # max |theta1 - theta1_ref| on the save grid (rad); inf: failed
    constraint: float  # max ||Phi_q||_inf on the save grid (m); nan: n/a
    work: str = ""  # steps, RHS evaluations, ...
    note: str = ""


def theta_error(theta, prob: Problem) -> float:
    """`max_k |theta1(t_k) - theta1_ref(t_k)|`, inf if anything is missing or
    non-finite (a failed solve)."""
    theta = np.asarray(theta, dtype=float)
    if theta.shape != prob.theta_ref.shape or not np.all(np.isfinite(theta)):
        return math.inf
    return float(np.max(np.abs(theta - prob.theta_ref)))


def r2_phi(q):
    """The five holonomic residuals of R2 (eq. 22) for q of shape (..., 6)."""
    q = np.asarray(q, dtype=float)
    x1, y1, t1, x2, y2, t2 = np.moveaxis(q, -1, 0)
    c1, s1, c2, s2 = np.cos(t1), np.sin(t1), np.cos(t2), np.sin(t2)
    return np.stack([x1 - H * c1, y1 - H * s1, x1 + H * c1 - x2 + H * c2,
                     y1 + H * s1 - y2 + H * s2, y2 + H * s2], axis=-1)


def constraint_error(q) -> float:
    """`max_k ||Phi_q(q(t_k))||_inf` over the finite saved states."""
    phi = np.abs(r2_phi(q))
    phi = phi[np.all(np.isfinite(phi), axis=-1)]
    return float(phi.max()) if phi.size else math.nan


def branch_note(q) -> str:
    """A note when the state leaves the branch theta2 = -theta1 of the exact
    solution (at the singular passage the mechanism can fold onto theta2 =
    pi + theta1, the slider then stays at the crank's pivot)."""
    q = np.asarray(q, dtype=float)
    q = q[np.all(np.isfinite(q), axis=-1)]
    gap = float(np.max(np.abs(q[:, 2] + q[:, 5]))) if len(q) else 0.0
    return f"off the branch θ2 = −θ1 (max |θ1 + θ2| = {gap:.2g})" if gap > 0.1 else ""


def timed(fn, repeats: int):
    """`(first, best, out)`: the first call's time, the best of `repeats` later
    calls (0 repeats: best = first) and the last output; JAX outputs are
    waited for."""
    t = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = best = time.perf_counter() - t
    if repeats > 0:
        best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return first, best, out


def steps_of(t1: float, dt: float) -> int:
    return round(t1 / dt)


def _fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "failed"
    return f"{x:.{digits}g}"


# ---------------------------------------------------------------------------
# 1. cdiff
# ---------------------------------------------------------------------------


def _start(theta0):
    """A consistent (q0, v0) on the branch theta2 = -theta1 at rest."""
    return MODEL.minimal_state(jnp.stack([theta0, jnp.zeros_like(theta0)]))


def _thetas(batch: int):
    """theta1(0) = pi/4 + [0, 1e-6]: distinct trajectories, the first unperturbed."""
    return jnp.pi / 4 + jnp.linspace(0.0, 1e-6, batch)


def cdiff_throughput(prob: Problem, batch: int, repeats: int):
    """RK4 steps per second of UK (c+e) at dt = 1e-2 over t1, final state only
    (`SaveAt(t1=True)`): a jitted `vmap` over `batch` starts, and one
    trajectory. **Returns** rows `(tool, trajectories, dt, steps/traj, compile,
    run, steps/s)`."""
    steps = steps_of(prob.t1, THROUGHPUT_DT)

    def one(theta0):
        q0, v0 = _start(theta0)
        sol = cdiff.simulate(MODEL, UK, q0, v0, t1=prob.t1, dt=THROUGHPUT_DT,
                             saveat=cdiff.SaveAt(t1=True))
        return sol.q[-1]

    rows = []
    for name, n, fn, arg in (
        ("cdiff UK c+e, vmapped batch", batch, _jit(jax.vmap(one)),
         _config.shard(_thetas(batch))),
        ("cdiff UK c+e, one trajectory", 1, _jit(one), jnp.asarray(jnp.pi / 4)),
    ):
        first, best, out = timed(lambda: fn(arg), repeats)
        if not bool(jnp.all(jnp.isfinite(out))):
            raise SystemExit(f"{name}: non-finite final state")
        rows.append((name, n, THROUGHPUT_DT, steps, first - best, best,
                     n * steps / best))
        print(f"  {name}: {n} x {steps} steps, compile {first - best:.2f} s, "
              f"run {best:.4f} s, {n * steps / best:,.0f} steps/s", flush=True)
    return rows


def _minimal_rk4(theta0, dt, t1, ts, max_steps):
    """cdiff's RK4 on eq. 24 (constant steps), theta1 at `ts`."""
    ode = MODEL.minimal_ode()
    y0 = ode.y0.at[0].set(theta0)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(ode.rhs), cdiff.RK4(), 0.0, t1, dt, y0, args=ode.args,
        saveat=diffrax.SaveAt(ts=ts), stepsize_controller=diffrax.ConstantStepSize(),
        max_steps=max_steps, throw=False)
    q, _ = ode.state(sol.ys)
    return jnp.where(sol.result == diffrax.RESULTS.successful, q, jnp.nan)


_OPTIONS: dict = {}  # XLA compiler options of the JAX programs (main sets them)


def _jit(fn):
    """`jax.jit` with the run's XLA compiler options."""
    return jax.jit(fn, compiler_options=_OPTIONS)


def cdiff_pareto(prob: Problem, dts, batch: int, repeats: int):
    """Accuracy and cost of cdiff over the step sizes `dts`, saving q on the grid:
    UK (c+e), Lagrange(10, 10) and the minimal ODE, all with RK4. Per
    formulation one compiled function of `dt` (traced; `max_steps` for the
    smallest) for one trajectory and one for a vmapped batch; cost per
    trajectory is the best run time (batched: divided by `batch`). The errors
    are those of the unperturbed first trajectory; the batched one is checked
    to agree with the single one."""
    ts = jnp.asarray(prob.ts)
    max_steps = max(steps_of(prob.t1, dt) for dt in dts)

    def constrained(formulation):
        def one(theta0, dt):
            q0, v0 = _start(theta0)
            sol = cdiff.simulate(MODEL, formulation, q0, v0, t1=prob.t1, dt=dt,
                                 saveat=cdiff.SaveAt(ts=ts), max_steps=max_steps,
                                 throw=False)
            return jnp.where(sol.succeeded, sol.q, jnp.nan)
        return one

    def minimal(theta0, dt):
        return _minimal_rk4(theta0, dt, prob.t1, ts, max_steps)

    setups = {
        "cdiff UK c+e": constrained(UK),
        "cdiff Lagrange(10,10)": constrained(cdiff.Lagrange(10.0, 10.0)),
        "cdiff minimal ODE": minimal,
    }
    points, compiles = [], []
    for name, one in setups.items():
        single = _jit(one)
        batched = _jit(jax.vmap(one, in_axes=(0, None)))
        thetas = _config.shard(_thetas(batch))
        for k, dt in enumerate(dts):
            steps = steps_of(prob.t1, dt)
            f1, b1, q = timed(lambda: single(jnp.asarray(jnp.pi / 4), dt), repeats)
            fb, bb, qb = timed(lambda: batched(thetas, dt), repeats)
            if k == 0:
                compiles.append((name, f1 - b1, fb - bb))
            q, qb0 = np.asarray(q), np.asarray(qb[0])
            agree = np.nanmax(np.abs(q - qb0)) if np.any(np.isfinite(q)) else 0.0
            if agree > 1e-9:
                print(f"  WARNING {name} dt={dt}: batched row 0 differs from the "
                      f"single trajectory by {agree:.2e}")
            err = theta_error(q[:, 2], prob)
            phi = math.nan if name == "cdiff minimal ODE" else constraint_error(q)
            work = f"{steps} steps"
            note = branch_note(q)
            points.append(Point(f"{name} (1 traj)", f"dt={dt:g}", b1, err, phi, work,
                                note))
            points.append(Point(f"{name} (batch {batch})", f"dt={dt:g}", bb / batch,
                                err, phi, work, note))
            print(f"  {name} dt={dt:g}: theta err {_fmt(err)}, Phi {_fmt(phi)}, "
                  f"1 traj {b1 * 1e3:.2f} ms, batch {bb:.3f} s "
                  f"({bb / batch * 1e3:.3f} ms/traj)", flush=True)
    for name, c1, cb in compiles:
        print(f"  compile {name}: single {c1:.2f} s, batched {cb:.2f} s")
    return points, compiles


# ---------------------------------------------------------------------------
# 2. NumPy: the same UK (c+e) equations and RK4, one trajectory at a time
# ---------------------------------------------------------------------------

_SQRT_M = np.sqrt(M_DIAG)
_A_FREE = Q_FORCE / M_DIAG  # unconstrained acceleration a = M^-1 Q
_RTOL = 10.0 * math.sqrt(np.finfo(float).eps)  # cdiff's pseudoinverse rtol
_TINY = np.finfo(float).eps ** 2


def _jacobian(q):
    """A_q = dPhi_q/dq of R2, by hand."""
    c1, s1, c2, s2 = math.cos(q[2]), math.sin(q[2]), math.cos(q[5]), math.sin(q[5])
    return np.array([[1.0, 0.0, H * s1, 0.0, 0.0, 0.0],
                     [0.0, 1.0, -H * c1, 0.0, 0.0, 0.0],
                     [1.0, 0.0, -H * s1, -1.0, 0.0, -H * s2],
                     [0.0, 1.0, H * c1, 0.0, -1.0, H * c2],
                     [0.0, 0.0, 0.0, 0.0, 1.0, H * c2]])


def _b_v(q, v):
    """b_v = -(A_q v)_q v, so that A_q qdd = b_v is Phi_q'' = 0."""
    c1, s1, c2, s2 = math.cos(q[2]), math.sin(q[2]), math.cos(q[5]), math.sin(q[5])
    w1, w2 = v[2] ** 2, v[5] ** 2
    return -H * np.array([c1 * w1, s1 * w1, -c1 * w1 - c2 * w2, -s1 * w1 - s2 * w2,
                          -s2 * w2])


def _energy(q, v):
    return 0.5 * v @ (M_DIAG * v) + MASS * G * (q[1] + q[4])


def _uk_rates(q, v, frozen):
    """Braun-Goldfarb eqs. 16, 17, 20 with M = R^T R (R = diag(sqrt(m_i)) here),
    C = A R^-1, the Delta terms and the energy-row threshold `frozen` at the
    step start. As cdiff.UdwadiaKalaba: the energy row's pseudoinverse is
    damped by |Phi_e| + rtol |E| (one step of iterated Tikhonov); the
    constraint rows use np.linalg.pinv (cdiff's smooth pseudoinverse agrees with
    it to (1e-7 / sigma_min)^4)."""
    delta_q, delta_v, delta_e, damping_e = frozen
    A = _jacobian(q)
    C = A / _SQRT_M
    C_pinv = np.linalg.pinv(C)
    # Eq. 16: q' = v + R^-1 C^+ (b_q - A_q v - Delta_q), b_q = 0.
    dq = v + (C_pinv @ (-(A @ v) - delta_q)) / _SQRT_M
    # Eq. 17: the ideal constraint force, y_v = C^+ (b_v - A_v a - Delta_v).
    y_v = C_pinv @ (_b_v(q, v) - A @ _A_FREE - delta_v)
    # Eq. 20: energy row A_e = dE/dv = M v, b_e = -(dE/dq) q', against N_v.
    c_e = _SQRT_M * v
    w = c_e - C_pinv @ (C @ c_e)
    r_ev = (-MASS * G * (dq[1] + dq[4]) - (M_DIAG * v) @ _A_FREE - delta_e
            - c_e @ y_v)
    ww = w @ w
    gram = ww + _RTOL**2 * ww + damping_e + _TINY
    lam = r_ev / gram
    lam = lam + (r_ev - ww * lam) / gram
    return dq, _A_FREE + (y_v + w * lam) / _SQRT_M


def numpy_uk_rk4(q, v, t1: float, dt: float, save_every: int):
    """Classic RK4 of the UK (c+e) equations in a Python loop, with Phi_q/dt,
    Phi_q'/dt, (E - E0)/dt and the energy threshold evaluated once at each step
    start (cdiff's FrozenStep). **Returns** q at step 0 and every `save_every`
    steps, shape (n_save, 6)."""
    q, v = np.array(q, dtype=float), np.array(v, dtype=float)
    e0 = _energy(q, v)
    out = [q.copy()]
    for i in range(steps_of(t1, dt)):
        energy = _energy(q, v)
        phi_e = energy - e0
        frozen = (r2_phi(q) / dt, (_jacobian(q) @ v) / dt, phi_e / dt,
                  abs(phi_e) + _RTOL * abs(energy))
        k1 = _uk_rates(q, v, frozen)
        k2 = _uk_rates(q + 0.5 * dt * k1[0], v + 0.5 * dt * k1[1], frozen)
        k3 = _uk_rates(q + 0.5 * dt * k2[0], v + 0.5 * dt * k2[1], frozen)
        k4 = _uk_rates(q + dt * k3[0], v + dt * k3[1], frozen)
        q = q + dt / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
        v = v + dt / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        if (i + 1) % save_every == 0:
            out.append(q.copy())
    return np.array(out)


def numpy_bench(prob: Problem, dts, repeats: int):
    """The NumPy UK (c+e) RK4 against cdiff at dt = 1e-2 (max |q_numpy -
    q_cdiff| on the save grid; stops the script above 1e-6), its steps/s on one
    trajectory of t1 at dt = 1e-2 (best of `repeats`), and its accuracy/cost
    at `dts` (one timed run each). **Returns** `(throughput row, points,
    difference)`."""
    every = steps_of(SAVE_DT, THROUGHPUT_DT)
    _, best, q_np = timed(lambda: numpy_uk_rk4(prob.q0, prob.v0, prob.t1,
                                               THROUGHPUT_DT, every), repeats)
    sol = cdiff.simulate(MODEL, UK, prob.q0, prob.v0, t1=prob.t1, dt=THROUGHPUT_DT,
                         saveat=cdiff.SaveAt(ts=jnp.asarray(prob.ts)))
    diff = float(np.max(np.abs(q_np - np.asarray(sol.q))))
    print(f"  NumPy vs cdiff (UK c+e, RK4, dt={THROUGHPUT_DT:g}, {prob.t1:g} s): "
          f"max |q_numpy - q_cdiff| = {diff:.3e}", flush=True)
    if not diff <= 1e-6:
        raise SystemExit(f"NumPy and cdiff disagree by {diff:.3e} > 1e-6: they do "
                         "not compute the same formulation")
    steps = steps_of(prob.t1, THROUGHPUT_DT)
    row = ("NumPy UK c+e, one trajectory", 1, THROUGHPUT_DT, steps, 0.0, best,
           steps / best)
    print(f"  NumPy: {steps} steps in {best:.3f} s, {steps / best:,.0f} steps/s")
    points = []
    for dt in dts:
        t = time.perf_counter()
        q = numpy_uk_rk4(prob.q0, prob.v0, prob.t1, dt, steps_of(SAVE_DT, dt))
        cost = time.perf_counter() - t
        points.append(Point("NumPy UK c+e (1 traj)", f"dt={dt:g}", cost,
                            theta_error(q[:, 2], prob), constraint_error(q),
                            f"{steps_of(prob.t1, dt)} steps", branch_note(q)))
        print(f"  NumPy dt={dt:g}: theta err {_fmt(points[-1].error)}, "
              f"{cost:.3f} s", flush=True)
    return row, points, diff


# ---------------------------------------------------------------------------
# 3. SciPy solve_ivp on the minimal ODE
# ---------------------------------------------------------------------------


def _minimal_rhs(t, y):
    """Eq. 24 as a first-order system, plain Python floats."""
    th, om = y
    acc = -3.0 / (5.0 - 3.0 * math.cos(2 * th)) * (
        math.sin(2 * th) * om * om + G / L * math.cos(th))
    return [om, acc]


def scipy_pareto(prob: Problem, rtols, repeats: int):
    """`solve_ivp` (RK45, DOP853, LSODA) on eq. 24 at rtol = atol, dense output
    at the save grid (`t_eval`): error and best wall time per trajectory, RHS
    evaluations as the work."""
    from scipy.integrate import solve_ivp

    points = []
    y0 = [math.pi / 4, 0.0]
    for method in ("RK45", "DOP853", "LSODA"):
        for rtol in rtols:
            def solve():
                return solve_ivp(_minimal_rhs, (0.0, prob.t1), y0, method=method,
                                 t_eval=prob.ts, rtol=rtol, atol=rtol)
            _, best, sol = timed(solve, repeats)
            err = theta_error(sol.y[0], prob) if sol.success else math.inf
            points.append(Point(f"SciPy {method}", f"rtol={rtol:.0e}", best, err,
                                math.nan, f"{sol.nfev} RHS",
                                "" if sol.success else sol.message))
        print(f"  SciPy {method}: " + ", ".join(
            f"{p.setting} {_fmt(p.error)}" for p in points[-len(rtols):]), flush=True)
    return points


# ---------------------------------------------------------------------------
# 4. SUNDIALS IDA
# ---------------------------------------------------------------------------


class _Deadline(Exception):
    pass


def _ida(residual, y0, yp0, prob, rtol, algebraic):
    """One IDA solve to the save grid; **returns** `(ys, seconds, nfev, note)`,
    `ys` truncated where it failed."""
    from sksundae.ida import IDA

    stop = time.perf_counter() + IDA_DEADLINE_S

    def resfn(t, y, yp, res):
        if time.perf_counter() > stop:
            raise _Deadline
        residual(t, y, yp, res)

    solver = IDA(resfn, rtol=rtol, atol=rtol, algebraic_idx=algebraic or None,
                 linsolver="dense", max_num_steps=5000)
    t = time.perf_counter()
    try:
        sol = solver.solve(prob.ts, y0, yp0)
    except _Deadline:
        return np.zeros((0, len(y0))), time.perf_counter() - t, -1, (
            f"stopped after {IDA_DEADLINE_S:.0f} s")
    seconds = time.perf_counter() - t
    ys = np.asarray(sol.y)
    n = int(np.sum(np.isin(np.asarray(sol.t), prob.ts)))
    note = "" if sol.success else (
        f"failed at t = {float(np.ravel(sol.t)[-1]):.4g} s: {sol.message}")
    return ys[:n], seconds, int(sol.nfev), note


def _dae_residual(t, y, yp, res):
    """Index-1 R2: q' - v, M v' - Q - A^T lambda, A v' - b_v."""
    q, v, lam = y[:6], y[6:12], y[12:]
    A = _jacobian(q)
    res[:6] = yp[:6] - v
    res[6:12] = M_DIAG * yp[6:12] - Q_FORCE - A.T @ lam
    res[12:] = A @ yp[6:12] - _b_v(q, v)


def _ode_residual(t, y, yp, res):
    res[:] = yp - np.asarray(_minimal_rhs(t, y))


def ida_pareto(prob: Problem, rtols, repeats: int):
    """IDA on the index-1 DAE (consistent start: v' and lambda from the KKT
    system at t = 0) and on eq. 24 as an implicit ODE, at rtol = atol. A solve
    that fails (the DAE's KKT matrix is singular at theta1 = -pi/2) counts as
    failed, with where it stopped in the note; only successful solves are
    repeated for timing."""
    q0, v0 = prob.q0, prob.v0
    A = _jacobian(q0)
    kkt = np.block([[np.diag(M_DIAG), -A.T], [A, np.zeros((5, 5))]])
    acc_lam = np.linalg.solve(kkt, np.concatenate([Q_FORCE, _b_v(q0, v0)]))
    dae = (_dae_residual, np.concatenate([q0, v0, acc_lam[6:]]),
           np.concatenate([v0, acc_lam[:6], np.zeros(5)]), list(range(12, 17)))
    y0 = np.array([math.pi / 4, 0.0])
    ode = (_ode_residual, y0, np.asarray(_minimal_rhs(0.0, y0)), [])
    points = []
    for name, (residual, y0, yp0, alg) in (("IDA index-1 DAE", dae),
                                           ("IDA minimal ODE", ode)):
        for rtol in rtols:
            ys, seconds, nfev, note = _ida(residual, y0, yp0, prob, rtol, alg)
            for _ in range(repeats if not note else 0):
                seconds = min(seconds, _ida(residual, y0, yp0, prob, rtol, alg)[1])
            if not note and not name.endswith("ODE"):
                note = branch_note(ys[:, :6])
            if not len(ys) or note.startswith(("failed", "stopped")):
                err = math.inf
            else:
                err = theta_error(ys[:, 0 if name.endswith("ODE") else 2], prob)
            phi = (math.nan if name.endswith("ODE") or not len(ys)
                   else constraint_error(ys[:, :6]))
            points.append(Point(name, f"rtol={rtol:.0e}", seconds, err, phi,
                                f"{nfev} residuals", note))
            print(f"  {name} rtol={rtol:.0e}: theta err {_fmt(err)}, "
                  f"Phi {_fmt(phi)}, {seconds:.3f} s {note}", flush=True)
    return points


# ---------------------------------------------------------------------------
# 5. MuJoCo and MJX
# ---------------------------------------------------------------------------

#: R2 in MJCF. Joints: the slider's x (slide), the rod's absolute direction
#: alpha_r seen from the slider (hinge), the crank's direction relative to the
#: rod (hinge); the crank's free end is pinned to the origin by `connect`.
MJCF = """
<mujoco model="slider-crank R2">
  <compiler angle="radian" inertiafromgeom="false"/>
  <option timestep="{dt}" gravity="0 {gy} 0" integrator="{integrator}"
          solver="Newton" iterations="100" tolerance="1e-12">
    <flag contact="disable"/>
  </option>
  <worldbody>
    <site name="pivot" pos="0 0 0"/>
    <body name="slider">
      <joint name="slide" type="slide" axis="1 0 0"/>
      <inertial pos="0 0 0" mass="1e-9" diaginertia="1e-9 1e-9 1e-9"/>
      <body name="rod">
        <joint name="rod" type="hinge" axis="0 0 1"/>
        <inertial pos="{h} 0 0" mass="{m}" diaginertia="1e-9 {inertia} {inertia}"/>
        <geom type="capsule" fromto="0 0 0 {l} 0 0" size="0.02" mass="0"/>
        <body name="crank" pos="{l} 0 0">
          <joint name="crank" type="hinge" axis="0 0 1"/>
          <inertial pos="{h} 0 0" mass="{m}" diaginertia="1e-9 {inertia} {inertia}"/>
          <geom type="capsule" fromto="0 0 0 {l} 0 0" size="0.02" mass="0"/>
          <site name="crank_pivot" pos="{l} 0 0"/>
        </body>
      </body>
    </body>
  </worldbody>
  <equality>
    <connect site1="crank_pivot" site2="pivot" solref="{solref}" solimp="{solimp}"/>
  </equality>
</mujoco>
"""
STIFF_SOLIMP = "0.9999 0.9999 0.001 0.5 2"
DEFAULT_SOLIMP = "0.9 0.95 0.001 0.5 2"


def mujoco_model(dt: float, integrator: str = "RK4", solref: str | None = None,
                 solimp: str = STIFF_SOLIMP):
    """The MjModel of R2 at `timestep = dt`; `solref` defaults to the stiffest
    that refsafe allows, time constant 2 dt, critical damping."""
    import mujoco

    xml = MJCF.format(dt=dt, gy=-G, integrator=integrator, h=H, l=L, m=MASS,
                      inertia=MASS * L**2 / 12,
                      solref=solref or f"{2 * dt!r} 1", solimp=solimp)
    return mujoco.MjModel.from_xml_string(xml)


def mujoco_qpos(theta1: float):
    """Joint positions of the R2 state theta2 = -theta1 (slider x, alpha_r, psi)."""
    return np.array([2 * L * math.cos(theta1), math.pi - theta1, 2 * theta1])


def mujoco_to_r2(qpos):
    """(theta1, q in R2's absolute coordinates) from joint positions (..., 3)."""
    qpos = np.asarray(qpos, dtype=float)
    xs, alpha_r, psi = qpos[..., 0], qpos[..., 1], qpos[..., 2]
    alpha_c = alpha_r + psi  # the crank's direction, from the rod end to the pivot
    ex, ey = xs + L * np.cos(alpha_r), L * np.sin(alpha_r)  # the crank-rod joint
    theta1, theta2 = alpha_c - math.pi, alpha_r - math.pi
    q = np.stack([ex + H * np.cos(alpha_c), ey + H * np.sin(alpha_c), theta1,
                  xs + H * np.cos(alpha_r), H * np.sin(alpha_r), theta2], axis=-1)
    return theta1, q


def mujoco_run(m, prob: Problem):
    """One trajectory: `mj_step(nstep)` from save time to save time; returns the
    joint positions on the save grid (NaN after an instability)."""
    import mujoco

    d = mujoco.MjData(m)
    d.qpos[:] = mujoco_qpos(math.pi / 4)
    d.qvel[:] = 0.0
    mujoco.mj_forward(m, d)
    every = steps_of(SAVE_DT, m.opt.timestep)
    out = np.full((len(prob.ts), 3), np.nan)
    out[0] = d.qpos
    for k in range(1, len(prob.ts)):
        mujoco.mj_step(m, d, nstep=every)
        out[k] = d.qpos
        if not np.all(np.isfinite(d.qpos)) or d.warning[
                mujoco.mjtWarning.mjWARN_BADQACC].number:
            out[k] = np.nan
            break
    return out


def mujoco_check(prob: Problem):
    """Same problem: MuJoCo's initial crank acceleration (stiff constraint, t = 0)
    against eq. 24's, and the mapped state against R2's q0."""
    import mujoco

    m = mujoco_model(1e-4)
    d = mujoco.MjData(m)
    d.qpos[:] = mujoco_qpos(math.pi / 4)
    mujoco.mj_forward(m, d)
    acc = d.qacc[1] + d.qacc[2]  # theta1'' = alpha_r'' + psi''
    exact = _minimal_rhs(0.0, [math.pi / 4, 0.0])[1]
    _, q = mujoco_to_r2(d.qpos)
    print(f"  MuJoCo check: theta1''(0) = {acc:.9f} vs eq. 24 {exact:.9f}; "
          f"|q0 - q0_R2| = {np.max(np.abs(q - prob.q0)):.1e}; total mass "
          f"{sum(m.body_mass):.9f}", flush=True)
    if abs(acc - exact) > 1e-3 * abs(exact) or np.max(np.abs(q - prob.q0)) > 1e-12:
        raise SystemExit("the MJCF model is not R2")


def mujoco_pareto(prob: Problem, dts, repeats: int):
    """MuJoCo (C) one trajectory at a time at `timestep` in `dts`: RK4 and
    implicitfast with the stiff constraint (solimp 0.9999, solref 2 dt) and RK4
    with MuJoCo's default solref/solimp (0.02 s, 0.9-0.95). Cost: best wall
    time of the whole trajectory loop."""
    points = []
    for series, integrator, solref, solimp in (
        ("MuJoCo RK4, stiff", "RK4", None, STIFF_SOLIMP),
        ("MuJoCo implicitfast, stiff", "implicitfast", None, STIFF_SOLIMP),
        ("MuJoCo RK4, default solref/solimp", "RK4", "0.02 1", DEFAULT_SOLIMP),
    ):
        for dt in dts:
            m = mujoco_model(dt, integrator, solref, solimp)
            _, best, qpos = timed(lambda: mujoco_run(m, prob), repeats)
            theta, q = mujoco_to_r2(qpos)
            points.append(Point(series, f"dt={dt:g}", best, theta_error(theta, prob),
                                constraint_error(q), f"{steps_of(prob.t1, dt)} steps",
                                branch_note(q)))
        print(f"  {series}: " + ", ".join(
            f"{p.setting} {_fmt(p.error)}" for p in points[-len(dts):]), flush=True)
    return points


def mujoco_softness(prob: Problem, dt: float):
    """theta1 error of MuJoCo RK4 at one timestep against the constraint
    impedance d = solimp[0] = solimp[1] (solref 2 dt): the softness floor."""
    rows = []
    for d in (0.9, 0.99, 0.999, 0.9999):
        m = mujoco_model(dt, solimp=f"{d} {d} 0.001 0.5 2")
        theta, q = mujoco_to_r2(mujoco_run(m, prob))
        rows.append((dt, d, theta_error(theta, prob), constraint_error(q)))
    print("  MuJoCo softness: " + ", ".join(f"d={d} {_fmt(e)}" for _, d, e, _ in rows))
    return rows


def mujoco_throughput(prob: Problem, batch: int, repeats: int, dt: float = 1e-3):
    """Steps/s of MuJoCo RK4 (stiff) at `dt` over t1: `mj_step` one trajectory,
    and `mujoco.rollout` of `batch` trajectories on 2 threads (states of every
    step kept, as rollout does)."""
    import mujoco
    from mujoco import rollout

    m = mujoco_model(dt)
    steps = steps_of(prob.t1, dt)
    rows = []
    _, best, _ = timed(lambda: mujoco_run(m, prob), repeats)
    rows.append(("MuJoCo RK4 mj_step, one trajectory", 1, dt, steps, 0.0, best,
                 steps / best))
    d = mujoco.MjData(m)
    d.qpos[:] = mujoco_qpos(math.pi / 4)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.empty(mujoco.mj_stateSize(m, spec))
    mujoco.mj_getState(m, d, state, spec)
    states = np.tile(state, (batch, 1))
    states[:, 2] += np.linspace(0.0, 1e-6, batch)  # qpos[1]: the rod's direction
    nstep = min(steps, 1000)
    datas = [mujoco.MjData(m) for _ in range(2)]
    pool = rollout.Rollout(nthread=2)
    try:
        _, best, _ = timed(lambda: pool.rollout(m, datas, states, nstep=nstep),
                           repeats)
    finally:
        pool.close()
    rows.append((f"MuJoCo RK4 rollout, {batch} traj, 2 threads", batch, dt, nstep,
                 0.0, best, batch * nstep / best))
    for r in rows:
        print(f"  {r[0]}: {r[5]:.3f} s, {r[6]:,.0f} steps/s", flush=True)
    return rows


def mjx_bench(prob: Problem, dts, batch: int, repeats: int):
    """MJX (JAX) on the MJCF model, RK4, stiff constraint: one jitted trajectory
    over t1 at each timestep of `dts` (timestep, solref and steps per save are
    traced: one compilation), compared with MuJoCo C at the same settings; and
    the throughput of a vmapped batch over 1000 steps at dt = 1e-3.
    **Returns** `(throughput rows, points)`."""
    import mujoco
    from mujoco import mjx

    base = mujoco_model(dts[0])
    mx0 = mjx.put_model(base)
    d = mujoco.MjData(base)
    d.qpos[:] = mujoco_qpos(math.pi / 4)
    dx0 = mjx.put_data(base, d)
    n_save = len(prob.ts) - 1

    def trajectory(mx, dx, every):
        def save(dx, _):
            dx = jax.lax.fori_loop(0, every, lambda i, dx: mjx.step(mx, dx), dx)
            return dx, dx.qpos
        _, qs = jax.lax.scan(save, dx, None, length=n_save)
        return jnp.concatenate([dx.qpos[None], qs])

    def with_dt(dt):
        return mx0.tree_replace({"opt.timestep": jnp.asarray(dt),
                                 "eq_solref": mx0.eq_solref.at[:, 0].set(2 * dt)})

    single = _jit(trajectory)
    points, rows = [], []
    for k, dt in enumerate(dts):
        every = jnp.asarray(steps_of(SAVE_DT, dt))
        first, best, qpos = timed(lambda: single(with_dt(dt), dx0, every), repeats)
        theta, q = mujoco_to_r2(np.asarray(qpos))
        c_theta, _ = mujoco_to_r2(mujoco_run(mujoco_model(dt), prob))
        gap = float(np.max(np.abs(theta - c_theta)))
        steps = steps_of(prob.t1, dt)
        points.append(Point("MJX RK4, stiff (1 traj)", f"dt={dt:g}", best,
                            theta_error(theta, prob), constraint_error(q),
                            f"{steps} steps", f"|θ1 − θ1 of MuJoCo C| = {gap:.1e} "
                            + branch_note(q)))
        if k == 0:
            rows.append(("MJX RK4, one trajectory", 1, dt, steps, first - best, best,
                         steps / best))
        print(f"  MJX dt={dt:g}: theta err {_fmt(points[-1].error)}, {best:.3f} s, "
              f"vs MuJoCo C {gap:.1e}", flush=True)

    nstep, dt = 1000, 1e-3
    mx = with_dt(dt)

    def roll(dq):
        dx = dx0.replace(qpos=dx0.qpos.at[1].add(dq))
        return jax.lax.fori_loop(0, nstep, lambda i, dx: mjx.step(mx, dx), dx).qpos

    batched = _jit(jax.vmap(roll))
    dqs = _config.shard(jnp.linspace(0.0, 1e-6, batch))
    first, best, _ = timed(lambda: batched(dqs), repeats)
    rows.append(("MJX RK4, vmapped batch", batch, dt, nstep, first - best, best,
                 batch * nstep / best))
    print(f"  MJX batch {batch} x {nstep}: compile {first - best:.1f} s, run "
          f"{best:.3f} s, {batch * nstep / best:,.0f} steps/s", flush=True)
    return rows, points


# ---------------------------------------------------------------------------
# 6. The Pareto front: cost to reach 1e-6, figure, CSV
# ---------------------------------------------------------------------------


def cost_at(points, target: float = TARGET):
    """Cost per trajectory at which a series reaches `target`: the cheapest
    setting at or below it, interpolated in log-log with the next cheaper
    setting (which is above it). **Returns** `(cost, how)`: how is
    "interpolated", "<= cheapest" (already below at the cheapest setting, or
    the cheaper neighbour failed), or "not reached (best ...)" with cost NaN."""
    pts = sorted(points, key=lambda p: p.cost)
    for i, p in enumerate(pts):
        if p.error <= target:
            if i == 0 or not math.isfinite(pts[i - 1].error):
                return p.cost, "<= cheapest" if i == 0 else "<= (neighbour failed)"
            a = pts[i - 1]
            la, lb = math.log(a.error), math.log(p.error)
            s = (math.log(target) - la) / (lb - la)
            return math.exp(math.log(a.cost) + s * math.log(p.cost / a.cost)), \
                "interpolated"
    finite = [p for p in pts if math.isfinite(p.error)]
    best = min(finite, key=lambda p: p.error) if finite else None
    how = (f"not reached in the sweep (best {best.error:.2g} at {best.setting})"
           if best else "not reached (all failed)")
    return math.nan, how


def _series(points):
    out: dict[str, list[Point]] = {}
    for p in points:
        out.setdefault(p.series, []).append(p)
    return out


def _family(series: str) -> str:
    """The series without its " (1 traj)" / " (batch N)" suffix."""
    return series.split(" (")[0]


def pareto_figure(points, path: Path, t1: float):
    """Log-log theta1 error against cost per trajectory, one line per series
    (one colour per tool and formulation; batched dashed), a horizontal line at
    1e-6 and a star, labelled with its cost, where each series crosses it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 7.5))
    ceiling = 10.0
    families = list(dict.fromkeys(_family(p.series) for p in points))
    cmap = plt.get_cmap("tab20")
    colours = {f: cmap((2 * i) % 20 + (i >= 10)) for i, f in enumerate(families)}
    markers = "osD^v<>pPhX*d"
    for name, pts in _series(points).items():
        family = _family(name)
        colour = colours[family]
        marker = markers[families.index(family) % len(markers)]
        pts = sorted(pts, key=lambda p: p.cost)
        x = [p.cost for p in pts]
        y = [min(p.error, ceiling) for p in pts]
        ax.plot(x, y, "--" if "batch" in name else "-", marker=marker, ms=4,
                color=colour, label=name)
        failed = [(p.cost, ceiling) for p in pts if not p.error <= ceiling]
        if failed:
            ax.plot(*zip(*failed), "x", color=colour, ms=10, mew=2)
        cost, _ = cost_at(pts)
        if math.isfinite(cost):
            ax.plot([cost], [TARGET], "*", color=colour, ms=15, markeredgecolor="k")
            ax.annotate(f"{cost * 1e3:.3g} ms", (cost, TARGET), xytext=(0, -14),
                        textcoords="offset points", rotation=90, ha="center",
                        va="top", fontsize=7, color=colour)
    ax.axhline(TARGET, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("wall time per trajectory [s]  (batched, dashed: batch time / "
                  "batch size)")
    ax.set_ylabel(f"max |θ1 − θ1_ref| over [0, {t1:g}] s [rad]")
    ax.set_title(f"R2 slider-crank, {t1:g} s, float64: accuracy against cost. "
                 f"Stars: cost to reach {TARGET:g}; x: failed or error >= {ceiling:g} "
                 f"(drawn at {ceiling:g})",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def write_csv(points, path: Path):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["series", "setting", "cost_s_per_trajectory", "theta1_error_rad",
                    "constraint_error_m", "work", "note"])
        for p in points:
            w.writerow([p.series, p.setting, f"{p.cost:.6g}", f"{p.error:.6g}",
                        f"{p.constraint:.6g}", p.work, p.note])


# ---------------------------------------------------------------------------
# Tables and main
# ---------------------------------------------------------------------------


def throughput_table(rows) -> str:
    numpy_sps = next((r[6] for r in rows if r[0].startswith("NumPy")), None)
    lines = ["| tool | trajectories | dt [s] | steps/traj | compile [s] | run [s] | "
             "steps/s | x NumPy |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, n, dt, steps, comp, run, sps in rows:
        ratio = f"{sps / numpy_sps:,.1f}" if numpy_sps else "—"
        lines.append(f"| {name} | {n} | {dt:g} | {steps} | {comp:.2f} | {run:.4f} | "
                     f"{sps:,.0f} | {ratio} |")
    return "\n".join(lines)


def points_table(points) -> str:
    lines = ["| series | setting | cost/traj [s] | θ1 error [rad] | max ‖Φ_q‖ [m] | "
             "work | note |", "|---|---|---:|---:|---:|---|---|"]
    for p in points:
        lines.append(f"| {p.series} | {p.setting} | {p.cost:.3g} | {_fmt(p.error)} | "
                     f"{_fmt(p.constraint)} | {p.work} | {p.note} |")
    return "\n".join(lines)


def target_table(points) -> str:
    series = _series(points)
    costs = {name: cost_at(pts) for name, pts in series.items()}
    ref = next((c for n, (c, _) in costs.items()
                if n.startswith("cdiff UK c+e (batch") and math.isfinite(c)), None)
    lines = [f"| series | cost/traj to reach {TARGET:g} [s] | / cdiff UK c+e batched | "
             "how |", "|---|---:|---:|---|"]
    for name, (cost, how) in costs.items():
        rel = f"{cost / ref:.3g}" if ref and math.isfinite(cost) else "—"
        lines.append(f"| {name} | {_fmt(cost)} | {rel} | {how} |")
    return "\n".join(lines)


def softness_table(rows) -> str:
    lines = ["| timestep [s] | solimp d | θ1 error [rad] | max ‖Φ_q‖ [m] |",
             "|---:|---:|---:|---:|"]
    for dt, d, err, phi in rows:
        lines.append(f"| {dt:g} | {d} | {_fmt(err)} | {_fmt(phi)} |")
    return "\n".join(lines)


def _available(tool: str):
    """None if the tool's packages import, else the reason."""
    modules = {"scipy": ["scipy.integrate"], "ida": ["sksundae.ida"],
               "mujoco": ["mujoco", "mujoco.rollout"], "mjx": ["mujoco", "mujoco.mjx"]}
    for name in modules.get(tool, []):
        try:
            __import__(name)
        except Exception as e:  # ImportError, or a broken binary
            return f"not installed ({name}: {type(e).__name__}: {e})".splitlines()[0]
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=None,
                        help="cdiff throughput batch (default 4096; --quick 256)")
    parser.add_argument("--pareto-batch", type=int, default=None,
                        help="batch of the cdiff accuracy/cost sweep (default 256; "
                        "--quick 32)")
    parser.add_argument("--mjx-batch", type=int, default=None,
                        help="MJX and MuJoCo rollout batch (default 256; --quick 16)")
    parser.add_argument("--t1", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repeats after the first call (default 2; "
                        "--quick 1)")
    parser.add_argument("--quick", action="store_true", help="small sweeps (smoke run)")
    parser.add_argument("--only", nargs="+", choices=TOOLS, metavar="TOOL",
                        help=f"run only these tools ({', '.join(TOOLS)})")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "out")
    _config.add_arguments(parser)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    _config.apply(args)
    global _OPTIONS
    _OPTIONS = _config.options(args.xla_options)
    q = 1 if args.quick else 0
    batch = args.batch or (256 if args.quick else 4096)
    pareto_batch = args.pareto_batch or (32 if args.quick else 256)
    mjx_batch = args.mjx_batch or (16 if args.quick else 256)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 2)
    tools = args.only or TOOLS
    args.out.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0]
    print(f"device: {device.platform} ({device.device_kind}), jax {jax.__version__}, "
          f"numpy {np.__version__}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}",
          flush=True)
    start = time.perf_counter()
    prob = Problem.build(args.t1)
    throughput, points, notes = [], [], []
    softness = []
    for tool in tools:
        reason = _available(tool)
        if reason:
            print(f"{tool}: {reason}")
            notes.append(f"{tool}: {reason}")
            continue
        print(f"{tool}:", flush=True)
        if tool == "cdiff":
            throughput += cdiff_throughput(prob, batch, repeats)
            pts, compiles = cdiff_pareto(prob, CDIFF_DTS[q], pareto_batch, repeats)
            points += pts
            notes += [f"compile {n}: {c1:.1f} s single, {cb:.1f} s batched"
                      for n, c1, cb in compiles]
        elif tool == "numpy":
            row, pts, diff = numpy_bench(prob, CDIFF_DTS[q], repeats)
            throughput.append(row)
            points += pts
            notes.append(f"NumPy vs cdiff, UK c+e RK4 dt={THROUGHPUT_DT:g}: max |Δq| "
                         f"= {diff:.1e}")
        elif tool == "scipy":
            points += scipy_pareto(prob, SCIPY_RTOLS[q], repeats)
        elif tool == "ida":
            points += ida_pareto(prob, IDA_RTOLS[q], repeats)
        elif tool == "mujoco":
            mujoco_check(prob)
            points += mujoco_pareto(prob, MUJOCO_DTS[q], repeats)
            softness = mujoco_softness(prob, 1e-3 if args.quick else 1e-4)
            throughput += mujoco_throughput(prob, mjx_batch, repeats)
        elif tool == "mjx":
            try:
                rows, pts = mjx_bench(prob, MJX_DTS[q], mjx_batch, repeats)
            except Exception as e:  # an MJX that does not run with this jax
                print(f"  MJX failed: {type(e).__name__}: {e}")
                notes.append(f"mjx: failed ({type(e).__name__}: {e})".splitlines()[0])
                continue
            throughput += rows
            points += pts
    tables = []
    if throughput:
        tables.append("Throughput (RK4 steps/s over all trajectories):\n\n"
                      + throughput_table(throughput))
    if points:
        tables.append("Accuracy and cost, every setting:\n\n" + points_table(points))
        tables.append(f"Cost per trajectory to reach a θ1 error of {TARGET:g} rad "
                      f"over {args.t1:g} s:\n\n" + target_table(points))
        write_csv(points, args.out / "pareto.csv")
        try:
            pareto_figure(points, args.out / "pareto.png", args.t1)
            print(f"wrote {args.out / 'pareto.png'} and {args.out / 'pareto.csv'}")
        except ImportError:
            print("matplotlib: not installed (no figure)")
    if softness:
        tables.append("MuJoCo RK4, constraint impedance (solimp) against error:\n\n"
                      + softness_table(softness))
    if notes:
        tables.append("Notes: " + "; ".join(notes) + ".")
    table = "\n\n".join(tables)
    print()
    print(table)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.record:
        record("compare.py",
               f"R2 slider-crank, {args.t1:g} s, float64, same start and exact "
               "reference for every tool. θ1 error: max over t = 0, 0.1, ... s of "
               "|θ1 − θ1_ref|; ‖Φ_q‖: max position-constraint residual (absolute "
               "coordinates). Cost: best wall time per trajectory (batched: batch "
               f"time / batch), compile apart; best of {repeats}. cdiff batch "
               f"{batch} (throughput), {pareto_batch} (sweep). NumPy, SciPy, IDA "
               "and mj_step on one core; XLA and rollout on all. "
               f"{_config.describe(args)} XLA_FLAGS: "
               f"`{os.environ.get('XLA_FLAGS', '') or '(none)'}`.", table)


if __name__ == "__main__":
    main()
