"""The reference models and their exact references, checked independently."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import cdiff

MODELS = [cdiff.models.MODELS[name]() for name in sorted(cdiff.models.MODELS)]


def test_slider_crank_reference_matches_scipy_dop853():
    """DOP853 at rtol = atol = 1e-12 gives theta1(100) = -2.599660 (the docs'
    -2.59966, to one more digit)."""
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
    # measured 7.6e-9 (at t = 100 s)
    np.testing.assert_allclose(ref.q[:, 2], scipy_sol.y[0], rtol=0, atol=3e-8)
    # To the printed digits: -2.59966045 (SciPy's, 7.6e-9 away, rounds alike).
    assert float(ref.q[-1, 2]) == pytest.approx(-2.599660, abs=5e-7)


# Per model, along the reference over 10 s: max |Phi|, max |A v|, max |nonholonomic|
# (None: the model has no such rows) and max |E - E0| (None: not conservative).
REFERENCE_BOUNDS = {  # measured (in the order above)
    "DoubleFourBar": (1.5e-15, 6e-15, None, 1.5e-8),  # 4.4e-16, 1.8e-15, 4.2e-9
    "ParticleOnCircle": (5e-16, 2e-16, None, 5e-16),  # 1.1e-16, 5.2e-17, 1.1e-16
    "PlanarArmOnCurve": (2e-15, 1e-14, None, 2e-9),  # 6.7e-16, 3.2e-15, 4.8e-10
    # |A v| is the vertical velocity, exactly 0 but for round-off: 1.9e-18.
    "RollingSphere": (5e-16, 1e-17, 1e-15, 1e-15),  # 1.1e-16, 2.2e-16, 2.4e-16
    "SliderCrank": (5e-16, 2e-15, None, 8e-10),  # 1.1e-16, 6.7e-16, 2.0e-10
    "SliderCrankJoint": (3e-15, 1e-14, None, 1e-9),  # 8.9e-16, 3.2e-15, 2.9e-10
    "Snakeboard": (None, None, 3e-10, None),  # 7.2e-11
    "TwoLinkOnCircle": (6e-15, 3e-15, None, 1e-8),  # 1.8e-15, 8.9e-16, 3.0e-9
}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_reference_lies_on_the_constraints_and_conserves_energy(model):
    phi_bound, rate_bound, nonholonomic_bound, energy_bound = REFERENCE_BOUNDS[
        type(model).__name__]
    ts = jnp.linspace(0.1, 10.0, 25)
    ref = model.reference(ts)
    phi = jax.vmap(lambda q: model.holonomic(0.0, q))(ref.q)
    A = jax.vmap(lambda q: jax.jacfwd(model.holonomic, argnums=1)(0.0, q))(ref.q)
    nonholonomic = jax.vmap(lambda q, v: model.nonholonomic(0.0, q, v))(ref.q, ref.v)
    if phi_bound is None:
        assert phi.shape[-1] == 0
    else:
        assert float(jnp.max(jnp.abs(phi))) < phi_bound
        rate = jnp.einsum("tij,tj->ti", A, ref.v)
        assert float(jnp.max(jnp.abs(rate))) < rate_bound
    if nonholonomic_bound is None:
        assert nonholonomic.shape[-1] == 0
    else:
        assert float(jnp.max(jnp.abs(nonholonomic))) < nonholonomic_bound
    assert (energy_bound is None) == (not getattr(model, "conservative", True))
    if energy_bound is None:
        return  # energy balance against the work done: the model's own test file
    q0, v0 = model.initial_state()
    e0 = model.energy(0.0, q0, v0)
    energy = jax.vmap(lambda q, v: model.energy(0.0, q, v))(ref.q, ref.v)
    assert float(jnp.max(jnp.abs(energy - e0))) < energy_bound


# The reference at t = 1e-9 s against the start: the motion in 1e-9 s, |v0| 1e-9
# (or 1/2 |a0| 1e-18 from rest) in q and |a0| 1e-9 in v. 0: exactly equal (at rest
# until a release; or a displacement below half an ulp of every entry of q0).
START_BOUNDS = {  # (q, v), measured in the comments
    "DoubleFourBar": (3e-9, 3e-9),  # 1.0e-9, 1.0e-9
    "ParticleOnCircle": (3e-9, 3e-9),  # 1.0e-9, 1.0e-9
    "PlanarArmOnCurve": (0, 0),
    "RollingSphere": (2e-8, 2e-8),  # 6.0e-9, 6.1e-9
    "SliderCrank": (2e-16, 1.5e-8),  # 5.6e-17, 4.4e-9
    "SliderCrankJoint": (0, 1.5e-8),  # 0, 4.6e-9
    "Snakeboard": (1.5e-17, 4e-8),  # 4.2e-18, 1.1e-8
    "TwoLinkOnCircle": (1.5e-17, 5e-8),  # 3.3e-18, 1.4e-8
}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
def test_initial_state_is_consistent_with_reference(model):
    q_bound, v_bound = START_BOUNDS[type(model).__name__]
    q0, v0 = model.initial_state()
    ref = model.reference(jnp.array([1e-9]))
    if q_bound:
        np.testing.assert_allclose(ref.q[0], q0, rtol=0, atol=q_bound)
    else:
        np.testing.assert_array_equal(ref.q[0], q0)
    if v_bound:
        np.testing.assert_allclose(ref.v[0], v0, rtol=0, atol=v_bound)
    else:
        np.testing.assert_array_equal(ref.v[0], v0)
    assert model.observable(q0).shape == (len(model.observable_names),)
