"""What a derivative through `cdiff.simulate` costs, per adjoint: time and memory.

    python benchmarks/gradients.py [--t1 10] [--batch 1] [--xla-options cdiff]
        [--cpu-devices N] [--record]

R2 (slider-crank) with UdwadiaKalaba and RK4 at dt = 1e-2, float64; the loss is the
mean squared slider position over the saved steps, differentiated with respect to
the link length and gravity (forward mode: one and both; with the default adjoint
`jax.jacfwd` goes through cdiff's own RK4 loop, with `diffrax.ForwardMode()`
through `diffrax.diffeqsolve`).
Columns: compile time, best-of-7 run time, the ratio to the plain simulation, and the
temporary memory XLA allocates for the compiled function (`memory_analysis()`).
"""

from __future__ import annotations

import argparse
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import _config  # noqa: E402
import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402


def _loss(t1, adjoint):
    def loss(p):
        model = cdiff.models.SliderCrank(l=p[0], g=p[1])
        q0, v0 = model.initial_state()
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=t1, dt=1e-2,
                             adjoint=adjoint)
        return jnp.mean(model.observable(sol.q)[:, 0] ** 2)

    return loss


def _measure(fn, x, options):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(x).compile(options)
    compile_s = time.perf_counter() - start
    best = np.inf
    for _ in range(7):
        start = time.perf_counter()
        jax.block_until_ready(compiled(x))
        best = min(best, time.perf_counter() - start)
    memory = compiled.memory_analysis()
    temp = getattr(memory, "temp_size_in_bytes", float("nan")) if memory else float("nan")
    return compile_s, best, temp


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t1", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=1,
                        help="vmap every row over this many parameter pairs")
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    _config.add_arguments(parser)
    args = parser.parse_args()
    _config.apply(args)
    options = _config.options(args.xla_options)
    p = jnp.array([1.0, 9.81])  # link length, gravity
    if args.batch > 1:  # lengths 1 ... 1.1: the same work per trajectory
        p = jnp.stack([jnp.linspace(1.0, 1.1, args.batch),
                       jnp.full(args.batch, 9.81)], axis=1)
    reverse = _loss(args.t1, None)  # cdiff's default: one checkpoint per step
    sqrt_n = _loss(args.t1, diffrax.RecursiveCheckpointAdjoint())
    few = _loss(args.t1, diffrax.RecursiveCheckpointAdjoint(checkpoints=16))
    forward = _loss(args.t1, diffrax.ForwardMode())
    setups = [
        ("simulation (loss only)", reverse),
        ("jax.grad, cdiff's default (own RK4 loop, every stage's input kept)",
         lambda x: jax.grad(reverse)(x)),
        ("jax.grad, RecursiveCheckpointAdjoint() (diffrax's O(sqrt n) checkpoints)",
         lambda x: jax.grad(sqrt_n)(x)),
        ("jax.grad, RecursiveCheckpointAdjoint(checkpoints=16)",
         lambda x: jax.grad(few)(x)),
        ("jax.jacfwd, cdiff's default (its own RK4 loop), 1 parameter",
         lambda x: jax.jacfwd(lambda a: reverse(x.at[0].set(a)))(x[0])),
        ("jax.jacfwd, cdiff's default (its own RK4 loop), 2 parameters",
         lambda x: jax.jacfwd(reverse)(x)),
        ("jax.jacfwd, ForwardMode(), 1 parameter",
         lambda x: jax.jacfwd(lambda a: forward(x.at[0].set(a)))(x[0])),
        ("jax.jacfwd, ForwardMode(), 2 parameters", lambda x: jax.jacfwd(forward)(x)),
    ]
    head = ("| derivative | compile (s) | run (ms) | / simulation | temporary memory "
            "(MB) |\n|---|---|---|---|---|")
    print(head)
    rows, base = [], None
    for name, fn in setups:
        x = p if args.batch == 1 else _config.shard(p)
        compile_s, run_s, temp = _measure(fn if args.batch == 1 else jax.vmap(fn), x,
                                          options)
        base = run_s if base is None else base
        rows.append(f"| {name} | {compile_s:.1f} | {run_s * 1e3:.1f} | "
                    f"{run_s / base:.2f} | {temp / 2**20:.2f} |")
        print(rows[-1], flush=True)
    table = "\n".join([head, *rows])
    if args.record:
        record("gradients.py", f"R2, UdwadiaKalaba + RK4, dt = 1e-2, t1 = {args.t1:g} s "
               f"({int(round(args.t1 / 1e-2))} steps, every step saved), float64"
               + (f", every row vmapped over {args.batch} parameter pairs."
                  if args.batch > 1 else ", one trajectory.") + " "
               + _config.describe(args), table)


if __name__ == "__main__":
    main()
