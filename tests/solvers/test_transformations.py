"""simulate composes with jit, vmap, grad, jacfwd and their compositions.

Compilation dominates the cost of these tests, so every transformed function is
built once (module level, cached) and shared by the tests that need it.
"""

import functools

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EPS

import cdiff

UK = cdiff.UdwadiaKalaba(constraint_correction=True, energy_correction=True)
T1 = 2.0


def _model(m=1.0, l=1.0, g=9.81):
    f64 = functools.partial(jnp.asarray, dtype=jnp.float64)
    return cdiff.models.SliderCrank(m=f64(m), l=f64(l), g=f64(g))


def _final(model, formulation, dt=1e-2, t1=T1, dv=0.0, **kw):
    q0, v0 = model.initial_state()
    v0 = v0.at[2].add(dv)  # spin the crank
    sol = cdiff.simulate(
        model, formulation, q0, v0, t1=t1, dt=dt, saveat=cdiff.SaveAt(t1=True), **kw
    )
    return sol.q[-1]


def _slider(model, dv, formulation, **kw):
    """The loss of the issue: the slider position at t = 2 s."""
    return model.slider(_final(model, formulation, dv=dv, **kw))


@functools.cache
def _value(formulation):
    return eqx.filter_jit(functools.partial(_slider, formulation=formulation))


@functools.cache
def _grad(formulation):
    """Reverse mode with respect to every model field and the initial velocity."""
    return jax.jit(
        jax.grad(functools.partial(_slider, formulation=formulation), argnums=(0, 1))
    )


def _central(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


# --- vmap -------------------------------------------------------------------------


def test_vmap_over_step_sizes_matches_separate_calls():
    model = _model()
    dts = 2.0 / jnp.array([50.0, 64.0, 80.0, 100.0, 125.0, 160.0, 200.0, 250.0])
    one = jax.jit(lambda dt: _final(model, UK, dt=dt, max_steps=250))
    batched = jax.vmap(one)(dts)
    # Round-off of batched against unbatched kernels, amplified along the run
    # through the singular passage: measured 0 to 4.9e-14 over the step sizes
    # (the kernels' rounding depends on the CPU's vector width).
    for dt, qb in zip(dts, batched):
        np.testing.assert_allclose(qb, one(dt), rtol=0, atol=2e-13)
    # A separate call with a concrete dt (its own max_steps) agrees too (3.6e-15).
    np.testing.assert_allclose(batched[3], _final(model, UK, dt=float(dts[3])),
                               rtol=0, atol=1.5e-14)
    # Different step sizes really give different answers (by 2.2e-5).
    assert float(jnp.max(jnp.abs(batched[0] - batched[-1]))) > 1e-8


def test_solution_reports_the_step_taken():
    model = _model()
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(model, UK, q0, v0, t1=1.0, dt=0.3)
    assert sol.ts.shape == (5,)  # t0 and ceil(1/0.3) = 4 steps
    assert float(sol.dt) == 0.25  # exact in binary, as are the step times
    np.testing.assert_array_equal(np.diff(np.asarray(sol.ts)), 0.25)


def test_vmap_over_gains_and_model_fields():
    model = _model()
    alphas = jnp.array([2.0, 5.0, 10.0])
    run = jax.jit(lambda a: _final(model, cdiff.Lagrange(a, a)))
    batched = jax.vmap(run)(alphas)
    for a, qb in zip(alphas, batched):
        # Round-off of batched against unbatched kernels (measured 0 here, in both
        # builds; not exact by construction, see above): 4 ulp of the largest |q|.
        want = run(a)
        atol = 4 * EPS * float(jnp.max(jnp.abs(want)))
        np.testing.assert_allclose(qb, want, rtol=0, atol=atol)
    assert float(jnp.max(jnp.abs(batched[0] - batched[2]))) > 1e-10  # 4.5e-6
    masses = jnp.array([0.5, 1.0, 2.0])
    by_mass = jax.vmap(lambda m: _final(_model(m=m), UK))(masses)
    # The slider-crank's motion does not depend on a common mass scale: exactly
    # for masses 0.5 and 2 (a power of two scales every rounding alike), to
    # round-off from mass 1 (measured 9.3e-15).
    np.testing.assert_array_equal(by_mass[0], by_mass[2])
    np.testing.assert_allclose(by_mass[0], by_mass[1], rtol=0, atol=3e-14)


def test_python_float_sweeps_reuse_the_compilation():
    """Float fields are traced, not static: a loop over values compiles once."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    kw = dict(t1=0.1, dt=1e-2, saveat=cdiff.SaveAt(t1=True))
    cdiff.simulate(model, cdiff.Lagrange(1.0, 1.0), q0, v0, **kw)
    with jax.log_compiles():
        import logging

        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            for a in (2.0, 3.0):
                cdiff.simulate(cdiff.models.SliderCrank(m=1.0 + a), cdiff.Lagrange(a, a),
                               q0, v0, **kw)
        finally:
            logger.removeHandler(handler)
    assert not [r for r in records if "_simulate" in r.getMessage()]


# --- grad -------------------------------------------------------------------------


@pytest.mark.parametrize("formulation", [UK], ids=repr)
def test_grad_matches_finite_differences(formulation):
    """d(slider at t = 2 s)/d(link length) and /d(initial crank rate), reverse mode,
    against central differences (with the energy correction; the other
    formulations' derivatives: tests/solvers/test_gradients.py)."""
    model = _model()
    g = _grad(formulation)(model, jnp.asarray(0.0))
    g_model, g_dv = g
    value = _value(formulation)
    fd_l = _central(lambda l: value(_model(l=l), jnp.asarray(0.0)), 1.0, 1e-5)
    fd_dv = _central(lambda dv: value(model, dv), jnp.asarray(0.0), 1e-6)
    fd_g = _central(lambda g: value(_model(g=g), jnp.asarray(0.0)), 9.81, 1e-4)
    # Measured relative differences 1.7e-8 (l) and 3.4e-6 (initial rate).
    assert float(jnp.abs(g_model.l - fd_l)) <= 1.5e-7 * float(jnp.abs(fd_l))
    assert float(jnp.abs(g_dv - fd_dv)) <= 1e-5 * float(jnp.abs(fd_dv))
    # Models are pytrees: every field gets a gradient. The motion is mass-free, so
    # d/dm is 0 (measured -9.2e-11), and d/dg is the central difference's
    # (measured 1.1e-8 relative).
    assert abs(float(g_model.m)) < 4e-10
    assert float(jnp.abs(g_model.g - fd_g)) <= 1e-7 * float(jnp.abs(fd_g))


def test_forward_mode_matches_reverse_mode():
    def final_slider(p):
        return _slider(_model(l=p[0], g=p[1]), jnp.asarray(0.0), UK,
                       adjoint=diffrax.ForwardMode())

    jf = jax.jit(jax.jacfwd(final_slider))(jnp.array([1.0, 9.81]))
    g_model, _ = _grad(UK)(_model(), jnp.asarray(0.0))
    # Round-off between the two modes: measured 3.1e-12 and 4.8e-14 relative.
    np.testing.assert_allclose(jf, jnp.stack([g_model.l, g_model.g]), rtol=1.5e-11)


def test_jit_vmap_grad_composition():
    @jax.jit
    @jax.vmap
    def grads(l):
        g_model, _ = _grad(UK)(_model(l=l), jnp.asarray(0.0))
        return jnp.stack([g_model.m, g_model.l])

    ls = jnp.array([0.8, 1.0, 1.2])
    batched = grads(ls)
    assert batched.shape == (3, 2)
    for l, gb in zip(ls, batched):
        single, _ = _grad(UK)(_model(l=l), jnp.asarray(0.0))
        # Batched kernels round differently: measured 2.4e-12 relative (d/dl),
        # 4.0e-14 absolute (d/dm, itself ~1e-14 or 1e-10).
        np.testing.assert_allclose(gb, jnp.stack([single.m, single.l]), rtol=1e-11,
                                   atol=2e-13)


# --- float32 ----------------------------------------------------------------------


def test_float32_runs():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    q0, v0 = q0.astype(jnp.float32), v0.astype(jnp.float32)
    sol = cdiff.simulate(model, UK, q0, v0, t1=1.0, dt=1e-2)
    assert sol.q.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(sol.q)))
    # float32 round-off: measured 1.19e-7 (eps = 1.19e-7).
    assert float(sol.max_constraint_error) < 1e-6


def test_grad_of_saveat_ts_on_the_step_grid():
    """Reverse mode through SaveAt(ts) whose times lie on the step grid (within
    round-off of step ends), under a vmap over step sizes. With diffrax's
    ConstantStepSize, RecursiveCheckpointAdjoint's recomputed steps assigned some
    of these save times to a different step than the forward pass: the gradient
    was 2.6% off at dt = 1e-3 here (27% with another loss). `simulate` reads its
    step times from a precomputed grid (its UniformGrid)."""
    model = cdiff.models.ParticleOnCircle(g=9.81, speed=0.0)
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 2.0, 201)  # on the step grids of both step sizes

    def loss(a, dt):
        sol = cdiff.simulate(model, cdiff.Lagrange(alpha=5.0, beta=5.0), q0, v0,
                             t1=2.001, dt=dt, saveat=cdiff.SaveAt(ts=ts),
                             max_steps=4002,
                             control=lambda t, q, v: a * jnp.stack(
                                 [jnp.sin(3 * t), jnp.zeros_like(t)]))
        return jnp.mean((sol.q[:, 0] - jnp.sin(ts)) ** 2)

    value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0)))
    dts = jnp.array([1e-3, 5e-4])
    _, grad = value_and_grad(jnp.asarray(30.0), dts)
    h = 1e-3
    fd = (value_and_grad(jnp.asarray(30.0 + h), dts)[0]
          - value_and_grad(jnp.asarray(30.0 - h), dts)[0]) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=3e-8)  # measured 3.4e-9, 3.6e-9
