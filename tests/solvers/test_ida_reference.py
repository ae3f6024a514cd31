"""The SUNDIALS IDA reference wrapper (tests/solvers/ida_reference.py) against known
solutions: a semi-explicit index-1 DAE in closed form, and the pendulum in
index-1 (acceleration-level) form against an ODE for its angle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

pytest.importorskip("sksundae")

from ida_reference import HAVE_IDA, ida_solve


def test_have_ida():
    assert HAVE_IDA


# --- (a) y' = -y + z, 0 = z - sin(t), y(0) = 1 -------------------------------
# y = 3/2 e^{-t} + (sin t - cos t)/2, z = sin t.


def _linear_residual(t, y, yp):
    return np.array([yp[0] + y[0] - y[1], y[1] - np.sin(t)])


def _linear_exact(t):
    t = np.asarray(t)
    return np.stack([1.5 * np.exp(-t) + 0.5 * (np.sin(t) - np.cos(t)), np.sin(t)], -1)


T_LIN = np.linspace(0.0, 5.0, 51)


def test_index1_closed_form_consistent_start():
    ts, ys = ida_solve(_linear_residual, T_LIN, [1.0, 0.0], [-1.0, 1.0], algebraic=[1])
    assert ts.shape == T_LIN.shape and ys.shape == (T_LIN.size, 2)
    np.testing.assert_array_equal(ts, T_LIN)
    np.testing.assert_allclose(ys, _linear_exact(T_LIN), rtol=0, atol=1e-8)


def test_index1_closed_form_computed_initial_conditions():
    # Wrong algebraic y0[1] and wrong yp0: IDACalcIC ('yp0') repairs both.
    _, ys = ida_solve(
        _linear_residual, T_LIN, [1.0, 0.7], [0.0, 0.0], algebraic=[1],
        calc_initcond="yp0",
    )
    # Measured exact (IDACalcIC's Newton step on a linear residual): held to 4 ulp
    # of the state's size 1, not to equality, which the finite-difference
    # Jacobian does not promise.
    np.testing.assert_allclose(ys[0], [1.0, 0.0], rtol=0, atol=4 * np.finfo(float).eps)
    np.testing.assert_allclose(ys, _linear_exact(T_LIN), rtol=0, atol=1e-8)


def test_two_output_times_and_per_component_atol():
    ts, ys = ida_solve(
        _linear_residual, [0.0, 5.0], [1.0, 0.0], [-1.0, 1.0], algebraic=[1],
        atol=[1e-10, 1e-10], max_step=0.5,
    )
    np.testing.assert_array_equal(ts, [0.0, 5.0])
    np.testing.assert_allclose(ys, _linear_exact(ts), rtol=0,
                               atol=5e-10)  # measured 1.4e-10


def test_failure_raises_runtime_error():
    with pytest.raises(RuntimeError, match="max_num_steps"):
        ida_solve(
            _linear_residual, T_LIN, [1.0, 0.0], [-1.0, 1.0], algebraic=[1],
            max_num_steps=3,
        )
    with pytest.raises(ValueError):
        ida_solve(_linear_residual, T_LIN, [1.0, 0.0], [-1.0, 1.0], algebraic=[2])


# --- (b) pendulum, index-1 form ----------------------------------------------
# y = (q, v, w, lam) in R^2 x R^2 x R^2 x R, unit mass, L = 1, g = 9.81:
#   q' = v,  v' = w,  0 = M w - f - G^T lam,  0 = G w + Gdot v,
# with the constraint |q|^2 = L^2, G = 2 q^T, Gdot v = 2 v.v, f = (0, -m g).
# The angle from the +x axis, q = L (cos th, sin th), obeys th'' = -(g/L) cos th.

G_ACC, LENGTH, MASS = 9.81, 1.0, 1.0


@jax.jit
def _pendulum_residual_jax(t, y, yp):
    q, v, w, lam = y[0:2], y[2:4], y[4:6], y[6]
    f = jnp.array([0.0, -MASS * G_ACC])
    return jnp.concatenate(
        [
            yp[0:2] - v,
            yp[2:4] - w,
            MASS * w - f - 2.0 * q * lam,
            jnp.stack([2.0 * q @ w + 2.0 * v @ v]),
        ]
    )


def _pendulum_residual(t, y, yp):
    return np.asarray(_pendulum_residual_jax(t, y, yp))


T_PEN = np.linspace(0.0, 2.0, 201)


def _reference_angle(ts):
    sol = scipy.integrate.solve_ivp(
        lambda t, x: [x[1], -(G_ACC / LENGTH) * np.cos(x[0])],
        (ts[0], ts[-1]), [0.0, 0.0], method="DOP853", t_eval=ts,
        rtol=1e-12, atol=1e-12,
    )
    assert sol.success
    return sol.y[0]


@pytest.mark.parametrize("calc_initcond", [None, "yp0"])
def test_pendulum_index1_against_angle_ode(calc_initcond):
    y0 = np.array([LENGTH, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # horizontal, at rest
    if calc_initcond is None:  # consistent: w = (0, -g), lam = 0
        y0[4:6] = [0.0, -G_ACC]
        yp0 = np.array([0.0, 0.0, 0.0, -G_ACC, 0.0, 0.0, 0.0])
    else:  # IDA computes w, lam and all of q', v'
        yp0 = np.zeros(7)
    ts, ys = ida_solve(
        _pendulum_residual, T_PEN, y0, yp0, algebraic=[4, 5, 6],
        calc_initcond=calc_initcond,
    )
    if calc_initcond is None:  # the consistent start, returned as given
        np.testing.assert_array_equal(ys[0, 4:7], [0.0, -G_ACC, 0.0])
    else:  # computed by IDACalcIC (measured 6.8e-14)
        np.testing.assert_allclose(ys[0, 4:7], [0.0, -G_ACC, 0.0], rtol=0, atol=3e-13)
    theta = np.unwrap(np.arctan2(ys[:, 1], ys[:, 0]))
    # (measured 3.6e-9 and 4.3e-9)
    np.testing.assert_allclose(theta, _reference_angle(ts), rtol=0, atol=1.5e-8)
    # The index-1 form only enforces the constraint at acceleration level;
    # its position-level drift must stay small at these tolerances (measured 4.4e-9
    # and 5.7e-9).
    assert np.max(np.abs(np.sum(ys[:, :2] ** 2, -1) - LENGTH**2)) < 2e-8
