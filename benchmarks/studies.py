"""The step-size study of R2, one compiled program per formulation, and what the
step sizes cost together (issues 6 and 20).

    python benchmarks/studies.py [--t1 10] [--record]

R2 (slider-crank), RK4, float64, eight step sizes from 1e-3 to 1e-1 (all dividing
0.1 s; errors measured every 0.1 s, on every step grid): Baumgarte at the best
gains of a vmapped gain sweep (6 x 6 gains x 8 step sizes in one call),
Udwadia-Kalaba with constraint correction, with constraint + energy correction,
and RK4 on the minimal ODE (eq. 24). For each formulation: the wall time of the
eight step sizes (on CPU one after another, the study's default there) against
the time of the smallest step alone (the same compiled program, best of 3), the
same study in one vmapped call over the step sizes (the GPU path) in the same run,
the gain sweep in its default chunks and in one call, and the errors at dt = 5e-2 and
1e-1 where the paper's Fig. 4(d) claim lives. Writes the table and Fig. 4 to
benchmarks/out/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402
from cdiff.cli._study import DEFAULT_DTS, DEFAULT_GAINS  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t1", type=float, default=10.0)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    model = cdiff.models.SliderCrank()
    n_save = int(round(args.t1 / 0.1))
    sweep = cdiff.studies.gain_sweep(
        model, cdiff.Lagrange(), {"alpha": DEFAULT_GAINS, "beta": DEFAULT_GAINS},
        DEFAULT_DTS, args.t1, n_save=n_save)
    print(sweep.best)
    formulations = {
        "Baumgarte (best gains)": sweep.best_formulation(),
        "UK": cdiff.UdwadiaKalaba(),
        "UK + energy": cdiff.UdwadiaKalaba(energy_correction=True),
        "RK4, minimal ODE": cdiff.studies.Minimal(),
    }
    study = cdiff.studies.step_size_study(model, formulations, DEFAULT_DTS, args.t1,
                                          n_save=n_save, repeat=3)
    print(study)
    out = Path(__file__).with_name("out")
    study.save(out / "r2-step-size")
    study.plot(out / "r2-step-size.png")
    sweep.save(out / "r2-gains")
    # The same, every step size in one vmapped call (the GPU path), in this run.
    vmapped = cdiff.studies.step_size_study(model, formulations, DEFAULT_DTS, args.t1,
                                            n_save=n_save, repeat=3, progress=False,
                                            vmap=True)
    one_call = cdiff.studies.gain_sweep(
        model, cdiff.Lagrange(), {"alpha": DEFAULT_GAINS, "beta": DEFAULT_GAINS},
        DEFAULT_DTS, args.t1, n_save=n_save, chunk_size=len(DEFAULT_GAINS) ** 2 * 8)

    lines = ["| formulation | compile [s] | 8 step sizes [s] | dt = 1e-3 alone [s] | "
             "ratio | 8 step sizes, one vmapped call [s] | its ratio | "
             "error at dt = 5e-2 | error at 1e-1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in formulations:
        rows = study.where(formulation=name)
        one = rows["time"][np.argmin(rows["dt"])]
        batch = rows["batch_time"][0]
        together = vmapped.where(formulation=name)["batch_time"][0]
        err = {dt: rows["max_error"][np.isclose(rows["dt"], dt)][0]
               for dt in (5e-2, 1e-1)}
        lines.append(f"| {name} | {rows['compile_time'][0]:.1f} | {batch:.3f} | "
                     f"{one:.3f} | {batch / one:.2f} | {together:.3f} | "
                     f"{together / one:.2f} | {err[5e-2]:.2e} | {err[1e-1]:.2e} |")
    best = sweep.best
    lines += ["", f"Gain sweep: {sweep.meta['batch']} runs in "
              f"{sweep.meta['chunks']} chunks, {sweep.meta['batch_time']:.2f} s "
              f"(compile {sweep.meta['compile_time']:.1f} s); in one vmapped call "
              f"{one_call.meta['batch_time']:.2f} s (compile "
              f"{one_call.meta['compile_time']:.1f} s). Best (alpha, beta) per dt: "
              + ", ".join(f"{dt:g}: ({a:g}, {b:g})"
                          for dt, a, b in zip(best["dt"], best["alpha"], best["beta"]))]
    table = "\n".join(lines)
    print(table)
    if args.record:
        record("studies.py", f"R2, t1 = {args.t1:g} s, RK4, float64; figure and "
               "tables in benchmarks/out/r2-step-size.{png,csv,npz}.", table)


if __name__ == "__main__":
    main()
