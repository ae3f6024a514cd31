"""The reference models and their exact references, checked independently."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import cdiff

MODELS = [cdiff.models.MODELS[name]() for name in sorted(cdiff.models.MODELS)]


def test_slider_crank_reference_matches_scipy_dop853():
    """DOP853 at rtol = atol = 1e-12 gives theta1(100) = -2.59966."""
    model = cdiff.models.SliderCrank()
    g = model.g / model.l

    def rhs(t, y):
        th, om = y
        acc = -3 / (5 - 3 * np.cos(2 * th)) * (np.sin(2 * th) * om**2 + g * np.cos(th))
        return [om, acc]

    ts = np.array([1.0, 10.0, 50.0, 100.0])
    scipy_sol = solve_ivp(rhs, (0, 100), [np.pi / 4, 0.0], method="DOP853",
                          rtol=1e-12, atol=1e-12, t_eval=ts)
    ref = model.reference(jnp.asarray(ts))
    np.testing.assert_allclose(ref.q[:, 2], scipy_sol.y[0], atol=1e-7)
    assert float(ref.q[-1, 2]) == pytest.approx(-2.59966, abs=5e-6)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_reference_lies_on_the_constraints_and_conserves_energy(model):
    ts = jnp.linspace(0.1, 10.0, 25)
    ref = model.reference(ts)
    phi = jax.vmap(lambda q: model.holonomic(0.0, q))(ref.q)
    A = jax.vmap(lambda q: jax.jacfwd(model.holonomic, argnums=1)(0.0, q))(ref.q)
    nonholonomic = jax.vmap(lambda q, v: model.nonholonomic(0.0, q, v))(ref.q, ref.v)
    assert float(jnp.max(jnp.abs(phi), initial=0.0)) < 1e-10
    assert float(jnp.max(jnp.abs(jnp.einsum("tij,tj->ti", A, ref.v)),
                         initial=0.0)) < 1e-9
    assert float(jnp.max(jnp.abs(nonholonomic), initial=0.0)) < 1e-9
    if not getattr(model, "conservative", True):
        return  # energy balance against the work done: the model's own test file
    q0, v0 = model.initial_state()
    e0 = model.energy(0.0, q0, v0)
    energy = jax.vmap(lambda q, v: model.energy(0.0, q, v))(ref.q, ref.v)
    assert float(jnp.max(jnp.abs(energy - e0))) < 1e-9 * max(1.0, abs(float(e0)))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_initial_state_is_consistent_with_reference(model):
    q0, v0 = model.initial_state()
    ref = model.reference(jnp.array([1e-9]))
    np.testing.assert_allclose(ref.q[0], q0, atol=1e-8)
    np.testing.assert_allclose(ref.v[0], v0, atol=1e-7)
    assert model.observable(q0).shape == (len(model.observable_names),)
