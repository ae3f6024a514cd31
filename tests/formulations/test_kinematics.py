"""cdiff.kinematics and the energy law (`cdiff.Terms.energy_law`) against
hand-derived Jacobians and rates.

Convention under test (cdiff.kinematics): A_q = dPhi_q/dq, b_q = -dPhi_q/dt,
dphi_q = A_q v - b_q, A_v = [A_q; dPhi_v/dv], b_v = [b_qv; b_vv] with
A_q qdd = b_qv equivalent to Phi_q'' = 0 and A_vv qdd = b_vv to Phi_v' = 0.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import slider_crank_numpy

import cdiff
from cdiff import kinematics

_kin = jax.jit(kinematics)


@jax.jit
def _law(model, t, q, v, qdot=None):
    """The energy law at `(t, q, v)` as the formulations read it: the
    `cdiff.Terms.energy_law` of `model.terms(t, q, v)`."""
    return model.terms(t, q, v).energy_law(qdot)


def _close(x, ref, atol):
    """x = ref to `atol`, each test's measured round-off times 3 to 5, or exactly
    (atol = 0) where every check of the test measured identical."""
    np.testing.assert_allclose(np.asarray(x), np.asarray(ref, dtype=float),
                               rtol=0, atol=atol)


def _state(rng, n):
    return jnp.asarray(rng.standard_normal(n)), jnp.asarray(rng.standard_normal(n))


# --- the slider-crank (Braun & Goldfarb eq. 22) ------------------------------------


def _slider_crank_hand(l, q, v):
    """R2's residual, and its A and b = -(dA/dt) v (Phi'' = A qdd + (dA/dt) v) from
    tests/helpers.py, all derived by hand."""
    x1, y1, t1, x2, y2, t2 = np.asarray(q)
    h = l / 2
    s1, c1, s2, c2 = np.sin(t1), np.cos(t1), np.sin(t2), np.cos(t2)
    phi = np.array([
        x1 - h * c1,
        y1 - h * s1,
        x1 + h * c1 - x2 + h * c2,
        y1 + h * s1 - y2 + h * s2,
        y2 + h * s2,
    ])
    _, _, A, Adot_v = slider_crank_numpy(np.asarray(q), np.asarray(v), l=l)
    return phi, A, -Adot_v


@pytest.mark.parametrize("seed", [0, 1])
def test_slider_crank_against_hand_derivation(seed):
    atol = {0: 4e-16, 1: 1e-16}[seed]  # measured 1.1e-16, 2.1e-17
    rng = np.random.default_rng(seed)
    model = cdiff.models.SliderCrank(m=1.3, l=0.7, g=9.81)
    q, v = _state(rng, 6)  # not on the constraint manifold
    t = jnp.asarray(0.37)
    kin = _kin(model, t, q, v)
    phi, A, b = _slider_crank_hand(0.7, q, v)
    assert kin.A_q.shape == (5, 6) and kin.A_v.shape == (5, 6)
    assert kin.b_v.shape == (5,) and kin.phi_v.shape == (0,)
    _close(kin.phi_q, phi, atol)
    _close(kin.A_q, A, atol)
    _close(kin.b_q, np.zeros(5), atol)  # time-independent
    _close(kin.dphi_q, A @ np.asarray(v), atol)
    _close(kin.A_v, A, atol)
    _close(kin.b_v, b, atol)
    _close(kin.velocity_residual, A @ np.asarray(v), atol)


def test_slider_crank_b_v_is_second_derivative_along_a_path():
    """Independent of the hand algebra: Phi(q(t))'' by finite differences along
    q(t) = q + v t + a t^2 / 2 equals A a - b."""
    rng = np.random.default_rng(2)
    model = cdiff.models.SliderCrank(m=1.3, l=0.7)
    q, v = (rng.standard_normal(6) for _ in range(2))
    a = rng.standard_normal(6)
    kin = _kin(model, jnp.asarray(0.0), jnp.asarray(q), jnp.asarray(v))

    def phi(s):
        return np.asarray(_slider_crank_hand(0.7, q + v * s + a * s**2 / 2, v)[0])

    h = 1e-4
    second = (phi(h) - 2 * phi(0.0) + phi(-h)) / h**2
    # The difference quotient's round-off, ~eps_mach / h^2 (measured 2.4e-8).
    np.testing.assert_allclose(np.asarray(kin.A_q) @ a - np.asarray(kin.b_v), second,
                               rtol=0, atol=1e-7)


# --- a time-dependent holonomic constraint -----------------------------------------


class Rheonomic(cdiff.AbstractModel):
    """Phi = [q0 - sin(w t) q1, q1^2 + q0 - t^2]."""

    omega: float = 1.7

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def holonomic(self, t, q):
        return jnp.stack([q[0] - jnp.sin(self.omega * t) * q[1],
                          q[1] ** 2 + q[0] - t**2])


@pytest.mark.parametrize("t", [0.0, 0.8, -1.3])
def test_time_dependent_holonomic(t):
    atol = {0.0: 0.0, 0.8: 3e-15, -1.3: 1.5e-15}[t]  # measured 0, 8.9e-16, 4.4e-16
    rng = np.random.default_rng(3)
    w = 1.7
    q, v = _state(rng, 2)
    kin = _kin(Rheonomic(omega=w), jnp.asarray(t), q, v)
    q0, q1 = np.asarray(q)
    v0, v1 = np.asarray(v)
    s, c = np.sin(w * t), np.cos(w * t)
    A = np.array([[1.0, -s], [1.0, 2 * q1]])
    dphi_dt = np.array([-w * c * q1, -2 * t])
    _close(kin.phi_q, [q0 - s * q1, q1**2 + q0 - t**2], atol)
    _close(kin.A_q, A, atol)
    _close(kin.b_q, -dphi_dt, atol)
    _close(kin.dphi_q, A @ np.asarray(v) + dphi_dt, atol)
    # Phi1'' = a0 - s a1 - 2 w c v1 + w^2 s q1 ; Phi2'' = a0 + 2 q1 a1 + 2 v1^2 - 2
    _close(kin.b_v, [2 * w * c * v1 - w**2 * s * q1, 2.0 - 2 * v1**2], atol)


# --- nonholonomic constraints ------------------------------------------------------


class KnifeEdge(cdiff.AbstractModel):
    """q = [x, y, theta]; no sideways slip: sin(theta) xd - cos(theta) yd = 0."""

    def mass_matrix(self, t, q):
        return jnp.eye(3, dtype=q.dtype)

    def nonholonomic(self, t, q, v):
        return jnp.stack([jnp.sin(q[2]) * v[0] - jnp.cos(q[2]) * v[1]])


class SpeedLimit(cdiff.AbstractModel):
    """Non-Pfaffian: unit planar speed, xd^2 + yd^2 - 1 = 0."""

    def mass_matrix(self, t, q):
        return jnp.eye(3, dtype=q.dtype)

    def nonholonomic(self, t, q, v):
        return jnp.stack([v[0] ** 2 + v[1] ** 2 - 1])


class Mixed(cdiff.AbstractModel):
    """One holonomic and two nonholonomic constraints, one of them time-dependent
    and non-Pfaffian: Phi_q = x^2 + y^2 - 1 - theta,
    Phi_v = [sin(theta) xd - cos(theta) yd, xd^2 + x yd - cos(t) theta]."""

    def mass_matrix(self, t, q):
        return jnp.eye(3, dtype=q.dtype)

    def holonomic(self, t, q):
        return jnp.stack([q[0] ** 2 + q[1] ** 2 - 1 - q[2]])

    def nonholonomic(self, t, q, v):
        return jnp.stack([
            jnp.sin(q[2]) * v[0] - jnp.cos(q[2]) * v[1],
            v[0] ** 2 + q[0] * v[1] - jnp.cos(t) * q[2],
        ])


def test_knife_edge():
    atol = 0.0  # measured: identical
    rng = np.random.default_rng(4)
    q, v = _state(rng, 3)
    kin = _kin(KnifeEdge(), jnp.asarray(0.5), q, v)
    th = float(q[2])
    xd, yd, thd = np.asarray(v)
    assert kin.A_q.shape == (0, 3) and kin.phi_q.shape == (0,)
    _close(kin.phi_v, [np.sin(th) * xd - np.cos(th) * yd], atol)
    _close(kin.A_v, [[np.sin(th), -np.cos(th), 0.0]], atol)
    # b_vv = -(dPhi_v/dq) v = -(cos(th) xd + sin(th) yd) thd
    _close(kin.b_v, [-(np.cos(th) * xd + np.sin(th) * yd) * thd], atol)
    _close(kin.velocity_residual, kin.phi_v, atol)


def test_non_pfaffian():
    atol = 0.0  # measured: identical
    rng = np.random.default_rng(5)
    q, v = _state(rng, 3)
    kin = _kin(SpeedLimit(), jnp.asarray(0.0), q, v)
    xd, yd, _ = np.asarray(v)
    _close(kin.phi_v, [xd**2 + yd**2 - 1], atol)
    _close(kin.A_v, [[2 * xd, 2 * yd, 0.0]], atol)
    _close(kin.b_v, [0.0], atol)


def test_mixed_holonomic_and_nonholonomic_rows_are_stacked():
    atol = 4e-16  # measured 1.1e-16
    rng = np.random.default_rng(6)
    q, v = _state(rng, 3)
    t = 0.9
    kin = _kin(Mixed(), jnp.asarray(t), q, v)
    x, y, th = np.asarray(q)
    xd, yd, thd = np.asarray(v)
    A_q = np.array([[2 * x, 2 * y, -1.0]])
    _close(kin.phi_q, [x**2 + y**2 - 1 - th], atol)
    _close(kin.A_q, A_q, atol)
    _close(kin.b_q, [0.0], atol)
    _close(kin.dphi_q, A_q @ np.asarray(v), atol)
    _close(kin.phi_v, [np.sin(th) * xd - np.cos(th) * yd,
                       xd**2 + x * yd - np.cos(t) * th], atol)
    A_vv = np.array([[np.sin(th), -np.cos(th), 0.0], [2 * xd, x, 0.0]])
    _close(kin.A_v, np.concatenate([A_q, A_vv]), atol)
    b = [
        -(2 * xd**2 + 2 * yd**2),  # Phi_q'' = A_q a + 2 xd^2 + 2 yd^2
        -(np.cos(th) * xd + np.sin(th) * yd) * thd,
        # d/dt Phi_v2 = A_vv a + xd yd - cos(t) thd + sin(t) th
        -(xd * yd - np.cos(t) * thd + np.sin(t) * th),
    ]
    _close(kin.b_v, b, atol)
    _close(kin.velocity_residual, np.concatenate([kin.dphi_q, kin.phi_v]), atol)


class Free(cdiff.AbstractModel):
    """No constraints at all."""

    def mass_matrix(self, t, q):
        return jnp.eye(q.shape[0], dtype=q.dtype)


def test_no_constraints_shapes():
    q, v = jnp.arange(4.0), jnp.ones(4)
    kin = kinematics(Free(), 0.0, q, v)
    assert kin.phi_q.shape == (0,) and kin.dphi_q.shape == (0,)
    assert kin.A_q.shape == (0, 4) and kin.b_q.shape == (0,)
    assert kin.phi_v.shape == (0,)
    assert kin.A_v.shape == (0, 4) and kin.b_v.shape == (0,)
    assert kin.velocity_residual.shape == (0,)
    # Also under jit and vmap.
    batched = jax.jit(jax.vmap(lambda q: kinematics(Free(), 0.0, q, v)))(
        jnp.stack([q, q]))
    assert batched.A_v.shape == (2, 0, 4)


# --- the energy law ----------------------------------------------------------------


@pytest.mark.parametrize("use_qdot", [False, True])
def test_energy_law_slider_crank(use_qdot):
    atol = 1e-15  # measured 2.8e-16
    rng = np.random.default_rng(7)
    m, l, g = 1.3, 0.7, 9.81
    model = cdiff.models.SliderCrank(m=m, l=l, g=g)
    q, v = _state(rng, 6)
    qdot = jnp.asarray(rng.standard_normal(6)) if use_qdot else None
    law = _law(model, jnp.asarray(0.2), q, v, qdot)
    Mdiag = np.array([m, m, m * l**2 / 12, m, m, m * l**2 / 12])
    vn = np.asarray(v)
    rate = vn if qdot is None else np.asarray(qdot)
    potential = m * g * (float(q[1]) + float(q[4]))
    _close(law.energy, 0.5 * np.sum(Mdiag * vn**2) + potential, atol)
    _close(law.A_e, Mdiag * vn, atol)
    # b_e = -dE/dt - (dE/dq) qdot, dE/dq = m g (e_y1 + e_y2)
    _close(law.b_e, -m * g * (rate[1] + rate[4]), atol)


class TimeEnergy(cdiff.AbstractModel):
    """E = 1/2 |v|^2 + t q0^2 + q1 v0 (explicitly time-dependent)."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def energy(self, t, q, v):
        return 0.5 * v @ v + t * q[0] ** 2 + q[1] * v[0]


def test_energy_law_time_dependent():
    atol = 0.0  # measured: identical
    rng = np.random.default_rng(8)
    q, v = _state(rng, 2)
    qdot = jnp.asarray(rng.standard_normal(2))
    t = 1.4
    q0, q1 = np.asarray(q)
    v0, v1 = np.asarray(v)
    for rate in [None, qdot]:
        law = _law(TimeEnergy(), jnp.asarray(t), q, v, rate)
        r0, r1 = np.asarray(v if rate is None else rate)
        _close(law.energy, 0.5 * (v0**2 + v1**2) + t * q0**2 + q1 * v0, atol)
        _close(law.A_e, [v0 + q1, v1], atol)
        _close(law.b_e, -(q0**2) - (2 * t * q0 * r0 + v0 * r1), atol)


def test_jacobian_matches_forward_mode_and_handles_no_rows():
    # private on purpose: kinematics' Jacobian kernel, on a bare f (no public name)
    from cdiff._kinematics import jacobian

    def f(x):
        return jnp.stack([jnp.sin(x[0]) * x[1], x[2] ** 3 - jnp.cos(x[1]) * x[0]])

    x = jnp.array([0.3, -1.2, 0.7])
    y, J = jax.jit(jacobian, static_argnums=0)(f, x)
    # Every entry is the same product of the same derivatives in either mode
    # (measured: identical, here and below).
    np.testing.assert_array_equal(y, f(x))
    np.testing.assert_array_equal(J, jax.jacfwd(f)(x))
    # Under vmap, and with its own derivative (the Jacobian is differentiated when
    # gradients are taken through a simulation).
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_array_equal(jax.vmap(lambda x: jacobian(f, x)[1])(xs),
                                  jax.vmap(jax.jacfwd(f))(xs))
    np.testing.assert_array_equal(jax.jacfwd(lambda x: jacobian(f, x)[1])(x),
                                  jax.jacfwd(jax.jacfwd(f))(x))
    y0, J0 = jacobian(lambda x: jnp.zeros((0,)), x)
    assert y0.shape == (0,) and J0.shape == (0, 3)
