"""Aghili's projection formulation: the properties its paper proves, its constraint
force, and agreement with the other formulations."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Duplicated

import cdiff
from cdiff._formulation.base import Context
from cdiff._formulation.projection import constraint_inertia, projector
from cdiff._linalg import PseudoInverse

INERTIAS = ["Mc", "Mc_sym", "Mc_gamma"]


def _random_case(seed, n=5, kind="full"):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, n))
    M = B @ B.T + 0.5 * np.eye(n)
    if kind == "full":
        A = rng.standard_normal((3, n))
    elif kind == "duplicated":
        a = rng.standard_normal((2, n))
        A = np.concatenate([a, a[:1]])
    else:  # rank one
        A = np.outer(rng.standard_normal(3), rng.standard_normal(n))
    return jnp.asarray(M), jnp.asarray(A), jnp.asarray(rng.standard_normal(n))


CASES = [(s, k) for s in range(4) for k in ("full", "duplicated", "rank1")]


@pytest.mark.parametrize("seed, kind", CASES)
def test_constraint_inertia_properties(seed, kind):
    """Theorem 2, Propositions 1-2 and Remark 3 of Aghili, on random M and A."""
    M, A, qdot = _random_case(seed, kind=kind)
    P = projector(PseudoInverse(A))
    np.testing.assert_allclose(P @ P, P, atol=1e-12)
    np.testing.assert_allclose(A @ P, 0.0, atol=1e-12)
    Mc, _ = constraint_inertia(M, P, "Mc")
    assert float(jnp.min(jnp.linalg.eigvalsh((Mc + Mc.T) / 2))) > 0  # p.d.
    assert float(jnp.max(jnp.abs(Mc - Mc.T))) > 1e-6  # but not symmetric
    # Remark 3: the skew part produces no kinetic energy.
    assert float(qdot @ Mc @ qdot) == pytest.approx(float(qdot @ M @ qdot), rel=1e-12)
    Ms, _ = constraint_inertia(M, P, "Mc_sym")
    np.testing.assert_allclose(Ms, Ms.T, atol=1e-12)
    assert float(jnp.min(jnp.linalg.eigvalsh(Ms))) > 0
    Mg, _ = constraint_inertia(M, P, "Mc_gamma")
    assert float(jnp.min(jnp.linalg.svd(Mg, compute_uv=False))) > 1e-6


class _Linear(cdiff.AbstractModel):
    """Linear constraints A q = 0 and a constant force: an independent KKT check."""

    M: jax.Array
    A: jax.Array
    f: jax.Array

    def mass_matrix(self, t, q):
        return self.M

    def forces(self, t, q, v):
        return self.f

    def holonomic(self, t, q):
        return self.A @ q


@pytest.mark.parametrize("seed, kind", CASES)
@pytest.mark.parametrize("inertia", INERTIAS)
def test_force_and_acceleration_match_the_kkt_solution(seed, kind, inertia):
    """Eq. 32 equals the Lagrange-multiplier force; with full-rank A the KKT system
    solved densely by numpy is the independent reference."""
    M, A, f = _random_case(seed, kind=kind)
    model = _Linear(M, A, f)
    n = M.shape[0]
    q, v = jnp.zeros(n), jnp.zeros(n)
    context = Context(model, None, jnp.asarray(jnp.nan))
    proj = cdiff.Projection(inertia).dynamics(0.0, (q, v), context, None)
    lag = cdiff.Lagrange().dynamics(0.0, (q, v), context, None)
    np.testing.assert_allclose(proj.rate[1], lag.rate[1], atol=1e-9)
    np.testing.assert_allclose(proj.force, lag.force, atol=1e-9)
    np.testing.assert_allclose(A.T @ proj.multipliers, proj.force, atol=1e-9)
    if kind == "full":
        m = A.shape[0]
        kkt = np.block([[np.asarray(M), -np.asarray(A).T], [np.asarray(A),
                                                            np.zeros((m, m))]])
        sol = np.linalg.solve(kkt, np.concatenate([np.asarray(f), np.zeros(m)]))
        np.testing.assert_allclose(proj.rate[1], sol[:n], atol=1e-10)
        np.testing.assert_allclose(proj.multipliers, sol[n:], atol=1e-9)


def test_particle_on_circle_force_is_eq_35():
    """Aghili Sec. 5.4: F = f_perp + m |qdot|^2 / rho eps_perp (Aghili's sign:
    M qdd + h = f - F), so Q_c = -F in cdiff's convention."""
    model = cdiff.models.ParticleOnCircle(g=9.81, speed=2.0)
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(model, cdiff.Projection(), q0, v0, t1=1.0, dt=1e-3,
                         saveat=cdiff.SaveAt(ts=jnp.linspace(0.0, 1.0, 11)))
    eps = sol.q / jnp.linalg.norm(sol.q, axis=1, keepdims=True)
    f = jnp.array([0.0, -model.m * model.g])
    f_perp = (eps @ f)[:, None] * eps
    speed2 = jnp.sum(sol.v**2, axis=1, keepdims=True)
    aghili = f_perp + model.m * speed2 / model.rho * eps
    np.testing.assert_allclose(sol.constraint_force, -aghili, atol=1e-8)
    # P = eps_par eps_par^T (eq. 35).
    q = sol.q[3]
    P = projector(PseudoInverse(jax.jacfwd(model.holonomic, 1)(0.0, q)))
    t = jnp.array([-q[1], q[0]]) / jnp.linalg.norm(q)
    np.testing.assert_allclose(P, jnp.outer(t, t), atol=1e-12)


@functools.cache
def _slider_crank_run(formulation, t1=3.0):
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, t1, 61)
    return cdiff.simulate(model, formulation, q0, v0, t1=t1, dt=1e-3,
                          saveat=cdiff.SaveAt(ts=ts))


@pytest.mark.parametrize("inertia", INERTIAS)
def test_slider_crank_agrees_with_udwadia_kalaba(inertia):
    """Over 3 s (through the singular configuration theta1 = -pi/2 at t = 0.5 s)."""
    proj = _slider_crank_run(cdiff.Projection(inertia))
    uk = _slider_crank_run(cdiff.UdwadiaKalaba())
    model = cdiff.models.SliderCrank()
    ref = model.reference(proj.ts[1:])
    assert float(jnp.max(jnp.abs(proj.q[1:, 2] - ref.q[:, 2]))) < 1e-7
    assert float(jnp.max(jnp.abs(proj.q[:, 2] - uk.q[:, 2]))) < 1e-7
    # Same constraint force and multipliers (full rank away from the singularity).
    regular = jnp.abs(jnp.cos(proj.q[:, 2])) > 0.1
    np.testing.assert_allclose(proj.constraint_force[regular],
                               uk.constraint_force[regular], atol=1e-5)
    np.testing.assert_allclose(proj.multipliers[regular], uk.multipliers[regular],
                               atol=1e-5)


def test_redundant_constraints_change_nothing():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    kw = dict(t1=2.0, dt=1e-3, saveat=cdiff.SaveAt(ts=jnp.linspace(0, 2, 21)))
    plain = cdiff.simulate(model, cdiff.Projection(), q0, v0, **kw)
    redundant = cdiff.simulate(Duplicated(model), cdiff.Projection(), q0, v0, **kw)
    assert float(jnp.max(jnp.abs(plain.q - redundant.q))) < 1e-9
    np.testing.assert_allclose(redundant.constraint_force, plain.constraint_force,
                               atol=1e-7)


def test_bad_inertia_name():
    with pytest.raises(ValueError, match="Mc_sym"):
        cdiff.Projection("M_c")
    with pytest.raises(ValueError, match="gamma"):
        cdiff.Projection("Mc", gamma=2.0)


def test_damping_removes_a_vanishing_constraint_as_eq_68():
    """R3 at the singular configuration q1 = -pi/2 (A = 0 up to round-off), moving
    along the branch (where Adot qdot = 0, Aghili's "C = 0"): with an absolute
    threshold (`damping` = eps^2, eps = 1e-6) the constraint is removed, P = I and
    the acceleration is the unconstrained one; without it the one-row relative
    threshold cannot act and P is an arbitrary blend. Off the singularity
    (|A| = 2e-3) the damping changes nothing."""
    model = cdiff.models.SliderCrankJoint()
    v = jnp.array([0.7, -1.4])  # along the branch q2 = 2 pi - 2 q1
    u = jnp.array([1.0, 0.5])  # joint torques (gravity has no torque there)
    context = Context(model, lambda t, q, v: u, jnp.asarray(jnp.nan))

    def qdd(formulation, q):
        return formulation.dynamics(0.0, (q, v), context, None).rate[1]

    damped, plain = cdiff.Projection(damping=1e-12), cdiff.Projection()
    singular = jnp.array([-jnp.pi / 2, 3 * jnp.pi])
    free = jnp.linalg.solve(model.mass_matrix(0.0, singular),
                            model.forces(0.0, singular, v) + u)
    np.testing.assert_allclose(qdd(damped, singular), free, atol=1e-9)
    assert float(jnp.max(jnp.abs(qdd(plain, singular) - free))) > 1e-3
    regular = jnp.array([-jnp.pi / 2 + 1e-3, 3 * jnp.pi - 2e-3])
    np.testing.assert_allclose(qdd(damped, regular), qdd(plain, regular),
                               rtol=1e-9, atol=1e-12)
