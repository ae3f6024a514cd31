"""cdiff.control: Aghili's projection-based controllers (Sec. 7).

Independent checks: the closed-form solution of the PD error law
e'' + G_D e' + G_P e = 0 (eq. 45), of the PI force-error law
(1 + G_F) e' + G_I e = 0 (eq. 50), exact numpy projectors and least-squares
minimum-norm forces, the constraint forces that cdiff's formulations compute
(Solution.constraint_force / multipliers, eq. 32), and central finite differences.
"""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import force_reference

import cdiff
from cdiff.control import HybridForceMotion, PassiveJoints, ProjectedInverseDynamics
from cdiff.models import PlanarArmOnCurve, TwoLinkOnCircle

T1, DT = 2.0, 1e-3
GP, GD = 36.0, 6.0  # e'' + 6 e' + 36 e = 0: zeta = 0.5, omega_d = sqrt(27)
E0 = -0.05  # initial tracking error (rad), along the constraint manifold


def _pd_error(ts, e0=E0, de0=0.0, gp=GP, gd=GD):
    """Closed-form solution of e'' + gd e' + gp e = 0 (underdamped)."""
    a = gd / 2
    w = np.sqrt(gp - a**2)
    return np.exp(-a * ts) * (e0 * np.cos(w * ts) + (de0 + a * e0) / w * np.sin(w * ts))


# --- R8: the arm on the unit circle (theta2 fixed by the constraint) ---------

ARM = PlanarArmOnCurve("circle", t_release=0.0)  # no holding torques
TH2 = float(ARM.hold[1])


def _theta1_d(t):
    return 0.3 + 0.2 * jnp.sin(2 * t), 0.4 * jnp.cos(2 * t), -0.8 * jnp.sin(2 * t)


def arm_reference(t):
    th, dth, ddth = _theta1_d(t)
    z = jnp.zeros_like(th)
    return jnp.stack([th, z + TH2]), jnp.stack([dth, z]), jnp.stack([ddth, z])


ARM_Q0 = jnp.array([0.3 - E0, TH2])  # e(0) = -0.05 rad along the circle
ARM_V0 = jnp.array([0.4, 0.0])  # e'(0) = 0


def _arm_error(sol):
    return np.asarray(_theta1_d(sol.ts)[0] - sol.q[:, 0])


def _tracking_loss(gp):
    ctrl = ProjectedInverseDynamics(ARM, arm_reference, gp, GD)
    # Reverse mode, every step checkpointed (cheaper to compile than the default
    # recursive scheme; the state is tiny).
    sol = cdiff.simulate(ARM, cdiff.UdwadiaKalaba(), ARM_Q0, ARM_V0, t1=T1, dt=DT,
                         control=ctrl, adjoint=diffrax.RecursiveCheckpointAdjoint(
                             checkpoints=round(T1 / DT)))
    e = _theta1_d(sol.ts)[0] - sol.q[:, 0]
    f = jax.vmap(ctrl)(sol.ts, sol.q, sol.v)  # the controller's force along the run
    return jnp.mean(e**2), (sol, f)


_value_and_grad = jax.jit(jax.value_and_grad(_tracking_loss, has_aux=True))


@functools.cache
def _pidc_run():
    return _value_and_grad(jnp.asarray(GP))


def test_pidc_tracking_law_and_minimum_norm_on_r8():
    (_, (sol, f)), _ = _pidc_run()
    ts = np.asarray(sol.ts)
    assert ts[-1] == T1  # the grid ends at t1 itself
    # eq. 45: the error follows e'' + G_D e' + G_P e = 0 from e(0) = -0.05
    # (measured 4.5e-13 rad).
    assert np.max(np.abs(_arm_error(sol) - _pd_error(ts))) < 2e-12
    assert float(sol.max_constraint_error) < 4e-15  # measured 8.9e-16
    # eq. 46: f = f_par, no component in N(A)^perp (exact numpy projector).
    f = np.asarray(f)
    A = np.asarray(jax.vmap(jax.jacfwd(ARM.holonomic, argnums=1), (None, 0))(
        0.0, sol.q))[:, 0, :]
    f_perp = np.sum(A * f, axis=1) / np.linalg.norm(A, axis=1)  # |(I - P) f|
    assert np.max(np.abs(f_perp)) <= 7e-14  # measured 1.7e-14 (|f| > 10)
    assert np.max(np.abs(f)) > 10.0  # a real force (gravity and tracking)


def test_pidc_gradient_wrt_gain_matches_finite_differences():
    (loss, _), grad = _pidc_run()
    h = 1e-3
    (lp, _), _ = _value_and_grad(jnp.asarray(GP + h))
    (lm, _), _ = _value_and_grad(jnp.asarray(GP - h))
    fd = (float(lp) - float(lm)) / (2 * h)
    assert np.isfinite(float(grad)) and float(grad) < 0  # stiffer gain, smaller error
    # Central differences, h = 1e-3: truncation, measured 8.7e-10 relative.
    assert float(grad) == pytest.approx(fd, rel=3e-9, abs=0)
    assert float(loss) > 0


def test_hybrid_force_and_motion_laws_on_r8():
    """With the controller's model equal to the plant, the PI loop on the measured
    multipliers (the controller's integrator integrated by the solver, the
    algebraic loop closed at every stage) follows eq. 50's law, whose closed form
    is `predicted_force_error`."""
    gf, gi, z0 = 1.0, 4.0, 2.0
    ctrl = HybridForceMotion(ARM, arm_reference, GP, GD, force_reference, gf=gf,
                             gi=gi, integral0=jnp.array([z0]))
    sol = cdiff.simulate(ARM, cdiff.UdwadiaKalaba(), ARM_Q0, ARM_V0, t1=T1, dt=DT,
                         control=ctrl)
    ts = np.asarray(sol.ts)
    # The motion is unaffected by the force loop (Sec. 7.3): eq. 45 again
    # (measured 4.5e-13 rad).
    assert np.max(np.abs(_arm_error(sol) - _pd_error(ts))) < 2e-12
    # (1 + G_F) e' + G_I e = 0, e(0) = -G_I z0 / (1 + G_F), on the multipliers the
    # formulation computes...
    k = gi / (1 + gf)
    e_exact = -k * z0 * np.exp(-k * ts)
    np.testing.assert_allclose(jax.vmap(ctrl.predicted_force_error)(sol.ts)[:, 0],
                               e_exact, rtol=0, atol=5e-15)  # measured 8.9e-16
    e_lam = np.asarray(force_reference(sol.ts)[0] - sol.multipliers[:, 0])
    assert np.max(np.abs(e_lam - e_exact)) < 1e-12  # measured 2.4e-13
    assert abs(e_lam[0]) > 1.0  # a visible transient
    # ...with the integrator z' = e saved along the run (e = -K z)...
    z = np.asarray(sol.controller_state[:, 0])
    assert np.max(np.abs(z - z0 * np.exp(-k * ts))) < 4e-13  # measured 9.7e-14
    # ...and on the force e_f = A^T e_lambda (A is constant on the circle).
    A = np.asarray(jax.vmap(jax.jacfwd(ARM.holonomic, argnums=1), (None, 0))(
        0.0, sol.q))[:, 0, :]
    e_f = A * np.asarray(force_reference(sol.ts)[0])[:, None] - np.asarray(
        sol.constraint_force)
    assert np.max(np.abs(e_f - A * e_exact[:, None])) < 1.5e-12  # measured 4.1e-13


class _FullyActuated(cdiff.AbstractModel):
    """R5 with every coordinate actuated (identity input matrix)."""

    inner: cdiff.AbstractModel

    def mass_matrix(self, t, q):
        return self.inner.mass_matrix(t, q)

    def forces(self, t, q, v):
        return self.inner.forces(t, q, v)

    def holonomic(self, t, q):
        return self.inner.holonomic(t, q)


# --- R5: four coordinates, three constraints, one actuated joint ------------

R5 = TwoLinkOnCircle()
DELTA = float(R5.delta)


def r5_chart(th):
    """The constraint manifold (branch theta2 = theta1 - delta) as q(theta1)."""
    return jnp.stack([
        th,
        R5.l1 * jnp.cos(th) + R5.lc2 * jnp.cos(th - DELTA),
        R5.l1 * jnp.sin(th) + R5.lc2 * jnp.sin(th - DELTA),
        th - DELTA,
    ])


def r5_reference(t):
    def q_d(t):
        return r5_chart(0.2 * jnp.sin(2 * t))

    def v_d(t):
        return jax.jvp(q_d, (t,), (jnp.ones_like(t),))[1]

    q, v = jax.jvp(q_d, (t,), (jnp.ones_like(t),))
    return q, v, jax.jvp(v_d, (t,), (jnp.ones_like(t),))[1]


def theta1(q):
    return q[:1]


def _r5_state(th, om):
    return jax.jvp(r5_chart, (jnp.asarray(th),), (jnp.asarray(om),))


def test_hybrid_force_is_what_the_formulations_compute():
    """At an off-reference state, every formulation's acceleration is u_p and its
    multipliers are the commanded ones (eq. 32 vs eqs. 49-52, cdiff's signs), for
    any integrator state and measurement (controller model = plant)."""
    model = _FullyActuated(R5)
    ctrl = HybridForceMotion(model, r5_reference, GP, GD,
                             lambda t: jnp.stack([3.0, -2.0, 50.0 + t]),
                             gf=2.0, gi=3.0, integral0=jnp.array([1.0, 0.5, -1.0]),
                             coordinates=theta1)
    t = jnp.asarray(0.3)
    q, v = _r5_state(0.25, -0.7)
    z = jnp.array([0.7, -0.2, 1.5])
    lam_m = jnp.array([2.0, -1.0, 47.0])  # a measurement
    # (UdwadiaKalaba is checked by the simulations.)
    formulations = (cdiff.Projection(), cdiff.Lagrange())

    @eqx.filter_jit
    def evaluate(ctrl, t, q, v):
        def control(t, q, v):
            return ctrl.input(t, q, v, z, lam_m)

        context = cdiff.Context(model, control, jnp.asarray(jnp.nan))
        dyns = [f.dynamics(t, (q, v), context, f.freeze(t, t + DT, (q, v), context))
                for f in formulations]
        kin = cdiff.kinematics(model, t, q, v)
        return (ctrl.motion_acceleration(t, q, v),
                ctrl.commanded_multipliers(t, z, lam_m), kin.A_v, kin.b_v, dyns)

    u_p, lam_c, A, b, dyns = evaluate(ctrl, t, q, v)
    # admissible (measured 1.0e-15; |b| <= 1.1)
    np.testing.assert_allclose(A @ u_p, b, rtol=0, atol=4e-15)
    lam_d = jnp.stack([3.0, -2.0, 50.3])
    # eq. 50 with the same operations (measured: identical)
    np.testing.assert_array_equal(lam_c, lam_d + 2.0 * (lam_d - lam_m) + 3.0 * z)
    for dyn in dyns:
        # measured 3.6e-14 (|u_p| <= 1.7), 9.8e-15 and 9.6e-15 relative
        np.testing.assert_allclose(dyn.rate[1], u_p, rtol=0, atol=1.5e-13)
        np.testing.assert_allclose(dyn.multipliers, lam_c, rtol=4e-14, atol=0)
        np.testing.assert_allclose(dyn.force, A.T @ lam_c, rtol=4e-14, atol=0)
    # The predicted force error decays by (1 + G_F) e' + G_I e = 0 (K = 1): with
    # K = I, expm(-K) is exp(-1) I and expm(0) = I (measured: identical).
    e0, e1 = ctrl.predicted_force_error(0.0), ctrl.predicted_force_error(1.0)
    np.testing.assert_array_equal(e1, np.exp(-1.0) * np.asarray(e0))
    np.testing.assert_array_equal(e0, -np.array([1.0, 0.5, -1.0]))


def test_weighted_force_minimises_the_weighted_norm():
    """Eq. 47: same motion, A W^-1 f = 0, and f = argmin f^T W^-1 f over f + A^T mu
    (numpy least squares)."""
    model = _FullyActuated(R5)
    W = np.array([[2.0, 0.3, 0.0, 0.1], [0.3, 1.0, 0.2, 0.0],
                  [0.0, 0.2, 0.5, 0.0], [0.1, 0.0, 0.0, 3.0]])
    plain = ProjectedInverseDynamics(model, r5_reference, GP, GD, coordinates=theta1)
    weighted = ProjectedInverseDynamics(model, r5_reference, GP, GD,
                                        weight=jnp.asarray(W), coordinates=theta1)
    t = jnp.asarray(0.4)
    q, v = _r5_state(0.1, 0.3)
    f, fw = (np.asarray(x) for x in eqx.filter_jit(
        lambda a, b: (a(t, q, v), b(t, q, v)))(plain, weighted))
    A = np.asarray(jax.jacfwd(model.holonomic, argnums=1)(t, q))
    P = np.eye(4) - np.linalg.pinv(A) @ A
    # |f| ~ 100; measured 4.3e-14 and 4.3e-14
    np.testing.assert_allclose(P @ fw, P @ f, rtol=0, atol=1.5e-13)  # the same motion
    np.testing.assert_allclose(A @ np.linalg.solve(W, fw), 0.0, rtol=0, atol=1.5e-13)
    Wi_half = np.linalg.cholesky(np.linalg.inv(W)).T  # f^T W^-1 f = |Wi_half f|^2
    mu = np.linalg.lstsq(Wi_half @ A.T, -Wi_half @ f, rcond=None)[0]
    np.testing.assert_allclose(fw, f + A.T @ mu, rtol=0, atol=3e-13)  # 8.5e-14
    assert fw @ np.linalg.solve(W, fw) < f @ np.linalg.solve(W, f)
    # eq. 46 (measured 3.6e-15)
    np.testing.assert_allclose((np.eye(4) - P) @ f, 0.0, rtol=0, atol=1.5e-14)


def test_passive_joints_track_with_zero_passive_force_on_r5():
    inner = ProjectedInverseDynamics(R5, r5_reference, GP, GD, coordinates=theta1)
    ctrl = PassiveJoints(inner)  # B = E E^+ from the (4, 1) input matrix
    q0, v0 = _r5_state(-E0, 0.4)  # theta1(0) = 0.05, theta1_d(0) = 0
    ctrl.check(0.0, q0)

    @jax.jit
    def run(q0, v0):
        sol = cdiff.simulate(R5, cdiff.UdwadiaKalaba(), q0, v0, t1=T1, dt=DT,
                             control=ctrl)
        return sol, jax.vmap(ctrl.generalized_force)(sol.ts, sol.q, sol.v)

    sol, f = run(q0, v0)
    ts = np.asarray(sol.ts)
    e = np.asarray(0.2 * jnp.sin(2 * sol.ts) - sol.q[:, 0])
    assert np.max(np.abs(e - _pd_error(ts))) < 2e-12  # eq. 45 in theta1; 4.5e-13
    assert float(sol.max_constraint_error) < 2e-14  # measured 5.3e-15
    # Eq. 60: no force on x2, y2, theta2, so f is in the range of E = e1 and the
    # applied force E u (u = E^+ f = f[0]) is f itself (the controller's run-time
    # check of E u = f did not fire).
    f = np.asarray(f)
    assert np.max(np.abs(f[:, 1:])) <= 1.5e-13  # measured 4.3e-14 (|f| > 50)
    assert np.max(np.abs(f[:, 0])) > 50.0


def test_underactuated_force_without_passive_joints_raises():
    inner = ProjectedInverseDynamics(R5, r5_reference, GP, GD, coordinates=theta1)
    q, v = _r5_state(0.05, 0.4)
    with pytest.raises(eqx.EquinoxRuntimeError, match="PassiveJoints"):
        eqx.filter_jit(inner)(jnp.asarray(0.0), q, v)


class _FreeMass(cdiff.AbstractModel):
    """A point mass in the vertical plane, no constraints."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.stack([0.0, -9.81]).astype(q.dtype)


def _free_reference(t):
    z = jnp.zeros((2,), jnp.result_type(float))
    return z, z, z


def test_not_controllable_raises_value_error_naming_eq_62():
    free = ProjectedInverseDynamics(_FreeMass(), _free_reference, 1.0, 1.0)
    with pytest.raises(ValueError, match="eq. 62"):
        PassiveJoints(free, actuated=[True, False])
    PassiveJoints(free, actuated=[True, True]).check(0.0, jnp.zeros(2))
    inner = ProjectedInverseDynamics(R5, r5_reference, GP, GD, coordinates=theta1)
    with pytest.raises(ValueError, match="eq. 62"):
        PassiveJoints(inner, actuated=[False] * 4)
    # Only x2 actuated: the arm's motion moves x2 at the rate -y2 theta1', so
    # control is lost where y2 = 0 (theta1 = 0.2168...), kept elsewhere.
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(r5_chart(jnp.asarray(mid))[2]) < 0 else (lo, mid)
    q_sing = r5_chart(jnp.asarray(lo))
    ctrl = PassiveJoints(inner, actuated=[False, True, False, False])
    ctrl.check(0.0, r5_chart(jnp.asarray(0.0)))
    with pytest.raises(ValueError, match="eq. 62"):
        ctrl.check(0.0, q_sing)
    # At run time (inside jit), through eqx.error_if.
    with pytest.raises(eqx.EquinoxRuntimeError, match="eq. 62"):
        eqx.filter_jit(ctrl)(jnp.asarray(0.0), q_sing, jnp.zeros(4))


def test_gains_are_validated():
    with pytest.raises(ValueError, match="gp"):
        ProjectedInverseDynamics(ARM, arm_reference, -1.0, GD)
    with pytest.raises(ValueError, match="gi"):
        HybridForceMotion(ARM, arm_reference, GP, GD, force_reference, gi=-1.0)


# --- Yun & Sarkar: computed-torque state feedback on eq. 28 (NullSpace) -----

def _theta1_output(q):
    return q[0]


def _ct_loss(gp):
    ctrl = cdiff.control.ComputedTorque(_theta1_output, _theta1_d, gp, GD)
    sol = cdiff.simulate(ARM, cdiff.NullSpace(alpha=10.0, dof=1), ARM_Q0, ARM_V0,
                         t1=T1, dt=DT, control=ctrl, adjoint=diffrax.ForwardMode(),
                         saveat=cdiff.SaveAt(ts=jnp.linspace(0.0, T1, 201)))
    e = _theta1_d(sol.ts)[0] - sol.q[:, 0]
    return jnp.mean(e**2), sol


@jax.jit
def _ct_value_and_derivative(gp):
    """The loss, its derivative w.r.t. G_P (forward mode: cheaper to compile
    than reverse mode here; NullSpace's reverse mode is in test_gradients.py) and
    the solution."""
    (loss, sol), (dloss, _) = jax.jvp(_ct_loss, (gp,), (jnp.ones_like(gp),))
    return loss, dloss, sol


def test_computed_torque_on_nullspace_tracks_r8_with_pidc_force():
    """ComputedTorque on x = (q, nu): the output error follows the PD law, and
    its least-norm input is Aghili's minimum-norm force for the same chart
    (two derivations, one force), along the whole run."""
    loss, grad, sol = _ct_value_and_derivative(jnp.asarray(GP))
    ts = np.asarray(sol.ts)
    assert np.max(np.abs(_arm_error(sol) - _pd_error(ts))) < 2e-12  # measured 4.5e-13
    assert float(sol.max_constraint_error) < 3e-15  # measured 7.8e-16
    # The input the state feedback applied, recomputed from the saved states.
    formulation = cdiff.NullSpace(alpha=10.0, dof=1)
    ctrl = cdiff.control.ComputedTorque(_theta1_output, _theta1_d, GP, GD)
    context = cdiff.Context(ARM, ctrl, jnp.asarray(jnp.nan))
    pidc = ProjectedInverseDynamics(ARM, arm_reference, GP, GD,
                                    coordinates=lambda q: q[:1])

    def both(t, x):
        u = ctrl.feedback(t, formulation.control_affine(t, x, context))
        q, v = formulation.coordinates(t, x, context)
        return u, pidc(t, q, v)

    u, f = jax.vmap(both)(sol.ts, sol.state)
    assert np.max(np.abs(f)) > 10.0
    # measured 7.3e-16 max|f|
    np.testing.assert_allclose(u, f, rtol=0, atol=3e-15 * np.max(np.abs(f)))
    # The derivative of the tracking loss w.r.t. G_P through the state feedback.
    h = 1e-3
    lp = float(_ct_value_and_derivative(jnp.asarray(GP + h))[0])
    lm = float(_ct_value_and_derivative(jnp.asarray(GP - h))[0])
    assert float(grad) < 0
    # Central differences, h = 1e-3: measured 1.8e-10 relative.
    assert float(grad) == pytest.approx((lp - lm) / (2 * h), rel=6e-10, abs=0)


def test_computed_torque_tracks_euler_angles_of_the_rolling_sphere():
    """Nonholonomic (two rolling rows) plus holonomic contact, dof 3: the three
    Euler angles follow their references with independent PD error laws while the
    sphere keeps rolling on the large one (input-output linearisation; the
    system is not input-state linearisable)."""
    model = cdiff.models.RollingSphere(t_displace=100.0)
    q0, v0 = model.initial_state()
    gp, gd = jnp.array([25.0, 36.0, 16.0]), jnp.array([6.0, 6.0, 6.0])
    y0, dy0 = q0[3:], v0[3:]
    offset = jnp.array([0.1, -0.05, 0.2])

    def reference(t):  # y_d = y0 + offset + dy0 t + 0.1 sin(t)
        return (y0 + offset + dy0 * t + 0.1 * jnp.sin(t),
                dy0 + 0.1 * jnp.cos(t), -0.1 * jnp.sin(t) * jnp.ones(3))

    ctrl = cdiff.control.ComputedTorque(lambda q: q[3:], reference, gp, gd)
    ts = jnp.linspace(0.0, 1.0, 51)
    sol = cdiff.simulate(model, cdiff.NullSpace(alpha=10.0, dof=3), q0, v0,
                         t1=1.0, dt=2e-3, control=ctrl, saveat=cdiff.SaveAt(ts=ts))
    e = np.asarray(jax.vmap(reference)(ts)[0] - sol.q[:, 3:])
    de0 = 0.1 * np.ones(3)  # dy_d(0) - dy(0)
    for i in range(3):
        expected = _pd_error(np.asarray(ts), float(offset[i]), de0[i],
                             float(gp[i]), float(gd[i]))
        # measured 6.7e-12, 6.2e-12, 5.2e-12 rad
        assert np.max(np.abs(e[:, i] - expected)) < 2.5e-11, i
    assert float(sol.max_constraint_error) < 5e-16  # measured 1.1e-16
    # The centre distance rho stays R + r (measured: exactly).
    np.testing.assert_array_equal(sol.q[:, 0], model.R + model.r)


def test_state_feedback_needs_nullspace():
    ctrl = cdiff.control.ComputedTorque(_theta1_output, _theta1_d, GP, GD)
    with pytest.raises(ValueError, match="NullSpace"):
        cdiff.simulate(ARM, cdiff.Lagrange(), ARM_Q0, ARM_V0, t1=0.1, dt=DT,
                       control=ctrl)
    with pytest.raises(ValueError, match="NullSpace"):
        ctrl(0.0, ARM_Q0, ARM_V0)
    with pytest.raises(ValueError, match="gd"):
        cdiff.control.ComputedTorque(_theta1_output, _theta1_d, GP, 0.0)


def test_computed_torque_with_too_many_outputs_stops_with_its_error():
    # Two outputs for one degree of freedom: the decoupling matrix has rank 1.
    def reference(t):
        return jnp.array([0.3, TH2 + 0.1]), jnp.zeros(2), jnp.zeros(2)

    ctrl = cdiff.control.ComputedTorque(lambda q: q, reference, GP, GD)
    with pytest.raises(Exception, match="decoupling matrix"):
        cdiff.simulate(ARM, cdiff.NullSpace(dof=1), ARM_Q0, ARM_V0, t1=0.01, dt=DT,
                       control=ctrl)
