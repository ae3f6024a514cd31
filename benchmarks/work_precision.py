"""Work-precision: error against cost for constant-step RK4, adaptive Runge-Kutta,
cdiff's BDF and SciPy on the minimal ODE.

    python benchmarks/work_precision.py [--models r2 r4 r1] [--t1 10] [--repeats 3]
        [--methods ...] [--quick] [--out benchmarks/out] [--record]

For each reference model with a minimal-coordinate ODE (R2 slider-crank, R4 double
four-bar, R1 particle on a circle under gravity), float64, from the paper's
initial state to `--t1`:

- constant-step RK4 (cdiff.RK4, cdiff's own loop) at several dt,
- Tsit5, Dopri5 and Dopri8 with diffrax's PIDController (rtol = atol) at several
  tolerances,

all with UdwadiaKalaba(constraint_correction=True, energy_correction=True);

- cdiff.BDF (rtol = atol) with GGL (the DAE formulation) and with
  Lagrange(alpha=10, beta=10) (an ODE formulation without per-step data, which BDF
  also takes; UdwadiaKalaba's frozen corrections need a one-step method);
- SciPy's DOP853 and Radau on the minimal ODE itself (two states, NumPy right-hand
  side): what a solver that needs no constraints at all costs.

Error: max over the observable's components (slider x_s; joint (x3, y3); the
position (q1, q2)) at t1 against SciPy's DOP853 at rtol = atol = 1e-13 on the
minimal ODE (checked against the model's own diffrax Dopri8 reference, printed).
Cost: the best of `--repeats` runs of the compiled solve (compilation excluded; one
compilation per method, the tolerance traced; per dt for RK4), the number of
attempted steps (SciPy: accepted steps; it does not count rejections) and of
evaluations: vector-field evaluations for the Runge-Kutta
methods (4 per RK4 step; 7 per Tsit5/Dopri5 and 14 per Dopri8 attempt, rejected
ones included: UdwadiaKalaba's per-step data changes the field at every step, so
the first-same-as-last stage is not reused; counted in tests/solvers/test_adaptive.py),
SciPy's `nfev`, and for BDF its DAE residual evaluations (4 Newton iterations per
attempted step) plus one Jacobian (jax.jacfwd) per attempted step.

Writes benchmarks/out/work-precision.{png,md,csv} (one log-log panel per model:
error against wall time and against evaluations); `--record` records the table in
benchmarks/RESULTS.md and HISTORY.md. `--quick` is a smoke test (t1 = 0.5 s, one setting each).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp

jax.config.update("jax_enable_x64", True)

import _config  # noqa: E402
import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402

RK4_DTS = (5e-2, 2e-2, 1e-2, 5e-3, 2e-3, 1e-3)
RK_TOLS = (1e-4, 1e-6, 1e-8, 1e-10, 1e-12)
BDF_TOLS = (1e-4, 1e-6, 1e-8, 1e-10)
SCIPY_TOLS = (1e-4, 1e-6, 1e-8, 1e-10, 1e-12)
FIRST_STEP = 1e-3  # dt of the adaptive methods: their first step

UK = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
#: evaluations of the vector field per attempted step with UK (FSAL not reused).
STAGES = {"Tsit5": 7, "Dopri5": 7, "Dopri8": 14}


# --- the models and their minimal ODEs, in NumPy ------------------------------------


class Case(NamedTuple):
    label: str
    model: Any
    rhs: Callable  # minimal ODE, y = (angle, rate)
    y0: np.ndarray
    observable: Callable  # minimal state -> the model's observable


def _slider_crank():
    model = cdiff.models.SliderCrank()
    g, l = float(model.g / model.l), float(model.l)

    def rhs(t, y):
        th, om = y
        acc = -3.0 / (5.0 - 3.0 * np.cos(2 * th)) * (np.sin(2 * th) * om**2
                                                     + g * np.cos(th))
        return np.array([om, acc])

    return Case("R2 slider-crank", model, rhs, np.array([np.pi / 4, 0.0]),
                lambda y: np.array([2 * l * np.cos(y[0])]))


def _double_four_bar():
    model = cdiff.models.DoubleFourBar()
    g, l = float(model.g / model.l), float(model.l)

    def rhs(t, y):
        return np.array([y[1], -7.0 / 6.0 * g * np.cos(y[0])])

    return Case("R4 double four-bar", model, rhs, np.array([np.pi / 2, -1.0 / l]),
                lambda y: np.array([2 * l + l * np.cos(y[0]), l * np.sin(y[0])]))


def _pendulum():
    model = cdiff.models.ParticleOnCircle(g=9.81)
    g, rho = float(model.g / model.rho), float(model.rho)

    def rhs(t, y):
        return np.array([y[1], -g * np.cos(y[0])])

    return Case("R1 particle on circle, g = 9.81", model, rhs,
                np.array([0.0, float(model.speed) / rho]),
                lambda y: np.array([rho * np.cos(y[0]), rho * np.sin(y[0])]))


CASES = {"r2": _slider_crank, "r4": _double_four_bar, "r1": _pendulum}


def reference(case: Case, t1: float) -> np.ndarray:
    """The observable at t1 by DOP853 at rtol = atol = 1e-13 on the minimal ODE."""
    sol = solve_ivp(case.rhs, (0.0, t1), case.y0, method="DOP853", rtol=1e-13,
                    atol=1e-13)
    return case.observable(sol.y[:, -1])


# --- the measurements -------------------------------------------------------------


class Row(NamedTuple):
    model: str
    method: str
    setting: str
    error: float
    constraint: float  # max |Phi_q| at t1 (NaN for SciPy: on the constraints)
    seconds: float
    steps: int  # attempted
    rejected: int
    evaluations: int
    jacobians: int
    failed: str  # "" when the solve succeeded


def _best(fn, arg, repeats):
    out = jax.block_until_ready(fn(arg))  # compiles
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(arg))
        best = min(best, time.perf_counter() - start)
    return best, jax.tree.map(np.asarray, out)


def _cdiff_program(case: Case, t1: float, make, options):
    """`param -> summary` of one cdiff solve, jitted; `make(param)` gives
    `(formulation, solver, controller, dt)`."""
    model = case.model
    q0, v0 = model.initial_state()

    def run(param):
        formulation, solver, controller, dt = make(param)
        sol = cdiff.simulate(model, formulation, q0, v0, t1=t1, dt=dt, solver=solver,
                             stepsize_controller=controller,
                             saveat=cdiff.SaveAt(t1=True), throw=False)
        q = sol.q[-1]
        return dict(observable=model.observable(q),
                    constraint=jnp.max(jnp.abs(model.holonomic(t1, q))),
                    steps=sol.stats["num_steps"],
                    rejected=sol.stats["num_rejected_steps"],
                    ok=sol.succeeded)

    return jax.jit(run, compiler_options=options)


def _cdiff_row(case, exact, method, setting, fn, param, repeats, evals, jacobians=0):
    seconds, out = _best(fn, param, repeats)
    error = float(np.max(np.abs(out["observable"] - exact)))
    steps, rejected = int(out["steps"]), int(out["rejected"])
    ok = bool(out["ok"]) and np.isfinite(error)
    return Row(case.label, method, setting, error, float(out["constraint"]), seconds,
               steps, rejected, evals(steps), jacobians * steps,
               "" if ok else "failed")


def measure_cdiff(case, t1, exact, args, options, methods):
    tol_array = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    if "RK4" in methods:
        for dt in args.rk4_dts:
            fn = _cdiff_program(case, t1, lambda _, dt=dt: (UK, cdiff.RK4(), None, dt),
                                options)
            yield _cdiff_row(case, exact, "RK4", f"dt = {dt:g}", fn, 0.0, args.repeats,
                             lambda n: 4 * n)
    for name in ("Tsit5", "Dopri5", "Dopri8"):
        if name not in methods:
            continue
        solver = getattr(diffrax, name)()

        def make(tol, solver=solver):
            return (UK, solver, diffrax.PIDController(rtol=tol, atol=tol), FIRST_STEP)

        fn = _cdiff_program(case, t1, make, options)
        for tol in args.rk_tols:
            yield _cdiff_row(case, exact, f"{name} + PID", f"tol = {tol:g}", fn,
                             tol_array(tol), args.repeats,
                             lambda n, s=STAGES[name]: s * n)
    for key, name, formulation in (
            ("GGL", "BDF + GGL", cdiff.GGL()),
            ("Lagrange", "BDF + Lagrange(10, 10)", cdiff.Lagrange(10.0, 10.0))):
        if key not in methods and "BDF" not in methods:
            continue

        def make(tol, formulation=formulation):
            return formulation, cdiff.BDF(tol, tol), None, FIRST_STEP

        fn = _cdiff_program(case, t1, make, options)
        for tol in args.bdf_tols:
            yield _cdiff_row(case, exact, name, f"tol = {tol:g}", fn, tol_array(tol),
                             args.repeats, lambda n: 4 * n, jacobians=1)


def measure_scipy(case, t1, exact, args):
    for method in ("DOP853", "Radau"):
        if method not in args.methods:
            continue
        for tol in args.scipy_tols:
            best, sol = np.inf, None
            for _ in range(max(args.repeats, 1)):
                start = time.perf_counter()
                sol = solve_ivp(case.rhs, (0.0, t1), case.y0, method=method, rtol=tol,
                                atol=tol)
                best = min(best, time.perf_counter() - start)
            error = float(np.max(np.abs(case.observable(sol.y[:, -1]) - exact)))
            steps = len(sol.t) - 1  # accepted (SciPy does not count rejections)
            yield Row(case.label, f"SciPy {method} (minimal ODE)", f"tol = {tol:g}",
                      error, float("nan"), best, steps, 0, int(sol.nfev),
                      int(sol.njev), "" if sol.success else "failed")


# --- output -----------------------------------------------------------------------


HEAD = ("| model | method | setting | error at t1 | abs(Phi_q) at t1 | time (ms) | "
        "steps (rejected) | evaluations | Jacobians |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|")


def markdown(row: Row) -> str:
    error = f"{row.error:.2e}" + (" (failed)" if row.failed else "")
    return (f"| {row.model} | {row.method} | {row.setting} | {error} | "
            f"{row.constraint:.1e} | {row.seconds * 1e3:.3g} | {row.steps} "
            f"({row.rejected}) | {row.evaluations} | {row.jacobians} |")


def plot(rows, labels, t1, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r.method for r in rows))
    colours = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    markers = "osd^v<>ph*"
    fig, axes = plt.subplots(2, len(labels), figsize=(max(5.2 * len(labels), 8), 9),
                             squeeze=False)
    for col, label in enumerate(labels):
        for row_i, (attr, ylabel) in enumerate(
                (("seconds", "wall time [s] (best run, compiled)"),
                 ("evaluations", "evaluations (vector field; BDF: residual)"))):
            ax = axes[row_i, col]
            for i, method in enumerate(methods):
                pts = sorted((r.error, getattr(r, attr)) for r in rows
                             if r.model == label and r.method == method
                             and not r.failed and r.error > 0)
                if pts:
                    ax.plot(*zip(*pts), "-", marker=markers[i % len(markers)], ms=4,
                            color=colours[method], label=method)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.invert_xaxis()
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel(f"max observable error at t1 = {t1:g} s (more accurate "
                          "to the right)")
            ax.set_ylabel(ylabel)
            if row_i == 0:
                ax.set_title(label, fontsize=10)
    handles, names = axes[0, 0].get_legend_handles_labels()
    for ax in axes.ravel():
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 4),
               fontsize=8)
    fig.suptitle("Work-precision, float64: UdwadiaKalaba with both corrections for "
                 "the Runge-Kutta methods,\nSciPy on the minimal ODE; failed runs "
                 "left out (see the table)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(CASES),
                        default=["r2", "r4", "r1"])
    parser.add_argument("--t1", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    all_methods = ["RK4", "Tsit5", "Dopri5", "Dopri8", "GGL", "Lagrange", "DOP853",
                   "Radau"]
    parser.add_argument("--methods", nargs="+", choices=all_methods + ["BDF"],
                        default=all_methods,
                        help="BDF: both BDF rows (GGL, Lagrange)")
    parser.add_argument("--rk4-dts", type=float, nargs="+", default=list(RK4_DTS))
    parser.add_argument("--rk-tols", type=float, nargs="+", default=list(RK_TOLS))
    parser.add_argument("--bdf-tols", type=float, nargs="+", default=list(BDF_TOLS))
    parser.add_argument("--scipy-tols", type=float, nargs="+",
                        default=list(SCIPY_TOLS))
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: t1 = 0.5 s, one setting per method, "
                             "one repeat")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).with_name("out"))
    parser.add_argument("--record", action="store_true",
                        help="record the table in benchmarks/RESULTS.md and HISTORY.md")
    _config.add_arguments(parser)
    args = parser.parse_args(argv)
    _config.apply(args)
    options = _config.options(args.xla_options)
    if args.quick:
        args.t1, args.repeats = 0.5, 1
        args.rk4_dts, args.rk_tols = [1e-2], [1e-6]
        args.bdf_tols, args.scipy_tols = [1e-6], [1e-6]
    rows, labels = [], []
    print(HEAD, flush=True)
    for key in args.models:
        case = CASES[key]()
        labels.append(case.label)
        exact = reference(case, args.t1)
        own = np.asarray(case.model.observable(
            case.model.reference(jnp.asarray([args.t1])).q[0]))
        print(f"<!-- {case.label}: DOP853 (1e-13) reference vs the model's diffrax "
              f"Dopri8 (1e-12) reference: {np.max(np.abs(own - exact)):.1e} -->",
              flush=True)
        for row in (*measure_cdiff(case, args.t1, exact, args, options, args.methods),
                    *measure_scipy(case, args.t1, exact, args)):
            rows.append(row)
            print(markdown(row), flush=True)
    table = "\n".join([HEAD, *map(markdown, rows)])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "work-precision.md").write_text(table + "\n")
    with (args.out / "work-precision.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(Row._fields)
        writer.writerows(rows)
    plot(rows, labels, args.t1, args.out / "work-precision.png")
    print(f"wrote {args.out}/work-precision.{{png,md,csv}}")
    if args.record:
        record("work_precision.py",
               f"float64, t1 = {args.t1:g} s; error of the observable at t1 against "
               "SciPy DOP853 (1e-13) on the minimal ODE; time: best of "
               f"{args.repeats} compiled runs; Runge-Kutta rows with "
               "UdwadiaKalaba(constraint + energy correction), adaptive first step "
               f"{FIRST_STEP:g}. {_config.describe(args)}", table)


if __name__ == "__main__":
    main()
