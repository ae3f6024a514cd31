"""The DAE approach against the ODE formulations on R8, in one run: accuracy and cost.

    python benchmarks/dae.py [--batch 64] [--record]

The planar arm on x = 1 and on the circle (Costa-Castello §5.2), free motion from the
release (t = 0.5 s) to 3 s, float64. For each setup: steps, compile time, run time
(best of 3), max error of (theta1, theta2) against the exact reference of the model
and the max constraint residual. Then the cost of `jax.grad` through BDF (w.r.t. the
mass of link 2) relative to the solve, and a `jax.vmap`ped batch of arms with
different link masses (BDF against RK4).
"""

from __future__ import annotations

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402
from cdiff.models import PlanarArmOnCurve  # noqa: E402

T0, T1 = 0.5, 3.0
TS = jnp.linspace(T0, T1, 251)


def _timed(fn, *args, repeats=3):
    """(compile s, best run s, output) of an `eqx.filter_jit`-ed call."""
    jitted = eqx.filter_jit(fn)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - start)
    return compile_s, best, out


def _setups():
    for rtol in (1e-6, 1e-8, 1e-10):
        yield f"GGL + BDF(rtol = atol = {rtol:g})", cdiff.GGL(), cdiff.BDF(rtol, rtol), 1e-4
    yield ("GGL no_inverse + BDF(1e-8)", cdiff.GGL("no_inverse"), cdiff.BDF(1e-8, 1e-8),
           1e-4)
    yield "IndexOne + BDF(1e-8)", cdiff.IndexOne(), cdiff.BDF(1e-8, 1e-8), 1e-4
    yield "Lagrange(0, 0) + BDF(1e-8)", cdiff.Lagrange(), cdiff.BDF(1e-8, 1e-8), 1e-4
    for dt in (1e-3, 1e-4):
        yield f"Lagrange(0, 0) + RK4, dt = {dt:g}", cdiff.Lagrange(), None, dt
    for dt in (1e-2, 1e-3):
        yield f"UdwadiaKalaba + RK4, dt = {dt:g}", cdiff.UdwadiaKalaba(), None, dt


def accuracy_table(curve):
    model = PlanarArmOnCurve(curve)
    q0, v0 = model.initial_state()
    exact = np.asarray(model.reference(TS).q)
    rows = []
    for name, formulation, solver, dt in _setups():
        def run(model, q0, v0, formulation=formulation, solver=solver, dt=dt):
            return cdiff.simulate(model, formulation, q0, v0, t0=T0, t1=T1, dt=dt,
                                  solver=solver, saveat=cdiff.SaveAt(ts=TS))

        compile_s, run_s, sol = _timed(run, model, q0, v0)
        err = float(np.abs(np.asarray(sol.q) - exact).max())
        steps = int(sol.stats["num_steps"])
        rows.append(f"| {curve} | {name} | {steps} | {compile_s:.1f} | {run_s * 1e3:.1f} "
                    f"| {err:.1e} | {float(sol.max_constraint_error):.1e} |")
        print(rows[-1], flush=True)
    return rows


def gradient_ratio():
    base = PlanarArmOnCurve("line_x1")
    q0, v0 = base.initial_state()

    def final_angle(m2):
        model = eqx.tree_at(lambda m: m.m2, base, m2)
        sol = cdiff.simulate(model, cdiff.GGL(), q0, v0, t0=T0, t1=T1, dt=1e-4,
                             solver=cdiff.BDF(1e-8, 1e-8),
                             saveat=cdiff.SaveAt(t1=True))
        return sol.q[-1, 0]

    m2 = jnp.asarray(5.0)
    _, forward_s, _ = _timed(final_angle, m2)
    _, grad_s, _ = _timed(jax.grad(final_angle), m2)
    return forward_s, grad_s


def batch_table(batch):
    base = PlanarArmOnCurve("line_x1")
    q0, v0 = base.initial_state()
    masses = jnp.linspace(4.0, 6.0, batch)

    def bdf(m2s):
        def one(m2):
            model = eqx.tree_at(lambda m: m.m2, base, m2)
            return cdiff.simulate(model, cdiff.GGL(), q0, v0, t0=T0, t1=T1, dt=1e-4,
                                  solver=cdiff.BDF(1e-8, 1e-8),
                                  saveat=cdiff.SaveAt(t1=True)).q[-1]
        return jax.vmap(one)(m2s)

    def rk4(m2s):
        def one(m2):
            model = eqx.tree_at(lambda m: m.m2, base, m2)
            return cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t0=T0, t1=T1,
                                  dt=1e-3, saveat=cdiff.SaveAt(t1=True)).q[-1]
        return jax.vmap(one)(m2s)

    rows = []
    for name, fn in (("GGL + BDF(1e-8)", bdf), ("UdwadiaKalaba + RK4, dt = 1e-3", rk4)):
        compile_s, run_s, _ = _timed(fn, masses)
        rows.append(f"| {name} | {batch} | {compile_s:.1f} | {run_s:.3f} | "
                    f"{run_s / batch * 1e3:.2f} |")
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--record", action="store_true",
                        help="record the tables in benchmarks/RESULTS.md and HISTORY.md")
    args = parser.parse_args()
    head = ("| curve | setup | steps | compile (s) | run (ms) | max q error | "
            "max constraint |\n|---|---|---|---|---|---|---|")
    print(head)
    rows = accuracy_table("line_x1") + accuracy_table("circle")
    forward_s, grad_s = gradient_ratio()
    grad_line = (f"\n`jax.grad` of theta1(3 s) w.r.t. m2 through GGL + BDF(1e-8) (x = 1): "
                 f"{grad_s * 1e3:.1f} ms against {forward_s * 1e3:.1f} ms for the solve "
                 f"({grad_s / forward_s:.1f} times).\n")
    print(grad_line)
    batch_head = ("\n| batched (vmap over m2) | batch | compile (s) | run (s) | "
                  "ms per trajectory |\n|---|---|---|---|---|")
    print(batch_head)
    batch_rows = batch_table(args.batch)
    table = "\n".join([head, *rows]) + "\n" + grad_line + batch_head + "\n" + "\n".join(
        batch_rows)
    if args.record:
        record("dae.py", "R8, free motion 0.5 s to 3 s, float64; errors against the "
               "exact references of the model.", table)


if __name__ == "__main__":
    main()
