"""Default speed: the calls a user writes, with no option passed (issue 20).

    python benchmarks/default_speed.py [--batch 4096] [--repeats 5]
        [--cli] [--record]

1. The natural batched call, verbatim:
   `jax.jit(jax.vmap(lambda q0: cdiff.simulate(model, UK(c + e), q0, v0, t1=1.0,
   dt=1e-2, saveat=cdiff.SaveAt(ts=jnp.array([1.0]))).q[-1]))` on R2 (slider-crank),
   float64, no compiler options, one JAX device; the same with `SaveAt(t1=True)`;
   the same without the `jax.jit` (`simulate` then compiles its own program, with
   `cdiff.compiler_options()`); and the NumPy port of the same equations and RK4
   (`compare.py`), one trajectory at a time, in the same run. Steps/s count all
   trajectories. `import cdiff` leaves XLA_FLAGS alone, so the jitted call gets
   JAX's defaults.
2. The natural call again in a fresh process that calls
   `cdiff.configure_xla_flags()` after `import cdiff` (the documented call).
3. `--cli`: `cdiff run slider-crank --t1 300` in a pseudo-terminal (the progress
   bar shown) against `--no-progress`, interleaved, best of `--repeats`: the run
   time the command reports and the whole command's wall time.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import cdiff  # noqa: E402
from _record import record  # noqa: E402
from compare import numpy_uk_rk4  # noqa: E402

MODEL = cdiff.models.SliderCrank()
STEPS = 100  # t1 = 1, dt = 1e-2


def natural(batch: int, saveat: str, jit: bool = True):
    """(the compiled natural call, its input, compile s) over `batch` starts
    (`jit=False`: the same `jax.vmap` without the `jax.jit`)."""
    model = MODEL
    q0s, v0 = model.initial_state()
    q0s = q0s + jnp.zeros((batch, 6)).at[:, 2].set(jnp.linspace(0.0, 1e-6, batch))

    # Made inside the traced function, as a user writes it (`jnp.array` there is
    # traced: the own loop's traced save times).
    make = {"ts": lambda: cdiff.SaveAt(ts=jnp.array([1.0])),
            "t1": lambda: cdiff.SaveAt(t1=True)}[saveat]
    fn = jax.vmap(lambda q0: cdiff.simulate(
        model, cdiff.UdwadiaKalaba(energy_correction=True), q0, v0, t1=1.0, dt=1e-2,
        saveat=make()).q[-1])
    fn = jax.jit(fn) if jit else fn
    with warnings.catch_warnings():  # the hint to call configure_xla_flags
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        jax.block_until_ready(fn(q0s))
        first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(fn(q0s))
    return fn, q0s, first - (time.perf_counter() - start)


def interleaved(calls: dict, repeats: int) -> tuple[dict, dict]:
    """Best run seconds and outputs of each `(fn, x)`, timed in turns."""
    best, out = dict.fromkeys(calls, np.inf), {}
    for _ in range(repeats):
        for name, (fn, x) in calls.items():
            start = time.perf_counter()
            out[name] = jax.block_until_ready(fn(x))
            best[name] = min(best[name], time.perf_counter() - start)
    return best, {k: np.asarray(v) for k, v in out.items()}


def numpy_run(repeats: int, trajectories: int = 5) -> tuple[float, np.ndarray]:
    """(best s per trajectory, final q) of the NumPy port, one trajectory at a time."""
    q0, v0 = (np.asarray(x) for x in MODEL.initial_state())
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(trajectories):
            q = numpy_uk_rk4(q0, v0, 1.0, 1e-2, STEPS)
        best = min(best, (time.perf_counter() - start) / trajectories)
    return best, q[-1]


def configured(batch: int, repeats: int) -> tuple[float, float]:
    """The natural call in a fresh process that calls
    `cdiff.configure_xla_flags()` first."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            "import cdiff; assert cdiff.configure_xla_flags() == 'set'; "
            "import default_speed as d; "
            f"fn, x, c = d.natural({batch}, 'ts'); "
            f"r = d.interleaved({{'ts': (fn, x)}}, {repeats})[0]['ts']; "
            "print('RESULT', c, r)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "CDIFF_XLA_FLAGS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    compile_s, run_s = (float(x) for x in out.split("RESULT")[1].split())
    return compile_s, run_s


def cli_run(progress: bool, out_dir: str, t1: float = 300.0) -> tuple[float, float, bool]:
    """(run s reported, wall s, bar seen) of `cdiff run slider-crank --t1 300`,
    stdout and stderr on a pseudo-terminal."""
    cmd = [sys.executable, "-m", "cdiff.cli", "run", "slider-crank", "--t1", f"{t1:g}",
           "--out", out_dir] + ([] if progress else ["--no-progress"])
    primary, secondary = pty.openpty()
    # An 80-column terminal (a new pseudo-terminal has 0 columns, and tqdm then
    # draws a bar of no width).
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=secondary, stderr=secondary, close_fds=True)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait()
    wall = time.perf_counter() - start
    os.close(primary)
    text = b"".join(chunks).decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"cdiff run failed:\n{text[-2000:]}")
    match = re.search(r"run ([0-9.]+) s\)", text)
    return float(match.group(1)), wall, "100.00%" in text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cli", action="store_true")
    parser.add_argument("--cli-t1", type=float, default=300.0)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    from cdiff import _compiler

    steps = args.batch * STEPS
    lines = ["| call | compile [s] | run [s] | steps/s | / NumPy |",
             "|---|---:|---:|---:|---:|"]
    fn_ts, x, c_ts = natural(args.batch, "ts")
    fn_t1, _, c_t1 = natural(args.batch, "t1")
    fn_vm, _, c_vm = natural(args.batch, "ts", jit=False)
    best, out = interleaved({"ts": (fn_ts, x), "t1": (fn_t1, x), "vmap": (fn_vm, x)},
                            args.repeats)
    (r_ts, q_ts), (r_t1, q_t1) = (best["ts"], out["ts"]), (best["t1"], out["t1"])
    r_vm = best["vmap"]
    per_traj, q_np = numpy_run(max(1, args.repeats // 2))
    numpy_rate = STEPS / per_traj
    diff = float(np.max(np.abs(q_ts[0] - q_np)))
    if diff > 1e-9 or not np.allclose(q_ts, q_t1, rtol=0, atol=1e-12):
        raise SystemExit(f"results disagree: NumPy {diff:.2e}, ts against t1 "
                         f"{np.max(np.abs(q_ts - q_t1)):.2e}")
    c_c, r_c = configured(args.batch, args.repeats)
    rows = [("natural call, `SaveAt(ts=jnp.array([1.0]))` (XLA_FLAGS untouched)",
             c_ts, r_ts),
            ("the same with `SaveAt(t1=True)`", c_t1, r_t1),
            ("the same `jax.vmap` without `jax.jit` (simulate passes the option)",
             c_vm, r_vm),
            ("natural call after `cdiff.configure_xla_flags()`", c_c, r_c)]
    for name, c, r in rows:
        lines.append(f"| {name} | {c:.2f} | {r:.4f} | {steps / r:,.0f} | "
                     f"{steps / r / numpy_rate:.0f} |")
    lines.append(f"| NumPy port, one trajectory at a time | — | {per_traj:.4f} per "
                 f"trajectory | {numpy_rate:,.0f} | 1 |")
    if args.cli:
        best = {True: (np.inf, np.inf), False: (np.inf, np.inf)}
        for _ in range(args.repeats):
            for progress in (True, False):
                run_s, wall, shown = cli_run(progress, "/tmp/cdiff-default-speed",
                                             args.cli_t1)
                if progress and not shown:
                    raise SystemExit("no progress bar in the terminal output")
                best[progress] = (min(best[progress][0], run_s),
                                  min(best[progress][1], wall))
        lines += ["", f"| `cdiff run slider-crank --t1 {args.cli_t1:g}` | run [s] "
                  "(reported) | "
                  "wall [s] |", "|---|---:|---:|"]
        for progress in (True, False):
            lines.append(f"| {'progress bar' if progress else '--no-progress'} | "
                         f"{best[progress][0]:.3f} | {best[progress][1]:.2f} |")
        lines.append(f"| ratio | {best[True][0] / best[False][0]:.3f} | "
                     f"{best[True][1] / best[False][1]:.3f} |")
    table = "\n".join(lines)
    print(table)
    print(f"max |q_numpy - q_cdiff| = {diff:.2e}; XLA option in this process: "
          f"{_compiler.FLAGS_STATUS}")
    if args.record:
        record("default_speed.py",
               "R2, UdwadiaKalaba (constraint + energy "
               f"correction), RK4, dt = 1e-2, {STEPS} steps, float64, batch "
               f"{args.batch}, one JAX device, no compiler options passed by the "
               f"caller; best of {args.repeats}. "
               f"NumPy agrees to {diff:.1e}.", table)


if __name__ == "__main__":
    main()
