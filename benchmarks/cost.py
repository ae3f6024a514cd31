"""Cost of the formulations on the slider-crank (R2), side by side in one run.

Braun & Goldfarb (Fig. 4e) claim that the energy correction "makes the integration
only slightly more expensive". This script measures it, and the cost of the other
formulations and of post-step projection: R2, RK4, dt = 1e-2, 100 s, float64, for
one trajectory and for a vmapped batch, compile time reported apart.

    python benchmarks/cost.py [--batch 64] [--repeats 3] [--only NAME ...] [--record]

`--record` records the table in benchmarks/RESULTS.md and HISTORY.md.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402

def _projected(projection):
    return cdiff.Projected(cdiff.RK4(), projection)


#: name -> (formulation, solver); solver None is plain RK4.
FORMULATIONS = {
    "Lagrange(alpha=10, beta=10)": (cdiff.Lagrange(10.0, 10.0), None),
    "UdwadiaKalaba (constraint)": (cdiff.UdwadiaKalaba(), None),
    "UdwadiaKalaba (constraint + energy)": (
        cdiff.UdwadiaKalaba(energy_correction=True), None),
    # Projection alone drifts and is thrown off at a singular passage of R2 within
    # 100 s (non-finite state): it is only measured with a post-step projection.
    "Projection + NewtonProjection": (
        cdiff.Projection(), _projected(cdiff.NewtonProjection())),
    "Projection + NewtonProjection(mass_weighted)": (
        cdiff.Projection(), _projected(cdiff.NewtonProjection(mass_weighted=True))),
    "Lagrange(0, 0) + GradientProjection": (
        cdiff.Lagrange(), _projected(cdiff.GradientProjection())),
    "NullSpace(alpha=10)": (cdiff.NullSpace(alpha=10.0, dof=1), None),
}


def _runner(setup, batch, t1, dt):
    formulation, solver = setup
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    save = cdiff.SaveAt(t1=True)

    def one(dq):
        sol = cdiff.simulate(model, formulation, q0 + dq, v0, t1=t1, dt=dt,
                             saveat=save, solver=solver)
        return sol.q[-1]

    if batch == 1:
        return jax.jit(lambda: one(jnp.zeros(6))), ()
    # Tiny perturbations of the initial angle: a batch of distinct trajectories.
    dq = jnp.zeros((batch, 6)).at[:, 2].set(jnp.linspace(0.0, 1e-6, batch))
    return jax.jit(jax.vmap(one)), (dq,)


def measure(formulation, batch, t1, dt, repeats):
    fn, args = _runner(formulation, batch, t1, dt)
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    compile_and_first = time.perf_counter() - t
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    steps = batch * round(t1 / dt)
    return compile_and_first - best, best, steps / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--t1", type=float, default=100.0)
    parser.add_argument("--dt", type=float, default=1e-2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="measure only the formulations whose names contain one "
                        "of these words (UdwadiaKalaba (constraint) is always kept)")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for name, formulation in FORMULATIONS.items():
        if args.only and name != "UdwadiaKalaba (constraint)" and not any(
            word in name for word in args.only
        ):
            continue
        for batch in (1, args.batch):
            compile_s, run_s, sps = measure(formulation, batch, args.t1, args.dt,
                                            args.repeats)
            rows.append((name, batch, compile_s, run_s, sps))
            print(f"{name:38s} batch {batch:5d}: compile {compile_s:6.2f} s, "
                  f"run {run_s:7.3f} s, {sps:12,.0f} steps/s", flush=True)
    base = {b: r for n, b, _, r, _ in rows if n == "UdwadiaKalaba (constraint)"}
    lines = [
        "| formulation | batch | compile [s] | run [s] | steps/s | time / UK (constraint) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, batch, c, r, sps in rows:
        lines.append(f"| {name} | {batch} | {c:.2f} | {r:.3f} | {sps:,.0f} | "
                     f"{r / base[batch]:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        record("cost.py", "R2 slider-crank, RK4, float64; steps/s counts all "
               "trajectories; compile time apart. Projected rows: RK4 wrapped in "
               "cdiff.Projected (3 Newton iterations + 1 velocity step per step).",
               table)

if __name__ == "__main__":
    main()
