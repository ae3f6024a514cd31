"""Controllers with state (issue 22): what the stateful path costs, and that a
controller without state runs the same program at the same speed as before.

    python benchmarks/control_state.py [--steps 2000] [--batch 64] [--repeats 5]
        [--baseline DIR] [--quick] [--record]

On the planar arm on the unit circle (R8), `cdiff.Lagrange()` and cdiff's own RK4
loop at dt = 1e-3, `--steps` steps:

- `pidc`: `ProjectedInverseDynamics` (no state) — one trajectory, a `jax.vmap`ped
  batch of `--batch` initial angles, and the reverse-mode gradient of a tracking
  loss with respect to `gp`;
- `zero-state`: the same controller written as an `AbstractStatefulController`
  with a state that stays zero (the cost of carrying a state);
- `hybrid`: `HybridForceMotion` on a controller model with masses 15% off, its PI
  loop on the measured multipliers (the algebraic loop closed by one Newton step
  at every stage).

Each case runs in a fresh process (its compile time is its own), all cases in
turns, `--repeats` times; run times are the best of the repeats (after the
compilation), compile times the first call's time less a run. With `--baseline
DIR`, DIR being a copy of the repository before controllers had state (e.g.
`git worktree add /tmp/before <commit>`), `pidc` also runs with cdiff imported
from DIR, in the same turns: its times side by side with the current code's, and
whether the two compiled programs are the same (a hash of the lowered program's
text). `--quick`: 200 steps, batch 8, one repeat.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = ("pidc", "zero-state", "hybrid")


def worker(case: str, steps: int, batch: int) -> dict:
    """Time one case in this process; returns its figures."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import cdiff
    from cdiff.control import HybridForceMotion, ProjectedInverseDynamics

    cdiff.configure_xla_flags()  # as the docs ask on CPU

    plant = cdiff.models.PlanarArmOnCurve("circle", t_release=0.0)
    th2 = float(plant.hold[1])
    dt = 1e-3
    t1 = steps * dt

    def tracking(t):
        th, dth, ddth = (0.3 + 0.2 * jnp.sin(2 * t), 0.4 * jnp.cos(2 * t),
                         -0.8 * jnp.sin(2 * t))
        z = jnp.zeros_like(th)
        return jnp.stack([th, z + th2]), jnp.stack([dth, z]), jnp.stack([ddth, z])

    def controller(gain):
        pidc = ProjectedInverseDynamics(plant, tracking, gain, 6.0)
        if case == "pidc":
            return pidc
        if case == "zero-state":
            from cdiff.control import AbstractStatefulController

            class ZeroState(AbstractStatefulController):
                inner: ProjectedInverseDynamics

                def init_state(self, t0, q0, v0):
                    return jnp.zeros((1,), q0.dtype)

                def input(self, t, q, v, state, measurement):
                    return self.inner(t, q, v)

                def state_rate(self, t, q, v, state, measurement):
                    return jnp.zeros_like(state)

            return ZeroState(pidc)
        model = cdiff.models.PlanarArmOnCurve("circle", t_release=0.0, m1=5.75,
                                              m2=5.75)
        return HybridForceMotion(model, tracking, gain, 6.0,
                                 lambda t: jnp.stack([20.0 + 5.0 * jnp.sin(3 * t)]),
                                 gf=1.0, gi=4.0)

    v0 = jnp.array([0.4, 0.0])

    def run(gain, th1):
        sol = cdiff.simulate(plant, cdiff.Lagrange(), jnp.stack([th1, th2]), v0,
                             t1=t1, dt=dt, control=controller(gain))
        return jnp.mean((tracking(sol.ts)[0][0] - sol.q[:, 0]) ** 2)

    gain, th1 = jnp.asarray(36.0), jnp.asarray(0.35)
    th1s = th1 + jnp.linspace(0.0, 0.05, batch)
    calls = {
        "one": (jax.jit(run), (gain, th1)),
        "batch": (jax.jit(jax.vmap(run, (None, 0))), (gain, th1s)),
        "gradient": (jax.jit(jax.grad(run)), (gain, th1)),
    }
    out = {}
    for name, (fn, args) in calls.items():
        text = fn.lower(*args).as_text()
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        first = time.perf_counter() - start
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best = min(best, time.perf_counter() - start)
        out[name] = {"compile": first - best, "run": best,
                     "program": hashlib.sha256(text.encode()).hexdigest()[:16]}
    return out


def spawn(case: str, path: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path))
    command = [sys.executable, str(HERE / "control_state.py"), "--worker", case,
               "--steps", str(args.steps), "--batch", str(args.batch)]
    done = subprocess.run(command, env=env, capture_output=True, text=True,
                          cwd=path, check=False)
    if done.returncode:
        raise RuntimeError(f"{case} ({path}) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a copy of the repository before controllers had state")
    parser.add_argument("--quick", action="store_true",
                        help="200 steps, batch 8, 1 repeat")
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    parser.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.batch)))
        return
    if args.quick:
        args.steps, args.batch, args.repeats = 200, 8, 1
    runs = [(case, "current", ROOT) for case in CASES]
    if args.baseline is not None:
        runs.insert(1, ("pidc", "baseline", args.baseline.resolve()))
    results: dict = {}
    for _ in range(args.repeats):
        for case, which, path in runs:
            figures = spawn(case, path, args)
            key = (case, which)
            if key not in results:
                results[key] = figures
                continue
            for name, f in figures.items():
                kept = results[key][name]
                kept["run"] = min(kept["run"], f["run"])
                kept["compile"] = min(kept["compile"], f["compile"])
    steps = args.steps
    lines = [
        "| controller | code | call | compile s | run ms | steps/s | program |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (case, which), figures in results.items():
        for name, f in figures.items():
            count = steps * (args.batch if name == "batch" else 1)
            lines.append(
                f"| {case} | {which} | {name} | {f['compile']:.1f} | "
                f"{1e3 * f['run']:.2f} | {count / f['run']:,.0f} | "
                f"`{f['program']}` |")
    table = "\n".join(lines)
    print(table)
    if args.baseline is not None:
        same = all(results[("pidc", "baseline")][n]["program"]
                   == results[("pidc", "current")][n]["program"]
                   for n in results[("pidc", "current")])
        print(f"pidc: the same compiled programs as the baseline: {same}")
    if args.record:
        sys.path.insert(0, str(HERE))
        from _record import record

        description = (
            f"R8 (arm on the unit circle), Lagrange, RK4 own loop, dt = 1e-3, "
            f"{steps} steps, batch {args.batch}; best of {args.repeats} fresh "
            "processes per case, taken in turns.")
        record("control_state.py", description, table)


if __name__ == "__main__":
    main()
