"""What a second process pays for a loaded model's solve and gradient, with
JAX's persistent compilation cache alone (`--cache persistent`: XLA's program is
kept, the second process still traces and lowers) or with cdiff's exported
programs beside it (`--cache exported`, `cdiff.cached_jit`: the traced program is
kept too, and its XLA compile is a persistent-cache hit).

Runs each program in two fresh processes sharing an empty cache folder. The
programs: `solve`, the documented recipe (a function calling
`cdiff.simulate(..., throw=False)` and returning the final state and
`sol.result`), and `gradient`, `jax.grad` of a loss on the final state with
respect to the initial coordinates; both take the model as an argument (its
arrays are inputs: the figures recorded before December 2026 closed over it,
making them constants of the program). Each row reports the set-up; with
`--cache persistent`, trace and lowering and XLA's compile (or cache load)
separately; "to program", from the call to a compiled program (everything
beyond the run itself); the first run; the time from the import to the result;
how many compilations the persistent cache answered; and, with `--cache
exported`, where the program came from (`exported`: traced and stored; `disk`:
loaded; `jit`: not storable):

    python benchmarks/second_process.py --models iftomm-a02-n-four-bar gripper
    python benchmarks/second_process.py --cache persistent exported \
        --programs solve gradient --models gripper
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {"gripper": HERE / "models" / "gripper.xml",
          "loop-walker": HERE / "models" / "loop_walker.xml"}


def child(name: str, cache: str, steps: int, kind: str = "persistent",
          program: str = "solve") -> dict:
    start = time.perf_counter()
    import warnings

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import mujoco
    import numpy as np

    import cdiff
    from cdiff.models import MJCF_LIBRARY, from_mujoco

    cdiff.configure_xla_flags()  # as the docs ask on CPU

    warnings.simplefilter("ignore")  # the models' "not simulated" notes
    cdiff.use_compilation_cache(cache)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(1)
        if event == "/jax/compilation_cache/cache_hits" else None)
    path = str(MODELS[name] if name in MODELS else MJCF_LIBRARY[name].path)
    t = time.perf_counter()
    model = from_mujoco(path)
    m = mujoco.MjModel.from_xml_path(path)
    q0 = jnp.asarray(m.key_qpos[0] if m.nkey else m.qpos0)
    v0 = jnp.asarray(m.key_qvel[0] if m.nkey else np.zeros(m.nv))
    dt = float(m.opt.timestep)
    load = time.perf_counter() - t

    # Module-level functions of (model, q0, v0), so that the exported cache's key
    # sees the model's structure as an argument; the settings are bound.
    fn = functools.partial(final if program == "solve" else gradient,
                           t1=steps * dt, dt=dt)
    row = dict(load=load, trace=None, xla=None, source=None)
    t = time.perf_counter()
    if kind == "persistent":
        import equinox as eqx

        lowered = eqx.filter_jit(fn).lower(model, q0, v0)
        row["trace"] = time.perf_counter() - t
        t2 = time.perf_counter()
        compiled = lowered.compile()
        row["xla"] = time.perf_counter() - t2
    else:
        compiled = cdiff.cached_jit(fn).compile(model, q0, v0)
        row["source"] = compiled.source
    row["to_program"] = time.perf_counter() - t
    t = time.perf_counter()
    out = jax.block_until_ready(compiled(model, q0, v0))
    row["run"] = time.perf_counter() - t
    if program == "solve":
        q, result = out
        assert result == cdiff.RESULTS.successful
    else:
        q = out
    assert bool(jnp.all(jnp.isfinite(q)))
    row.update(total=time.perf_counter() - start, hits=len(hits))
    return row


def final(model, q0, v0, *, t1, dt):
    """The final coordinates and the result code of a solve."""
    import cdiff

    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=t1, dt=dt,
                         saveat=cdiff.SaveAt(t1=True), throw=False)
    return sol.q[-1], sol.result


def _loss(q0, model, v0, t1, dt):
    q, _ = final(model, q0, v0, t1=t1, dt=dt)
    return (q**2).sum()


def gradient(model, q0, v0, *, t1, dt):
    """The gradient of a loss on the final state with respect to `q0`."""
    import jax

    return jax.grad(_loss)(q0, model, v0, t1, dt)


def _seconds(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["iftomm-a02-n-four-bar", "gripper"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--cache", nargs="+", choices=["persistent", "exported"],
                        default=["persistent"])
    parser.add_argument("--programs", nargs="+", choices=["solve", "gradient"],
                        default=["solve"])
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child[:2], args.steps, *args.child[2:])))
        return
    print("| model | program | cache | process | model load (s) | trace + lower (s) "
          "| XLA or cache load (s) | to program (s) | run (s) | import to result "
          "(s) | cache hits | program |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models:
        for program in args.programs:
            for kind in args.cache:
                with tempfile.TemporaryDirectory() as cache:
                    for which in ("first", "second"):
                        out = subprocess.run(
                            [sys.executable, __file__, "--steps", str(args.steps),
                             "--child", name, cache, kind, program],
                            capture_output=True, text=True, check=True)
                        r = json.loads(out.stdout.strip().splitlines()[-1])
                        print(f"| {name} | {program} | {kind} | {which} | "
                              f"{r['load']:.2f} | {_seconds(r['trace'])} | "
                              f"{_seconds(r['xla'])} | {r['to_program']:.2f} | "
                              f"{r['run']:.2f} | {r['total']:.1f} | {r['hits']} | "
                              f"{r['source'] or '—'} |", flush=True)


if __name__ == "__main__":
    main()
