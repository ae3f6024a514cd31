"""cdiff.RK4 as a diffrax solver: convergence order against the matrix
exponential, and Simpson's rule for quadrature problems."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from helpers import EPS

import cdiff


# A damped rotation: eigenvalues -0.5 +- 2i.
A = np.array([[-0.5, 2.0], [-2.0, -0.5]])
Y0 = np.array([1.0, -0.3])


@jax.jit
def _linear_solve(dt):
    """y' = A y from 0 to 1 with a constant (traced) step dt >= 0.025."""
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: jnp.asarray(A) @ y),
        cdiff.RK4(),
        0.0,
        1.0,
        dt,
        jnp.asarray(Y0),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=diffrax.ConstantStepSize(),
        max_steps=40,
    )
    return sol.ys[-1], sol.stats["num_steps"]


def test_global_order_four_against_expm():
    exact = scipy.linalg.expm(A) @ Y0
    dts = [0.1, 0.05, 0.025]
    errors = []
    for dt in dts:
        y1, steps = _linear_solve(jnp.asarray(dt))
        assert int(steps) == round(1 / dt)
        errors.append(float(np.linalg.norm(np.asarray(y1) - exact)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 4) <= 0.3), (errors, orders)
    # And the error is RK4-sized: the one-step amplification error of a fourth-order
    # method at h * |lambda| ~ 0.2 is of order (h |lambda|)^5 / 120 per step.
    assert errors[0] < 1e-4


def test_one_step_stability_polynomial():
    """For y' = A y one RK4 step multiplies by the degree-4 Taylor polynomial of
    exp(hA): I + hA + (hA)^2/2 + (hA)^3/6 + (hA)^4/24, computed here by hand."""
    h = 0.1
    hA = h * A
    P = (np.eye(2) + hA + hA @ hA / 2 + hA @ hA @ hA / 6
         + hA @ hA @ hA @ hA / 24)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: jnp.asarray(A) @ y),
        cdiff.RK4(), 0.0, h, h, jnp.asarray(Y0),
        saveat=diffrax.SaveAt(t1=True),
    )
    np.testing.assert_allclose(sol.ys[-1], P @ Y0, rtol=0, atol=1e-15)  # 2.2e-16


def _quadrature_step(f, t0, h):
    """One RK4 step of y' = f(t), y(t0) = 0: a quadrature of f over [t0, t0 + h]."""
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: f(t)),
        cdiff.RK4(), t0, t0 + h, h, jnp.asarray(0.0),
        saveat=diffrax.SaveAt(t1=True),
    )
    assert int(sol.stats["num_steps"]) == 1
    return float(sol.ys[-1])


def _simpson(f, t0, h):
    return h / 6 * (f(t0) + 4 * f(t0 + h / 2) + f(t0 + h))


@pytest.mark.parametrize("t0, h", [(0.0, 0.5), (0.3, 0.25), (-1.0, 1.3)])
def test_one_step_is_simpsons_rule(t0, h):
    def cubic(t):
        return 2.0 - 3.0 * t + 0.7 * t**2 + 1.9 * t**3

    def antiderivative(t):
        return 2.0 * t - 1.5 * t**2 + 0.7 / 3 * t**3 + 1.9 / 4 * t**4

    got = _quadrature_step(cubic, t0, h)
    exact = antiderivative(t0 + h) - antiderivative(t0)
    # Round-off: measured 0 against the antiderivative and up to 0.99 eps relative
    # against Simpson's sum, in both builds.
    np.testing.assert_allclose(got, exact, rtol=2 * EPS, atol=0)
    np.testing.assert_allclose(got, _simpson(cubic, t0, h), rtol=4 * EPS, atol=0)


def test_one_step_quartic_has_simpsons_error():
    """Not exact beyond cubics: for f = t^4 on [0, h] Simpson gives 5 h^5 / 24,
    the exact integral is h^5 / 5 (difference h^5 / 120)."""
    h = 0.5
    got = _quadrature_step(lambda t: t**4, 0.0, h)
    # measured 1 ulp (8.7e-19, 0.6 eps relative)
    assert got == pytest.approx(5 * h**5 / 24, rel=2 * EPS, abs=0)
    # that ulp after the cancellation (measured 3.5e-15 relative)
    assert abs(got - h**5 / 5) == pytest.approx(h**5 / 120, rel=1.2e-14, abs=0)


def test_tableau_is_classic_rk4():
    tab = cdiff.RK4.tableau
    np.testing.assert_array_equal(tab.b_sol, [1 / 6, 1 / 3, 1 / 3, 1 / 6])
    np.testing.assert_array_equal(tab.c, [0.5, 0.5, 1.0])
    # Consistency: c_i is the row sum of a_i.
    for c, row in zip(tab.c, tab.a_lower):
        assert np.sum(row) == c  # exact: one nonzero entry per row
    # The embedded error weights b_sol - b_embedded must sum to zero.
    assert np.sum(tab.b_error) == pytest.approx(0.0, abs=1e-15)
    assert cdiff.RK4().order(None) == 4
