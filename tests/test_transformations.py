"""simulate composes with jit, vmap, grad, jacfwd and their compositions."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff

UK = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
FORMULATIONS = [cdiff.Lagrange(10.0, 10.0), cdiff.UdwadiaKalaba(), UK]


def _final(model, formulation, dt=1e-2, t1=2.0, q0=None, v0=None, **kw):
    if q0 is None:
        q0, v0 = model.initial_state()
    sol = cdiff.simulate(
        model, formulation, q0, v0, t1=t1, dt=dt, saveat=cdiff.SaveAt(t1=True), **kw
    )
    return sol.q[-1]


def test_vmap_over_step_sizes_matches_separate_calls():
    model = cdiff.models.SliderCrank()
    dts = 2.0 / jnp.array([50.0, 64.0, 80.0, 100.0, 125.0, 160.0, 200.0, 250.0])
    batched = jax.jit(jax.vmap(lambda dt: _final(model, UK, dt=dt, max_steps=250)))(
        dts
    )
    for dt, qb in zip(dts, batched):
        q = _final(model, UK, dt=float(dt))
        np.testing.assert_allclose(qb, q, rtol=0, atol=1e-12)
    # Different step sizes really give different answers.
    assert float(jnp.max(jnp.abs(batched[0] - batched[-1]))) > 1e-8


def test_solution_reports_the_step_taken():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(model, UK, q0, v0, t1=1.0, dt=0.3)
    assert sol.ts.shape == (5,)  # t0 and ceil(1/0.3) = 4 steps
    assert float(sol.dt) == pytest.approx(0.25)
    np.testing.assert_allclose(np.diff(np.asarray(sol.ts)), 0.25)


@pytest.mark.parametrize("formulation", FORMULATIONS, ids=repr)
def test_grad_wrt_link_length_matches_finite_differences(formulation):
    def slider(l):
        model = cdiff.models.SliderCrank(l=l)
        return model.slider(_final(model, formulation))

    l0, h = 1.0, 1e-5
    g = jax.grad(slider)(jnp.asarray(l0))
    fd = (slider(jnp.asarray(l0 + h)) - slider(jnp.asarray(l0 - h))) / (2 * h)
    assert bool(jnp.isfinite(g))
    assert float(jnp.abs(g - fd)) <= 1e-5 * float(jnp.abs(fd))


def test_forward_mode_matches_reverse_mode():
    def final_q(params):
        m, l = params
        model = cdiff.models.SliderCrank(m=m, l=l)
        return _final(model, UK, adjoint=diffrax.ForwardMode())

    def final_q_rev(params):
        m, l = params
        model = cdiff.models.SliderCrank(m=m, l=l)
        return _final(model, UK)

    p = jnp.array([1.3, 0.9])
    jf = jax.jacfwd(final_q)(p)
    jr = jax.jacrev(final_q_rev)(p)
    np.testing.assert_allclose(jf, jr, rtol=1e-8, atol=1e-10)


def test_grad_wrt_initial_state():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()

    def loss(v0):
        return model.slider(_final(model, UK, q0=q0, v0=v0, t1=1.0))

    d = jnp.zeros(6).at[2].set(1.0)  # spin the crank
    g = jax.grad(loss)(v0)
    h = 1e-6
    fd = (loss(v0 + h * d) - loss(v0 - h * d)) / (2 * h)
    assert float(jnp.abs(g @ d - fd)) <= 1e-5 * float(jnp.abs(fd))


def test_vmap_over_gains_and_model_fields():
    model = cdiff.models.SliderCrank()
    alphas = jnp.array([2.0, 5.0, 10.0])
    batched = jax.vmap(lambda a: _final(model, cdiff.Lagrange(a, a)))(alphas)
    for a, qb in zip(alphas, batched):
        np.testing.assert_allclose(qb, _final(model, cdiff.Lagrange(float(a), float(a))),
                                   atol=1e-12)
    masses = jnp.array([0.5, 1.0, 2.0])
    by_mass = jax.vmap(lambda m: _final(cdiff.models.SliderCrank(m=m), UK))(masses)
    # The slider-crank's motion does not depend on a common mass scale.
    np.testing.assert_allclose(by_mass[0], by_mass[2], atol=1e-9)


def test_jit_vmap_grad_composition():
    @jax.jit
    @jax.vmap
    def dslider_dm_dl(l):
        def f(params):
            model = cdiff.models.SliderCrank(m=params[0], l=params[1])
            return model.slider(_final(model, UK, t1=0.5))

        return jax.grad(f)(jnp.stack([jnp.asarray(1.0), l]))

    ls = jnp.array([0.8, 1.0, 1.2])
    grads = dslider_dm_dl(ls)
    assert grads.shape == (3, 2)
    assert bool(jnp.all(jnp.isfinite(grads)))
    np.testing.assert_allclose(grads[:, 0], 0.0, atol=1e-8)  # mass-independent
    for l, gb in zip(ls, grads):
        single = jax.grad(
            lambda l: cdiff.models.SliderCrank(l=l).slider(
                _final(cdiff.models.SliderCrank(l=l), UK, t1=0.5)
            )
        )(l)
        np.testing.assert_allclose(gb[1], single, rtol=1e-10)


def test_filter_grad_over_a_model():
    """Models are pytrees: eqx.filter_grad gives a gradient per field."""
    model = cdiff.models.SliderCrank(m=jnp.asarray(1.0), l=jnp.asarray(1.0),
                                     g=jnp.asarray(9.81))

    @eqx.filter_grad
    def grads(model):
        return model.slider(_final(model, UK, t1=0.5))

    g = grads(model)
    assert bool(jnp.isfinite(g.l)) and bool(jnp.isfinite(g.g))
    assert abs(float(g.m)) < 1e-8


def test_float32_runs():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    q0, v0 = q0.astype(jnp.float32), v0.astype(jnp.float32)
    sol = cdiff.simulate(model, UK, q0, v0, t1=1.0, dt=1e-2)
    assert sol.q.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(sol.q)))
    assert float(sol.max_constraint_error) < 1e-3
