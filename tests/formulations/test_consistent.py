"""cdiff.consistent_state: guesses projected onto the position and velocity
constraints, checked by the constraints themselves and by the least-squares
property of the velocity correction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff

from helpers import Body, quat_exp, quat_mul

PENDULUM = Body(inertia=jnp.array([0.5, 0.4, 0.3]), c=jnp.array([0.0, 0.0, -0.6]),
                hinge=True)
Q0 = jnp.array([np.cos(1.0), 0.0, np.sin(1.0), 0.0])

CRANK = cdiff.models.SliderCrank()
GUESS_Q = CRANK.initial_state()[0] + jnp.array([0.02, -0.01, 0.03, 0.01, 0.02, -0.02])
GUESS_V = jnp.array([0.3, -0.2, 0.1, 0.4, 0.0, 0.2])


def test_slider_crank_guess_is_projected_onto_both_levels():
    q, v = cdiff.consistent_state(CRANK, GUESS_Q, GUESS_V)
    kin = cdiff.kinematics(CRANK, 0.0, q, v)
    assert float(jnp.max(jnp.abs(kin.phi_q))) < 5e-16  # measured 1.1e-16
    assert float(jnp.max(jnp.abs(kin.velocity_residual))) < 2e-16  # measured 4.2e-17
    # Least squares: v - v_guess lies in the row space of A_v (orthogonal to every
    # admissible velocity), i.e. v is the admissible velocity closest to the guess.
    null = np.linalg.svd(np.asarray(kin.A_v))[2][np.linalg.matrix_rank(kin.A_v):]
    # Round-off: measured 1.5e-17.
    np.testing.assert_allclose(null @ np.asarray(v - GUESS_V), 0.0, rtol=0, atol=6e-17)


def test_mass_weighted_velocity_is_closest_in_kinetic_metric():
    q, v = cdiff.consistent_state(CRANK, GUESS_Q, GUESS_V, mass_weighted=True)
    kin = cdiff.kinematics(CRANK, 0.0, q, v)
    M = np.asarray(CRANK.mass_matrix(0.0, q))
    null = np.linalg.svd(np.asarray(kin.A_v))[2][np.linalg.matrix_rank(kin.A_v):]
    # Round-off: measured 5.5e-18 (both XLA CPU emitters; 1.8e-17 noted before).
    np.testing.assert_allclose(null @ M @ np.asarray(v - GUESS_V), 0.0, rtol=0,
                               atol=2.5e-17)


def test_consistent_state_keeps_a_consistent_state():
    q0, v0 = CRANK.initial_state()
    q, v = cdiff.consistent_state(CRANK, q0, v0)
    np.testing.assert_array_equal(q, q0)  # converged guesses are left unchanged
    # v0 = 0, and the velocity projection of 0 is exactly 0.
    np.testing.assert_array_equal(v, v0)


def test_quaternion_guess_stays_unit():
    q = quat_mul(Q0, quat_exp(jnp.array([0.05, -0.02, 0.04])))
    qp, vp = cdiff.consistent_state(PENDULUM, q, jnp.array([0.2, 0.3, 0.1]))
    assert float(jnp.max(jnp.abs(PENDULUM.holonomic(0.0, qp)))) < 1e-12
    # Measured equal; 2 ulp allowed.
    np.testing.assert_allclose(jnp.linalg.norm(qp), 1.0, rtol=0, atol=4.5e-16)


class TwoCircles(cdiff.AbstractModel):
    """A particle on two disjoint circles: no configuration satisfies both."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def holonomic(self, t, q):
        p = q - jnp.array([3.0, 0.0])
        return jnp.stack([q @ q - 1.0, p @ p - 1.0])


def test_inconsistent_constraints_are_named():
    with pytest.raises(ValueError, match="inconsistent"):
        cdiff.consistent_state(TwoCircles(), jnp.array([1.5, 0.1]))


def test_transformations():
    f = jax.jit(lambda q: cdiff.consistent_state(CRANK, q, GUESS_V))
    q, _ = f(GUESS_Q)
    assert float(jnp.max(jnp.abs(CRANK.holonomic(0.0, q)))) < 5e-16  # 1.1e-16
    batch = GUESS_Q + jnp.linspace(0.0, 0.01, 3)[:, None]
    qs, _ = jax.vmap(f)(batch)
    assert qs.shape == (3, 6)
    # The slider position of the projected state as a function of the guess's crank
    # angle: reverse mode against central differences.

    def slider(th):
        q, _ = cdiff.consistent_state(CRANK, GUESS_Q.at[2].set(th), GUESS_V)
        return CRANK.slider(q)

    th = GUESS_Q[2]
    h = 1e-6
    fd = (slider(th + h) - slider(th - h)) / (2 * h)
    # Measured 6.1e-11 relative (the differences' round-off).
    np.testing.assert_allclose(jax.grad(slider)(th), fd, rtol=2.5e-10)


def test_fixed_coordinates_are_held_and_the_rest_solved():
    """The slider-crank (R2, coordinates x1, y1, theta1, x2, y2, theta2) from a
    rough guess with the crank angle and rate chosen: `fixed=(2,)` holds them and
    the projection lands on the exact configuration of that crank angle (branch
    theta2 = -theta1) and velocity; without it the minimum-norm projection moves
    the crank as well."""
    model = cdiff.models.SliderCrank()
    h, theta, w = 0.5, 0.4, 2.0
    c, s = np.cos(theta), np.sin(theta)
    exact_q = np.array([h * c, h * s, theta, 3 * h * c, h * s, -theta])
    exact_v = w * np.array([-h * s, h * c, 1.0, -3 * h * s, h * c, -1.0])
    guess_q = exact_q + np.array([0.05, -0.04, 0.0, 0.1, 0.03, 0.08])
    guess_v = np.array([0.0, 0.0, w, 0.0, 0.0, 0.0])
    for weighted in (False, True):
        q, v = cdiff.consistent_state(model, jnp.asarray(guess_q),
                                      jnp.asarray(guess_v), fixed=(2,),
                                      mass_weighted=weighted)
        assert float(q[2]) == theta and float(v[2]) == w
        np.testing.assert_allclose(q, exact_q, rtol=0, atol=1e-12)
        np.testing.assert_allclose(v, exact_v, rtol=0, atol=1e-12)
    q, _ = cdiff.consistent_state(model, jnp.asarray(guess_q), jnp.asarray(guess_v))
    assert abs(float(q[2]) - theta) > 1e-3  # the control: the crank moved
    with pytest.raises(ValueError, match="6 velocity coordinates"):
        cdiff.consistent_state(model, jnp.asarray(guess_q), fixed=(6,))


def test_fixed_takes_one_index_and_names_too_many():
    """`fixed=2` is `fixed=(2,)`; holding two coordinates of the one-degree-of-
    freedom slider-crank at values the constraints cannot meet together is named
    as such (the count held and the mechanism's degrees of freedom), not as an
    inconsistent constraint set."""
    model = cdiff.models.SliderCrank()
    one, _ = cdiff.consistent_state(model, GUESS_Q, GUESS_V, fixed=2)
    same, _ = cdiff.consistent_state(model, GUESS_Q, GUESS_V, fixed=(2,))
    np.testing.assert_array_equal(one, same)
    with pytest.raises(ValueError, match=r"fixed = \(2, 5\).*2 coordinate\(s\) held.*"
                                         r"1 degree\(s\) of freedom"):
        cdiff.consistent_state(model, GUESS_Q, GUESS_V, fixed=(2, 5))
    with pytest.raises(ValueError, match="fixed must be an index or a sequence"):
        cdiff.NewtonProjection(fixed="crank")
