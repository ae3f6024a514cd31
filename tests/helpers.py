"""Shared test fixtures: small models with exact solutions, and cached runs."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import cdiff

#: Machine epsilon of float64: the tests' round-off bounds are written in it.
EPS = np.finfo(np.float64).eps


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


@eqx.filter_jit
def dynamics_at(model, formulation, q, v, control=None, dt=1e-3):
    """A formulation's acceleration `vdot`, constraint force and multipliers at one
    state `(q, v)`, through public names: the first saved row of a one-step
    `cdiff.simulate` (`Solution` evaluates the formulation's dynamics at every saved
    state, with the per-step data of a step `dt` starting there). Compiled once per
    model and formulation structure, controller and `dt` (`eqx.filter_jit`: array
    fields are traced, Python floats are static)."""
    sol = cdiff.simulate(model, formulation, q, v, t1=dt, dt=dt, control=control,
                         saveat=cdiff.SaveAt(t0=True), throw=False)
    return sol.vdot[0], sol.constraint_force[0], sol.multipliers[0]


# --- R2 in NumPy, derived by hand (independent of cdiff's autodiff kinematics) -----


def slider_crank_numpy(q, v, m=1.0, l=1.0, g=9.81):
    """R2's M, Q, constraint Jacobian A and the velocity term (dA/dt) v, differentiated
    by hand from Braun-Goldfarb eq. 22 (see `cdiff.models.SliderCrank`)."""
    _, _, t1, _, _, t2 = q
    w1, w2 = v[2], v[5]
    h = l / 2
    s1, c1, s2, c2 = np.sin(t1), np.cos(t1), np.sin(t2), np.cos(t2)
    M = np.diag([m, m, m * l**2 / 12, m, m, m * l**2 / 12])
    Q = np.array([0.0, -m * g, 0.0, 0.0, -m * g, 0.0])
    A = np.array([
        [1, 0, h * s1, 0, 0, 0],
        [0, 1, -h * c1, 0, 0, 0],
        [1, 0, -h * s1, -1, 0, -h * s2],
        [0, 1, h * c1, 0, -1, h * c2],
        [0, 0, 0, 0, 1, h * c2],
    ])
    Adot_v = np.array([
        h * c1 * w1**2,
        h * s1 * w1**2,
        -h * c1 * w1**2 - h * c2 * w2**2,
        -h * s1 * w1**2 - h * s2 * w2**2,
        -h * s2 * w2**2,
    ])
    return M, Q, A, Adot_v


def kkt_numpy(M, Q, A, b):
    """The acceleration and the minimum-norm multipliers of M qdd = Q + A^T lam,
    A qdd = b, by least squares on the KKT matrix (numpy's SVD): qdd is unique on a
    consistent system, and lstsq's minimum-norm solution makes lam the minimum-norm
    choice also where A loses rank."""
    n, k = A.shape[1], A.shape[0]
    kkt = np.block([[M, -A.T], [A, np.zeros((k, k))]])
    x = np.linalg.lstsq(kkt, np.concatenate([Q, b]), rcond=None)[0]
    return x[:n], x[n:]


def slider_crank_theta_ddot(theta, omega, g_over_l=9.81):
    """R2's crank acceleration on the branch theta2 = -theta1 from its Lagrangian,
    derived here by hand: T = (m l^2 / 2)(2/3 + 2 sin^2 theta) omega^2 (crank and rod,
    centres at (l/2)(cos, sin) and (3l/2 cos, l/2 sin), rod angle -theta),
    V = m g l sin theta. (Braun-Goldfarb write the same as eq. 24.)"""
    inertia = 2.0 / 3.0 + 2.0 * np.sin(theta) ** 2
    return -(2.0 * np.sin(theta) * np.cos(theta) * omega**2
             + g_over_l * np.cos(theta)) / inertia


def restitution_events(rhs, hit, y0, e, t1, impacts):
    """Impact times and rates of a one-coordinate ODE `rhs(t, y)`, y = (x, xdot),
    whose row `hit(t, y)` reaches zero from above: DOP853 at rtol = atol = 1e-13
    with SciPy's event location, the rate reversed and scaled by `e` at each
    impact (Newton's law in one coordinate). Rows `(t, xdot before)`."""
    from scipy.integrate import solve_ivp

    def event(t, y):
        return hit(t, y)

    event.terminal, event.direction = True, -1
    t, y, out = 0.0, list(y0), []
    while len(out) < impacts:
        sol = solve_ivp(rhs, (t, t1), y, method="DOP853", rtol=1e-13, atol=1e-13,
                        events=event)
        t, y = sol.t_events[0][0], sol.y_events[0][0]
        out.append((t, y[1]))
        y = [y[0], -e * y[1]]
    return np.array(out)


def slider_crank_exact_scipy(ts, theta0=np.pi / 4, omega0=0.0, g_over_l=9.81):
    """(theta1, omega1) of R2 at `ts` by scipy's DOP853 at rtol = atol = 1e-13 on
    `slider_crank_theta_ddot` (independent of cdiff's reference solve)."""
    from scipy.integrate import solve_ivp

    ts = np.asarray(ts, dtype=float)
    sol = solve_ivp(lambda t, y: [y[1], slider_crank_theta_ddot(y[0], y[1], g_over_l)],
                    (0.0, float(ts[-1])), [theta0, omega0], method="DOP853",
                    rtol=1e-13, atol=1e-13, t_eval=ts)
    assert sol.success, sol.message
    return sol.y[0], sol.y[1]


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


def max_abs(x) -> float:
    """The largest absolute entry of `x`, as a Python float."""
    return float(jnp.max(jnp.abs(x)))


class FreeParticle(cdiff.AbstractModel):
    """A free particle of unit mass in the plane: no forces, no constraints."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)


def double_x(item):
    """A cheap item function for `cdiff.studies.map_batches` (one tiny compilation):
    `{"y": 2 x}`."""
    return {"y": item["x"] * 2.0}


def force_reference(t):
    """The desired multiplier lambda_d(t) = 20 + 5 sin 3t that
    `cdiff.control.HybridForceMotion` tracks on R8 (the arm on the unit circle)."""
    return jnp.stack([20.0 + 5.0 * jnp.sin(3.0 * t)])


# --- unilateral rows: the bouncing ball and the pendulum against a wall ------------
# (tests/events/test_unilateral*.py, against closed forms and SciPy's event location)

GRAVITY = 9.81


class Disk(cdiff.AbstractModel):
    """A uniform disk of unit mass and radius `radius` on a floor (friction
    `friction`), `(x, y, phi)`: the slip of its contact point
    `dx/dt + radius dphi/dt` (tests/events' friction tests)."""

    radius: float = 0.5
    friction: float = 0.3

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.array([1.0, 1.0, 0.5 * self.radius**2], q.dtype))

    def forces(self, t, q, v):
        return jnp.array([0.0, -GRAVITY, 0.0], v.dtype)

    def unilateral(self, t, q):
        return q[1:2] - self.radius

    def slip(self, t, q, v):
        return (v[0] + self.radius * v[2])[None, None]


class Ball(cdiff.AbstractModel):
    """A ball of mass 2 at height q >= 0 under gravity."""

    restitution: float = 0.5

    def mass_matrix(self, t, q):
        return 2.0 * jnp.eye(1, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.full_like(v, -2.0 * GRAVITY)

    def energy(self, t, q, v):
        return v @ v + 2.0 * GRAVITY * q[0]

    def unilateral(self, t, q):
        return q


def ball_impacts(h0, e, n):
    """The first `n` impact times and speeds of a ball dropped from rest at h0."""
    t, u = np.sqrt(2 * h0 / GRAVITY), np.sqrt(2 * GRAVITY * h0)
    times, speeds = [], []
    for _ in range(n):
        times.append(t)
        speeds.append(u)
        u *= e
        t += 2 * u / GRAVITY
    return np.array(times), np.array(speeds)


def ball_height_closed_form(h0, e, t1=0.8):
    """The height at `t1` of a ball dropped from rest at h0, after one bounce."""
    s = np.sqrt(2 * h0 / GRAVITY)
    u = e * GRAVITY * s
    return u * (t1 - s) - 0.5 * GRAVITY * (t1 - s) ** 2


def ball_height_derivative(h0=1.0, e=0.5, eps=1e-6):
    """d q(T) / d(h0, e) of the closed form, by central differences."""
    q = ball_height_closed_form
    return ((q(h0 + eps, e) - q(h0 - eps, e)) / (2 * eps),
            (q(h0, e + eps) - q(h0, e - eps)) / (2 * eps))


T_RELEASE = 0.505  # inside a step of 0.01


class LiftedBall(Ball):
    """A ball resting on the ground, lifted by a force growing as 2 m g t / t_r: the
    contact force m g (1 - t / t_r) pushes until t_r, then it would pull."""

    def forces(self, t, q, v):
        return jnp.full_like(v, -2.0 * GRAVITY + 2.0 * GRAVITY * t / T_RELEASE)


class PendulumAgainstWall(cdiff.AbstractModel):
    """A unit point mass on a rod of length l in Cartesian coordinates, and a wall
    at x = -a: g = x + a >= 0."""

    l: float = 1.0
    a: float = 0.4
    restitution: float = 0.6

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.array([0.0, -GRAVITY], q.dtype)

    def energy(self, t, q, v):
        return 0.5 * v @ v + GRAVITY * q[1]

    def holonomic(self, t, q):
        return jnp.atleast_1d(q @ q - self.l**2)

    def unilateral(self, t, q):
        return jnp.atleast_1d(q[0] + self.a)


def assert_two_wall_impacts(sol, reference, *, after_rtol):
    """`sol`, a successful solve of `PendulumAgainstWall()` from the wall release,
    has its two impacts at the `reference` times (to 1e-9 s), arrives at their
    speeds (to 1e-8) and leaves at e = 0.6 times them (to `after_rtol`)."""
    assert sol.result == cdiff.RESULTS.successful
    ev = sol.stats["events"]
    assert int(ev.count) == 2
    np.testing.assert_allclose(np.asarray(ev.t[:2]), reference[:, 0], rtol=0,
                               atol=1e-9)
    speed = np.linalg.norm(np.asarray(ev.v_before[:2]), axis=1)
    np.testing.assert_allclose(speed, np.abs(reference[:, 1]), rtol=1e-8)
    after = np.linalg.norm(np.asarray(ev.v_after[:2]), axis=1)
    np.testing.assert_allclose(after, 0.6 * speed, rtol=after_rtol)


def wall_reference(theta0, l, a, e, t1, impacts):
    """Impact times and angular speeds of the angle ODE (SciPy's event location,
    `restitution_events`)."""
    return restitution_events(lambda t, y: [y[1], -GRAVITY / l * np.sin(y[0])],
                              lambda t, y: np.sin(y[0]) + a / l, [theta0, 0.0], e, t1,
                              impacts)
