"""The two speed paths of `cdiff.simulate`, each against the general one:

* `compute_once` (cdiff/_xla.py): a vector field evaluated with every distinct
  transcendental function computed once gives the same numbers as the plain
  evaluation, under jit, vmap, jvp and grad, and the compiled CPU program holds one
  sine and one cosine per angle where the plain one recomputes them in every fused
  loop that uses them;
* the own constant-step RK4 loop (`rk4_solve`): the same saved rows, statistics,
  failures and gradients as `diffrax.diffeqsolve` with `cdiff.RK4`.
"""

from __future__ import annotations

import re

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Exploding

import cdiff
from cdiff import _simulate, _xla
from cdiff._formulation.base import Context

CPU = jax.default_backend() == "cpu"
MODEL = cdiff.models.SliderCrank()
UK = cdiff.UdwadiaKalaba(energy_correction=True)


def _context(model=MODEL):
    q0, v0 = model.initial_state()
    return Context(model, None, model.energy(0.0, q0, v0), None, UK)


def _rate(t, y, context):
    """The UK (c + e) rate of the slider-crank with zero per-step corrections."""
    frozen = jax.tree.map(jnp.zeros_like, UK.freeze(0.0, 0.01, y, context))
    return UK.vector_field(t, y, context, frozen)


def _states(n=8):
    q0, v0 = MODEL.initial_state()
    angles = jnp.linspace(0.0, 0.3, n)
    return (q0 + jnp.zeros((n, 6)).at[:, 2].set(angles),
            v0 + jnp.zeros((n, 6)).at[:, 2].set(angles))


def _assert_tree_equal(a, b, rtol=0.0, atol=0.0):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# -- compute_once -------------------------------------------------------------------


def test_compute_once_same_values_under_transformations():
    context = _context()
    fast = _xla.compute_once(_rate)
    q, v = _states()
    batched = jax.jit(jax.vmap(lambda q, v: fast(0.0, (q, v), context)))
    plain = jax.jit(jax.vmap(lambda q, v: _rate(0.0, (q, v), context)))
    # Equal up to the order in which XLA's differently fused loops add.
    _assert_tree_equal(batched(q, v), plain(q, v), rtol=1e-13, atol=1e-13)

    def loss(f, g):  # a model parameter through the rate
        model = eqx.tree_at(lambda m: m.g, MODEL, g)
        return jnp.sum(f(0.0, (q[3], v[3]), _context(model))[1] ** 2)

    g = jnp.asarray(9.81)
    grad_fast, grad_plain = (jax.jit(jax.grad(lambda g: loss(f, g)))(g)
                             for f in (fast, _rate))
    np.testing.assert_allclose(grad_fast, grad_plain, rtol=1e-12)
    tangent = (jnp.ones(6), jnp.zeros(6))

    @jax.jit
    def jvps(y):
        return [jax.jvp(lambda y: f(0.0, y, context), (y,), (tangent,))[1]
                for f in (fast, _rate)]

    jvp_fast, jvp_plain = jvps((q[1], v[1]))
    _assert_tree_equal(jvp_fast, jvp_plain, rtol=1e-12, atol=1e-12)


def _count(hlo: str, op: str) -> int:
    return len(re.findall(rf"\b{op}\(", hlo))


@pytest.mark.skipif(not CPU, reason="compute_once acts on the CPU backend only")
def test_compute_once_one_evaluation_per_angle():
    context = _context()
    q, v = _states(64)

    def compiled(f):
        fn = jax.jit(jax.vmap(lambda q, v: f(0.0, (q, v), context)))
        return fn.lower(q, v).compile(cdiff.compiler_options()).as_text()

    fast, plain = compiled(_xla.compute_once(_rate)), compiled(_rate)
    # Two angles (crank and rod): one sine and one cosine each.
    assert _count(fast, "sine") == 2 and _count(fast, "cosine") == 2
    # Without it XLA recomputes them inside every fused loop that reads them.
    assert _count(plain, "sine") + _count(plain, "cosine") > 8


def test_compute_once_static_arguments_and_errors():
    def f(x, scale, label):
        assert label == "static"
        y = eqx.error_if(x, x < 0, "negative input")
        return {"s": jnp.sin(y) * scale, "c": jnp.cos(y), "none": None}

    fast = _xla.compute_once(f)
    out = jax.jit(fast, static_argnums=2)(jnp.asarray(0.5), jnp.asarray(2.0), "static")
    assert out["none"] is None
    np.testing.assert_allclose(out["s"], 2 * np.sin(0.5), rtol=1e-15)
    np.testing.assert_allclose(out["c"], np.cos(0.5), rtol=1e-15)
    with pytest.raises(Exception, match="negative input"):
        jax.block_until_ready(
            jax.jit(fast, static_argnums=2)(jnp.asarray(-1.0), 2.0, "static"))


# -- the own RK4 loop ----------------------------------------------------------------


def _both(fn):
    """`fn()` with simulate's own RK4 loop and with diffrax.diffeqsolve."""
    try:
        _simulate._OWN_LOOP = True
        own = fn()
        _simulate._OWN_LOOP = False
        general = fn()
    finally:
        _simulate._OWN_LOOP = True
    return own, general


SAVES = {
    "default": None,  # t0 and steps
    "t1": cdiff.SaveAt(t1=True),
    "steps-t1": cdiff.SaveAt(steps=True, t1=True),
}


@pytest.mark.parametrize("save", list(SAVES))
def test_own_loop_matches_diffrax(save):
    q0, v0 = MODEL.initial_state()

    def run():
        return cdiff.simulate(MODEL, UK, q0, v0, t1=0.3, dt=0.01,
                              saveat=SAVES[save], max_steps=36)

    own, general = _both(run)
    assert own.q.shape == general.q.shape
    np.testing.assert_array_equal(np.asarray(own.ts), np.asarray(general.ts))
    np.testing.assert_allclose(own.q, general.q, rtol=0, atol=1e-13)
    np.testing.assert_allclose(own.v, general.v, rtol=0, atol=1e-12)
    # Unused rows (max_steps > 30 steps) are inf in both.
    assert np.array_equal(np.isinf(own.q), np.isinf(general.q))
    assert int(own.stats["num_steps"]) == int(general.stats["num_steps"]) == 30
    assert own.result == general.result == cdiff.RESULTS.successful


# Lagrange: no per-step data; NullSpace: its own state (q, nu, R) and end-of-step map.
@pytest.mark.parametrize("formulation", [cdiff.Lagrange(), cdiff.NullSpace()])
def test_own_loop_matches_diffrax_formulations(formulation):
    q0, v0 = MODEL.initial_state()
    own, general = _both(lambda: cdiff.simulate(MODEL, formulation, q0, v0, t1=0.2,
                                                dt=0.01))
    np.testing.assert_allclose(own.q, general.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(own.multipliers, general.multipliers, rtol=1e-9,
                               atol=1e-9)


@pytest.mark.parametrize("save", ["default", "t1"])
def test_own_loop_failure_as_diffrax(save):
    def run():
        return cdiff.simulate(Exploding(), cdiff.Lagrange(), jnp.zeros(2),
                              jnp.zeros(2), t1=2.0, dt=0.1, throw=False,
                              saveat=SAVES[save])

    own, general = _both(run)
    assert own.result == general.result == cdiff.RESULTS.nonfinite
    assert int(own.stats["num_steps"]) == int(general.stats["num_steps"]) < 20
    np.testing.assert_array_equal(np.asarray(own.ts), np.asarray(general.ts))
    np.testing.assert_array_equal(np.asarray(own.q), np.asarray(general.q))
    with pytest.raises(RuntimeError, match="Nonfinite"):
        cdiff.simulate(Exploding(), cdiff.Lagrange(), jnp.zeros(2), jnp.zeros(2),
                       t1=2.0, dt=0.1)


def test_own_loop_forward_and_reverse_mode_agree(monkeypatch):
    # Both through the own loop (a lax.scan, checkpointed per step); their agreement
    # with finite differences is tests/test_gradients.py's subject.
    q0, v0 = MODEL.initial_state()

    def loss(g, length):
        model = cdiff.models.SliderCrank(g=g, l=length)
        sol = cdiff.simulate(model, cdiff.Lagrange(), q0, v0, t1=0.2, dt=0.01,
                             saveat=cdiff.SaveAt(t1=True))
        return model.slider(sol.q[-1])

    reverse = jax.jit(jax.grad(loss, argnums=(0, 1)))(9.81, 1.0)
    forward = jax.jit(jax.jacfwd(loss, argnums=(0, 1)))(9.81, 1.0)
    np.testing.assert_allclose(forward, reverse, rtol=1e-10)
    assert all(abs(float(x)) > 1e-4 for x in reverse)
    # Reverse mode storing one state per step (recomputing whole steps) instead of
    # every stage's input: the same derivative.
    monkeypatch.setattr(_simulate, "_KEEP_STAGES", 0)
    per_step = jax.jit(jax.grad(loss, argnums=(0, 1)))(9.81, 1.0)
    np.testing.assert_allclose(per_step, reverse, rtol=1e-12)


def test_own_loop_only_for_plain_constant_rk4():
    steps = _simulate._own_loop_steps
    constant = diffrax.ConstantStepSize()
    plain = cdiff.SaveAt(t0=True, steps=True)
    times = (0.0, 1.0, 0.1)
    assert steps(cdiff.RK4(), constant, plain, None, False, 10, times) == 10
    # Anything else goes to diffrax.diffeqsolve.
    assert steps(diffrax.Tsit5(), constant, plain, None, False, 10, times) is None
    projected = cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())
    assert steps(projected, constant, plain, None, False, 10, times) is None
    assert steps(cdiff.RK4(), constant, plain, diffrax.ForwardMode(), False, 10,
                 times) is None
    assert steps(cdiff.RK4(), constant, plain, None, True, 10, times) is None
    assert steps(cdiff.RK4(), constant, cdiff.SaveAt(ts=jnp.linspace(0, 1, 3)), None,
                 False, 10, times) is None
    assert steps(cdiff.RK4(), constant, cdiff.SaveAt(dense=True), None, False, 10,
                 times) is None
    assert steps(cdiff.RK4(), diffrax.PIDController(rtol=1e-6, atol=1e-6), plain,
                 None, False, 10, times) is None
    # A step size traced (vmap over dt): the number of steps is not known.
    seen = []
    jax.jit(lambda dt: seen.append(steps(cdiff.RK4(), constant, plain, None, False,
                                         10, (0.0, 1.0, dt))) or dt)(0.1)
    assert seen == [None]
    # Fewer max_steps than steps: diffrax reports the failure.
    assert steps(cdiff.RK4(), constant, plain, None, False, 9, times) is None
    # More steps than one checkpoint each allows: diffrax's O(sqrt(n)) checkpoints.
    many = (0.0, 1.0, 1.0 / 20_000)
    assert steps(cdiff.RK4(), constant, plain, None, False, 20_000, many) is None
