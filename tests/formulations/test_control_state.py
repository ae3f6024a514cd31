"""Controllers with state (`cdiff.control.AbstractStatefulController`), and
`HybridForceMotion`'s PI loop on the measured constraint force of a plant that is
not the controller's model (issue 22).

The plant is the planar arm on the unit circle (R8), the controller's model the
same arm with both masses 15% heavier. Independent references:

- a closed-loop solve of the same equations with SciPy (DOP853, rtol = atol =
  1e-12) on the augmented state (q, v, z): the arm's M, Q, A, b written out here in
  NumPy (the two-link terms, phi = |p|^2 - 1), the controller's law written out
  again, and the algebraic loop closed by one solve of the KKT system with the
  multipliers on both sides;
- the model error delta = (A M_p^-1 A^T)^-1 (b - A M_p^-1 (M_c u_p - Q_c + Q_p))
  from the same NumPy terms, with which the loop gives (1 + G_F) e = -G_I z - delta
  at every instant;
- central differences of the closed-loop loss;
- for controllers without state, values stored from the code before controllers
  had state.
"""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import force_reference
from scipy.integrate import solve_ivp

import cdiff
from cdiff.control import (
    AbstractStatefulController,
    HybridForceMotion,
    PassiveJoints,
    ProjectedInverseDynamics,
)
from cdiff.models import PlanarArmOnCurve, TwoLinkOnCircle

PLANT = PlanarArmOnCurve("circle", t_release=0.0)
TH2 = float(PLANT.hold[1])
MASS = 5.0  # both links of the plant
MISMATCH = 1.15  # the controller's model: masses 15% off
GP, GD = 100.0, 20.0  # the motion: critically damped, rate 10 /s
GF, GI = 1.0, 10.0  # the force loop: K = G_I / (1 + G_F) = 5 /s
T1, DT = 3.0, 1e-3
Q_D = np.array([0.3, TH2])  # regulate the arm to q_d, started 0.05 rad off
Q0, V0 = jnp.array([0.35, TH2]), jnp.zeros(2)


def controller_model(scale):
    return PlanarArmOnCurve("circle", t_release=0.0, m1=MASS * scale,
                            m2=MASS * scale)


def reference(t):
    z = jnp.zeros(2, jnp.result_type(float))
    return jnp.asarray(Q_D), z, z


def hybrid(gf, gi, scale=MISMATCH):
    return HybridForceMotion(controller_model(scale), reference, GP, GD,
                             force_reference, gf=gf, gi=gi)


@jax.jit
def _closed_loop(gf, gi):
    return cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=T1, dt=DT,
                          control=hybrid(gf, gi))


@functools.cache
def _runs():
    """The closed loop without and with integral action (one compilation)."""
    return {gi: _closed_loop(jnp.asarray(GF), jnp.asarray(gi)) for gi in (0.0, GI)}


def _force_error(sol):
    return np.asarray(force_reference(sol.ts)[0] - sol.multipliers[:, 0])


# --- the independent reference ------------------------------------------------

L1 = L2 = 1.0
LC1 = LC2 = 0.5
I1 = I2 = 1.0
G = 9.81


def _arm(q, v, m):
    """M, Q = -c - G, A, b of the two-link arm (both masses m) with its end
    effector on the unit circle."""
    c2, s2 = np.cos(q[1]), np.sin(q[1])
    m11 = I1 + I2 + m * LC1**2 + m * (L1**2 + LC2**2 + 2 * L1 * LC2 * c2)
    m12 = I2 + m * (LC2**2 + L1 * LC2 * c2)
    M = np.array([[m11, m12], [m12, I2 + m * LC2**2]])
    h = m * L1 * LC2 * s2
    coriolis = np.array([-h * (2 * v[0] * v[1] + v[1] ** 2), h * v[0] ** 2])
    g12 = m * LC2 * G * np.cos(q[0] + q[1])
    gravity = np.array([(m * LC1 + m * L1) * G * np.cos(q[0]) + g12, g12])
    th1, th12, w1, w12 = q[0], q[0] + q[1], v[0], v[0] + v[1]
    p = np.array([L1 * np.cos(th1) + L2 * np.cos(th12),
                  L1 * np.sin(th1) + L2 * np.sin(th12)])
    J = np.array([[-L1 * np.sin(th1) - L2 * np.sin(th12), -L2 * np.sin(th12)],
                  [L1 * np.cos(th1) + L2 * np.cos(th12), L2 * np.cos(th12)]])
    jdot_v = -np.array([L1 * np.cos(th1) * w1**2 + L2 * np.cos(th12) * w12**2,
                        L1 * np.sin(th1) * w1**2 + L2 * np.sin(th12) * w12**2])
    A = (2 * p @ J)[None, :]  # d phi / dq, phi = |p|^2 - 1
    b = np.array([-2 * (J @ v) @ (J @ v) - 2 * p @ jdot_v])
    return M, -coriolis - gravity, A, b


def _law(q, v, scale):
    """The controller model's M u_p - Q (eqs. 43-44 at rest reference) and A."""
    M, Q, A, b = _arm(q, v, MASS * scale)
    A_pinv = A.T / (A @ A.T)
    P = np.eye(2) - A_pinv @ A
    u_p = A_pinv @ b + P @ (GP * (Q_D - q) - GD * v)
    return M @ u_p - Q, A


def _closed_loop_rhs(t, x, gf, gi, scale):
    """(q, v, z)' and the multipliers: the plant M_p q'' = Q_p + f + A^T lam,
    A q'' = b with f = M_c u_p - Q_c - A^T lam_c, lam_c = lam_d + gf (lam_d - lam)
    + gi z: the loop closed by one KKT solve, lam on both sides."""
    q, v, z = x[:2], x[2:4], x[4:]
    M, Q, A, b = _arm(q, v, MASS)
    F, _ = _law(q, v, scale)
    lam_d = 20.0 + 5.0 * np.sin(3.0 * t)
    rhs = np.concatenate([Q + F - A[0] * ((1 + gf) * lam_d + gi * z), b])
    K = np.block([[M, -(1 + gf) * A.T], [A, np.zeros((1, 1))]])
    qdd_lam = np.linalg.solve(K, rhs)
    lam = qdd_lam[2:]
    return np.concatenate([v, qdd_lam[:2], lam_d - lam]), lam


@functools.cache
def _scipy(gi):
    ts = np.asarray(_runs()[gi].ts)
    run = solve_ivp(lambda t, x: _closed_loop_rhs(t, x, GF, gi, MISMATCH)[0],
                    (0.0, T1), np.concatenate([Q0, V0, [0.0]]), method="DOP853",
                    t_eval=ts, rtol=1e-12, atol=1e-12)
    assert run.success
    lam = np.array([_closed_loop_rhs(t, x, GF, gi, MISMATCH)[1]
                    for t, x in zip(run.t, run.y.T)])
    return run.y.T, lam


def _delta(sol):
    """The model error delta (the multipliers the plant adds to the commanded
    ones) at every saved state."""
    out = []
    for q, v in zip(np.asarray(sol.q), np.asarray(sol.v)):
        M, Q, A, b = _arm(q, v, MASS)
        F, _ = _law(q, v, MISMATCH)
        Minv_At = np.linalg.solve(M, A.T)
        out.append(np.linalg.solve(A @ Minv_At, b - A @ np.linalg.solve(M, F + Q)))
    return np.array(out)[:, 0]


# --- acceptance -----------------------------------------------------------------


def test_without_integral_action_the_force_error_settles_at_the_model_error():
    sol = _runs()[0.0]
    e = _force_error(sol)
    delta = _delta(sol)
    # The loop closed at every instant: (1 + G_F) e = -delta (measured 4.0e-14 N).
    assert np.max(np.abs((1 + GF) * e + delta)) < 4e-13
    # The error settles where the motion does (the arm at rest, 0.0126 rad off
    # q_d: the model's gravity is 15% off), at -delta / (1 + G_F) = -0.58492 N,
    # 2.9% of the commanded 20 N (measured; it changes by 1.1e-8 N over the last
    # second).
    late = np.asarray(sol.ts) >= T1 - 1.0
    assert np.ptp(e[late]) < 1e-7
    assert e[-1] == pytest.approx(-0.584921, abs=1e-6)
    # measured 4.4e-15 relative
    assert e[-1] == pytest.approx(-delta[-1] / (1 + GF), rel=1.5e-14, abs=0)


def test_integral_action_removes_the_error_at_the_rate_of_eq_50():
    sol = _runs()[GI]
    e = _force_error(sol)
    z = np.asarray(sol.controller_state)[:, 0]
    # The loop and the integrator: (1 + G_F) e = -G_I z - delta (measured 3.6e-14 N).
    assert np.max(np.abs((1 + GF) * e + GI * z + _delta(sol))) < 1.5e-13
    # Decays below 1e-6 of the commanded force (measured 8.3e-9 at t = 3 s)...
    assert abs(e[-1]) / float(force_reference(T1)[0]) < 8e-8
    # ...at eq. 50's rate K = G_I / (1 + G_F) = 5 /s once the motion has settled
    # (log-linear fit over the last second: measured 5.0010 /s, the motion's
    # own decay still in it).
    ts = np.asarray(sol.ts)
    late = ts >= T1 - 1.0
    rate = -np.polyfit(ts[late], np.log(np.abs(e[late])), 1)[0]
    assert rate == pytest.approx(GI / (1 + GF), rel=1e-3)
    # With the same mismatch and no integral action it stays (previous test).
    assert abs(_force_error(_runs()[0.0])[-1]) > 0.5


@pytest.mark.parametrize("gi", [0.0, GI])
def test_closed_loop_matches_an_independent_scipy_solve(gi):
    sol = _runs()[gi]
    x, lam = _scipy(gi)
    # Measured (gi = 0, 10): q 5.2e-12, v 8.0e-11, z 2.4e-12 / 3.1e-12,
    # multipliers 3.0e-11 / 4.5e-11 (RK4 at dt = 1e-3 against DOP853 at 1e-12).
    assert np.max(np.abs(x[:, :2] - np.asarray(sol.q))) < 5e-11
    assert np.max(np.abs(x[:, 2:4] - np.asarray(sol.v))) < 3e-10
    assert np.max(np.abs(x[:, 4:] - np.asarray(sol.controller_state))) < 1.2e-11
    assert np.max(np.abs(lam - np.asarray(sol.multipliers))) < 1.5e-10


ROUTE_TS = np.linspace(0.0, 0.3, 7)


@pytest.mark.parametrize("route", ["nullspace-projected", "bdf"])
def test_other_routes_integrate_the_controller_state(route):
    """The controller's state through NullSpace's state (q, nu, R) and a post-step
    projection (diffrax's loop), and through BDF on an ODE formulation (the
    augmented state flattened), against the SciPy solve."""
    if route == "bdf":
        kw = {"formulation": cdiff.Lagrange(alpha=10.0, beta=10.0),
              "solver": cdiff.BDF(rtol=1e-10, atol=1e-10)}
    else:
        kw = {"formulation": cdiff.NullSpace(alpha=10.0),
              "solver": cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())}
    sol = cdiff.simulate(PLANT, kw.pop("formulation"), Q0, V0, t1=0.3, dt=DT,
                         control=hybrid(GF, GI),
                         saveat=cdiff.SaveAt(ts=jnp.asarray(ROUTE_TS)), **kw)
    run = solve_ivp(lambda t, x: _closed_loop_rhs(t, x, GF, GI, MISMATCH)[0],
                    (0.0, 0.3), np.concatenate([Q0, V0, [0.0]]), method="DOP853",
                    t_eval=ROUTE_TS, rtol=1e-12, atol=1e-12)
    lam = np.array([_closed_loop_rhs(t, x, GF, GI, MISMATCH)[1]
                    for t, x in zip(run.t, run.y.T)])
    # Measured (nullspace-projected, bdf): q 4.9e-12, 1.4e-10; z 3.0e-12, 3.3e-11;
    # multipliers 4.3e-11, 9.7e-10.
    bound_q, bound_z, bound_lam = {"bdf": (5e-10, 1.2e-10, 3e-9),
                                   "nullspace-projected": (2e-11, 1.2e-11, 1.5e-10),
                                   }[route]
    assert np.max(np.abs(run.y.T[:, :2] - np.asarray(sol.q))) < bound_q
    assert np.max(np.abs(run.y.T[:, 4:] - np.asarray(sol.controller_state))) < bound_z
    assert np.max(np.abs(lam - np.asarray(sol.multipliers))) < bound_lam


# --- gradients and tuning -------------------------------------------------------

LOSS_T1, LOSS_DT = 1.0, 2e-3


def _loss(ctrl):
    """Mean squared force error over a 1 s closed-loop run."""
    sol = cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=LOSS_T1, dt=LOSS_DT,
                         control=ctrl)
    return jnp.mean((force_reference(sol.ts)[0] - sol.multipliers[:, 0]) ** 2)


def _loss_of_gains(gf, gi, scale):
    return _loss(hybrid(gf, gi, scale))


def test_gradient_wrt_the_gains_matches_central_differences_under_vmap():
    scales = np.array([0.85, 1.15, 1.3])
    gf, gi, h = 1.0, 2.0, 1e-4
    # One vmapped call: the gradient at (gf, gi) and the four shifted losses, for
    # every mismatch.
    shifts = np.array([[0, 0], [h, 0], [-h, 0], [0, h], [0, -h]])
    gfs = np.repeat(gf + shifts[:, 0], 3)
    gis = np.repeat(gi + shifts[:, 1], 3)
    batch = jax.jit(jax.vmap(jax.value_and_grad(_loss_of_gains, argnums=(0, 1))))
    values, (d_gf, d_gi) = batch(jnp.asarray(gfs), jnp.asarray(gis),
                                 jnp.asarray(np.tile(scales, 5)))
    values = np.asarray(values).reshape(5, 3)
    fd_gf = (values[1] - values[2]) / (2 * h)
    fd_gi = (values[3] - values[4]) / (2 * h)
    d_gf, d_gi = np.asarray(d_gf)[:3], np.asarray(d_gi)[:3]
    assert np.all(d_gf < 0) and np.all(d_gi < 0)  # more gain, less error
    # Measured relative differences: gf 2.1e-9, 2.3e-9, 2.3e-9; gi 5.8e-10,
    # 6.4e-10, 6.0e-10 (the central differences' own error, of order h^2).
    np.testing.assert_allclose(d_gf, fd_gf, rtol=2e-8)
    np.testing.assert_allclose(d_gi, fd_gi, rtol=2.5e-9)


def test_tune_lowers_the_closed_loop_loss():
    ctrl = hybrid(1.0, 2.0)
    # Only the PI gains are trained (the controller's model and the motion
    # gains are arrays too): an equinox filter spec.
    spec = eqx.tree_at(lambda c: (c.gf, c.gi), jax.tree.map(lambda _: False, ctrl),
                       (True, True))
    fit = cdiff.studies.tune(_loss, ctrl, optax.adam(0.5), steps=4,
                             trainable=spec, progress=False)
    # Measured: 0.1436, 0.0919, 0.0652, 0.0497, 0.0398.
    assert np.all(np.diff(fit.history) < 0)
    assert fit.history[-1] < 0.5 * fit.history[0]
    assert float(fit.params.gi) > 2.0 and float(fit.params.gf) > 1.0
    assert fit.params.model.m1 == MASS * MISMATCH  # not trained


# --- controllers without state; other routes ------------------------------------

ARM_REF_Q0 = jnp.array([0.35, TH2])
ARM_REF_V0 = jnp.array([0.4, 0.0])


def _tracking(t):
    th, dth, ddth = (0.3 + 0.2 * jnp.sin(2 * t), 0.4 * jnp.cos(2 * t),
                     -0.8 * jnp.sin(2 * t))
    z = jnp.zeros_like(th)
    return jnp.stack([th, z + TH2]), jnp.stack([dth, z]), jnp.stack([ddth, z])


PIDC = ProjectedInverseDynamics(PLANT, _tracking, 36.0, 6.0)


class _ZeroState(AbstractStatefulController):
    """A controller without memory written as a stateful one: a state that
    stays zero."""

    inner: ProjectedInverseDynamics

    def init_state(self, t0, q0, v0):
        return {"z": jnp.zeros((1,), q0.dtype)}

    def input(self, t, q, v, state, measurement):
        return self.inner(t, q, v)

    def state_rate(self, t, q, v, state, measurement):
        return {"z": jnp.zeros_like(state["z"])}


# The last row (q, v, multipliers, vdot) of two runs of PIDC, stored (float.hex)
# from the code before controllers had state.
_STORED_RK4 = ['0x1.d92a923799d00p-2', '-0x1.0c152382d7365p+1', '0x1.68c059af54491p-3',
               '-0x1.24dd2f1a9f4fap-57', '-0x1.07c2e64f2f00cp+0',
               '-0x1.ad0f184423989p-3', '0x1.9800000000000p-48']
_STORED_TSIT5 = ['0x1.d92a9237c4572p-2', '-0x1.0c152382d7366p+1',
                 '0x1.68c059632bed9p-3', '-0x1.5caf8908279bbp-54',
                 '-0x1.07c2e62a4a5d7p+0']


def _adaptive(control):
    return cdiff.simulate(
        PLANT, cdiff.Lagrange(), ARM_REF_Q0, ARM_REF_V0, t1=0.5, dt=1e-2,
        control=control, solver=diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
        saveat=cdiff.SaveAt(t1=True))


def test_controllers_without_state_are_unchanged():
    sol = cdiff.simulate(PLANT, cdiff.UdwadiaKalaba(), ARM_REF_Q0, ARM_REF_V0, t1=0.5,
                         dt=1e-3, control=PIDC)
    assert sol.controller_state is None
    row = np.concatenate([sol.q[-1], sol.v[-1], sol.multipliers[-1], sol.vdot[-1]])
    stored = np.array([float.fromhex(x) for x in _STORED_RK4])
    np.testing.assert_array_equal(row, stored)  # measured: equal
    # The same controller as a stateful one with a zero state: the same run.
    wrapped = cdiff.simulate(PLANT, cdiff.UdwadiaKalaba(), ARM_REF_Q0, ARM_REF_V0,
                             t1=0.5, dt=1e-3, control=_ZeroState(PIDC))
    assert wrapped.controller_state["z"].shape == (501, 1)
    assert not np.any(np.asarray(wrapped.controller_state["z"]))
    for a, b in ((wrapped.q, sol.q), (wrapped.v, sol.v),
                 (wrapped.multipliers, sol.multipliers), (wrapped.vdot, sol.vdot)):
        np.testing.assert_array_equal(a, b)  # measured: equal
    np.testing.assert_array_equal(wrapped.evaluate(0.2505)[0],
                                  sol.evaluate(0.2505)[0])  # dense output; equal
    # Through diffrax with an adaptive step (Tsit5, PID controller).
    sol = _adaptive(PIDC)
    row = np.concatenate([sol.q[-1], sol.v[-1], sol.multipliers[-1]])
    stored = np.array([float.fromhex(x) for x in _STORED_TSIT5])
    np.testing.assert_array_equal(row, stored)  # measured: equal
    wrapped = _adaptive(_ZeroState(PIDC))
    assert wrapped.controller_state["z"].shape == (1, 1)
    # The zero component enters the error norm, so the steps differ slightly (the
    # same 18 steps; measured 4.3e-12 rad apart, the solve's tolerance 1e-8).
    np.testing.assert_allclose(wrapped.q, sol.q, rtol=0, atol=2e-11)


# --- errors -----------------------------------------------------------------------


class _WrongRate(_ZeroState):
    def state_rate(self, t, q, v, state, measurement):
        return {"z": jnp.zeros((2,), q.dtype)}


class _Nonlinear(AbstractStatefulController):
    """A measuring controller whose input is nonlinear in the measurement: the
    force A^T (0.1 lambda_m^2) pulls the multipliers towards their square."""

    model: cdiff.AbstractModel
    measures = True

    def init_state(self, t0, q0, v0):
        return jnp.zeros((0,), q0.dtype)

    def input(self, t, q, v, state, measurement):
        A = cdiff.kinematics(self.model, t, q, v).A_v
        return A.T @ (0.1 * measurement**2 + 1.0) + self.model.gravity_torques(q)

    def state_rate(self, t, q, v, state, measurement):
        return state


class _NonlinearIterated(_Nonlinear):
    measurement_iterations = 4


class _Unconstrained(cdiff.AbstractModel):
    """The arm without its constraint."""

    def mass_matrix(self, t, q):
        return PLANT.mass_matrix(t, q)

    def forces(self, t, q, v):
        return PLANT.forces(t, q, v)


def test_clear_errors():
    with pytest.raises(ValueError, match="state_rate returns"):
        cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=0.01, dt=DT,
                       control=_WrongRate(PIDC))
    # A DAE formulation cannot carry the controller's state.
    with pytest.raises(ValueError, match="ODE formulation"):
        cdiff.simulate(PLANT, cdiff.GGL(), Q0, V0, t1=0.01, dt=DT,
                       solver=cdiff.BDF(), control=hybrid(GF, GI))
    # The controller's model must have the plant's coordinates and constraints.
    wrong = HybridForceMotion(TwoLinkOnCircle(), reference, GP, GD, force_reference)
    with pytest.raises(ValueError, match="same coordinates"):
        cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=0.01, dt=DT,
                       control=wrong)
    unconstrained = HybridForceMotion(_Unconstrained(), reference, GP, GD,
                                      force_reference)
    with pytest.raises(ValueError, match="constraint rows"):
        cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=0.01, dt=DT,
                       control=unconstrained)
    with pytest.raises(TypeError, match="AbstractController"):
        PassiveJoints(hybrid(GF, GI))


def test_a_nonlinear_measurement_loop_is_checked():
    # One Newton step does not close a nonlinear loop: the run stops, naming it.
    with pytest.raises(eqx.EquinoxRuntimeError, match="algebraic loop"):
        cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=0.01, dt=DT,
                       control=_Nonlinear(PLANT))
    sol = cdiff.simulate(PLANT, cdiff.Lagrange(), Q0, V0, t1=0.01, dt=DT,
                         control=_NonlinearIterated(PLANT), throw=False)
    assert bool(sol.succeeded)
    # At rest against gravity the constraint force is the commanded one, with the
    # multiplier solving lam = -(0.1 lam^2 + 1).
    lam = np.asarray(sol.multipliers[0, 0])
    # measured 5.3e-15 relative
    assert lam == pytest.approx(-(0.1 * lam**2 + 1.0), rel=2e-14, abs=0)
