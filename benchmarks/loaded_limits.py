"""What joint ranges cost a loaded MuJoCo model: the same model without and with
its ranges (unilateral rows), side by side in one run.

    python benchmarks/loaded_limits.py [--models gripper loop-walker] [--steps 200]
                                       [--grad-steps 20] [--repeats 2] [--rounds 1]
                                       [--record] [--clock wall]

`gripper` is `benchmarks/models/gripper.xml` (8 dof, two four-bar loops) given the
ranges of a real parallel gripper: each sprung fingertip starts against its
range and its spring holds it there (an event in the first step, then a held
row), and the drivers, couplers and followers have ranges they never reach.
`loop-walker` is `benchmarks/models/loop_walker.xml` (32 dof, four loops) with a
range on every hinge that its motion never reaches. Each is started from its
first keyframe (the fingertips moved onto their ranges), at the file's timestep,
with `UdwadiaKalaba` and RK4, and measured as

- **forward**: `jax.jit` of `cdiff.simulate` (final state) over `--steps` steps;
- **gradient**: `jax.jit(jax.grad(loss))` of the final state's squared norm with
  respect to the bodies' masses, through `--grad-steps` steps;

each first call in its phases (trace, lowering, XLA, first run) and the best of
`--repeats` runs after it, with the ratio of the model with ranges to the model
without them. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from _config import CLOCKS, first_call, set_clock  # noqa: E402
from _record import record  # noqa: E402

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from cdiff.models import from_mujoco  # noqa: E402

HERE = Path(__file__).parent
# The fingertips' springs pull them towards springref = +-0.1; their ranges stop
# them at +-0.05, where they start.
TIP_RANGE = 0.05


def gripper_spec(ranges: bool) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(HERE / "models" / "gripper.xml"))
    spec.compiler.degree = False  # (angles in radians: springref 0.1 rad)
    qpos = np.array(spec.keys[0].qpos)
    names = [j.name for j in spec.joints]
    for i, joint in enumerate(spec.joints):
        if joint.name.endswith("_tip"):
            side = 1.0 if joint.name.startswith("l") else -1.0
            qpos[i] = side * TIP_RANGE
            if ranges:
                joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
                joint.range = sorted([side * TIP_RANGE, -side * 1.0])
        elif ranges:
            joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
            joint.range = [-1.5, 1.5]
    spec.keys[0].qpos = qpos
    # (The tips start at rest, against their ranges.)
    qvel = np.array(spec.keys[0].qvel)
    qvel[[names.index("l_tip"), names.index("r_tip")]] = 0.0
    spec.keys[0].qvel = qvel
    return spec


def walker_spec(ranges: bool) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(HERE / "models" / "loop_walker.xml"))
    spec.compiler.degree = False
    if ranges:
        for joint in spec.joints:
            if joint.type == mujoco.mjtJoint.mjJNT_HINGE:
                joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
                joint.range = [-3.0, 3.0]
    return spec


SPECS = {"gripper": gripper_spec, "loop-walker": walker_spec}


def measure(spec, args):
    m = spec.compile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the models' "not simulated" notes
        model = from_mujoco(spec)
    q0, v0 = jnp.asarray(m.key_qpos[0]), jnp.asarray(m.key_qvel[0])
    dt = float(m.opt.timestep)

    def final(model, q0, v0, steps):
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=steps * dt,
                             dt=dt, saveat=cdiff.SaveAt(t1=True))
        return sol.q[-1]

    def loss(mass):
        tuned = model.tree_replace({"body_mass": mass})
        return jnp.sum(final(tuned, q0, v0, args.grad_steps) ** 2)

    forward = first_call(lambda q, v: final(model, q, v, args.steps), q0, v0,
                     repeats=args.repeats)
    gradient = first_call(jax.grad(loss), model.mjx_model.body_mass,
                          repeats=args.repeats)
    return {"forward": forward, "gradient": gradient,
            "rows": int(np.sum(m.jnt_limited))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(SPECS), default=["gripper"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--grad-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure everything this many times, round after round, "
                             "and keep each one's fastest (for a noisy machine)")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall time, or the process's CPU time (which a shared "
                             "VM's steal time does not inflate)")
    args = parser.parse_args()
    set_clock(args.clock)
    # Every measurement `--rounds` times, round after round, each phase set kept
    # from its fastest first call and each run the best of all (on a shared
    # machine whose speed drifts, a slow phase then falls on every case alike).
    best = {}
    for round_ in range(args.rounds):
        for name in args.models:
            for ranges in (False, True):
                out = measure(SPECS[name](ranges), args)
                for kind in ("forward", "gradient"):
                    phases, run, _ = out[kind]
                    old = best.get((name, ranges, kind))
                    if old is not None:
                        run = min(run, old[1])
                        phases = min(phases, old[0], key=sum)
                    best[(name, ranges, kind)] = (phases, run, out["rows"])
                    if args.rounds > 1:
                        print(f"round {round_ + 1}: {name} ranges={ranges} {kind}: "
                              f"first call {sum(out[kind][0]):.2f} s, run "
                              f"{out[kind][1] * 1e3:.1f} ms", flush=True)
    rows = []
    for name in args.models:
        for ranges in (False, True):
            for kind, steps in (("forward", args.steps), ("gradient", args.grad_steps)):
                (trace, lower, xla, first_run), run, n_rows = best[(name, ranges, kind)]
                first = trace + lower + xla + first_run
                b_phases, b_run, _ = best[(name, False, kind)]
                label = f"with ranges ({n_rows} rows)" if ranges else "without"
                rows.append(
                    f"| {name} | {label} | {kind}, {steps} steps | {trace:.2f} | "
                    f"{lower:.2f} | {xla:.2f} | {first:.2f} | "
                    f"{first / sum(b_phases):.2f} | {run * 1e3:.1f} | {run / b_run:.2f} |")
                print(rows[-1], flush=True)
    table = "\n".join([
        "| model | ranges | call | trace (s) | lowering (s) | XLA (s) | "
        "compile + first run (s) | / without | run (ms) | / without |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|", *rows])
    print(table)
    if args.record:
        record("loaded_limits.py", "UdwadiaKalaba + RK4 at the file's timestep, "
               f"float64, final state; best of {args.repeats} runs and of "
               f"{args.rounds} rounds' first calls.", table)


if __name__ == "__main__":
    main()
