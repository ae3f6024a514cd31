"""Accuracy against the exact references: the Braun-Goldfarb claims, in numbers.

    python benchmarks/accuracy.py [--record]

R2 (slider-crank, 100 s) at dt = 1e-2 and 5e-2 and R4 (double four-bar, 1000 s) at
dt = 1e-2, RK4, float64: max constraint error, max energy error and max error of the
observable (slider x_s; joint (x3, y3)) against the exact minimal-coordinate solution,
for Udwadia-Kalaba with constraint correction, with constraint + energy correction,
Baumgarte at the best gains of a small vmapped sweep, and RK4 on the minimal ODE.
"""

from __future__ import annotations

import argparse

import diffrax
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import cdiff  # noqa: E402
if __name__ == "__main__":  # as the docs ask on CPU: before any JAX computation
    cdiff.configure_xla_flags()  # (not where another script imports this one)
from _record import record  # noqa: E402

GAINS = jnp.array([1.0, 2.0, 5.0, 10.0, 20.0])


def _errors(model, sol, ref_obs):
    obs_err = jnp.max(jnp.abs(model.observable(sol.q[1:]) - ref_obs))
    return (float(sol.max_constraint_error), float(sol.max_energy_error),
            float(jnp.where(jnp.isfinite(obs_err), obs_err, jnp.inf)))


def _minimal_rk4(model, t1, dt, ts):
    """RK4 on the minimal ODE that defines the model's reference, same step."""
    from cdiff.models import _double_four_bar, _slider_crank

    if isinstance(model, cdiff.models.SliderCrank):
        rhs, y0 = _slider_crank._minimal_rhs, jnp.array([jnp.pi / 4, 0.0])
    else:
        rhs, y0 = _double_four_bar._rhs, jnp.array([jnp.pi / 2, -1.0 / model.l])
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs), cdiff.RK4(), 0.0, t1, dt, y0,
        args=jnp.asarray(model.g / model.l), saveat=diffrax.SaveAt(ts=ts),
        max_steps=int(round(t1 / dt)),
    )
    th = sol.ys[:, 0]
    if isinstance(model, cdiff.models.SliderCrank):
        return jnp.abs(2 * model.l * jnp.cos(th) - model.observable(
            model.reference(ts).q)[:, 0])
    exact = model.observable(model.reference(ts).q)
    approx = jnp.stack([2 * model.l + model.l * jnp.cos(th), model.l * jnp.sin(th)], -1)
    return jnp.abs(approx - exact)


def study(model, t1, dt, n_save):
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, t1, n_save + 1)
    save = cdiff.SaveAt(ts=ts)
    ref_obs = model.observable(model.reference(ts[1:]).q)
    rows = {}
    for name, f in [("UdwadiaKalaba (constraint)", cdiff.UdwadiaKalaba()),
                    ("UdwadiaKalaba (constraint + energy)",
                     cdiff.UdwadiaKalaba(energy_correction=True))]:
        sol = cdiff.simulate(model, f, q0, v0, t1=t1, dt=dt, saveat=save, throw=False)
        rows[name] = _errors(model, sol, ref_obs)

    @jax.jit
    @jax.vmap
    def baumgarte(alpha, beta):
        sol = cdiff.simulate(model, cdiff.Lagrange(alpha, beta), q0, v0, t1=t1, dt=dt,
                             saveat=save, throw=False)
        c, e, o = (sol.max_constraint_error, sol.max_energy_error,
                   jnp.max(jnp.abs(model.observable(sol.q[1:]) - ref_obs)))
        ok = jnp.isfinite(o) & jnp.all(jnp.isfinite(sol.q))
        return jnp.where(ok, c, jnp.inf), jnp.where(ok, e, jnp.inf), jnp.where(ok, o, jnp.inf)

    alpha, beta = (g.ravel() for g in jnp.meshgrid(GAINS, GAINS))
    c, e, o = baumgarte(alpha, beta)
    best = int(jnp.argmin(o))
    rows[f"Lagrange (best of {alpha.size}: alpha={float(alpha[best]):g}, "
         f"beta={float(beta[best]):g}; {int(jnp.sum(jnp.isfinite(o)))} finite)"] = (
        float(c[best]), float(e[best]), float(o[best]))
    rows["RK4 on the minimal ODE"] = (
        float("nan"), float("nan"), float(jnp.max(_minimal_rk4(model, t1, dt, ts[1:]))))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    cases = [
        ("R2 slider-crank, 100 s", cdiff.models.SliderCrank(), 100.0, 1e-2, 10000),
        ("R2 slider-crank, 100 s", cdiff.models.SliderCrank(), 100.0, 5e-2, 2000),
        ("R4 double four-bar, 1000 s", cdiff.models.DoubleFourBar(), 1000.0, 1e-2,
         20000),
    ]
    lines = ["| case | dt | method | max abs(Phi_q) | max abs(E - E0) | max observable error |",
             "|---|---:|---|---:|---:|---:|"]
    for label, model, t1, dt, n in cases:
        print(f"{label}, dt = {dt:g} ...", flush=True)
        for name, (c, e, o) in study(model, t1, dt, n).items():
            line = f"| {label} | {dt:g} | {name} | {c:.2e} | {e:.2e} | {o:.2e} |"
            print(line, flush=True)
            lines.append(line)
    table = "\n".join(lines)
    if args.record:
        record("accuracy.py", "RK4, float64; errors against the exact "
               "minimal-coordinate references (observable: slider x_s for R2, joint "
               "(x3, y3) for R4), maxima over the run at the saved times.", table)

if __name__ == "__main__":
    main()
