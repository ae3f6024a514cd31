"""cdiff.analysis: constraint rank, reduction index matrix and differential index
(Costa-Castelló, Griñó & Basañez), the singular-configuration search (Proposition 1) and
the Frobenius test (Yun & Sarkar, Remark 1), against closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Duplicated, FreeParticle, Skate

import cdiff
from cdiff import analysis


def _slider_crank_at(theta1):
    """R2 on its exact branch theta2 = -theta1 (on the constraints)."""
    h = 0.5
    c, s = np.cos(theta1), np.sin(theta1)
    return jnp.array([h * c, h * s, theta1, 3 * h * c, h * s, -theta1])


def test_rank_and_index_of_the_slider_crank():
    model = cdiff.models.SliderCrank()
    regular, singular = _slider_crank_at(np.pi / 4), _slider_crank_at(-np.pi / 2)
    assert int(analysis.constraint_rank(model, 0.0, regular)) == 5
    assert int(analysis.constraint_rank(model, 0.0, singular)) == 4
    assert analysis.differential_index(model, 0.0, regular) == 3
    assert analysis.differential_index(model, 0.0, singular) is None
    # Redundant rows: rank 5 of 10, no index.
    assert int(analysis.constraint_rank(Duplicated(model), 0.0, regular)) == 5
    assert analysis.differential_index(Duplicated(model), 0.0, regular) is None
    # Eq. 44 by numpy.
    G = np.asarray(jax.jacfwd(model.holonomic, 1)(0.0, regular))
    M = np.asarray(model.mass_matrix(0.0, regular))
    im = analysis.reduction_index_matrix(model, 0.0, regular)
    # measured 8.9e-16 (entries up to 5)
    np.testing.assert_allclose(im.phi, G @ np.linalg.solve(M, G.T), rtol=0, atol=3e-15)
    # Measured 0 (both 120 less an ulp, not by construction): a few ulps.
    np.testing.assert_allclose(im.det, np.linalg.det(G @ np.linalg.solve(M, G.T)),
                               rtol=5e-16)
    assert float(analysis.reduction_index_matrix(model, 0.0, singular).cond) > 1e12


def test_degenerate_input_is_named():
    """No constraints, a NaN configuration and a negative mass are refused by name
    (they raised a bare IndexError, or read as a singular point, rank 0 and no
    index, or as a perfectly conditioned one, condition number 1)."""
    free, q = FreeParticle(), jnp.zeros(2)
    assert analysis.differential_index(free, 0.0, q) == 0  # an ODE: index 0
    with pytest.raises(ValueError, match="FreeParticle has no holonomic constraints"):
        analysis.reduction_index_matrix(free, 0.0, q)
    with pytest.raises(ValueError, match="FreeParticle has no holonomic constraints"):
        analysis.singular_configurations(free, q[None])
    model = cdiff.models.SliderCrank()
    nan = _slider_crank_at(np.pi / 4).at[0].set(jnp.nan)
    for check in (analysis.constraint_rank, analysis.differential_index,
                  analysis.reduction_index_matrix):
        with pytest.raises(ValueError, match="configuration q contains non-finite values"):
            check(model, 0.0, nan)
    negative = cdiff.models.SliderCrank(m=-1.0)
    with pytest.raises(ValueError, match="not positive definite"):
        analysis.reduction_index_matrix(negative, 0.0, _slider_crank_at(np.pi / 4))


def test_index_of_other_models():
    four_bar = cdiff.models.DoubleFourBar()
    assert analysis.differential_index(four_bar, 0.0, four_bar.initial_state()[0]) == 3
    skate = Skate()
    assert analysis.differential_index(skate, 0.0, jnp.array([0.0, 0.0, 0.3])) == 2

    class Free(cdiff.AbstractModel):
        def mass_matrix(self, t, q):
            return jnp.eye(2, dtype=q.dtype)

    assert analysis.differential_index(Free(), 0.0, jnp.zeros(2)) == 0


def test_index_matrix_along_a_solution():
    """The condition number of phi blows up at the singular passage of R2
    (theta1 = -pi/2 at t = 0.5 s) and is moderate elsewhere."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 1.0, 201)
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=1.0, dt=1e-3,
                         saveat=cdiff.SaveAt(ts=ts))
    cond = np.asarray(analysis.along(analysis.reduction_index_matrix, model, sol).cond)
    rank = np.asarray(analysis.along(analysis.constraint_rank, model, sol))
    theta = np.asarray(sol.q[:, 2])
    near = np.abs(np.cos(theta)) < 1e-2
    assert near.any() and (cond[near] > 1e3).all()
    assert (cond[np.abs(np.cos(theta)) > 0.3] < 1e3).all()
    assert (rank[np.abs(np.cos(theta)) > 1e-3] == 5).all()


def test_singular_configuration_search():
    """Proposition 1 on R2 and R4: every converged point lies on the constraints
    with a rank-deficient Jacobian (numpy SVD); for R2 it is one of the known
    singular configurations theta1 = +-pi/2. R4 has more than the "all links
    horizontal" ones of the paper: the search also finds configurations where
    only the right-hand parallelogram is flat (y2 = y3 = 0)."""
    model = cdiff.models.SliderCrank()
    q0, _ = model.initial_state()
    rng = np.random.default_rng(0)
    guesses = jnp.asarray(np.asarray(q0) + 0.4 * rng.standard_normal((6, 6)))
    res = analysis.singular_configurations(model, guesses)
    assert int(res.found.sum()) >= 4
    # Measured at each point: |Phi| 6.1e-17, smallest singular value 7.2e-17, and
    # |cos(theta1)| 6.1e-17, that of the double nearest pi/2: the search lands on it.
    for q in np.asarray(res.q)[np.asarray(res.found)]:
        assert np.max(np.abs(model.holonomic(0.0, jnp.asarray(q)))) < 2.5e-16
        G = np.asarray(jax.jacfwd(model.holonomic, 1)(0.0, jnp.asarray(q)))
        assert np.linalg.svd(G, compute_uv=False)[-1] < 3e-16
        assert abs(np.cos(q[2])) < 2.5e-16
    four_bar = cdiff.models.DoubleFourBar()
    q4, _ = four_bar.initial_state()
    guesses = jnp.asarray(np.asarray(q4) + 0.3 * rng.standard_normal((4, 6)))
    guesses = guesses.at[:, 1::2].multiply(0.1)  # start near the horizontal
    res = analysis.singular_configurations(four_bar, guesses)
    assert bool(res.found.any())
    for q in np.asarray(res.q)[np.asarray(res.found)]:
        # The squared link lengths are l^2 = 1 (Phi = squared length - l^2, exact
        # back and forth near 1): measured 0; 1.1e-16, half an ulp of 1, with XLA's
        # default fusion emitter.
        l2 = four_bar.l**2
        np.testing.assert_allclose(
            np.asarray(four_bar.holonomic(0.0, jnp.asarray(q))) + l2, l2,
            rtol=4.5e-16, atol=0)
        G = np.asarray(jax.jacfwd(four_bar.holonomic, 1)(0.0, jnp.asarray(q)))
        # The search lands on the singular set to round-off, at or below LAPACK's
        # floor for a generic rank-deficient G (~eps |G| ~ 5e-16). Measured 1.9e-17
        # with the suite's XLA flag, 1.4e-16 with XLA's default fusion emitter in a
        # run of this file alone (1.7e-17 in the whole suite).
        assert np.linalg.svd(G, compute_uv=False)[-1] < 4e-16
        assert abs(q[3]) < 1e-8 or abs(q[5]) < 1e-8  # a flat link pair
    flat = jnp.array([1.0, 0.0, 2.0, 0.0, 3.0, 0.0])  # all links horizontal
    assert analysis.differential_index(four_bar, 0.0, flat) is None


class _VelocityFormCircle(cdiff.AbstractModel):
    """R1's constraint written at velocity level, q . qdot = 0 (integrable)."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def nonholonomic(self, t, q, v):
        return jnp.stack([q @ v])


def test_frobenius():
    """Remark 1: the knife edge and both snakeboard constraints are nonholonomic
    (the closure fills the space); R1's velocity form and R2's constraints are
    holonomic (the distribution is involutive)."""
    skate = analysis.frobenius(Skate(), jnp.array([0.1, 0.2, 0.3]))
    assert (skate.holonomic, skate.nonholonomic, skate.dim_closure) == (0, 1, 3)
    board = analysis.frobenius(cdiff.models.Snakeboard(),
                               jnp.array([0.1, 0.2, 0.3, 0.2, 0.1, 0.9]))
    assert (board.holonomic, board.nonholonomic) == (0, 2)
    assert (board.dim_distribution, board.dim_closure) == (4, 6)
    circle = analysis.frobenius(_VelocityFormCircle(), jnp.array([0.6, 0.8]))
    assert (circle.holonomic, circle.nonholonomic) == (1, 0)
    crank = cdiff.models.SliderCrank()
    r2 = analysis.frobenius(crank, crank.initial_state()[0])
    assert (r2.holonomic, r2.dim_closure) == (5, 1)
