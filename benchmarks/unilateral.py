"""The cost of unilateral rows: a Cartesian pendulum (2 s, float64) without
unilateral rows, with a wall it never reaches, and with a wall it hits
(restitution 0.6, about 5 impacts): one trajectory, a vmapped batch, and the
gradient of one final coordinate with respect to the initial angle. Integrated by
cdiff's own RK4 loop (UdwadiaKalaba, dt = 1e-3), by diffrax's Tsit5 with adaptive
steps (segments of diffeqsolve between events) and by GGL with cdiff's BDF
(segments of BDF).

    python benchmarks/unilateral.py [--batch 256] [--repeats 5] [--rounds 1]
                                    [--record] [--solvers rk4 tsit5 bdf]

The first call is reported in its phases (tracing, lowering, XLA's compile, and
the first run) and in all, the run time is the best of `--repeats`; each with its
ratio to the pendulum without rows and the same solver. With `--rounds N` every
case is measured N times, round after round, and its fastest first call and run
are kept: on a shared machine whose speed drifts, a slow phase then falls on
every case alike instead of on whichever ran during it.
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
from _config import CLOCKS, best_of_rounds, set_clock  # noqa: E402
from _record import record  # noqa: E402

GRAVITY = 9.81


class Pendulum(cdiff.AbstractModel):
    """A unit point mass on a rod of unit length, Cartesian coordinates."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.array([0.0, -GRAVITY], q.dtype)

    def energy(self, t, q, v):
        return 0.5 * v @ v + GRAVITY * q[1]

    def holonomic(self, t, q):
        return jnp.atleast_1d(q @ q - 1.0)


class PendulumAndWall(Pendulum):
    """The pendulum and a wall at x = -a: g = x + a >= 0."""

    a: float = 0.4
    restitution: float = 0.6

    def unilateral(self, t, q):
        return jnp.atleast_1d(q[0] + self.a)


CASES = {"no rows": Pendulum(), "wall never reached": PendulumAndWall(a=2.0),
         "wall hit": PendulumAndWall()}
SOLVERS = {
    "rk4": ("RK4, dt = 1e-3", cdiff.UdwadiaKalaba(), {}),
    "tsit5": ("Tsit5, PID 1e-8", cdiff.UdwadiaKalaba(), dict(
        solver=diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8))),
    "bdf": ("GGL + BDF 1e-8", cdiff.GGL(), dict(solver=cdiff.BDF(rtol=1e-8,
                                                                  atol=1e-8))),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall time, or the process's CPU time (which a shared "
                             "VM's steal time does not inflate)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every case this many times, round after round, "
                             "and keep each one's fastest (for a noisy machine)")
    parser.add_argument("--solvers", nargs="+", choices=list(SOLVERS),
                        default=list(SOLVERS))
    args = parser.parse_args()
    set_clock(args.clock)
    theta = jnp.linspace(0.5, 0.7, args.batch)
    cases = []  # ((solver label, model name, trajectories), function, argument)
    for key in args.solvers:
        label, formulation, options = SOLVERS[key]
        for name, model in CASES.items():
            if key != "rk4" and name == "wall never reached":
                continue

            def final(theta, model=model, formulation=formulation, options=options):
                q0 = jnp.stack([jnp.sin(theta), -jnp.cos(theta)])
                sol = cdiff.simulate(model, formulation, q0, jnp.zeros(2), t1=2.0,
                                     dt=1e-3, saveat=cdiff.SaveAt(t1=True), **options)
                return sol.q[-1]

            def loss(theta, final=final):
                return final(theta)[0]

            cases += [((label, name, "one"), final, theta[0]),
                      ((label, name, f"batch {args.batch}"), jax.vmap(final), theta),
                      ((label, name, "gradient of one"), jax.grad(loss), theta[0])]
    best = best_of_rounds(cases, rounds=args.rounds, repeats=args.repeats)
    rows = []
    for (label, name, kind), _, _ in cases:
        phases, run = best[(label, name, kind)]
        base_phases, base_run = best[(label, "no rows", kind)]
        first = sum(phases)
        trace, lower, xla, _ = phases
        rows.append(f"| {label} | {name} | {kind} | {trace:.2f} | {lower:.2f} "
                    f"| {xla:.2f} | {first:.2f} | {first / sum(base_phases):.2f} "
                    f"| {run * 1e3:.2f} | {run / base_run:.2f} |")
    table = "\n".join(["| solver | model | trajectories | trace (s) | lowering (s) | "
                       "XLA (s) | compile + first run (s) | / no rows | run (ms) | "
                       "/ no rows |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
                       *rows])
    print(table)
    if args.record:
        record("unilateral.py", "Cartesian pendulum, 2 s, float64, "
               f"SaveAt(t1=True), best of {args.repeats} runs and of {args.rounds} "
               "rounds' first calls; solvers "
               f"{', '.join(SOLVERS[k][0] for k in args.solvers)}.", table)


if __name__ == "__main__":
    main()
