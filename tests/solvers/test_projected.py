"""Post-step projection (cdiff.Projected): Aghili's Newton projection (eq. 37) and
Terze's gradient-projective partitioning, with every formulation, under vmap, grad
and jacfwd."""

import functools
import itertools

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import max_abs, slider_crank_saved

import cdiff

NEWTON = cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())


# --- the projections themselves -----------------------------------------------------


def _perturbed_slider_crank(scale=1e-3, seed=0):
    model = cdiff.models.SliderCrank()
    q0, _ = model.initial_state()
    rng = np.random.default_rng(seed)
    return (model, q0 + scale * jnp.asarray(rng.standard_normal(6)),
            jnp.asarray(rng.standard_normal(6)))


def _jacobian(model, q):
    return jax.jacfwd(model.holonomic, 1)(0.0, q)


@pytest.mark.parametrize("mass_weighted", [False, True])
def test_newton_projection_is_eq_37_and_converges_quadratically(mass_weighted):
    model, q, v = _perturbed_slider_crank()
    proj = cdiff.NewtonProjection(iterations=1, mass_weighted=mass_weighted)
    # One step is q - A^+ Phi (or its kinetic-metric version), by numpy's pinv.
    A, phi = np.asarray(_jacobian(model, q)), np.asarray(model.holonomic(0.0, q))
    M = np.asarray(model.mass_matrix(0.0, q))
    if mass_weighted:
        Mi = np.linalg.inv(M)
        expected = q - Mi @ A.T @ np.linalg.solve(A @ Mi @ A.T, phi)
    else:
        expected = q - np.linalg.pinv(A) @ phi
    # Measured 0 (bitwise equal on the CPU: the same LAPACK calls); the bound is
    # 2 ulp of each coordinate.
    np.testing.assert_allclose(proj.position(model, 0.0, q), expected, rtol=4.5e-16,
                               atol=0)
    # Quadratic convergence (Theorem 3): |Phi_{k+1}| <= K |Phi_k|^2.
    norms = [max_abs(model.holonomic(0.0, q))]
    for n in (1, 2, 3):
        p = cdiff.NewtonProjection(iterations=n, mass_weighted=mass_weighted)
        norms.append(max_abs(model.holonomic(0.0, p.position(model, 0.0, q))))
    assert norms[1] < 10 * norms[0] ** 2 and norms[2] < 10 * norms[1] ** 2
    assert norms[3] < 3e-16  # measured 5.6e-17


@pytest.mark.parametrize("mass_weighted", [False, True])
def test_newton_velocity_projection_is_the_minimum_norm_correction(mass_weighted):
    model, q, v = _perturbed_slider_crank()
    proj = cdiff.NewtonProjection(mass_weighted=mass_weighted)
    q1, v1 = proj(model, 0.0, q, v)
    A = np.asarray(_jacobian(model, q1))
    # On the velocity constraints (measured 1.5e-16 unweighted, 5.0e-16 weighted).
    assert max_abs(A @ v1) < (2e-15 if mass_weighted else 6e-16)
    # The correction is normal to the tangent space (in the chosen metric): no
    # component along the manifold, so the tangential velocity is kept.
    W = np.asarray(model.mass_matrix(0.0, q1)) if mass_weighted else np.eye(6)
    null = np.linalg.svd(A)[2][A.shape[0]:].T  # tangent space basis
    # Measured 3.7e-16 unweighted, 3.1e-17 weighted.
    assert max_abs(null.T @ W @ (v1 - v)) < (1.5e-16 if mass_weighted else 1.5e-15)
    assert max_abs(v1 - v) > 0.1  # and it did change v


def _mass_projections(M, A):
    """Terze's d_i in the kinetic metric, by numpy: the M-orthogonal projector
    Pi = M^-1 A^T (A M^-1 A^T)^-1 A onto the constraint subspace,
    d_i = <e_i, Pi e_i>_M / <e_i, e_i>_M."""
    Mi = np.linalg.inv(M)
    Pi = Mi @ A.T @ np.linalg.solve(A @ Mi @ A.T, A)
    return np.diag(M @ Pi) / np.diag(M)


def test_gradient_projection_criterion_and_partition():
    model, q, _ = _perturbed_slider_crank()
    A = _jacobian(model, q)
    M = np.asarray(model.mass_matrix(0.0, q))
    for metric, expected in (
        ("mass", _mass_projections(M, np.asarray(A))),
        ("euclidean", np.diag(np.linalg.pinv(A) @ A)),
    ):
        gp = cdiff.GradientProjection(metric=metric)
        Y = gp.projections(model, 0.0, q, A)
        # Measured 2.9e-13 (mass), 3.9e-13 (euclidean).
        np.testing.assert_allclose(jnp.sum(Y**2, axis=1), expected, rtol=0,
                                   atol=1.5e-12)
        idx = np.asarray(gp.dependent(model, 0.0, q, A))
        # The first pick is the criterion's best (ties, here y1 and y2 in the
        # Euclidean metric, may go either way: the GPU picks the other one).
        assert expected[idx[0]] > np.max(expected) - 1e-12
        assert len(set(idx)) == A.shape[0]
        # The set is valid, and the best conditioned of all valid sets that share
        # the first pick is no better than the greedy one by more than a factor 10.
        cond = np.linalg.cond(np.asarray(A)[:, idx])
        assert cond < 20  # measured 4.0 (both metrics)
        others = [s for s in itertools.combinations(range(6), 5) if idx[0] in s]
        best = min(np.linalg.cond(np.asarray(A)[:, list(s)]) for s in others)
        assert cond < 10 * best  # not a tolerance: a quality factor (measured 1)


def test_gradient_projection_moves_only_dependent_coordinates():
    model, q, v = _perturbed_slider_crank()
    for partition in ("optimal", "second"):
        gp = cdiff.GradientProjection(partition=partition)
        q1, v1 = gp(model, 0.0, q, v)
        assert max_abs(model.holonomic(0.0, q1)) < 3e-16  # measured 5.6e-17
        assert max_abs(_jacobian(model, q1) @ v1) < 3e-15  # measured 7.2e-16
        idx = np.asarray(gp.dependent(model, 0.0, q, _jacobian(model, q)))
        independent = np.setdiff1d(np.arange(6), idx)
        assert len(independent) == 1
        assert float(q1[independent[0]]) == float(q[independent[0]])
    # "second" replaces the last pick of "optimal" by the runner-up.
    A = _jacobian(model, q)
    opt = cdiff.GradientProjection().dependent(model, 0.0, q, A)
    sec = cdiff.GradientProjection(partition="second").dependent(model, 0.0, q, A)
    assert list(opt[:-1]) == list(sec[:-1]) and int(opt[-1]) != int(sec[-1])


def test_terze_fig_1_the_optimal_partition_errs_less_along_the_manifold():
    """Terze Fig. 1: a point inside the unit circle at angle 0.2 is projected
    along x (optimal: x's direction aligns with the gradient) or along y (second).
    The optimal correction lands near the nearest point of the manifold; along y
    it slides far along the circle."""
    model = cdiff.models.ParticleOnCircle()
    q = 0.95 * jnp.array([jnp.cos(0.2), jnp.sin(0.2)])
    v = jnp.zeros(2)
    nearest = jnp.array([jnp.cos(0.2), jnp.sin(0.2)])
    x, y = q
    landing = {"optimal": jnp.array([jnp.sqrt(1 - y**2), y]),  # along x
               "second": jnp.array([x, jnp.sqrt(1 - x**2)])}  # along y
    errors = {}
    for partition in ("optimal", "second"):
        gp = cdiff.GradientProjection(partition=partition, iterations=8)
        q1, _ = gp(model, 0.0, q, v)
        # Measured 1.1e-16 (optimal), 1.7e-16 (second) on coordinates of 0.2-1.
        np.testing.assert_allclose(q1, landing[partition], rtol=0, atol=7e-16)
        errors[partition] = float(jnp.linalg.norm(q1 - nearest))
    assert 10 * errors["optimal"] < errors["second"]


# --- simulations --------------------------------------------------------------------

def _slider_crank(formulation, solver=None, redundant=False, t1=10.0):
    return slider_crank_saved(formulation, solver, t1=t1, redundant=redundant)


def test_formulations_agree_on_theta1():
    """Issue #3: on R2 over 10 s at dt = 1e-3 (twenty singular passages) Lagrange,
    UdwadiaKalaba, Projection with Newton projection and NullSpace agree on
    theta1 to 1e-6, and with the exact solution."""
    proj = _slider_crank(cdiff.Projection(), NEWTON)
    exact = cdiff.models.SliderCrank().reference(proj.ts[1:]).q[:, 2]
    assert max_abs(proj.q[1:, 2] - exact) < 4e-8  # measured 9.8e-9
    assert max_abs(proj.holonomic_residual) < 4e-15  # projected to round-off: 9.4e-16
    assert max_abs(proj.velocity_residual) < 1.5e-14  # measured 3.8e-15
    # Measured 5.0e-9 (Lagrange), 9.9e-9 (UdwadiaKalaba), 7.5e-8 (NullSpace).
    for other, bound in ((cdiff.Lagrange(10.0, 10.0), 2e-8),
                         (cdiff.UdwadiaKalaba(), 4e-8),
                         (cdiff.NullSpace(alpha=10.0), 3e-7)):
        assert max_abs(_slider_crank(other).q[:, 2] - proj.q[:, 2]) < bound, other


@pytest.mark.parametrize("formulation", [cdiff.UdwadiaKalaba(), cdiff.Lagrange(),
                                         cdiff.NullSpace()], ids=repr)
def test_projection_with_every_formulation(formulation):
    """Over 2 s (four singular passages), projected every step: constraints at
    round-off, trajectory on the exact solution; even the unstabilised Lagrange
    passes the singularities."""
    sol = _slider_crank(formulation, NEWTON, t1=2.0)
    exact = cdiff.models.SliderCrank().reference(sol.ts[1:]).q[:, 2]
    assert max_abs(sol.holonomic_residual) < 3e-15  # measured 7.2e-16 to 7.8e-16
    # Measured 3.1e-15 (UdwadiaKalaba), 4.2e-15 (Lagrange), 8.9e-16 (NullSpace).
    nullspace = isinstance(formulation, cdiff.NullSpace)
    assert max_abs(sol.velocity_residual) < (4e-15 if nullspace else 1.5e-14)
    # Measured 3.1e-9, 1.2e-9, 3.8e-9 (the same order).
    assert max_abs(sol.q[1:, 2] - exact) < 8e-9


@pytest.mark.slow
def test_redundant_constraints_change_nothing():
    """Issue #3: duplicating every constraint row leaves the projected trajectory
    unchanged (Projection + Newton projection; the formulations alone are covered
    in their own files).

    Through a singular passage this holds for the mass-weighted projection (to
    1e-15 over 2 s), but the unweighted one amplifies round-off there: near the
    singularity the pseudoinverse's gain reaches 1/(2 rtol |A|) ~ 1e6, so the two
    runs part by 2e-11 at the t = 0.9 s passage and 2e-9 by t = 2 s. Before the
    first passage both agree to round-off."""
    weighted = cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection(mass_weighted=True))
    # Measured 1.8e-14 (weighted; 3.6e-15 with XLA's default fusion emitter: the
    # round-off of two runs through a singular passage) and 0 (unweighted, bitwise
    # equal on the CPU; the bound allows a few ulp of the coordinates, of at most
    # 1.5).
    for solver, t1, bound in ((weighted, 2.0, 6e-14), (NEWTON, 0.4, 1e-15)):
        plain = _slider_crank(cdiff.Projection(), solver, t1=t1)
        redundant = _slider_crank(cdiff.Projection(), solver, redundant=True, t1=t1)
        assert max_abs(plain.q - redundant.q) < bound


def test_gradient_projection_on_the_pendulum():
    """R1 with gravity at a coarse step: both partitions hold the constraint at
    round-off; the optimal one tracks the exact solution better than the second
    best (Terze's S3 against S4)."""
    model = cdiff.models.ParticleOnCircle(g=9.81, speed=2.0)
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 5.0, 51)
    ref = model.reference(ts[1:])
    errors = {}
    for partition in ("optimal", "second"):
        solver = cdiff.Projected(cdiff.RK4(),
                                 cdiff.GradientProjection(partition=partition))
        sol = cdiff.simulate(model, cdiff.Lagrange(), q0, v0, t1=5.0, dt=0.05,
                             solver=solver, saveat=cdiff.SaveAt(ts=ts))
        assert max_abs(sol.holonomic_residual) < 2e-15  # measured 2.2e-16, 4.4e-16
        assert max_abs(sol.velocity_residual) < 6e-15  # measured 9.7e-16, 1.5e-15
        errors[partition] = max_abs(sol.q[1:] - ref.q)
    assert errors["optimal"] < 1e-3
    # The optimal partition at least 3x more accurate (measured 5.3e-4 against 0.042).
    assert 3 * errors["optimal"] < errors["second"]  # not a tolerance: an ordering


# --- transformations ----------------------------------------------------------------


def _slider(l, solver, adjoint=None):
    model = cdiff.models.SliderCrank(l=l)
    q0, v0 = model.initial_state()
    kw = {} if adjoint is None else dict(adjoint=adjoint)
    sol = cdiff.simulate(model, cdiff.Projection(), q0, v0, t1=0.6, dt=2e-2,
                         solver=solver, saveat=cdiff.SaveAt(t1=True), **kw)
    return model.slider(sol.q[-1])


@pytest.mark.parametrize("projection", [cdiff.GradientProjection()], ids=repr)
def test_grad_and_vmap_through_the_projection(projection):
    """Issue #3: reverse and forward mode through Projected(RK4(), ...) match
    central finite differences (over the singular passage at t = 0.5 s), under vmap:
    one compilation gives the values at l - h, l, l + h and the gradients. (For
    NewtonProjection: tests/solvers/test_gradients.py.)"""
    solver = cdiff.Projected(cdiff.RK4(), projection)
    f = jax.jit(jax.vmap(jax.value_and_grad(functools.partial(_slider, solver=solver))))
    h = 1e-5
    ls = jnp.array([0.9 - h, 0.9, 0.9 + h, 1.1 - h, 1.1, 1.1 + h])
    values, grads = (x.reshape(2, 3) for x in f(ls))
    fd = (values[:, 2] - values[:, 0]) / (2 * h)
    forward = jax.jit(jax.vmap(jax.jacfwd(functools.partial(
        _slider, solver=solver, adjoint=diffrax.ForwardMode()))))(ls[1::3])
    # Measured against the differences: 6.2e-11 in both modes (l = 0.9).
    np.testing.assert_allclose(grads[:, 1], fd, rtol=6e-10)
    np.testing.assert_allclose(forward, fd, rtol=6e-10)


# --- bad input ----------------------------------------------------------------------


def test_bad_arguments():
    with pytest.raises(ValueError, match="iterations"):
        cdiff.NewtonProjection(iterations=0)
    with pytest.raises(ValueError, match="optimal"):
        cdiff.GradientProjection(partition="best")
    with pytest.raises(ValueError, match="euclidean"):
        cdiff.GradientProjection(metric="inertia")
    with pytest.raises(TypeError, match="projection"):
        cdiff.Projected(cdiff.RK4(), "newton")
    with pytest.raises(TypeError, match="solver"):
        cdiff.Projected(cdiff.NewtonProjection(), cdiff.NewtonProjection())


def test_outside_simulate_says_how_to_use_it():
    with pytest.raises(ValueError, match="cdiff.simulate"):
        diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, a: -y), NEWTON, 0.0, 1.0,
                            0.1, jnp.ones(2))
