"""Throughput: RK4 steps per second of a vmapped batch against the batch size.

    python benchmarks/throughput.py [--batches 1 16 256 4096 65536] [--steps 100]
        [--models r2 r4] [--dtypes float64 float32] [--xla-options default cdiff]
        [--kernels diffrax cdiff] [--cpu-devices N] [--chunk 8192] [--record]

R2 (slider-crank) and R4 (double four-bar) with
`UdwadiaKalaba(constraint_correction=True, energy_correction=True)`, RK4 at
dt = 1e-2, every trajectory of the batch started from a slightly different
angle, only the final state kept (`SaveAt(t1=True)`). Steps/s counts all
trajectories together; compile time (first call minus the best later call) is
reported apart; best of `--repeats` runs. Issue 7's acceptance: >= 1e6 steps/s
at batch 4096 on the 2-core CPU in float64, >= 1e8 on an H100/H200.

Each configuration is compiled with JAX's default XLA options and with
`cdiff.compiler_options()` (on CPU: no YNNPACK library fusions), side by side in
one run; `--kernels diffrax cdiff` adds the comparison of cdiff's constant-step
RK4 loop and `compute_once` with `diffrax.diffeqsolve` and the vector field as
written. The ratio column divides by the first variant of the same configuration. `--cpu-devices N` splits the CPU into N JAX devices
(`jax_num_cpu_devices`) and shards every batch over them: each core then runs its
share of the batch on its own, without XLA's per-operation thread
synchronisation.
"""

from __future__ import annotations

import argparse
import os
import time

import _config
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402

MODELS = {"r2": cdiff.models.SliderCrank, "r4": cdiff.models.DoubleFourBar}
FORMULATION = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
DT = 1e-2


def runner(model_name: str, dtype, batch: int, steps: int, chunk: int | None,
           options: str, solver=None):
    """A jitted function of a `(batch, nq)` perturbation returning final states,
    compiled with the XLA options called `options`, and the perturbation (sharded
    over the devices)."""
    model = MODELS[model_name]()
    q0, v0 = (x.astype(dtype) for x in model.initial_state())
    t1 = steps * DT

    def one(dq):
        sol = cdiff.simulate(model, FORMULATION, q0 + dq, v0, t1=t1, dt=DT,
                             saveat=cdiff.SaveAt(t1=True), solver=solver)
        return sol.q[-1]

    # Perturb the first angle-like coordinate by up to 1e-6: distinct trajectories.
    angle = 2 if model_name == "r2" else 0
    dq = jnp.zeros((batch, q0.shape[0]), dtype).at[:, angle].set(
        jnp.linspace(0.0, 1e-6, batch, dtype=dtype))
    if chunk is not None and batch > chunk:
        # One vmapped call per chunk of `chunk` trajectories (compiled once), results
        # to the host in between, as a sweep larger than memory would run.
        def fn(dq):
            return cdiff.studies.map_batches(one, dq, chunk_size=chunk, progress=False,
                                             compiler_options=_config.options(options))

        return fn, dq
    return (jax.jit(jax.vmap(one), compiler_options=_config.options(options)),
            _config.shard(dq))


def measure(model_name, dtype, batch, steps, repeats, chunk, options, kernels):
    with _config.kernels(kernels) as solver:
        fn, dq = runner(model_name, dtype, batch, steps, chunk, options, solver)
        t = time.perf_counter()
        out = jax.block_until_ready(fn(dq))
        first = time.perf_counter() - t
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            out = jax.block_until_ready(fn(dq))
            best = min(best, time.perf_counter() - t)
    finite = bool(jnp.all(jnp.isfinite(out)))
    return first - best, best, batch * steps / best, finite


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+",
                        default=[1, 16, 256, 4096, 65536])
    parser.add_argument("--steps", type=int, default=100,
                        help="RK4 steps per trajectory (dt = 1e-2)")
    parser.add_argument("--models", nargs="+", default=["r2", "r4"], choices=MODELS)
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"],
                        choices=["float64", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=None,
                        help="run batches larger than this as chunks of this size "
                             "with cdiff.studies.map_batches (default on CPU: 8192)")
    parser.add_argument("--record", action="store_true")
    _config.add_arguments(parser, several=True)
    args = parser.parse_args(argv)
    _config.apply(args)
    device = jax.devices()[0]
    if args.chunk is None and device.platform == "cpu":
        args.chunk = 8192
    print(f"device: {device.platform} ({device.device_kind}); "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    lines = ["| model | dtype | batch | XLA options | kernels | compile [s] | run [s] "
             "| steps/s | / first | finite |",
             "|---|---|---:|---|---|---:|---:|---:|---:|---|"]
    variants = [(o, k) for o in args.xla_options for k in args.kernels]
    for model_name in args.models:
        for dtype_name in args.dtypes:
            dtype = jnp.dtype(dtype_name)
            for batch in args.batches:
                base = None
                for options, kernels in variants:
                    c, r, sps, finite = measure(model_name, dtype, batch, args.steps,
                                                args.repeats, args.chunk, options,
                                                kernels)
                    base = sps if base is None else base
                    ratio = f"{sps / base:.2f}"
                    print(f"{model_name} {dtype_name} batch {batch:6d} {options:7s} "
                          f"{kernels:7s}: "
                          f"compile {c:6.2f} s, run {r:8.4f} s, {sps:14,.0f} steps/s"
                          f"{'' if finite else '  (NON-FINITE)'}", flush=True)
                    chunked = args.chunk is not None and batch > args.chunk
                    lines.append(
                        f"| {model_name.upper()} | {dtype_name} | {batch}"
                        f"{f' ({batch // args.chunk} x {args.chunk})' if chunked else ''}"
                        f" | {options} | {kernels} | {c:.2f} | {r:.4f} | {sps:,.0f} "
                        f"| {ratio} "
                        f"| {finite} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        flags = os.environ.get("XLA_FLAGS", "")
        record("throughput.py",
               "UdwadiaKalaba (constraint + energy correction), RK4, dt = 1e-2, "
               f"{args.steps} steps per trajectory, final state only; steps/s counts "
               "all trajectories; compile time apart; best of "
               f"{args.repeats}. {_config.describe(args)} XLA_FLAGS: "
               f"`{flags or '(none)'}`.", table)


if __name__ == "__main__":
    main()
