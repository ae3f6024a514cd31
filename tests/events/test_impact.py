"""The impact map of unilateral constraints (`cdiff.impact`) against closed forms:
a pendulum on a stop in Cartesian coordinates (one degree of freedom: v+ = -e v-),
a particle in a corner (simultaneous impacts) and a pulling row left out."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff


class PendulumAgainstWall(cdiff.AbstractModel):
    """A point mass on a rod of length l (Cartesian coordinates) and a wall at
    x = -a: g = x + a >= 0."""

    m: float = 2.0
    l: float = 1.0
    a: float = 0.5
    restitution: float = 0.0

    def mass_matrix(self, t, q):
        return self.m * jnp.eye(2, dtype=q.dtype)

    def holonomic(self, t, q):
        return jnp.atleast_1d(q @ q - self.l**2)

    def unilateral(self, t, q):
        return jnp.atleast_1d(q[0] + self.a)


class PointInCorner(cdiff.AbstractModel):
    """A point of mass diag(1, 3) in the quadrant x >= 0, y >= 0."""

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.array([1.0, 3.0], q.dtype))

    def unilateral(self, t, q):
        return q


def _at_wall(model, speed):
    """The state at the wall, moving towards it along the circle."""
    x = -model.a
    y = -np.sqrt(model.l**2 - x**2)
    q = jnp.array([x, y])
    tangent = jnp.array([y, -x]) / model.l  # along the circle, x decreasing
    return q, speed * tangent


@pytest.mark.parametrize("e", [0.0, 0.3, 1.0])
def test_pendulum_on_a_stop_reverses_with_restitution(e):
    model = PendulumAgainstWall(restitution=e)
    q, v = _at_wall(model, 1.7)
    out = cdiff.impact(model, 0.0, q, v)
    np.testing.assert_allclose(np.asarray(out.v), -e * np.asarray(v), atol=1e-14)
    energy = lambda v: 0.5 * model.m * float(v @ v)  # noqa: E731
    assert abs(energy(out.v) - e**2 * energy(v)) <= 1e-12 * energy(v)
    # The impulse pushes, and it is the momentum change along the wall's normal
    # (the rod's impulse is along the rod, which at the wall has an x part too).
    assert bool(out.rows[0]) and float(out.impulse[0]) > 0
    A = jnp.array([[2 * q[0], 2 * q[1]], [1.0, 0.0]])
    lam = jnp.linalg.solve(A.T, model.m * (out.v - v))
    np.testing.assert_allclose(float(out.impulse[0]), float(lam[1]), rtol=1e-12)


def test_moving_away_is_no_impact():
    model = PendulumAgainstWall(restitution=0.5)
    q, v = _at_wall(model, -1.7)
    out = cdiff.impact(model, 0.0, q, v)
    np.testing.assert_array_equal(np.asarray(out.v), np.asarray(v))
    assert not bool(out.rows[0]) and float(out.impulse[0]) == 0.0


def test_simultaneous_impacts_in_a_corner():
    """Both walls at once: each velocity component reverses with its own
    restitution (the metric is diagonal, so the rows decouple)."""
    q, v = jnp.zeros(2), jnp.array([-1.0, -2.0])
    out = cdiff.impact(PointInCorner(), 0.0, q, v, restitution=jnp.array([0.5, 0.25]))
    np.testing.assert_allclose(np.asarray(out.v), [0.5, 0.5], atol=1e-14)
    np.testing.assert_allclose(np.asarray(out.impulse), [1.5, 7.5], rtol=1e-12)
    # Arriving at one wall only: the other row takes no part.
    out = cdiff.impact(PointInCorner(), 0.0, q, jnp.array([-1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(out.v), [0.0, 2.0], atol=1e-14)
    assert np.asarray(out.rows).tolist() == [True, False]


class SlantedCorner(cdiff.AbstractModel):
    """A unit point in the wedge y >= 0, y >= x (rows coupled in the metric)."""

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def unilateral(self, t, q):
        return jnp.stack([q[1], q[1] - q[0]])


def test_a_row_whose_impulse_would_pull_leaves():
    """At the wedge's corner moving down and right, only the floor arrives. Its
    impact alone would leave v = (1, 0), which drives y - x >= 0 inwards, so that
    row joins: the impulses push, no row arrives afterwards, and each row either
    pushes at zero rate or takes no impulse (here both stop the point)."""
    q, v = jnp.zeros(2), jnp.array([1.0, -1.0])
    out = cdiff.impact(SlantedCorner(), 0.0, q, v)
    impulse = np.asarray(out.impulse)
    assert np.all(impulse >= 0)
    G = np.array([[0.0, 1.0], [-1.0, 1.0]])
    gdot = G @ np.asarray(out.v)
    assert np.all(gdot >= -1e-14)
    # Complementarity: a row either pushes with zero rate or takes no impulse.
    assert np.all(np.abs(impulse * gdot) <= 1e-14)
    # Both rows at rest after a plastic impact into the corner: v+ = 0.
    np.testing.assert_allclose(np.asarray(out.v), [0.0, 0.0], atol=1e-14)


def test_impact_composes_with_vmap_and_grad():
    """Over a batch of restitutions, and d(v+)/de = -v- (finite differences too)."""
    model = PendulumAgainstWall()
    q, v = _at_wall(model, 1.7)

    def after(e):
        return cdiff.impact(eqx.tree_at(lambda m: m.restitution, model, e), 0.0, q, v).v

    es = jnp.linspace(0.0, 1.0, 5)
    batch = jax.vmap(after)(es)
    np.testing.assert_allclose(np.asarray(batch), -np.asarray(es)[:, None] * np.asarray(v),
                               atol=1e-14)
    d = jax.jacfwd(after)(0.4)
    np.testing.assert_allclose(np.asarray(d), -np.asarray(v), atol=1e-12)
    dr = jax.jacrev(after)(0.4)
    np.testing.assert_allclose(np.asarray(dr), -np.asarray(v), atol=1e-12)
