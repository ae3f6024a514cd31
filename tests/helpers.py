"""Shared test fixtures: small models with exact solutions, and cached runs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import cdiff


@functools.cache
def _mjx_compiler_options():
    """XLA CPU options that compile MJX's thousands of scalar operations 2-3 times
    faster (each test program runs once, briefly); none where not supported."""
    options = {"xla_cpu_use_fusion_emitters": False,
               "xla_backend_optimization_level": 0}
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # noqa: BLE001 - another backend or XLA version
        return {}
    return options


def mjx_jit(fn):
    """`jax.jit` with options that compile MJX programs faster, for the tests'
    top-level programs through `cdiff.models.MuJoCoModel`."""
    return jax.jit(fn, compiler_options=_mjx_compiler_options())


class Skate(cdiff.AbstractModel):
    r"""A knife edge (ice skate) on the plane: q = [x, y, theta], one nonholonomic
    constraint sin(theta) xdot - cos(theta) ydot = 0 (no sideways slip), no forces.

    Exact solution from speed u along the blade and spin omega: theta = omega t,
    x = (u/omega) sin(omega t), y = (u/omega)(1 - cos(omega t)).
    """

    m: float = 2.0
    inertia: float = 0.3

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.stack([self.m, self.m, self.inertia]).astype(q.dtype))

    def nonholonomic(self, t, q, v):
        return jnp.stack([jnp.sin(q[2]) * v[0] - jnp.cos(q[2]) * v[1]])

    def energy(self, t, q, v):
        return 0.5 * v @ self.mass_matrix(t, q) @ v

    @staticmethod
    def exact(ts, u=1.0, omega=2.0):
        th = omega * ts
        q = np.stack([u / omega * np.sin(th), u / omega * (1 - np.cos(th)), th], -1)
        v = np.stack([u * np.cos(th), u * np.sin(th), np.full_like(ts, omega)], -1)
        return q, v


class Duplicated(cdiff.AbstractModel):
    """Any model with every holonomic constraint row written twice (redundant)."""

    inner: cdiff.AbstractModel

    def mass_matrix(self, t, q):
        return self.inner.mass_matrix(t, q)

    def forces(self, t, q, v):
        return self.inner.forces(t, q, v)

    def holonomic(self, t, q):
        phi = self.inner.holonomic(t, q)
        return jnp.concatenate([phi, phi])

    def energy(self, t, q, v):
        return self.inner.energy(t, q, v)


@functools.cache
def slider_crank_run(formulation, dt, t1=100.0):
    """One R2 run per (formulation, dt), shared by every test that needs it."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    return cdiff.simulate(model, formulation, q0, v0, t1=t1, dt=dt, throw=False)


@functools.cache
def slider_crank_saved(formulation, solver=None, t1=10.0, dt=1e-3, redundant=False):
    """One R2 run per setting saved every 0.05 s, shared across test files (the
    agreement tests of several formulations compare the same runs)."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, t1, int(round(t1 / 0.05)) + 1)
    return cdiff.simulate(Duplicated(model) if redundant else model, formulation,
                          q0, v0, t1=t1, dt=dt, solver=solver,
                          saveat=cdiff.SaveAt(ts=ts))


def rk4_minimal_slider_crank(dt, t1=100.0):
    """RK4 (cdiff.RK4, constant step) on the minimal ODE, eq. 24 of Braun-Goldfarb."""
    import diffrax

    model = cdiff.models.SliderCrank()

    def rhs(t, y, args):
        th, om = y
        acc = -3.0 / (5.0 - 3.0 * jnp.cos(2 * th)) * (
            jnp.sin(2 * th) * om**2 + model.g / model.l * jnp.cos(th)
        )
        return jnp.stack([om, acc])

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(rhs),
        cdiff.RK4(),
        0.0,
        t1,
        dt,
        jnp.array([jnp.pi / 4, 0.0]),
        saveat=diffrax.SaveAt(t0=True, steps=True),
        max_steps=int(round(t1 / dt)),
    )
    return sol.ts, 2 * model.l * jnp.cos(sol.ys[:, 0])


def stack_curves(curves):
    """The `(coefficients, hold)` of `PlanarArmOnCurve` for each curve name, stacked
    for one `jax.vmap` over curves (the curve name itself is static)."""
    models = [cdiff.models.PlanarArmOnCurve(c) for c in curves]
    return (jnp.stack([m.coefficients for m in models]),
            jnp.stack([m.hold for m in models]))


class Exploding(cdiff.AbstractModel):
    """A force exp(rate t) that overflows to inf during the run for rate = 1000."""

    rate: float = 1000.0

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.exp(self.rate * t) * jnp.ones_like(q)


def quat_mul(a, b):
    aw, av = a[0], a[1:]
    bw, bv = b[0], b[1:]
    return jnp.concatenate([(aw * bw - av @ bv)[None],
                            aw * bv + bw * av + jnp.cross(av, bv)])


def rotation(q):
    w, x, y, z = q / jnp.linalg.norm(q)
    return jnp.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def quat_exp(dv):
    """exp of the rotation vector dv as a unit quaternion, smooth at dv = 0."""
    theta2 = dv @ dv
    safe = jnp.where(theta2 > 1e-12, theta2, 1.0)
    theta = jnp.sqrt(safe)
    sinc = jnp.where(theta2 > 1e-12, jnp.sin(theta / 2) / theta, 0.5 - theta2 / 48)
    cos = jnp.where(theta2 > 1e-12, jnp.cos(theta / 2), 1 - theta2 / 8)
    return jnp.concatenate([cos[None], sinc * dv])


class Body(cdiff.AbstractModel):
    """A rigid body on a ball joint at the origin: q = quaternion (w, x, y, z) of its
    orientation, v = its angular velocity in the body frame. Inertia about the pivot
    `inertia` (principal, body axes), mass `m` with its centre at `c` (body
    frame), gravity along -z. With `hinge=True` two holonomic rows keep the body's
    y-axis on the world y-axis: a compound pendulum about y."""

    inertia: jnp.ndarray
    c: jnp.ndarray
    m: float = 1.0
    g: float = 9.81
    hinge: bool = False

    def mass_matrix(self, t, q):
        return jnp.diag(self.inertia).astype(q.dtype)

    def forces(self, t, q, v):
        Iw = self.inertia * v
        gravity_body = rotation(q).T @ jnp.array([0.0, 0.0, -self.m * self.g])
        return -jnp.cross(v, Iw) + jnp.cross(self.c, gravity_body)

    def holonomic(self, t, q):
        if not self.hinge:
            return jnp.zeros((0,), q.dtype)
        y_axis = rotation(q)[:, 1]
        return jnp.stack([y_axis[0], y_axis[2]])

    def energy(self, t, q, v):
        potential = self.m * self.g * (rotation(q) @ self.c)[2]
        return 0.5 * v @ (self.inertia * v) + potential

    def position_rate(self, t, q, v):
        return 0.5 * quat_mul(q, jnp.concatenate([jnp.zeros(1, v.dtype), v]))

    def integrate_position(self, q, dv):
        return quat_mul(q, quat_exp(dv))
