"""Models whose coordinates hold a unit quaternion (nq = 4 > nv = 3): the kinematic map
q' = T(q) v through the kinematics, every formulation, the projections and the DAE
formulations, against references computed in other coordinates."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Body, quat_exp, quat_mul, rotation

import cdiff

# private on purpose: the models' internal reference solver, on this file's own ODEs
from cdiff.models._reference import solve_minimal


def _pendulum_rhs(t, y, args):
    k = args  # m g d / I_yy
    return jnp.stack([y[1], -k * jnp.sin(y[0])])


PENDULUM = Body(inertia=jnp.array([0.5, 0.4, 0.3]), c=jnp.array([0.0, 0.0, -0.6]),
                hinge=True)
THETA0 = 2.0  # rad from the hanging position, about y
Q0 = jnp.array([np.cos(THETA0 / 2), 0.0, np.sin(THETA0 / 2), 0.0])
V0 = jnp.array([0.0, 0.3, 0.0])  # body-frame angular velocity along y


def pendulum_reference(ts):
    k = PENDULUM.m * PENDULUM.g * 0.6 / PENDULUM.inertia[1]
    y = solve_minimal(_pendulum_rhs, jnp.array([THETA0, 0.3]), ts, k)
    return y[:, 0]


def angle_about_y(q):
    R = jax.vmap(rotation)(q)
    return jnp.arctan2(R[:, 0, 2], R[:, 2, 2])  # the body z-axis in the x-z plane


def test_kinematic_map_and_exact_integral_agree():
    q = Q0
    v = jnp.array([0.3, -0.2, 0.5])
    h = 1e-6
    step = PENDULUM.integrate_position
    fd = (step(q, h * v) - step(q, -h * v)) / (2 * h)
    # measured 3.6e-11 (round-off of the difference, eps / h)
    rate = PENDULUM.position_rate(0.0, q, v)
    np.testing.assert_allclose(fd, rate, rtol=0, atol=1e-10)
    # At dv = 0 the exponential map's derivative is exactly v / 2: the gradient is
    # T(q)^T 1, the same products (measured: equal).
    grad = jax.grad(lambda dv: PENDULUM.integrate_position(q, dv).sum())(jnp.zeros(3))
    linear = jax.grad(lambda w: PENDULUM.position_rate(0.0, q, w).sum())(jnp.zeros(3))
    np.testing.assert_array_equal(grad, linear)


def test_kinematics_use_the_velocity_jacobian():
    t = jnp.asarray(0.0)
    q = Q0 / jnp.linalg.norm(Q0)
    v = jnp.array([0.3, -0.2, 0.5])
    kin = cdiff.kinematics(PENDULUM, t, q, v)
    assert kin.A_q.shape == (2, 3)
    # dPhi/dt along q' = T(q) v by a central difference of the exact flow.
    def phi(dv):
        return PENDULUM.holonomic(t, PENDULUM.integrate_position(q, dv))

    h = 1e-5
    np.testing.assert_allclose(kin.A_q @ v, (phi(h * v) - phi(-h * v)) / (2 * h),
                               rtol=0, atol=1e-11)  # measured 3.1e-12
    # b_qv = -d^2/ds^2 Phi along the flow at constant v (second difference at
    # h = 1e-4: measured 3.0e-11).
    h = 1e-4
    second = (phi(h * v) - 2 * phi(0 * v) + phi(-h * v)) / h**2
    np.testing.assert_allclose(-kin.b_v, second, rtol=0, atol=1e-10)


FORMULATIONS = {
    "udwadia-kalaba": (cdiff.UdwadiaKalaba(), cdiff.RK4()),
    "lagrange": (cdiff.Lagrange(10.0, 10.0), cdiff.RK4()),
    "projection+newton": (cdiff.Projection(),
                          cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())),
    "regularized": (cdiff.Regularized(h=1e-2), cdiff.RK4()),
    "null-space": (cdiff.NullSpace(alpha=10.0), cdiff.RK4()),
}


@pytest.mark.parametrize("name", sorted(FORMULATIONS))
def test_ball_jointed_compound_pendulum_matches_the_minimal_ode(name):
    formulation, solver = FORMULATIONS[name]
    sol = cdiff.simulate(PENDULUM, formulation, Q0, V0, t1=3.0, dt=2e-3, solver=solver)
    assert sol.succeeded
    assert sol.q.shape[1] == 4 and sol.v.shape[1] == 3
    err = np.max(np.abs(angle_about_y(sol.q) - pendulum_reference(sol.ts)))
    # measured 3.5e-10 for every formulation: RK4's truncation on the manifold, where
    # the stabilizing terms vanish.
    assert err < 1e-9, err
    # Exact: V0 and gravity's torque lie along y, so x and z of the quaternion stay
    # exactly 0 and the hinge rows vanish identically.
    assert float(sol.max_constraint_error) == 0.0


@pytest.mark.parametrize("formulation", [cdiff.GGL(), cdiff.IndexOne()],
                         ids=["ggl", "index-one"])
def test_ball_jointed_pendulum_with_bdf(formulation):
    sol = cdiff.simulate(PENDULUM, formulation, Q0, V0, t1=1.0, dt=1e-3,
                         solver=cdiff.BDF(rtol=1e-8, atol=1e-8))
    assert sol.succeeded, sol.message
    rows = np.isfinite(np.asarray(sol.ts))
    err = np.max(np.abs(angle_about_y(sol.q[rows]) - pendulum_reference(sol.ts[rows])))
    assert err < 2e-6, err  # measured 6.1e-7 (both)


def test_newton_projection_moves_along_the_exponential_map():
    q = quat_mul(Q0, quat_exp(jnp.array([0.02, -0.01, 0.03])))  # off the hinge
    v = jnp.array([0.1, 0.3, -0.2])
    qp, vp = cdiff.NewtonProjection(iterations=4)(PENDULUM, 0.0, q, v)
    # measured 2.3e-48; 3.9e-47 with XLA's default fusion emitter (four Newton
    # steps converge quadratically; chaotic round-off below the ulp of |q|)
    assert float(jnp.max(jnp.abs(PENDULUM.holonomic(0.0, qp)))) < 2e-46
    # still unit to an ulp (measured: the norm rounds to 1.0)
    np.testing.assert_allclose(jnp.linalg.norm(qp), 1.0, rtol=0, atol=2.3e-16)
    kin = cdiff.kinematics(PENDULUM, 0.0, qp, vp)
    assert float(jnp.max(jnp.abs(kin.velocity_residual))) < 1e-16  # measured 3.1e-17


FREE = Body(inertia=jnp.array([1.0, 2.0, 3.0]), c=jnp.zeros(3), g=0.0)


def _rotation_rhs(t, y, inertia):
    R, w = y[:9].reshape(3, 3), y[9:]
    skew = jnp.array([[0, -w[2], w[1]], [w[2], 0, -w[0]], [-w[1], w[0], 0]])
    wdot = -jnp.cross(w, inertia * w) / inertia
    return jnp.concatenate([(R @ skew).ravel(), wdot])


def test_torque_free_body_conserves_energy_and_momentum():
    w0 = jnp.array([0.1, 2.0, 0.1])  # near the unstable intermediate axis
    q0 = jnp.array([1.0, 0.0, 0.0, 0.0])
    sol = cdiff.simulate(FREE, cdiff.UdwadiaKalaba(), q0, w0, t1=5.0, dt=1e-3)
    L = jax.vmap(lambda q, w: rotation(q) @ (FREE.inertia * w))(sol.q, sol.v)
    assert float(jnp.max(jnp.abs(L - L[0]))) < 2e-12  # measured 5.1e-13
    assert float(sol.max_energy_error) < 2e-13  # measured 6.4e-14
    # Against Euler's equations with the rotation matrix as coordinates.
    y0 = jnp.concatenate([jnp.eye(3).ravel(), w0])
    ref = solve_minimal(_rotation_rhs, y0, sol.ts[1:], FREE.inertia)
    R = jax.vmap(rotation)(sol.q[1:])
    # measured 5.3e-10
    assert float(jnp.max(jnp.abs(R.reshape(-1, 9) - ref[:, :9]))) < 2e-9


def test_gradient_through_quaternion_coordinates_matches_differences():
    def final_angle(m):
        model = Body(PENDULUM.inertia, PENDULUM.c, m=m, hinge=True)
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), Q0, V0, t1=1.0, dt=1e-2,
                             saveat=diffrax.SaveAt(t1=True))
        return angle_about_y(sol.q)[-1]

    g = jax.grad(final_angle)(1.0)
    h = 1e-5
    fd = (final_angle(1.0 + h) - final_angle(1.0 - h)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-9)  # measured 2.9e-10 relative


def test_wrong_velocity_size_is_named():
    with pytest.raises(ValueError, match=r"v0 must have shape \(3,\)"):
        cdiff.simulate(PENDULUM, cdiff.UdwadiaKalaba(), Q0, jnp.zeros(4), t1=0.1,
                       dt=1e-2)
