"""Two or more versions of cdiff in one process: R2's simulation and its gradient,
timed in interleaved rounds (this VM's speed drifts by tens of percent within
minutes, so separate runs of two versions compare badly).

    git worktree add /tmp/cdiff-old <commit>
    mkdir -p /tmp/versions && cp -r /tmp/cdiff-old/cdiff /tmp/versions/cdiff_old \\
        && cp -r cdiff /tmp/versions/cdiff_new
    python benchmarks/versions.py /tmp/versions cdiff_old cdiff_new [--batch 64]
        [--rounds 15] [--record]

Each argument after the folder is a copy of the `cdiff` package under another name
(the package imports itself relatively, so copies load side by side). The loss is
that of `gradients.py`: R2, UdwadiaKalaba + RK4, dt = 1e-2, 10 s, float64, the mean
squared slider position, differentiated with respect to the link length and gravity
by `jax.grad`; every program is compiled with `cdiff.compiler_options()`. Reported:
the best of `--rounds` interleaved rounds.
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


def _programs(cd, p, batch):
    def loss(p):
        model = cd.models.SliderCrank(l=p[0], g=p[1])
        q0, v0 = model.initial_state()
        sol = cd.simulate(model, cd.UdwadiaKalaba(), q0, v0, t1=10.0, dt=1e-2)
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
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    args = parser.parse_args()
    sys.path.insert(0, args.folder)
    p = jnp.array([1.0, 9.81])
    if args.batch > 1:
        p = jnp.stack([jnp.linspace(1.0, 1.1, args.batch),
                       jnp.full(args.batch, 9.81)], axis=1)
    programs = {name: _programs(importlib.import_module(name), p, args.batch)
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
            "gradient: max relative difference to the first |\n|---|---:|---:|---:|---:|")
    rows = []
    for name in args.packages:
        sim, grad = best[name, "simulation"], best[name, "gradient"]
        ref = values[first, "gradient"]
        diff = float(np.max(np.abs(values[name, "gradient"] - ref) / np.abs(ref)))
        rows.append(f"| {name} | {sim * 1e3:.1f} | {grad * 1e3:.1f} | {grad / sim:.2f} "
                    f"| {diff:.1e} |")
    table = "\n".join([head, *rows])
    print(table)
    if args.record:
        record("versions.py", f"R2, UdwadiaKalaba + RK4, dt = 1e-2, 10 s, float64, "
               f"{'one trajectory' if args.batch == 1 else f'vmapped over {args.batch}'}"
               f", best of {args.rounds} interleaved rounds, cdiff.compiler_options().",
               table)


if __name__ == "__main__":
    main()
