"""Mid-size models: cost per RK4 step of cdiff against a plain JAX implementation
and SciPy (issue 20, item 4).

    python benchmarks/mid_size.py [--steps 400] [--repeats 5] [--record]

Three models of 60 to 300 coordinates, float64, constant-step RK4 (dt = 1e-3), one
trajectory:

- `cdiff.models.NFourBar(n=40)` (IFToMM A02 in natural coordinates: 82
  coordinates, 81 constraints) and `n=100` (202, 201);
- `cdiff.models.PendulumChain(n=100)` (200 Cartesian coordinates, 100 constraints).

Each is run by
- cdiff: `cdiff.simulate` with `cdiff.UdwadiaKalaba()` (constraint correction,
  the pseudoinverse through the mass-weighted Gram matrix), jitted;
- plain JAX: the textbook index-1 KKT system $[M, A^T; A, 0][\\dot v; -\\lambda] =
  [Q; -\\dot A v]$ solved with `jnp.linalg.solve`, the Jacobian by `jax.jacfwd`, in
  a `lax.scan` of the same RK4 steps, jitted;
- SciPy: the same KKT system with NumPy and `scipy.linalg.solve` (the Jacobian and
  $\\dot A v$ written by hand from the model's equations), the same RK4 steps in a
  Python loop.

and the shipped MJCF N four-bar (`iftomm-a02-n-four-bar`, MJX dynamics, 81 joint
coordinates, 120 constraint rows) with cdiff alone. (The comparison with cdiff
before the kernel changes this benchmark measured, products and sums above 12
rows and reverse-mode Jacobians throughout, is in benchmarks/HISTORY.md; rerun
it from a worktree of an earlier commit.)

Steps per second are the best of `--repeats` runs, the three interleaved; compile
time is the first call minus one run. The error is the largest coordinate error
at the last step against the model's exact or tight-tolerance reference.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

jax.config.update("jax_enable_x64", True)


import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402

DT = 1e-3


def _rk4(f, y, dt):
    k1 = f(y)
    k2 = f(y + 0.5 * dt * k1)
    k3 = f(y + 0.5 * dt * k2)
    k4 = f(y + dt * k3)
    return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def plain_jax(model, steps):
    """The KKT system with `jnp.linalg.solve` and the same RK4, one `lax.scan`."""
    t = jnp.zeros(())

    def rate(y):
        q, v = jnp.split(y, 2)
        M, Q = model.mass_matrix(t, q), model.forces(t, q, v)
        A = jax.jacfwd(lambda q: model.holonomic(t, q))(q)
        # A'v = d/dq (A v) v: the second directional derivative of the residuals.
        Adot_v = jax.jvp(lambda q: jax.jvp(lambda q: model.holonomic(t, q), (q,), (v,))[1],
                         (q,), (v,))[1]
        k = A.shape[0]
        K = jnp.block([[M, A.T], [A, jnp.zeros((k, k), q.dtype)]])
        sol = jnp.linalg.solve(K, jnp.concatenate([Q, -Adot_v]))
        return jnp.concatenate([v, sol[: q.shape[0]]])

    @jax.jit
    def run(q0, v0):
        y = jnp.concatenate([q0, v0])
        y = jax.lax.scan(lambda y, _: (_rk4(rate, y, DT), None), y, None, length=steps)[0]
        return jnp.split(y, 2)[0]

    return run


def _scipy_kinematics(model, q, v):
    """`A` and `A'v` of the two chain models written out with NumPy."""
    p, w = q.reshape(-1, 2), v.reshape(-1, 2)
    k = p.shape[0]
    if isinstance(model, cdiff.models.PendulumChain):
        d = np.diff(p, axis=0, prepend=np.zeros((1, 2)))
        dv = np.diff(w, axis=0, prepend=np.zeros((1, 2)))
        A = np.zeros((k, 2 * k))
        i = np.arange(k)
        A[i, 2 * i], A[i, 2 * i + 1] = 2 * d[:, 0], 2 * d[:, 1]
        A[i[1:], 2 * i[1:] - 2], A[i[1:], 2 * i[1:] - 1] = -2 * d[1:, 0], -2 * d[1:, 1]
        return A, 2 * np.sum(dv**2, axis=1)
    # NFourBar: rows crank 0, coupler 0, crank 1, ..., crank N.
    pivots = float(model.l) * np.arange(k)
    A = np.zeros((2 * k - 1, 2 * k))
    adv = np.zeros(2 * k - 1)
    for i in range(k):
        r = 2 * i
        A[r, 2 * i], A[r, 2 * i + 1] = 2 * (p[i, 0] - pivots[i]), 2 * p[i, 1]
        adv[r] = 2 * np.sum(w[i] ** 2)
        if i + 1 < k:
            d, dv = p[i + 1] - p[i], w[i + 1] - w[i]
            A[r + 1, 2 * i: 2 * i + 2] = -2 * d
            A[r + 1, 2 * i + 2: 2 * i + 4] = 2 * d
            adv[r + 1] = 2 * np.sum(dv**2)
    return A, adv


def scipy_run(model, steps):
    """The KKT system with NumPy and `scipy.linalg.solve`, RK4 in a Python loop."""
    q0, _ = model.initial_state()
    M = np.asarray(model.mass_matrix(0.0, q0))
    n = M.shape[0]

    def rate(y):
        q, v = y[:n], y[n:]
        Q = np.asarray(model.forces(0.0, jnp.asarray(q), jnp.asarray(v))) \
            if rate.Q is None else rate.Q
        A, adv = _scipy_kinematics(model, q, v)
        k = A.shape[0]
        K = np.block([[M, A.T], [A, np.zeros((k, k))]])
        sol = scipy.linalg.solve(K, np.concatenate([Q, -adv]), check_finite=False)
        return np.concatenate([v, sol[:n]])

    rate.Q = np.asarray(model.forces(0.0, q0, jnp.zeros_like(q0)))  # constant

    def run(q0, v0):
        y = np.concatenate([np.asarray(q0), np.asarray(v0)])
        for _ in range(steps):
            y = _rk4(rate, y, DT)
        return y[:n]

    return run


def cdiff_run(model, steps):
    """`cdiff.simulate` with UK, jitted."""
    formulation = cdiff.UdwadiaKalaba()

    @jax.jit
    def run(q0, v0):
        return cdiff.simulate(model, formulation, q0, v0, t1=steps * DT, dt=DT).q[-1]

    return run


def measure(name, model, steps, repeats, scipy_steps):
    q0, v0 = model.initial_state()
    ref = np.asarray(model.reference(jnp.array([steps * DT])).q[-1])
    runs = {"cdiff UK": (cdiff_run(model, steps), steps),
            "plain JAX KKT": (plain_jax(model, steps), steps),
            "SciPy KKT": (scipy_run(model, scipy_steps), scipy_steps)}
    first, best, err = {}, {k: np.inf for k in runs}, {}
    for key, (run, _) in runs.items():
        t = time.perf_counter()
        out = np.asarray(jax.block_until_ready(run(q0, v0)))
        first[key] = time.perf_counter() - t
        if runs[key][1] == steps:
            err[key] = float(np.max(np.abs(out - ref)))
    for _ in range(repeats):
        for key, (run, _) in runs.items():
            t = time.perf_counter()
            jax.block_until_ready(run(q0, v0))
            best[key] = min(best[key], time.perf_counter() - t)
    rows = []
    base = runs["plain JAX KKT"][1] / best["plain JAX KKT"]
    for key, (_, n) in runs.items():
        rate = n / best[key]
        compile_s = max(first[key] - best[key], 0.0) if key != "SciPy KKT" else None
        rows.append((name, key, rate, rate / base,
                     "—" if compile_s is None else f"{compile_s:.1f}",
                     f"{err[key]:.1e}" if key in err else "—"))
        print(rows[-1], flush=True)
    return rows


def measure_mjcf(steps, repeats):
    """The shipped MJCF N four-bar (MJX dynamics, 81 joint coordinates, 120
    constraint rows of which 40 vanish identically): cdiff alone (the plain KKT
    matrix is singular with the redundant rows)."""
    model = cdiff.models.from_mujoco(cdiff.models.mjcf_path("iftomm-a02-n-four-bar"))
    q0, v0 = model.initial_state()
    ref = cdiff.models.NFourBar(n=40).reference(jnp.array([steps * DT]))
    b0 = np.asarray(ref.q[-1, :2])
    runs = {"cdiff UK on the MJCF file (MJX)": cdiff_run(model, steps)}
    n_steps = {"cdiff UK on the MJCF file (MJX)": steps}
    rows = []
    name = "N four-bar, N = 40, MJCF (81, 120)"
    for key, run in runs.items():
        t = time.perf_counter()
        q = np.asarray(jax.block_until_ready(run(q0, v0)))
        first = time.perf_counter() - t
        best = np.inf
        for _ in range(max(repeats // 2, 1)):
            t = time.perf_counter()
            jax.block_until_ready(run(q0, v0))
            best = min(best, time.perf_counter() - t)
        tip = model.site_position(jnp.asarray(q), "B0")[:2]
        err = f"{float(np.max(np.abs(np.asarray(tip) - b0))):.1e} (B0)" \
            if n_steps[key] == steps else "—"
        rows.append((name, key, n_steps[key] / best, None, f"{first - best:.1f}", err))
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    cases = [
        ("N four-bar, N = 40 (82 coordinates, 81 constraints)",
         cdiff.models.NFourBar(n=40)),
        ("N four-bar, N = 100 (202, 201)", cdiff.models.NFourBar(n=100)),
        ("100-pendulum chain (200, 100)", cdiff.models.PendulumChain(n=100)),
    ]
    rows = []
    for name, model in cases:
        rows += measure(name, model, args.steps, args.repeats, max(args.steps // 4, 10))
    rows += measure_mjcf(args.steps // 4, args.repeats)
    table = ("| model | implementation | RK4 steps/s | ÷ plain JAX | compile (s) | "
             f"error at t = {args.steps * DT:g} s |\n|---|---|---:|---:|---:|---:|\n")
    table += "\n".join(
        f"| {m} | {k} | {r:,.0f} | {'—' if x is None else f'{x:.2f}'} | {c} | {e} |"
        for m, k, r, x, c, e in rows)
    print(table)
    if args.record:
        record("mid_size.py", __doc__.split("\n\n")[2].strip(), table)


if __name__ == "__main__":
    main()
