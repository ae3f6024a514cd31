"""Tracing and compilation time of `simulate` for two or more versions of cdiff in one
process: what a user waits for before the first step, and most of the test suite's
time (a test's solve runs in milliseconds after seconds of tracing and compiling).

    git worktree add /tmp/cdiff-old <commit>
    mkdir -p /tmp/versions && cp -r /tmp/cdiff-old/cdiff /tmp/versions/cdiff_old \\
        && cp -r cdiff /tmp/versions/cdiff_new
    python benchmarks/compile_time.py /tmp/versions cdiff_old cdiff_new \\
        [--rounds 3] [--record]

Each argument after the folder is a copy of the `cdiff` package under another name
(see `versions.py`). The programs: R2 (slider-crank), RK4, dt = 1e-2, 1 s, float64,
saving every step, for Lagrange, UdwadiaKalaba, Projection and NullSpace: the
whole `Solution` (`solution`: what a call of `simulate` outside `jit` compiles),
and the gradient of the mean squared slider
position with respect to the link length (`gradient`). For each round and version,
`jax.clear_caches()` first, then `jax.jit(fn).lower(...)` (tracing, transformations
and lowering to StableHLO) and `.compile()` (XLA) are timed apart; versions take
turns within a round. Reported: the best of `--rounds` rounds, and the ratio of each
version's total (trace + compile) to the first version's.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

from _record import record  # noqa: E402

FORMULATIONS = ("Lagrange", "UdwadiaKalaba", "Projection", "NullSpace")


def _formulation(cd, name):
    if name == "Lagrange":
        return cd.Lagrange(10.0, 10.0)
    if name == "NullSpace":
        return cd.NullSpace(alpha=10.0, dof=1)
    return getattr(cd, name)()


def _functions(cd, name):
    def solve(length):
        model = cd.models.SliderCrank(l=length)
        q0, v0 = model.initial_state()
        return cd.simulate(model, _formulation(cd, name), q0, v0, t1=1.0, dt=1e-2)

    def solution(length):
        return solve(length)

    def loss(length):
        sol = solve(length)
        return jnp.mean(cd.models.SliderCrank(l=length).observable(sol.q)[:, 0] ** 2)

    return {"solution": solution, "gradient": jax.grad(loss)}


def _time(cd, name, kind):
    jax.clear_caches()
    fn = _functions(cd, name)[kind]
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(jnp.asarray(1.0))
    traced = time.perf_counter()
    lowered.compile(cd.compiler_options())
    return traced - start, time.perf_counter() - traced


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder holding the package copies")
    parser.add_argument("packages", nargs="+", help="package names in that folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    args = parser.parse_args()
    sys.path.insert(0, args.folder)
    versions = {p: importlib.import_module(p) for p in args.packages}
    cases = [(f, k) for k in ("solution", "gradient") for f in FORMULATIONS]
    best = {}
    for r in range(args.rounds):
        for case in cases:
            for p, cd in versions.items():
                t = _time(cd, *case)
                key = (case, p)
                best[key] = t if key not in best else min(best[key], t, key=sum)
                print(f"round {r + 1}/{args.rounds} {case[1]:10s} {case[0]:14s} {p}: "
                      f"trace {t[0]:6.2f} s, compile {t[1]:6.2f} s", flush=True)
    first = args.packages[0]
    rows = ["| program | formulation | version | trace + lower [s] | compile [s] | "
            f"total / {first} |", "|---|---|---|---|---|---|"]
    for case in cases:
        for p in args.packages:
            t = best[(case, p)]
            ratio = sum(t) / sum(best[(case, first)])
            rows.append(f"| {case[1]} | {case[0]} | {p} | {t[0]:.2f} | {t[1]:.2f} | "
                        f"{ratio:.2f} |")
    table = "\n".join(rows)
    print(table)
    if args.record:
        record("compile_time.py", "R2, RK4, dt = 1e-2, 1 s, float64; best of "
               f"{args.rounds} interleaved rounds, caches cleared before each.", table)


if __name__ == "__main__":
    main()
