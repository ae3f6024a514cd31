"""The cost of Coulomb friction: a disk launched sliding on a floor (1 s, float64,
Lagrange, Tsit5 with a PID controller at 1e-8), without friction (mu = 0 known
before tracing: the frictionless path) and with it (mu = 0.3: it slides, then
rolls from t* = v0 / (3 mu g) = 0.34 s, one stick event), and a block held on a
slope inside its cone (one stick event at the start): one trajectory, a vmapped
batch over mu, and the gradient of the final position with respect to mu.

    python benchmarks/contact.py [--batch 64] [--repeats 5] [--rounds 1] [--record]

The first call is reported in its phases (tracing, lowering, XLA's compile and
the first run) and in all, the run as the best of `--repeats`, each with its ratio
to the frictionless disk. With `--rounds N` every case is measured N times, round
after round, and its fastest first call and run are kept (a noisy machine's slow
phases then fall on every case alike).

Not yet here (issue 49 asks for them): MuJoCo C and MJX's step on the same MJCF,
which needs contacts between MuJoCo geoms.
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


class Disk(cdiff.AbstractModel):
    """A uniform disk of unit mass and radius 0.5 on a floor, `(x, y, angle)`."""

    friction: float = 0.3

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.array([1.0, 1.0, 0.125], q.dtype))

    def forces(self, t, q, v):
        return jnp.array([0.0, -GRAVITY, 0.0], v.dtype)

    def unilateral(self, t, q):
        return q[1:2] - 0.5

    def slip(self, t, q, v):
        return (v[0] + 0.5 * v[2]).reshape(1, 1)


class Block(cdiff.AbstractModel):
    """A unit block on a slope of 0.3 rad, `(x up the slope, height)`."""

    friction: float = 0.5

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return -GRAVITY * jnp.array([jnp.sin(0.3), jnp.cos(0.3)], v.dtype)

    def unilateral(self, t, q):
        return q[1:]

    def slip(self, t, q, v):
        return v[None, :1]


OPTIONS = dict(solver=diffrax.Tsit5(),
               stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
               saveat=cdiff.SaveAt(t1=True), max_steps=4096)
CASES = {
    "disk, no friction": (lambda mu: Disk(0.0), [0.0, 0.5, 0.0], [3.0, 0.0, 0.0]),
    "disk, slides then rolls": (lambda mu: Disk(mu), [0.0, 0.5, 0.0],
                                [3.0, 0.0, 0.0]),
    "block, sticks": (lambda mu: Block(mu + 0.2), [0.0, 0.0], [0.0, 0.0]),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    set_clock(args.clock)
    mus = jnp.linspace(0.25, 0.35, args.batch)
    cases = []
    for name, (build, q0, v0) in CASES.items():
        def final(mu, build=build, q0=q0, v0=v0):
            sol = cdiff.simulate(build(mu), cdiff.Lagrange(), jnp.array(q0),
                                 jnp.array(v0), t1=1.0, dt=1e-3, **OPTIONS)
            return sol.q[-1]

        def loss(mu, final=final):
            return final(mu)[0]

        cases += [((name, "one"), final, mus[0]),
                  ((name, f"batch {args.batch}"), jax.vmap(final), mus)]
        if name != "disk, no friction":  # (mu = 0 is static there: nothing to vary)
            cases.append(((name, "gradient of one"), jax.grad(loss), mus[0]))
    best = best_of_rounds(cases, rounds=args.rounds, repeats=args.repeats)
    rows = []
    for (name, kind), _, _ in cases:
        phases, run = best[(name, kind)]
        base = best.get(("disk, no friction", kind))
        first = sum(phases)
        trace, lower, xla, _ = phases
        ratio = ((f"{first / sum(base[0]):.2f}", f"{run / base[1]:.2f}") if base
                 else ("", ""))
        rows.append(f"| {name} | {kind} | {trace:.2f} | {lower:.2f} | {xla:.2f} "
                    f"| {first:.2f} | {ratio[0]} | {run * 1e3:.2f} | {ratio[1]} |")
    table = "\n".join(["| model | trajectories | trace (s) | lowering (s) | XLA (s) | "
                       "compile + first run (s) | / no friction | run (ms) | "
                       "/ no friction |", "|---|---|---:|---:|---:|---:|---:|---:|---:|",
                       *rows])
    print(table)
    if args.record:
        record("contact.py", "Disk and block, 1 s, float64, Lagrange, Tsit5 with PID "
               f"1e-8, SaveAt(t1=True), batch over mu, best of {args.repeats} runs "
               f"and of {args.rounds} rounds' first calls.", table)


if __name__ == "__main__":
    main()
