"""Aghili's projection formulation: the properties its paper proves, its constraint
force, and agreement with the other formulations."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    EPS,
    Duplicated,
    dynamics_at,
    kkt_numpy,
    max_abs,
    slider_crank_exact_scipy,
    slider_crank_numpy,
    slider_crank_saved,
    slider_crank_theta_ddot,
)

import cdiff

# private on purpose: Theorem 2, Props. 1-2 concern P and M_c; no public call gives them
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
    # Round-off throughout, at the scale of each quantity (measured over all cases:
    # 0.25-1 eps, 0.24-0.97 eps |A|, 0.25-0.98 eps |Ms| and 0-2.2e-16 relative).
    np.testing.assert_allclose(P @ P, P, rtol=0, atol=2 * EPS)
    np.testing.assert_allclose(A @ P, 0.0, rtol=0, atol=2 * EPS * max_abs(A))
    Mc, _ = constraint_inertia(M, P, "Mc")
    assert float(jnp.min(jnp.linalg.eigvalsh((Mc + Mc.T) / 2))) > 0  # p.d.
    assert float(jnp.max(jnp.abs(Mc - Mc.T))) > 1e-6  # but not symmetric
    # Remark 3: the skew part produces no kinetic energy.
    assert float(qdot @ Mc @ qdot) == pytest.approx(float(qdot @ M @ qdot), rel=1e-15,
                                                    abs=0)
    Ms, _ = constraint_inertia(M, P, "Mc_sym")
    np.testing.assert_allclose(Ms, Ms.T, rtol=0, atol=2 * EPS * max_abs(Ms))
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


@functools.cache
def _batched_dynamics(formulation):
    """(acceleration, constraint force, multipliers) of `formulation` at q = v = 0
    for every case of CASES: one vmapped one-step `cdiff.simulate` (all cases have
    the same shapes), compiled once per formulation."""
    M, A, f = (jnp.stack(x) for x in zip(*(_random_case(s, kind=k) for s, k in CASES)))
    zeros = jnp.zeros(M.shape[-1])
    return jax.vmap(lambda M, A, f: dynamics_at(_Linear(M, A, f), formulation, zeros,
                                                zeros))(M, A, f)


# Measured per case (inertia-seed-kind): qdd and the force against the KKT solution,
# A^T lambda against the force, the multipliers (their part in range(A) where A
# loses rank, see below) against the minimum-norm ones, qdd and the force against
# cdiff.Lagrange. All round-off; they vary from case to case by 10-50 times, so
# each case is held to 5 times its own figures (the larger of XLA's default CPU
# fusion emitter and the suite's, conftest.py: they differ by up to 4x).
KKT_MEASURED = {
    "Mc-0-full": (6.9e-16, 1.7e-15, 2.2e-16, 1.6e-15, 8.3e-17, 4.4e-16),
    "Mc-0-duplicated": (1.0e-15, 3.1e-15, 2.8e-16, 2.2e-15, 5.6e-16, 3.3e-16),
    "Mc-0-rank1": (8.3e-16, 1.1e-16, 1.1e-16, 5.6e-16, 4.4e-16, 2.2e-16),
    "Mc-1-full": (6.1e-16, 5.6e-16, 2.2e-16, 3.3e-16, 1.7e-16, 8.9e-16),
    "Mc-1-duplicated": (3.9e-16, 8.9e-16, 3.3e-16, 2.2e-16, 3.1e-16, 6.1e-16),
    "Mc-1-rank1": (4.3e-16, 4.4e-16, 1.1e-16, 1.1e-16, 5.1e-16, 6.7e-16),
    "Mc-2-full": (8.3e-17, 1.1e-15, 2.2e-16, 4.4e-16, 3.4e-16, 7.8e-16),
    "Mc-2-duplicated": (4.4e-16, 6.9e-16, 5.6e-17, 5.0e-16, 2.2e-16, 3.9e-16),
    "Mc-2-rank1": (8.3e-16, 4.7e-16, 2.8e-17, 1.5e-16, 3.3e-16, 1.7e-16),
    "Mc-3-full": (3.4e-15, 4.5e-15, 2.8e-16, 2.6e-15, 4.3e-16, 1.2e-15),
    "Mc-3-duplicated": (4.4e-16, 5.6e-16, 2.2e-16, 8.3e-16, 3.9e-16, 8.9e-16),
    "Mc-3-rank1": (1.3e-15, 3.3e-16, 1.1e-16, 2.1e-16, 1.3e-15, 7.8e-16),
    "Mc_sym-0-full": (7.5e-16, 1.7e-15, 4.4e-16, 1.6e-15, 1.5e-16, 4.4e-16),
    "Mc_sym-0-duplicated": (1.0e-15, 3.1e-15, 1.7e-16, 2.2e-15, 4.4e-16, 4.4e-16),
    "Mc_sym-0-rank1": (3.3e-16, 2.2e-16, 5.6e-17, 3.9e-16, 2.2e-16, 1.4e-16),
    "Mc_sym-1-full": (5.6e-16, 6.7e-16, 2.2e-16, 3.9e-16, 1.1e-16, 8.9e-16),
    "Mc_sym-1-duplicated": (4.4e-16, 8.9e-16, 2.2e-16, 1.7e-16, 3.6e-16, 1.2e-15),
    "Mc_sym-1-rank1": (5.6e-16, 4.4e-16, 2.2e-16, 1.1e-16, 5.6e-16, 6.7e-16),
    "Mc_sym-2-full": (9.7e-17, 1.1e-15, 4.4e-16, 4.4e-16, 3.7e-16, 7.8e-16),
    "Mc_sym-2-duplicated": (6.7e-16, 5.6e-16, 1.1e-16, 5.0e-16, 4.4e-16, 3.3e-16),
    "Mc_sym-2-rank1": (4.4e-16, 5.0e-16, 2.8e-17, 1.6e-16, 8.9e-16, 1.4e-16),
    "Mc_sym-3-full": (3.4e-15, 4.5e-15, 2.2e-16, 2.4e-15, 4.2e-16, 8.3e-16),
    "Mc_sym-3-duplicated": (4.4e-16, 8.9e-16, 8.9e-16, 5.6e-16, 3.9e-16, 6.7e-16),
    # qdd: 5.3e-15 on an AMD EPYC with AVX2 (8.9e-16 where the table was made).
    "Mc_sym-3-rank1": (5.3e-15, 1.3e-15, 2.2e-16, 5.6e-16, 1.1e-15, 3.3e-16),
    "Mc_gamma-0-full": (7.5e-16, 1.7e-15, 4.4e-16, 1.8e-15, 1.5e-16, 4.4e-16),
    "Mc_gamma-0-duplicated": (1.0e-15, 3.6e-15, 2.2e-16, 2.4e-15, 5.0e-16, 5.0e-16),
    "Mc_gamma-0-rank1": (3.9e-16, 1.1e-16, 1.1e-16, 5.6e-16, 2.2e-16, 2.2e-16),
    "Mc_gamma-1-full": (5.6e-16, 4.4e-16, 2.2e-16, 3.3e-16, 1.7e-16, 6.7e-16),
    "Mc_gamma-1-duplicated": (6.7e-16, 1.1e-15, 2.2e-16, 2.8e-16, 5.6e-16, 8.3e-16),
    "Mc_gamma-1-rank1": (4.4e-16, 6.7e-16, 1.1e-16, 1.1e-16, 3.9e-16, 8.9e-16),
    "Mc_gamma-2-full": (6.2e-17, 1.1e-15, 4.4e-16, 4.4e-16, 3.0e-16, 6.7e-16),
    "Mc_gamma-2-duplicated": (5.6e-16, 3.3e-16, 1.1e-16, 3.6e-16, 3.3e-16, 3.6e-16),
    "Mc_gamma-2-rank1": (2.2e-16, 8.3e-16, 2.8e-17, 2.0e-16, 6.7e-16, 1.9e-16),
    "Mc_gamma-3-full": (3.4e-15, 4.7e-15, 2.2e-16, 2.8e-15, 4.2e-16, 1.1e-15),
    "Mc_gamma-3-duplicated": (1.2e-15, 4.4e-16, 4.4e-16, 5.6e-16, 1.1e-15, 1.8e-15),
    "Mc_gamma-3-rank1": (1.8e-15, 8.9e-16, 2.2e-16, 3.3e-16, 1.3e-15, 2.2e-16),
}


@pytest.mark.parametrize("seed, kind", CASES)
@pytest.mark.parametrize("inertia", INERTIAS)
def test_force_and_acceleration_match_the_kkt_solution(seed, kind, inertia):
    """Eq. 32 against the KKT system solved by numpy (least squares: the acceleration
    and the force are unique also where A loses rank, and the multipliers the
    minimum-norm ones); cdiff.Lagrange's acceleration and force as an extra."""
    M, A, f = (np.asarray(x) for x in _random_case(seed, kind=kind))
    i = CASES.index((seed, kind))
    qdd, force, lam = (np.asarray(x[i]) for x in
                       _batched_dynamics(cdiff.Projection(inertia)))
    qdd_ref, lam_ref = kkt_numpy(M, f, A, np.zeros(A.shape[0]))
    bounds = [5 * x for x in KKT_MEASURED[f"{inertia}-{seed}-{kind}"]]
    # Round-off (measured over all cases: up to 6.2e-15, 4.9e-15, 8.9e-16).
    np.testing.assert_allclose(qdd, qdd_ref, rtol=0, atol=bounds[0])
    np.testing.assert_allclose(force, A.T @ lam_ref, rtol=0, atol=bounds[1])
    np.testing.assert_allclose(A.T @ lam, force, rtol=0, atol=bounds[2])
    # The multipliers: unique with full-rank A (measured up to 2.2e-15). With
    # redundant rows the minimum-norm ones are their part in range(A); the damped
    # pseudoinverse (eps = rtol^2 |A|_F^2) leaves round-off amplified by 1/eps along
    # the null space of A^T, which A^T lambda (the force above) does not see.
    if kind == "full":
        np.testing.assert_allclose(lam, lam_ref, rtol=0, atol=bounds[3])
    else:
        in_range = A @ np.linalg.pinv(A) @ lam
        np.testing.assert_allclose(in_range, lam_ref, rtol=0, atol=bounds[3])
        # Its size is round-off's, so it changes with the compiled program (by up
        # to 5x in one case): over the 24 redundant cases, measured up to 1.3e-3
        # with XLA's default CPU fusion emitter and with the suite's; 3.9e-3 in an
        # earlier build.
        assert np.max(np.abs(lam - in_range)) < 1e-2
    lag_qdd, lag_force, _ = (np.asarray(x[i]) for x in
                             _batched_dynamics(cdiff.Lagrange()))
    # Round-off (measured up to 1.3e-15 and 1.3e-15).
    np.testing.assert_allclose(qdd, lag_qdd, rtol=0, atol=bounds[4])
    np.testing.assert_allclose(force, lag_force, rtol=0, atol=bounds[5])


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
    np.testing.assert_allclose(sol.constraint_force, -aghili, rtol=0,
                               atol=1.5e-9)  # measured 3.8e-10
    # P = eps_par eps_par^T (eq. 35).
    q = sol.q[3]
    P = projector(PseudoInverse(jax.jacfwd(model.holonomic, 1)(0.0, q)))
    t = jnp.array([-q[1], q[0]]) / jnp.linalg.norm(q)
    # Round-off: measured 5.9e-17.
    np.testing.assert_allclose(P, jnp.outer(t, t), rtol=0, atol=3e-16)


def _exact_constraint_force(ts):
    """R2's constraint force and minimum-norm multipliers along the exact motion, in
    NumPy: theta1 by SciPy (DOP853 at 1e-13) on the hand-derived equation of motion,
    qdd from the branch theta2 = -theta1, Q_c = M qdd - Q, lambda = (A^T)^+ Q_c
    (l = m = 1, g = 9.81: SliderCrank's defaults)."""
    theta, omega = slider_crank_exact_scipy(ts)
    alpha = slider_crank_theta_ddot(theta, omega)
    h = 0.5
    s, c = np.sin(theta), np.cos(theta)
    qdd = np.stack([-h * (s * alpha + c * omega**2), h * (c * alpha - s * omega**2),
                    alpha, -3 * h * (s * alpha + c * omega**2),
                    h * (c * alpha - s * omega**2), -alpha], axis=1)
    forces, lams = [], []
    for th, om, a in zip(theta, omega, qdd):
        q = np.array([h * np.cos(th), h * np.sin(th), th, 3 * h * np.cos(th),
                      h * np.sin(th), -th])
        M, Q, A, _ = slider_crank_numpy(q, np.zeros(6))
        forces.append(M @ a - Q)
        lams.append(np.linalg.lstsq(A.T, forces[-1], rcond=None)[0])
    return theta, np.array(forces), np.array(lams)


# Bounds on theta1, the constraint force and the multipliers (regular rows),
# against the exact motion and UK alike. Measured: Mc 1.3e-8, 2.1e-7, 5.6e-7;
# Mc_sym 3.3e-9, 5.2e-8, 1.4e-7; Mc_gamma 2.4e-10, 5.7e-9 (3.1e-9 against the exact
# motion), 7.9e-9.
SLIDER_CRANK_BOUNDS = {"Mc": (5e-8, 8e-7, 2e-6),
                       "Mc_sym": (1.2e-8, 2e-7, 5e-7),
                       "Mc_gamma": (1e-9, 2e-8, 3e-8)}


@pytest.mark.parametrize("inertia", INERTIAS)
def test_slider_crank_agrees_with_the_exact_solution(inertia):
    """Over 3 s (through the singular configuration theta1 = -pi/2 at t = 0.5 s):
    theta1, the constraint force and the multipliers against the exact motion
    (NumPy/SciPy); cdiff.UdwadiaKalaba as an extra."""
    # Saved every 0.05 s (61 rows), dt = 1e-3.
    proj = slider_crank_saved(cdiff.Projection(inertia), t1=3.0)
    uk = slider_crank_saved(cdiff.UdwadiaKalaba(), t1=3.0)
    theta, force, lam = _exact_constraint_force(np.asarray(proj.ts))
    theta_bound, force_bound, lambda_bound = SLIDER_CRANK_BOUNDS[inertia]
    assert max_abs(proj.q[:, 2] - theta) < theta_bound
    assert max_abs(proj.q[:, 2] - uk.q[:, 2]) < theta_bound
    # The constraint force and the multipliers away from the singularity, where
    # A has full rank (near it the force differs from the exact motion's by up to
    # 2.6e-3 (Mc), 6.4e-4 (Mc_sym), 3.6e-5 (Mc_gamma) at the saved rows).
    regular = np.abs(np.cos(theta)) > 0.1
    np.testing.assert_allclose(proj.constraint_force[regular], force[regular], rtol=0,
                               atol=force_bound)
    np.testing.assert_allclose(proj.multipliers[regular], lam[regular], rtol=0,
                               atol=lambda_bound)
    np.testing.assert_allclose(proj.constraint_force[regular],
                               uk.constraint_force[regular], rtol=0, atol=force_bound)
    np.testing.assert_allclose(proj.multipliers[regular], uk.multipliers[regular],
                               rtol=0, atol=lambda_bound)


def test_redundant_constraints_change_nothing():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    kw = dict(t1=2.0, dt=1e-3, saveat=cdiff.SaveAt(ts=jnp.linspace(0, 2, 21)))
    plain = cdiff.simulate(model, cdiff.Projection(), q0, v0, **kw)
    redundant = cdiff.simulate(Duplicated(model), cdiff.Projection(), q0, v0, **kw)
    # Measured 2.9e-12 (both builds) where this was written, 2.4e-11 on an AMD EPYC
    # with AVX2: the damped pseudoinverse amplifies the CPU's rounding.
    assert max_abs(plain.q - redundant.q) < 1e-10
    np.testing.assert_allclose(redundant.constraint_force, plain.constraint_force,
                               rtol=0, atol=1.5e-7)  # 4.4e-9 there, 3.7e-8 here


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

    def control(t, q, v):
        return u

    def qdd(formulation, q):
        return dynamics_at(model, formulation, q, v, control)[0]

    damped, plain = cdiff.Projection(damping=1e-12), cdiff.Projection()
    singular = jnp.array([-jnp.pi / 2, 3 * jnp.pi])
    free = jnp.linalg.solve(model.mass_matrix(0.0, singular),
                            model.forces(0.0, singular, v) + u)
    # Measured 0 (the same arithmetic once P = I); free = (1, 0.5): 2 ulp relative.
    np.testing.assert_allclose(qdd(damped, singular), free, rtol=4.5e-16, atol=0)
    assert max_abs(qdd(plain, singular) - free) > 1e-3  # measured 0.81
    regular = jnp.array([-jnp.pi / 2 + 1e-3, 3 * jnp.pi - 2e-3])
    # Measured 3.9e-14 (on accelerations of 1.6e-3 and 3.1e-3).
    np.testing.assert_allclose(qdd(damped, regular), qdd(plain, regular), rtol=0,
                               atol=1.5e-13)
