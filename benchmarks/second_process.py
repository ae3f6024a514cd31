"""What a second process pays for a loaded model's solve: JAX's persistent
compilation cache (`cdiff.use_compilation_cache`) keeps XLA's program, and the
second process still traces and lowers it.

Runs the documented recipe (a `jax.jit` of a function calling
`cdiff.simulate(..., throw=False)`, then reading `sol.result`) in two fresh
processes sharing an empty cache folder, and reports each one's set-up, trace and
lowering, XLA compile (or cache load) and run, separately:

    python benchmarks/second_process.py --models iftomm-a02-n-four-bar gripper
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {"gripper": HERE / "models" / "gripper.xml",
          "loop-walker": HERE / "models" / "loop_walker.xml"}


def child(name: str, cache: str, steps: int) -> dict:
    start = time.perf_counter()
    import warnings

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import mujoco
    import numpy as np

    import cdiff
    from cdiff.models import MJCF_LIBRARY, from_mujoco

    warnings.simplefilter("ignore")  # the models' "not simulated" notes
    cdiff.use_compilation_cache(cache)
    path = str(MODELS[name] if name in MODELS else MJCF_LIBRARY[name].path)
    t = time.perf_counter()
    model = from_mujoco(path)
    m = mujoco.MjModel.from_xml_path(path)
    q0 = jnp.asarray(m.key_qpos[0] if m.nkey else m.qpos0)
    v0 = jnp.asarray(m.key_qvel[0] if m.nkey else np.zeros(m.nv))
    dt = float(m.opt.timestep)
    load = time.perf_counter() - t

    def final(q0, v0):
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=steps * dt,
                             dt=dt, saveat=cdiff.SaveAt(t1=True), throw=False)
        return sol.q[-1], sol.result

    t = time.perf_counter()
    lowered = jax.jit(final).lower(q0, v0)
    trace = time.perf_counter() - t
    t = time.perf_counter()
    compiled = lowered.compile()
    xla = time.perf_counter() - t
    t = time.perf_counter()
    q, result = jax.block_until_ready(compiled(q0, v0))
    run = time.perf_counter() - t
    assert result == cdiff.RESULTS.successful and bool(jnp.all(jnp.isfinite(q)))
    return dict(load=load, trace=trace, xla=xla, run=run,
                total=time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["iftomm-a02-n-four-bar", "gripper"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.steps)))
        return
    print("| model | process | model load (s) | trace + lower (s) | XLA or cache "
          "load (s) | run (s) | import to result (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.models:
        with tempfile.TemporaryDirectory() as cache:
            for which in ("first", "second"):
                out = subprocess.run(
                    [sys.executable, __file__, "--steps", str(args.steps),
                     "--child", name, cache],
                    capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"| {name} | {which} | {r['load']:.2f} | {r['trace']:.2f} | "
                      f"{r['xla']:.2f} | {r['run']:.2f} | {r['total']:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
