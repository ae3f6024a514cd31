"""Loaded MuJoCo models: compile time, throughput and gradients of cdiff, side by
side with MuJoCo's C engine and MJX, in one run.

    python benchmarks/loaded.py [--models NAME ...] [--steps 1000] [--batch 256]
        [--batch-steps 100] [--grad-steps 20] [--repeats 2] [--before] [--record]

For each model (the shipped MJCF files of `cdiff.models.MJCF_LIBRARY` that have
equality constraints; `benchmarks/models/gripper.xml`, an 8-dof parallel gripper
with two four-bar loops, a joint coupling and a tendon servo; and
`benchmarks/models/loop_walker.xml`, a free-floating 32-dof walker with ball
joints, springs and four `connect` loops), started from its first keyframe at the
file's own timestep:

1. **MuJoCo C**: `mujoco.mj_step` at the model's settings (its integrator,
   solver and soft equality constraints), `--steps` steps.
2. **MJX**: `jax.jit(mjx.step)` (contacts off): its compile time (trace and
   lower, then XLA), `--steps` steps of one trajectory called from Python, and
   `jax.jit(jax.vmap(mjx.step))` over `--batch` copies for `--batch-steps` steps.
   Not in a `fori_loop`, which deadlocked on robot-scale models with jaxlib
   0.10.2 on the development CPU. Run in this process, before cdiff.
3. **cdiff**: `jax.jit` of `cdiff.simulate(model, UdwadiaKalaba(), q0, v0, ...)`
   (RK4, final state only) for one trajectory of `--steps` steps and a `jax.vmap`
   over `--batch` initial velocities (the keyframe's scaled by 0.5 to 1.5, which
   keeps them consistent) for `--batch-steps` steps; and `jax.grad` of the final
   state's squared norm with respect to the bodies' masses through
   `--grad-steps` steps. With `--before`, also the same model built with the
   constraint terms by autodiff through MJX's kinematic tree (`cdiff.Terms`, the
   path before one-pass terms), so that the ratio is measured in the same run.

Reported: compile time split into trace + lower and XLA compile, and the first
call (compile and one run; for MJX, compile and one step), for the batch and the
gradient the first call minus a run, run time as steps/s (all members of a
batch together), and the largest equality residual (MuJoCo's `efc_pos` rows of
type equality, `mj_fwdPosition` on the final `qpos`) each method leaves. The
table goes to stdout, progress to stderr; `--record` records it in RESULTS.md and HISTORY.md.
Needs `mujoco` and `mujoco-mjx` (`pip install -e ".[bench]"`). Time it on a quiet
machine.
"""

from __future__ import annotations

import sys
from pathlib import Path


import argparse
import contextlib
import io
import queue
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from _record import record  # noqa: E402

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from cdiff.models import MJCF_LIBRARY, MuJoCoModel, from_mujoco  # noqa: E402

with contextlib.redirect_stdout(io.StringIO()):
    from mujoco import mjx  # noqa: E402

HERE = Path(__file__).parent
MODELS = {"loop-walker": HERE / "models" / "loop_walker.xml",
          "gripper": HERE / "models" / "gripper.xml"}
MODELS.update({name: entry.path for name, entry in MJCF_LIBRARY.items()})
DEFAULT = ["slider-crank-mjcf", "double-four-bar-mjcf", "iftomm-a02-n-four-bar",
           "iftomm-a03-andrews-squeezer", "iftomm-a05-flyball-governor",
           "gripper", "loop-walker"]


class AutodiffTerms(MuJoCoModel):
    """The same model with the constraint terms derived by autodiff through MJX's
    kinematic tree (`cdiff.Terms`): cdiff's path before one-pass terms."""

    def terms(self, t, q, v=None):
        return cdiff.Terms(self, t, q, v)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def equality_error(m, qpos) -> float:
    """The largest equality residual of MuJoCo's constraint rows at `qpos`."""
    d = mujoco.MjData(m)
    d.qpos[:] = qpos
    mujoco.mj_fwdPosition(m, d)
    rows = d.efc_pos[d.efc_type == mujoco.mjtConstraint.mjCNSTR_EQUALITY]
    return float(np.abs(rows).max(initial=0.0))


def best(f, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f())
        times.append(time.perf_counter() - start)
    return min(times)


def start(m):
    """The first keyframe's `(qpos, qvel)`, else `qpos0` at rest."""
    if m.nkey:
        return m.key_qpos[0].copy(), m.key_qvel[0].copy()
    return m.qpos0.copy(), np.zeros(m.nv)


def c_engine(m, steps):
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = start(m)
    begin = time.perf_counter()
    for _ in range(steps):
        mujoco.mj_step(m, d)
    seconds = time.perf_counter() - begin
    return {"steps/s": steps / seconds, "error": equality_error(m, d.qpos)}


def compile_split(fn, *args):
    """`(compiled, trace + lower seconds, XLA seconds)`."""
    begin = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    traced = time.perf_counter() - begin
    begin = time.perf_counter()
    compiled = lowered.compile()
    return compiled, traced, time.perf_counter() - begin


def mjx_engine(path, steps, batch, batch_steps, repeats, results):
    m = mujoco.MjModel.from_xml_path(str(path))
    c = m.__copy__()
    c.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    c.opt.enableflags = 0  # MJX refuses the energy flag, which changes no motion
    try:
        mx = mjx.put_model(c)
    except Exception as e:  # noqa: BLE001 - reported in the table
        log(f"  MJX cannot load it: {e}")
        return
    qpos, qvel = start(m)
    d = mjx.make_data(mx).replace(qpos=jnp.asarray(qpos), qvel=jnp.asarray(qvel))
    begin = time.perf_counter()
    step, traced, xla = compile_split(mjx.step, mx, d)
    x = jax.block_until_ready(step(mx, d))
    first = time.perf_counter() - begin
    # MJX's step returns some index fields of a model with tendons as int64
    # (make_data's are int32): the steps from there on go through jax.jit, which
    # compiles once more for them, outside the timing.
    step = jax.jit(mjx.step)
    jax.block_until_ready(step(mx, x))
    begin = time.perf_counter()
    for _ in range(steps):
        x = step(mx, x)
    jax.block_until_ready(x)
    out = {"trace": traced, "xla": xla, "first call": first,
           "steps/s": steps / (time.perf_counter() - begin),
           "error": equality_error(m, np.asarray(x.qpos))}
    results.put(out)
    ds = jax.tree.map(lambda a: jnp.broadcast_to(a, (batch,) + a.shape), d)
    batched = jax.vmap(mjx.step, in_axes=(None, 0))
    _, _, bxla = compile_split(batched, mx, ds)
    bstep = jax.jit(batched)
    jax.block_until_ready(bstep(mx, bstep(mx, ds)))  # both dtypes compiled

    def run():
        x = ds
        for _ in range(batch_steps):
            x = bstep(mx, x)
        return x

    out["batch compile"] = bxla
    out["batch steps/s"] = batch * batch_steps / best(run, repeats)
    results.put(out)


def mjx_in_process(path, args):
    """`mjx_engine` in this process (before cdiff's runs, so that neither compiles
    while the other is timed). Returns what it measured."""
    results = queue.Queue()
    mjx_engine(path, args.steps, args.batch, args.batch_steps, args.repeats, results)
    out = None
    while not results.empty():
        out = results.get()
    return out


def cdiff_engine(path, cls, m, args):
    model = from_mujoco(path, cls=cls)
    q0, v0 = (jnp.asarray(x) for x in start(m))
    dt = float(m.opt.timestep)
    formulation = cdiff.UdwadiaKalaba()

    def final(model, q0, v0, steps):
        sol = cdiff.simulate(model, formulation, q0, v0, t1=steps * dt, dt=dt,
                             saveat=cdiff.SaveAt(t1=True))
        return sol.q[-1]

    begin = time.perf_counter()
    one, traced, xla = compile_split(lambda q, v: final(model, q, v, args.steps), q0, v0)
    jax.block_until_ready(one(q0, v0))
    first = time.perf_counter() - begin
    seconds = best(lambda: one(q0, v0), args.repeats)
    out = {"trace": traced, "xla": xla, "first call": first,
           "steps/s": args.steps / seconds,
           "error": equality_error(m, np.asarray(one(q0, v0)))}
    log(f"  one trajectory: trace {traced:.1f} s, XLA {xla:.1f} s, "
        f"{out['steps/s']:.0f} steps/s")

    scales = jnp.linspace(0.5, 1.5, args.batch)
    batch = jax.jit(jax.vmap(lambda s: final(model, q0, s * v0, args.batch_steps)))
    begin = time.perf_counter()
    jax.block_until_ready(batch(scales))
    first = time.perf_counter() - begin
    seconds = best(lambda: batch(scales), args.repeats)
    out["batch compile"] = first - seconds
    out["batch steps/s"] = args.batch * args.batch_steps / seconds
    log(f"  batch {args.batch}: compile {out['batch compile']:.1f} s, "
        f"{out['batch steps/s']:.0f} steps/s")

    def loss(mass):
        tuned = model.tree_replace({"body_mass": mass})
        return jnp.sum(final(tuned, q0, v0, args.grad_steps) ** 2)

    grad = jax.jit(jax.grad(loss))
    mass = model.mjx_model.body_mass
    begin = time.perf_counter()
    g = jax.block_until_ready(grad(mass))
    first = time.perf_counter() - begin
    seconds = best(lambda: grad(mass), args.repeats)
    out["grad compile"], out["grad run"] = first - seconds, seconds
    out["grad finite"] = bool(np.all(np.isfinite(np.asarray(g))))
    log(f"  gradient: compile {out['grad compile']:.1f} s, run {seconds:.3f} s")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT, choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batch-steps", type=int, default=100)
    parser.add_argument("--grad-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", action="store_true",
                        help="also cdiff with the constraint terms by autodiff")
    parser.add_argument("--no-mjx", nargs="*", default=[], metavar="NAME",
                        help="models to run without MJX (its step deadlocks on the "
                             "N four-bar on a 2-core CPU with jaxlib 0.10.2)")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    rows = []
    for name in args.models:
        path = MODELS[name]
        m = mujoco.MjModel.from_xml_path(str(path))
        log(f"{name}: nq {m.nq}, nv {m.nv}, {m.neq} equalities")
        results = {"MuJoCo C": c_engine(m, args.steps)}
        if name not in args.no_mjx:
            log("  MJX")
            results["MJX"] = mjx_in_process(path, args)
        variants = [("cdiff", MuJoCoModel)]
        if args.before:
            variants.append(("cdiff, autodiff terms", AutodiffTerms))
        for label, cls in variants:
            log(f"  {label}")
            results[label] = cdiff_engine(path, cls, m, args)
        rows.append((name, m, results))

    def cell(r, key, fmt):
        return "—" if r is None or key not in r else format(r[key], fmt)

    lines = [
        "| model (nq/nv) | method | trace + lower (s) | XLA compile (s) | "
        "compile + first call (s) | steps/s, one | "
        f"batch {args.batch} compile (s) | steps/s, batch {args.batch} | "
        f"grad {args.grad_steps} steps compile (s) | grad run (s) | max abs(Φ) at end |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m, results in rows:
        for label, r in results.items():
            lines.append(
                f"| {name} ({m.nq}/{m.nv}) | {label} | {cell(r, 'trace', '.1f')} | "
                f"{cell(r, 'xla', '.1f')} | {cell(r, 'first call', '.1f')} | "
                f"{cell(r, 'steps/s', ',.0f')} | "
                f"{cell(r, 'batch compile', '.1f')} | {cell(r, 'batch steps/s', ',.0f')} | "
                f"{cell(r, 'grad compile', '.1f')} | {cell(r, 'grad run', '.3f')} | "
                f"{cell(r, 'error', '.1e')} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        record("loaded.py", f"{args.steps} steps (one trajectory), batch {args.batch} "
               f"x {args.batch_steps} steps, gradient through {args.grad_steps} steps; "
               "UdwadiaKalaba + RK4 at each file's timestep; best of "
               f"{args.repeats}.", table)


if __name__ == "__main__":
    main()
