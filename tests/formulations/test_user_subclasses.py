"""Every public abstract class, subclassed as a user would from its docstring, on a
user's own model: a pendulum in Cartesian coordinates with the constraint
x^2 + y^2 - l^2 = 0 (not one of cdiff's models). Each run is checked against an
independent reference: SciPy's DOP853 on the pendulum's angle equation at 1e-12, or
a closed form of the closed loop.

(AbstractStatefulController is exercised in tests/formulations/test_control_state.py.)"""

import equinox as eqx
import pytest
import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp
from helpers import EPS

import cdiff

jax.config.update("jax_enable_x64", True)

M, L, G = 2.0, 1.5, 9.81
THETA0 = 1.0  # rad from the lowest point, released at rest
T1, DT = 2.0, 1e-3


class CartesianPendulum(cdiff.AbstractModel):
    """A point mass `m` on a massless rod of length `l` about the origin; gravity -y."""

    m: float = M
    l: float = L
    g: float = G

    def mass_matrix(self, t, q):
        return self.m * jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.array([0.0, -self.m * self.g], dtype=q.dtype)

    def holonomic(self, t, q):
        return jnp.array([q @ q - self.l**2])

    def energy(self, t, q, v):
        return 0.5 * self.m * (v @ v) + self.m * self.g * q[1]


MODEL = CartesianPendulum()
Q0 = jnp.array([L * np.sin(THETA0), -L * np.cos(THETA0)])
V0 = jnp.zeros(2)
TS = np.linspace(0.0, T1, round(T1 / DT) + 1)


def angle_reference(damping=0.0, ts=TS):
    """(q, v) at `ts` from theta'' = -(g/l) sin(theta) - (c/m) theta' by DOP853."""
    sol = solve_ivp(lambda t, y: [y[1], -G / L * np.sin(y[0]) - damping / M * y[1]],
                    (0.0, ts[-1]), [THETA0, 0.0], method="DOP853", t_eval=ts,
                    rtol=1e-12, atol=1e-12)
    th, om = sol.y
    q = np.stack([L * np.sin(th), -L * np.cos(th)], axis=1)
    v = np.stack([L * np.cos(th) * om, L * np.sin(th) * om], axis=1)
    return q, v


Q_REF, V_REF = angle_reference()


def run(formulation, **kwargs):
    kwargs.setdefault("dt", DT)
    return cdiff.simulate(MODEL, formulation, Q0, V0, t1=T1,
                          saveat=cdiff.SaveAt(ts=jnp.asarray(TS)), **kwargs)


def kkt(model, t, q, v, f, solve=jnp.linalg.solve):
    """Acceleration and multipliers of [[M, A^T], [A, 0]] [a; -lam] = [f; b], the
    system solved by `solve(K, rhs)`."""
    kin = cdiff.kinematics(model, t, q, v)
    A, b = kin.A_v, kin.b_v
    k = A.shape[0]
    K = jnp.block([[model.mass_matrix(t, q), A.T], [A, jnp.zeros((k, k), q.dtype)]])
    x = solve(K, jnp.concatenate([f, b]))
    n = f.shape[0]
    return x[:n], -x[n:], A


# -- AbstractFormulation ---------------------------------------------------------


class PlainKKT(cdiff.AbstractFormulation):
    """Lagrange's multiplier form solved by one dense KKT solve, no stabilisation
    (and no `control`: `context.control` is not read)."""

    def dynamics(self, t, y, context, frozen):
        q, v = y
        a, lam, A = kkt(context.model, t, q, v, context.model.forces(t, q, v))
        return cdiff.Dynamics(rate=(v, a), force=A.T @ lam, multipliers=lam)


def test_user_formulation():
    sol = run(PlainKKT())
    err = np.abs(np.asarray(sol.q) - Q_REF).max()
    assert err < 1e-10  # measured 1.7e-11: RK4's error at dt = 1e-3 over 2 s
    # The constraint force is the rod's tension: lam A = Q_c, |Q_c| = m(|v|^2/l + g cos)
    q, v = np.asarray(sol.q), np.asarray(sol.v)
    tension = M * (np.sum(v**2, axis=1) / L - G * q[:, 1] / L)
    assert np.abs(np.linalg.norm(np.asarray(sol.constraint_force), axis=1)
                  - tension).max() < 3e-9  # measured 4.1e-10 (|q| drifts off l)
    # As an extra: the same ODE as cdiff's Lagrange without Baumgarte terms.
    lagrange = run(cdiff.Lagrange())
    assert np.abs(np.asarray(lagrange.q) - q).max() < 2e-14  # measured 2.3e-15


class KKTWithRows(cdiff.AbstractFormulation):
    """The KKT system solved in the least-squares sense, declared able to take
    unilateral rows: it enforces whatever holonomic rows its model has, the held
    ones included, and a row not held (a zero row) gets a zero multiplier."""

    supports_unilateral = True

    def dynamics(self, t, y, context, frozen):
        q, v = y
        model = context.model
        a, lam, A = kkt(model, t, q, v, model.forces(t, q, v),
                        solve=lambda K, r: jnp.linalg.pinv(K) @ r)
        return cdiff.Dynamics(rate=(v, a), force=A.T @ lam, multipliers=lam)


class PendulumAndWall(CartesianPendulum):
    """The pendulum and a wall at x = -a it swings into (perfectly plastic)."""

    a: float = 0.5
    restitution: float = 0.0

    def unilateral(self, t, q):
        return jnp.array([q[0] + self.a])


def test_a_formulation_outside_the_package_declares_what_it_supports():
    """Adding a formulation is its own class and nothing else: what it can do is
    read from its declarations (here `supports_unilateral`) by the checks and the
    route choice, and it runs through `simulate` with events and through a study."""
    wall = PendulumAndWall()
    with pytest.raises(ValueError, match="PlainKKT, which does not declare "
                                         "supports_unilateral"):
        cdiff.simulate(wall, PlainKKT(), Q0, V0, t1=T1, dt=DT)
    sol = cdiff.simulate(wall, KKTWithRows(), Q0, V0, t1=T1, dt=DT)
    assert sol.succeeded
    # The first impact against the angle ODE's event by DOP853 at 1e-12: the bob
    # reaches x = -a at theta = -asin(a / l).
    ref = solve_ivp(lambda t, y: [y[1], -G / L * np.sin(y[0])], (0.0, T1),
                    [THETA0, 0.0], method="DOP853", rtol=1e-12, atol=1e-12,
                    events=lambda t, y: L * np.sin(y[0]) + wall.a)
    events = sol.stats["events"]
    assert int(events.count) >= 1
    np.testing.assert_allclose(float(events.t[0]), ref.t_events[0][0], rtol=0,
                               atol=1e-10)
    # Plastic, and the rod leaves the bob no other motion: it stops dead there
    # (and gravity swings it back). cdiff's own Lagrange (the same ODE without
    # Baumgarte terms) agrees with it through the event.
    assert np.abs(np.asarray(events.v_before[0])).max() > 1.0
    assert np.abs(np.asarray(events.v_after[0])).max() < 1e-10
    lagrange = cdiff.simulate(wall, cdiff.Lagrange(), Q0, V0, t1=T1, dt=DT)
    np.testing.assert_allclose(np.asarray(sol.q), np.asarray(lagrange.q), rtol=0,
                               atol=1e-12)
    # A study runs it beside cdiff's own: RK4's fourth order on the slider-crank,
    # the same errors as Lagrange's (the same ODE).
    study = cdiff.studies.step_size_study(
        cdiff.models.SliderCrank(), {"KKT": KKTWithRows(), "Lagrange":
                                     cdiff.Lagrange()}, [2e-2, 1e-2], 1.0,
        n_save=50, time_each=False, progress=False)
    kkt_error = study.where(formulation="KKT")["max_error"]
    coarse, fine = kkt_error
    assert 10 < coarse / fine < 24  # fourth order: 16
    np.testing.assert_allclose(
        kkt_error, study.where(formulation="Lagrange")["max_error"],
        rtol=1e-6)


# -- AbstractDAEFormulation ------------------------------------------------------


class VelocityIndexOne(cdiff.AbstractDAEFormulation):
    """x = [q, v, lam]: q' = v, M v' = Q + A^T lam, A v' = b (index 1 in v' and lam)."""

    def algebraic_sizes(self, nv, m, k):
        return (k,)

    def algebraic_values(self, t, q, v, a, lam, context):
        return (lam,)

    def multipliers(self, x):
        return self.blocks(x)[2]

    def residual(self, t, x, xdot, context):
        model = context.model
        q, v, lam = self.blocks(x)
        qdot, vdot, _ = self.blocks(xdot)
        kin = cdiff.kinematics(model, t, q, v)
        A, b = self.kept(kin.A_v), self.kept(kin.b_v)
        return jnp.concatenate([
            qdot - v,
            model.mass_matrix(t, q) @ vdot - model.forces(t, q, v) - A.T @ lam,
            A @ vdot - b,
        ])


def test_user_dae_formulation():
    sol = run(VelocityIndexOne(), dt=1e-4, solver=cdiff.BDF(rtol=1e-9, atol=1e-9))
    assert sol.succeeded
    err = np.abs(np.asarray(sol.q) - Q_REF).max()
    assert err < 5e-7  # measured 5.2e-8 (BDF's global error at 1e-9)
    # The multiplier is the tension over |A| = 2l: lam = -|Q_c| / (2 l).
    q, v = np.asarray(sol.q), np.asarray(sol.v)
    tension = M * (np.sum(v**2, axis=1) / L - G * q[:, 1] / L)
    lam = np.asarray(sol.multipliers)[:, 0]
    assert np.abs(lam + tension / (2 * L)).max() < 2e-6  # measured 2.9e-7
    # As an extra: cdiff's own index-1 DAE (with w = v' as a variable) agrees.
    ref = run(cdiff.IndexOne(), dt=1e-4, solver=cdiff.BDF(rtol=1e-9, atol=1e-9))
    assert np.abs(np.asarray(ref.q) - q).max() < 1.5e-14  # measured 3.5e-15


# -- AbstractProjection ----------------------------------------------------------


class MinimumNorm(cdiff.AbstractProjection):
    """The Euclidean minimum-norm correction, by NumPy-style least squares."""

    iterations: int = eqx.field(static=True, default=3)

    def corrector(self, model, t, q, A, *, throw=True):
        return lambda A, r: jnp.linalg.lstsq(A, r)[0]


def test_user_projection_without_throw():
    """A corrector written before `throw` was passed still works, with a
    DeprecationWarning at the class statement naming the fix."""
    with pytest.warns(DeprecationWarning, match=r"corrector.*`\*, throw: bool = True`"):
        class Old(cdiff.AbstractProjection):
            iterations: int = eqx.field(static=True, default=3)

            def corrector(self, model, t, q, A):
                return lambda A, r: jnp.linalg.lstsq(A, r)[0]

    q = jnp.asarray(Q0) * 1.01  # off the circle
    new, old = MinimumNorm().position(MODEL, 0.0, q), Old().position(MODEL, 0.0, q)
    np.testing.assert_array_equal(np.asarray(old), np.asarray(new))
    assert abs(float(MODEL.holonomic(0.0, q)[0])) > 1e-3
    assert abs(float(MODEL.holonomic(0.0, old)[0])) < 1e-12


def test_user_projection():
    dt = 1e-2  # a coarse step: without the projection RK4 drifts off the circle
    ts = np.linspace(0.0, T1, round(T1 / dt) + 1)
    q_ref, _ = angle_reference(ts=ts)
    kwargs = dict(t1=T1, dt=dt, saveat=cdiff.SaveAt(ts=jnp.asarray(ts)))
    plain = cdiff.simulate(MODEL, PlainKKT(), Q0, V0, **kwargs)
    sol = cdiff.simulate(MODEL, PlainKKT(), Q0, V0,
                         solver=cdiff.Projected(cdiff.RK4(), MinimumNorm()), **kwargs)
    assert float(plain.max_constraint_error) > 1e-7  # measured 4.9e-7
    assert float(sol.max_constraint_error) < 1e-14  # measured 2.2e-15 (|q|^2 - l^2)
    assert float(sol.max_velocity_error) < 1e-14  # measured 3.0e-15
    err = np.abs(np.asarray(sol.q) - q_ref).max()
    assert err < 3e-7  # measured 4.7e-8 (1.7e-7 without the projection)
    # As an extra: cdiff's Newton projection (for M = mI the same rule).
    newton = cdiff.simulate(MODEL, PlainKKT(), Q0, V0, solver=cdiff.Projected(
        cdiff.RK4(), cdiff.NewtonProjection(iterations=3)), **kwargs)
    # Measured 0 (bitwise equal on the CPU, both builds); 2 ulp of the largest |q|.
    scale = np.abs(np.asarray(sol.q)).max()
    np.testing.assert_allclose(newton.q, sol.q, rtol=0, atol=2 * EPS * scale)


# -- AbstractController ----------------------------------------------------------


class ViscousDrag(cdiff.control.AbstractController):
    """A drag force -c v on the mass (a controller with a model, as the built-in
    ones)."""

    model: cdiff.AbstractModel
    c: float

    def generalized_force(self, t, q, v):
        return -self.c * v


def test_user_controller():
    c = 0.8
    q_ref, _ = angle_reference(damping=c)
    sol = run(cdiff.Lagrange(), control=ViscousDrag(MODEL, c))
    err = np.abs(np.asarray(sol.q) - q_ref).max()
    assert err < 1e-10  # measured 1.1e-11
    # the drag does work: the energy falls from -15.9 J to -23.3 J (measured)
    assert float(sol.energy[0] - sol.energy[-1]) > 7.0


# -- AbstractStateFeedback -------------------------------------------------------


class DampTheSpeed(cdiff.control.AbstractStateFeedback):
    """Feedback linearisation on Yun-Sarkar's eq. 28: the input that makes the
    tangential part of q'' + k q' vanish, S^T (S nu' + gamma + k q') = 0, so that the
    speed along the circle decays as exp(-k t)."""

    k: float

    def feedback(self, t, system):
        S = system.S
        nudot = -jnp.linalg.solve(S.T @ S, S.T @ (system.gamma + self.k * system.qdot))
        return jnp.linalg.pinv(system.gain) @ (nudot - system.drift)


def test_user_state_feedback():
    k = 1.5
    v0 = jnp.array([L * np.cos(THETA0), L * np.sin(THETA0)]) * 2.0  # tangent, 2 rad/s
    sol = cdiff.simulate(MODEL, cdiff.NullSpace(alpha=10.0), Q0, v0, t1=T1, dt=DT,
                         control=DampTheSpeed(k),
                         saveat=cdiff.SaveAt(ts=jnp.asarray(TS)))
    speed = np.linalg.norm(np.asarray(sol.v), axis=1)
    exact = float(jnp.linalg.norm(v0)) * np.exp(-k * TS)
    assert np.abs(speed - exact).max() < 2e-11  # measured 4.8e-12
    assert float(sol.max_constraint_error) < 1e-10  # measured 1.2e-11 (alpha = 10)


def test_context_evaluates_a_formulation_outside_a_solve():
    """`cdiff.Context`'s example: UK's dynamics at one state of R2 (a moving one, off
    the constraint's singular set), against the KKT system of R2 derived by hand in
    NumPy (tests/helpers.py)."""
    from helpers import kkt_numpy, slider_crank_numpy

    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    q, v = cdiff.consistent_state(model, q0, v0.at[2].set(1.3))
    f = cdiff.UdwadiaKalaba().bind(model, 0.0, q, v)
    aux = f.prepare(model, 0.0, q, v)
    context = cdiff.Context(model, None, model.energy(0.0, q, v), aux, f)
    y = f.init_state(0.0, q, v, context)
    dyn = f.dynamics(0.0, y, context, f.freeze(0.0, 1e-3, y, context))
    M, Q, A, Adot_v = slider_crank_numpy(np.asarray(q), np.asarray(v))
    vdot, lam = kkt_numpy(M, Q, A, -Adot_v)
    # Measured 9.0e-14 and 9.2e-14 (accelerations up to 4.4 m/s^2).
    np.testing.assert_allclose(dyn.rate[1], vdot, rtol=0, atol=5e-13)
    np.testing.assert_allclose(dyn.force, A.T @ lam, rtol=0, atol=5e-13)
