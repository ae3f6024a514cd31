"""Settings the benchmarks share: XLA compiler options, cdiff's kernels and the
number of CPU devices; and the timing of a first call in its phases."""

from __future__ import annotations

import contextlib
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import cdiff
from cdiff import _compiler

OPTIONS = ("default", "cdiff")
KERNELS = ("diffrax", "cdiff")


def add_arguments(parser, *, several: bool = False) -> None:
    """`--xla-options` (`default`: JAX's; `cdiff`: `cdiff.compiler_options()`) and
    `--cpu-devices N` (split the CPU into N JAX devices, batches sharded over them)."""
    parser.add_argument(
        "--xla-options", choices=OPTIONS, nargs="+" if several else None,
        default=list(OPTIONS) if several else "cdiff",
        help="XLA compiler options of cdiff's programs: JAX's defaults or "
             "cdiff.compiler_options()" + (" (each, side by side)" if several else ""))
    if several:
        parser.add_argument(
            "--kernels", choices=KERNELS, nargs="+", default=["cdiff"],
            help="cdiff's kernels for constant-step RK4 (its own loop, each distinct "
                 "transcendental computed once) or diffrax.diffeqsolve with the "
                 "vector field as written (each, side by side)")
    parser.add_argument(
        "--cpu-devices", type=int, default=None,
        help="split the CPU into this many JAX devices and shard every batch over "
             "them (jax_num_cpu_devices; default: JAX's, one)")


def apply(args) -> None:
    """Call before the first JAX computation."""
    if args.cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)


def options(name: str) -> dict:
    """The compiler options called `name` (see `add_arguments`): `cdiff`, the CPU
    option itself; `default`, none (JAX's defaults: `import cdiff` leaves
    XLA_FLAGS alone)."""
    return _compiler.cpu_options() if name == "cdiff" else {}


@contextlib.contextmanager
def kernels(name: str):
    """Within: yields the RK4 solver of the kernels called `name` (`diffrax`:
    `cdiff.RK4(fast_paths=False)`, diffrax.diffeqsolve and the vector field as
    written; `cdiff`: its own RK4 loop and `compute_once`). Clears JAX's caches
    on entry and exit so that nothing traced with the other kernels is reused."""
    jax.clear_caches()
    try:
        yield cdiff.RK4(fast_paths=name == "cdiff")
    finally:
        jax.clear_caches()


def describe(args) -> str:
    """One sentence for RESULTS.md."""
    chosen = args.xla_options if isinstance(args.xla_options, list) else [args.xla_options]
    text = {"default": "no compiler options",
            "cdiff": f"the CPU option `{_compiler.cpu_options()}`"}
    flags = {"not configured": "not set (`import cdiff` leaves it alone)",
             "set": "set by `cdiff.configure_xla_flags()`", "yours": "set by the caller",
             "off": "not set (CDIFF_XLA_FLAGS=0: JAX's defaults)",
             "too late": "not set (backend started first)",
             "unknown": "unknown to this jaxlib"}[_compiler.FLAGS_STATUS]
    return (f"Compiler options: {'; '.join(text[c] for c in chosen)}; the option "
            f"in XLA_FLAGS: {flags}. "
            f"{jax.device_count()} {jax.devices()[0].platform} device(s), batches "
            "sharded over them.")


def shard(tree):
    """`tree`'s arrays split along their first axis over all local devices (when
    it divides evenly; otherwise left on the default device)."""
    devices = jax.local_devices()
    leaves = jax.tree.leaves(tree)
    if len(devices) == 1 or any(np.shape(x)[0] % len(devices) for x in leaves):
        return tree
    sharding = NamedSharding(Mesh(np.array(devices), ("batch",)), PartitionSpec("batch"))
    return jax.device_put(tree, sharding)


# The clock of `first_call`: wall time, or this process's CPU time (all its
# threads), which a shared VM's steal time does not inflate (`--clock cpu`).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def set_clock(name: str) -> None:
    """Time `first_call` by `CLOCKS[name]`."""
    global _clock
    _clock = CLOCKS[name]


def first_call(fn, *args, repeats: int):
    """`jax.jit(fn)` from cleared caches (as a user's first call): `(phases, best,
    value)`, the first call's phases `[trace, lowering, XLA, first run]` in
    seconds, the best of `repeats` runs after it, and its value (by the clock
    `set_clock` chose: wall time unless told)."""
    jax.clear_caches()
    phases = []
    start = _clock()
    f = jax.jit(fn)
    for stage in (lambda f: f.trace(*args), lambda t: t.lower(),
                  lambda lowered: lowered.compile()):
        f = stage(f)
        phases.append(_clock() - start)
        start = _clock()
    value = jax.block_until_ready(f(*args))
    phases.append(_clock() - start)
    best = np.inf
    for _ in range(repeats):
        start = _clock()
        jax.block_until_ready(f(*args))
        best = min(best, _clock() - start)
    return phases, best, value


def best_of_rounds(cases, *, rounds: int, repeats: int) -> dict:
    """`{key: (phases, run)}` for `cases`, `(key, fn, x)` each with `key` a tuple
    of labels: each case's first call (`first_call`) and runs, in `rounds` rounds
    over all the cases (a noisy machine's slow phases then fall on every case
    alike), keeping the round with the fastest first call and the best run of
    all. With several rounds, each measurement is printed as it is taken."""
    best = {}
    for round_ in range(rounds):
        for key, fn, x in cases:
            phases, run, _ = first_call(fn, x, repeats=repeats)
            old = best.get(key)
            if old is None or sum(phases) < sum(old[0]):
                best[key] = (phases, min(run, old[1]) if old else run)
            else:
                best[key] = (old[0], min(run, old[1]))
            if rounds > 1:
                print(f"round {round_ + 1}: {' | '.join(key)}: first call "
                      f"{sum(phases):.2f} s, run {run * 1e3:.2f} ms", flush=True)
    return best
