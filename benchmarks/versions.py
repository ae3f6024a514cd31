"""Two or more versions of cdiff in one process: R2's simulation and its gradient,
timed in interleaved rounds (this VM's speed drifts by tens of percent within
minutes, so separate runs of two versions compare badly).

    git worktree add /tmp/cdiff-old <commit>
    mkdir -p /tmp/versions && cp -r /tmp/cdiff-old/cdiff /tmp/versions/cdiff_old \\
        && cp -r cdiff /tmp/versions/cdiff_new
    python benchmarks/versions.py /tmp/versions cdiff_old cdiff_new [--batch 64]
        [--rounds 15] [--case rk4|projected|consistent] [--record]

Each argument after the folder is a copy of the `cdiff` package under another name
(the package imports itself relatively, so copies load side by side). The loss is
that of `gradients.py`: R2, UdwadiaKalaba + RK4, dt = 1e-2, 10 s, float64, the mean
squared slider position, differentiated with respect to the link length and gravity
by `jax.grad`; every program is compiled with `cdiff.compiler_options()`. Reported:
the best of `--rounds` interleaved rounds.

`--case projected`: the same with `cdiff.Projected(cdiff.RK4(),
cdiff.NewtonProjection(mass_weighted=True))` (a Gauss-Newton projection after every
step). `--case consistent`: `cdiff.consistent_state` from R2's initial state with
its angle and slider moved by 0.05 (30 tol-gated Gauss-Newton steps), the loss the
squared norm of the state it returns.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

from _record import record  # noqa: E402


CASES = {
    "rk4": "R2, UdwadiaKalaba + RK4, dt = 1e-2, 10 s",
    "projected": "R2, UdwadiaKalaba + Projected(RK4, NewtonProjection(mass_weighted="
                 "True)), dt = 1e-2, 10 s",
    "consistent": "R2, consistent_state from a guess 0.05 off",
}


def _programs(cd, p, batch, case):
    def loss(p):
        model = cd.models.SliderCrank(l=p[0], g=p[1])
        q0, v0 = model.initial_state()
        if case == "consistent":
            q, v = cd.consistent_state(model, q0 + 0.05, v0)
            return jnp.sum(q**2) + jnp.sum(v**2)
        solver = (cd.RK4() if case == "rk4" else
                  cd.Projected(cd.RK4(), cd.NewtonProjection(mass_weighted=True)))
        sol = cd.simulate(model, cd.UdwadiaKalaba(), q0, v0, t1=10.0, dt=1e-2,
                          solver=solver)
        return jnp.mean(model.observable(sol.q)[:, 0] ** 2)

    programs = {}
    for kind, fn in (("simulation", loss), ("gradient", jax.grad(loss))):
        fn = jax.vmap(fn) if batch > 1 else fn
        programs[kind] = jax.jit(fn).lower(p).compile(cd.compiler_options())
    return programs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder holding the package copies")
    parser.add_argument("packages", nargs="+", help="package names in that folder")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--case", choices=sorted(CASES), default="rk4")
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    args = parser.parse_args()
    sys.path.insert(0, args.folder)
    p = jnp.array([1.0, 9.81])
    if args.batch > 1:
        p = jnp.stack([jnp.linspace(1.0, 1.1, args.batch),
                       jnp.full(args.batch, 9.81)], axis=1)
    programs = {name: _programs(importlib.import_module(name), p, args.batch, args.case)
                for name in args.packages}
    best, values = {}, {}
    for name, progs in programs.items():
        for kind, c in progs.items():
            values[name, kind] = np.asarray(jax.block_until_ready(c(p)))
            best[name, kind] = np.inf
    for _ in range(args.rounds):
        for name, progs in programs.items():
            for kind, c in progs.items():
                start = time.perf_counter()
                jax.block_until_ready(c(p))
                best[name, kind] = min(best[name, kind], time.perf_counter() - start)
    first = args.packages[0]
    head = ("| package | simulation (ms) | gradient (ms) | gradient / simulation | "
            "gradient: max difference to the first, relative to its largest entry |\n|---|---:|---:|---:|---:|")
    rows = []
    for name in args.packages:
        sim, grad = best[name, "simulation"], best[name, "gradient"]
        ref = values[first, "gradient"]
        diff = float(np.max(np.abs(values[name, "gradient"] - ref))
                     / np.max(np.abs(ref)))
        rows.append(f"| {name} | {sim * 1e3:.3g} | {grad * 1e3:.3g} | {grad / sim:.2f} "
                    f"| {diff:.1e} |")
    table = "\n".join([head, *rows])
    print(table)
    if args.record:
        record("versions.py", f"{CASES[args.case]}, float64, "
               f"{'one trajectory' if args.batch == 1 else f'vmapped over {args.batch}'}"
               f", best of {args.rounds} interleaved rounds, cdiff.compiler_options().",
               table, section=None if args.case == "rk4" else f"versions.py ({args.case})")


if __name__ == "__main__":
    main()
