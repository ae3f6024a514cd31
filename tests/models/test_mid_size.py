"""Mid-size models (issue 20, item 4): the N four-bar in natural coordinates and a
chain of pendulums in Cartesian coordinates, against independent references; and
the dense linear-algebra path (more than `UNROLL` rows) they run on."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from helpers import EPS

import cdiff



def test_n_four_bar_with_two_windows_is_the_double_four_bar():
    """N = 2 is Braun & Goldfarb's R4: the same mass matrix, forces, energy, start
    and reference, and the same constraints in the chain's order."""
    n2, r4 = cdiff.models.NFourBar(n=2), cdiff.models.DoubleFourBar()
    q, v = r4.initial_state()
    q2, v2 = n2.initial_state()
    # measured 6.1e-17 (cos(pi / 2) where R4 writes 0)
    np.testing.assert_allclose(q2, q, rtol=0, atol=2e-16)
    np.testing.assert_allclose(v2, v, rtol=0, atol=2e-16)
    x = q + jnp.array([0.1, -0.2, 0.3, 0.05, -0.1, 0.2])
    assert np.array_equal(n2.mass_matrix(0.0, x), r4.mass_matrix(0.0, x))
    assert np.array_equal(n2.forces(0.0, x, v), r4.forces(0.0, x, v))
    # R4 orders cranks first: [crank 0, crank 1, crank 2, coupler 0, coupler 1].
    # Exact: the same arithmetic (pivots 0, l, 2l).
    np.testing.assert_array_equal(n2.holonomic(0.0, x),
                                  r4.holonomic(0.0, x)[jnp.array([0, 3, 1, 4, 2])])
    # Measured equal in both builds (the products in another order): 4 ulp.
    np.testing.assert_allclose(float(n2.energy(0.0, x, v)),
                               float(r4.energy(0.0, x, v)), rtol=4 * EPS, atol=0)
    ts = jnp.array([0.5, 2.0])
    # Measured 0 in both builds (c g / l and 7/6 g / l happen to round alike; an ulp
    # apart, the adaptive steps could differ): 4 ulp.
    np.testing.assert_allclose(n2.reference(ts).q, r4.reference(ts).q,
                               rtol=4 * EPS, atol=0)


def test_n_four_bar_energy_and_load_match_the_parallelogram_reduction():
    """N = 40 on the parallelogram motion: kinetic energy 1/2 m l^2 w^2 ((N+1)/3 + N)
    and the weight on the moving points ((N + 1)/2 + N) m g (each crank's other half
    rests on its pivot), the terms the reference's coefficient is built
    from (cdiff.models.NFourBar's docstring)."""
    n, m, l, g = 40, 1.3, 0.7, 9.81
    model = cdiff.models.NFourBar(n=n, m=m, l=l, g=g)
    th, om = 0.4, -1.7
    q, v = model.minimal_state(jnp.array([th, om]))
    kinetic = 0.5 * v @ model.mass_matrix(0.0, q) @ v
    # measured 1.4e-16 relative (both builds)
    assert float(kinetic) == pytest.approx(0.5 * m * l**2 * om**2 * ((n + 1) / 3 + n),
                                           rel=6e-16, abs=0)
    # Measured equal in both builds (a sum of 82 terms against one product): 4 ulp.
    np.testing.assert_allclose(float(jnp.sum(model.forces(0.0, q, v))),
                               -((n + 1) / 2 + n) * m * g, rtol=4 * EPS, atol=0)
    assert model.holonomic(0.0, q).shape == (2 * n + 1,)
    assert float(jnp.max(jnp.abs(model.holonomic(0.0, q)))) < 1e-14  # 4e-15 at x = 28 m
    with pytest.raises(ValueError, match="positive integer"):
        cdiff.models.NFourBar(n=0)


@pytest.fixture(scope="module")
def four_bar_40():
    model = cdiff.models.NFourBar(n=40)
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=0.2, dt=1e-3,
                         saveat=cdiff.SaveAt(ts=jnp.array([0.2])))
    return model, sol


def test_n_four_bar_40_follows_the_exact_motion(four_bar_40):
    """UK with constraint correction, RK4 at dt = 1e-3, against the parallelogram
    reduction: measured 1.9e-13 in every coordinate at 0.2 s, 6.1e-13 in velocity."""
    model, sol = four_bar_40
    ref = model.reference(sol.ts)
    assert float(jnp.max(jnp.abs(sol.q - ref.q))) < 6e-13
    assert float(jnp.max(jnp.abs(sol.v - ref.v))) < 2e-12


def _chain_kkt_rhs(n, g):
    """The chain in Cartesian coordinates as an index-1 KKT system, in NumPy:
    independent of cdiff's kinematics and of the minimal ODE."""
    def rhs(t, y):
        p, w = y[: 2 * n].reshape(n, 2), y[2 * n:].reshape(n, 2)
        d = np.diff(p, axis=0, prepend=np.zeros((1, 2)))
        dv = np.diff(w, axis=0, prepend=np.zeros((1, 2)))
        A = np.zeros((n, 2 * n))
        for i in range(n):
            A[i, 2 * i: 2 * i + 2] = 2 * d[i]
            if i:
                A[i, 2 * i - 2: 2 * i] = -2 * d[i]
        K = np.block([[np.eye(2 * n), A.T], [A, np.zeros((n, n))]])
        f = np.tile([0.0, -g], n)
        acc = np.linalg.solve(K, np.concatenate([f, -2 * np.sum(dv**2, axis=1)]))[: 2 * n]
        return np.concatenate([y[2 * n:], acc])
    return rhs


def test_pendulum_chain_reference_matches_a_scipy_kkt_solve():
    """The model's reference (minimal ODE in link angles, diffrax Dopri8) against
    SciPy's DOP853 on the Cartesian KKT system at rtol = atol = 1e-12, 8 links."""
    model = cdiff.models.PendulumChain(n=8)
    q0, v0 = model.initial_state()
    ts = np.array([0.3, 0.6])
    sol = solve_ivp(_chain_kkt_rhs(8, model.g), (0.0, 0.6), np.concatenate([q0, v0]),
                    method="DOP853", rtol=1e-12, atol=1e-12, t_eval=ts)
    ref = model.reference(jnp.asarray(ts))
    np.testing.assert_allclose(ref.q, sol.y[:16].T, rtol=0, atol=2e-11)  # 5.7e-12
    np.testing.assert_allclose(ref.v, sol.y[16:].T, rtol=0, atol=1e-10)  # 2.9e-11


def test_pendulum_chain_100_follows_the_reference():
    """100 links (200 coordinates, 100 constraints), UK with constraint and energy
    correction, RK4 at dt = 1e-3 for 0.1 s: measured 5.7e-11 in position, energy
    kept to round-off (7.3e-12)."""
    model = cdiff.models.PendulumChain(n=100)
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(energy_correction=True), q0, v0,
                         t1=0.1, dt=1e-3, saveat=cdiff.SaveAt(ts=jnp.array([0.1])))
    ref = model.reference(sol.ts)
    assert float(jnp.max(jnp.abs(sol.q - ref.q))) < 1e-10
    e = model.energy(0.0, sol.q[-1], sol.v[-1]) - model.energy(0.0, q0, v0)
    # measured 0; 7.3e-12 with XLA's default fusion emitter
    assert abs(float(e)) < 3e-11


def test_gradient_through_the_dense_path_matches_central_differences():
    """N = 6 (14 coordinates, 13 constraints: one more than the unrolled kernels
    take), d(final y of B0)/dg through 50 RK4 steps against central differences."""
    model = cdiff.models.NFourBar(n=6)
    q0, v0 = model.initial_state()

    @jax.jit
    def final_y(g):
        m = eqx.tree_at(lambda m: m.g, model, g)
        return cdiff.simulate(m, cdiff.UdwadiaKalaba(), q0, v0, t1=0.05, dt=1e-3).q[-1, 1]

    grad = jax.grad(final_y)(9.81)
    h = 1e-4
    fd = (final_y(9.81 + h) - final_y(9.81 - h)) / (2 * h)
    assert float(grad) == pytest.approx(float(fd), rel=1e-7)
    # The same derivative from the parallelogram reduction y = l sin(theta),
    # theta'' = -c (g / l) cos(theta), by semi-implicit Euler at 1e-5 s.
    c = model.minimal_ode().args / 9.81

    def y_of(g):
        def step(state, _):
            th, om = state
            om = om - 1e-5 * c * g * jnp.cos(th)
            return (th + 1e-5 * om, om), None
        (th, _), _ = jax.lax.scan(step, (jnp.pi / 2, -1.0), None, length=5000)
        return jnp.sin(th)

    # measured 4.0e-8 relative (both builds)
    assert float(grad) == pytest.approx(float(jax.grad(y_of)(9.81)), rel=1.5e-7, abs=0)


class _Skewed13(cdiff.AbstractModel):
    """A 13 x 13 mass matrix (above the unrolled size) with one skew entry."""

    skew: float = 0.0

    def mass_matrix(self, t, q):
        M = 2.0 * jnp.eye(13, dtype=q.dtype)
        return M.at[3, 9].add(self.skew)


def test_large_non_symmetric_mass_matrix_is_refused():
    run = eqx.filter_jit(lambda model: cdiff.simulate(
        model, cdiff.UdwadiaKalaba(), jnp.zeros(13), jnp.ones(13), t1=0.2, dt=0.1).q)
    assert np.all(np.isfinite(np.asarray(run(_Skewed13(skew=0.0)))))
    with pytest.raises(eqx.EquinoxRuntimeError, match="not symmetric"):
        jax.block_until_ready(run(_Skewed13(skew=1e-3)))
