"""The two speed paths of `cdiff.simulate`, each against the general one:

* `compute_once` (cdiff/_reschedule.py): a vector field evaluated with every distinct
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

# private on purpose: the fast paths' kernels and route choices, internal to simulate
from cdiff import _reschedule, _routes, _simulate

CPU = jax.default_backend() == "cpu"
MODEL = cdiff.models.SliderCrank()
UK = cdiff.UdwadiaKalaba(energy_correction=True)


def _context(model=MODEL):
    q0, v0 = model.initial_state()
    return cdiff.Context(model, None, model.energy(0.0, q0, v0), None, UK)


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
    fast = _reschedule.compute_once(_rate)
    q, v = _states()
    batched = jax.jit(jax.vmap(lambda q, v: fast(0.0, (q, v), context)))
    plain = jax.jit(jax.vmap(lambda q, v: _rate(0.0, (q, v), context)))
    # Equal up to the order in which XLA's differently fused loops add: measured
    # equal (both XLA CPU emitters, here and below); two ulp allowed.
    _assert_tree_equal(batched(q, v), plain(q, v), rtol=4.5e-16)

    def loss(f, g):  # a model parameter through the rate
        model = eqx.tree_at(lambda m: m.g, MODEL, g)
        return jnp.sum(f(0.0, (q[3], v[3]), _context(model))[1] ** 2)

    g = jnp.asarray(9.81)
    grad_fast, grad_plain = (jax.jit(jax.grad(lambda g: loss(f, g)))(g)
                             for f in (fast, _rate))
    np.testing.assert_allclose(grad_fast, grad_plain, rtol=4.5e-16, atol=0)
    tangent = (jnp.ones(6), jnp.zeros(6))

    @jax.jit
    def jvps(y):
        return [jax.jvp(lambda y: f(0.0, y, context), (y,), (tangent,))[1]
                for f in (fast, _rate)]

    jvp_fast, jvp_plain = jvps((q[1], v[1]))
    _assert_tree_equal(jvp_fast, jvp_plain, rtol=4.5e-16)


def _count(hlo: str, op: str) -> int:
    return len(re.findall(rf"\b{op}\(", hlo))


@pytest.mark.skipif(not CPU, reason="compute_once acts on the CPU backend only")
def test_compute_once_one_evaluation_per_angle():
    context = _context()
    q, v = _states(64)

    def compiled(f):
        fn = jax.jit(jax.vmap(lambda q, v: f(0.0, (q, v), context)))
        return fn.lower(q, v).compile(cdiff.compiler_options()).as_text()

    fast, plain = compiled(_reschedule.compute_once(_rate)), compiled(_rate)
    # Two angles (crank and rod): one sine and one cosine each.
    assert _count(fast, "sine") == 2 and _count(fast, "cosine") == 2
    # Without it XLA recomputes them inside every fused loop that reads them.
    assert _count(plain, "sine") + _count(plain, "cosine") > 8


def test_compute_once_static_arguments_and_errors():
    def f(x, scale, label):
        assert label == "static"
        y = eqx.error_if(x, x < 0, "negative input")
        return {"s": jnp.sin(y) * scale, "c": jnp.cos(y), "none": None}

    fast = _reschedule.compute_once(f)
    out = jax.jit(fast, static_argnums=2)(jnp.asarray(0.5), jnp.asarray(2.0), "static")
    assert out["none"] is None
    np.testing.assert_allclose(out["s"], 2 * np.sin(0.5), rtol=1e-15)
    np.testing.assert_allclose(out["c"], np.cos(0.5), rtol=1e-15)
    with pytest.raises(Exception, match="negative input"):
        jax.block_until_ready(
            jax.jit(fast, static_argnums=2)(jnp.asarray(-1.0), 2.0, "static"))


# -- the own RK4 loop ----------------------------------------------------------------


def _both(fn):
    """`fn(solver)` with simulate's own RK4 loop and with diffrax.diffeqsolve."""
    return fn(cdiff.RK4()), fn(cdiff.RK4(fast_paths=False))


# Save times off the step grid, on it, repeated, at t0 and at t1.
TS = np.array([0.0, 0.013, 0.1, 0.1, 0.155, 0.299, 0.3])
SAVES = {
    "default": None,  # t0 and steps
    "t1": cdiff.SaveAt(t1=True),
    "steps-t1": cdiff.SaveAt(steps=True, t1=True),
    "ts": cdiff.SaveAt(ts=TS),
    "t0-ts-t1": cdiff.SaveAt(t0=True, ts=TS, t1=True),
}


@pytest.mark.parametrize("save", list(SAVES))
def test_own_loop_matches_diffrax(save):
    q0, v0 = MODEL.initial_state()

    def run(solver):
        return cdiff.simulate(MODEL, UK, q0, v0, t1=0.3, dt=0.01, solver=solver,
                              saveat=SAVES[save], max_steps=36)

    own, general = _both(run)
    assert own.q.shape == general.q.shape
    np.testing.assert_array_equal(np.asarray(own.ts), np.asarray(general.ts))
    # The same arithmetic (stages, weights, Hermite interpolant): measured equal.
    np.testing.assert_array_equal(np.asarray(own.q), np.asarray(general.q))
    np.testing.assert_array_equal(np.asarray(own.v), np.asarray(general.v))
    # Unused rows (max_steps > 30 steps) are inf in both.
    assert np.array_equal(np.isinf(own.q), np.isinf(general.q))
    assert int(own.stats["num_steps"]) == int(general.stats["num_steps"]) == 30
    assert own.result == general.result == cdiff.RESULTS.successful


def _route(monkeypatch):
    """The names of the routes `simulate` takes from now on."""
    routes = []
    choose = _simulate.choose_route

    def spy(*args, **kwargs):
        route = choose(*args, **kwargs)
        routes.append(type(route).__name__)
        return route

    monkeypatch.setattr(_simulate, "choose_route", spy)
    return routes


def test_own_loop_save_times_traced_and_differentiated(monkeypatch):
    """Save times traced under jit (here an argument; as `jnp.array` inside a jitted
    function) are interpolated by every step of the own loop: the same rows as
    concrete ones, and the same gradient as diffrax."""
    routes = _route(monkeypatch)
    model = cdiff.models.ParticleOnCircle(g=9.81, speed=0.0)
    q0, v0 = model.initial_state()
    ts = TS / 0.3 * 0.5

    def run(ts, g, solver=None):
        model = cdiff.models.ParticleOnCircle(g=g, speed=0.0)
        return cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=0.5, dt=0.02,
                              saveat=cdiff.SaveAt(ts=ts, t1=True), solver=solver)

    concrete = run(jnp.asarray(ts), 9.81)
    traced = jax.jit(run)(jnp.asarray(ts), 9.81)
    assert routes == ["OwnRK4Route", "OwnRK4Route"]
    np.testing.assert_array_equal(np.asarray(traced.ts), np.append(ts, 0.5))
    np.testing.assert_array_equal(np.asarray(traced.q), np.asarray(concrete.q))

    def grad(solver):
        return jax.jit(lambda ts, g: jax.grad(
            lambda g: jnp.sum(run(ts, g, solver).q[:-1, 1] ** 2))(g))(
                jnp.asarray(ts), 9.81)

    own, general = _both(grad)
    assert routes[2:] == ["OwnRK4Route", "DiffraxRoute"]
    assert abs(float(general)) > 1e-2
    np.testing.assert_array_equal(own, general)  # measured equal
    # More traced times than the own loop interpolates at every step: diffrax.
    steps = _routes._own_loop_steps
    many = jnp.linspace(0.0, 0.5, _routes._TRACED_SAVE_TIMES + 1)
    seen = []
    jax.jit(lambda t: seen.append([steps(cdiff.RK4(), diffrax.ConstantStepSize(),
                                         cdiff.SaveAt(ts=x), None, 25,
                                         (0.0, 0.5, 0.02)) for x in (t, t[:16])])
            or t)(many)
    assert seen == [[None, 25]]


@pytest.mark.parametrize("ts, match", [
    ([0.2, 0.1], "must be sorted; ts\\[0\\] = 0.2 > ts\\[1\\] = 0.1"),
    ([-0.1, 0.1], "must lie in \\[t0, t1\\]"),
    ([0.1, 0.31], "must lie in \\[t0, t1\\]"),
    ([0.1, np.nan], "non-finite"),
])
def test_save_times_checked_before_tracing(ts, match):
    q0, v0 = MODEL.initial_state()
    with pytest.raises(ValueError, match=match):
        cdiff.simulate(MODEL, UK, q0, v0, t1=0.3, dt=0.01,
                       saveat=cdiff.SaveAt(ts=jnp.asarray(ts)))


def test_own_loop_progress_bar(monkeypatch, capfd):
    """A progress bar on the own loop: the same numbers, one bar for a vmapped
    batch, updated after each block of steps."""
    routes = _route(monkeypatch)
    q, v = _states(4)

    def run(q0, v0, progress):
        return cdiff.simulate(MODEL, UK, q0, v0, t1=0.3, dt=0.01, progress=progress,
                              saveat=cdiff.SaveAt(t1=True)).q[-1]

    quiet = jax.vmap(lambda q0, v0: run(q0, v0, False))(q, v)
    capfd.readouterr()
    shown = jax.vmap(lambda q0, v0: run(q0, v0, True))(q, v)
    err = capfd.readouterr().err
    assert routes == ["OwnRK4Route", "OwnRK4Route"]
    np.testing.assert_array_equal(np.asarray(shown), np.asarray(quiet))
    assert err.count("100.00%") >= 1 and "0.00%" in err
    # 30 steps in 6 blocks of 5: a refresh per block, for the whole batch.
    assert 5 <= err.count("%|") <= 10


def test_own_loop_long_solve_checkpoints_blocks(monkeypatch):
    """Beyond `checkpoint_every_step` steps (16 here), reverse mode keeps one state
    per block and recomputes the block's steps: the same gradient as one state per
    step and as diffrax (whose default adjoint then takes sqrt(n) checkpoints)."""
    q0, v0 = cdiff.models.ParticleOnCircle(g=9.81, speed=0.0).initial_state()

    def grad(solver=None):  # a new function each time: traced with the current bounds
        def loss(g):
            model = cdiff.models.ParticleOnCircle(g=g, speed=0.0)
            sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=0.5,
                                 dt=0.02, saveat=cdiff.SaveAt(t1=True), solver=solver)
            return sol.q[-1, 1]
        return jax.jit(jax.grad(loss))(9.81)

    per_step = grad()
    routes = _route(monkeypatch)
    blocks = dict(checkpoint_every_step=16, keep_stages=0)
    own = grad(cdiff.RK4(**blocks))
    general = grad(cdiff.RK4(fast_paths=False, **blocks))
    assert routes == ["OwnRK4Route", "DiffraxRoute"]
    assert abs(float(per_step)) > 1e-2
    np.testing.assert_allclose(own, per_step, rtol=5e-16)  # measured 1.6e-16
    # Two programs: equal with XLA's default fusion emitter, 3.3e-16 apart (1.5
    # ulp) with the suite's (conftest.py).
    np.testing.assert_allclose(own, general, rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="checkpoint_every_step must be an int"):
        cdiff.RK4(checkpoint_every_step=-1)


@pytest.mark.parametrize("save", ["default", "t1", "ts"])
def test_own_loop_failure_as_diffrax(save):
    def run(solver):
        return cdiff.simulate(Exploding(), cdiff.Lagrange(), jnp.zeros(2),
                              jnp.zeros(2), t1=2.0, dt=0.1, throw=False,
                              saveat=SAVES[save], solver=solver)

    own, general = _both(run)
    assert own.result == general.result == cdiff.RESULTS.nonfinite
    assert int(own.stats["num_steps"]) == int(general.stats["num_steps"]) < 20
    np.testing.assert_array_equal(np.asarray(own.ts), np.asarray(general.ts))
    # (Interpolated rows within an ulp: 3.8e16 against 3.8e16 + 24.)
    np.testing.assert_allclose(np.asarray(own.q), np.asarray(general.q),
                               rtol=0 if save != "ts" else 1e-15)
    with pytest.raises(RuntimeError, match="Nonfinite"):
        cdiff.simulate(Exploding(), cdiff.Lagrange(), jnp.zeros(2), jnp.zeros(2),
                       t1=2.0, dt=0.1)


def test_own_loop_forward_and_reverse_mode_agree():
    # Both through the own loop: reverse mode by the discrete adjoint (default),
    # forward mode through the plain scan (adjoint=ForwardMode()); their agreement
    # with finite differences is tests/solvers/test_gradients.py's subject.
    q0, v0 = MODEL.initial_state()

    def loss(g, length, adjoint=None, solver=None):
        model = cdiff.models.SliderCrank(g=g, l=length)
        sol = cdiff.simulate(model, cdiff.Lagrange(), q0, v0, t1=0.2, dt=0.01,
                             saveat=cdiff.SaveAt(t1=True), adjoint=adjoint,
                             solver=solver)
        return model.slider(sol.q[-1])

    def plain(g, length, solver=None):
        return loss(g, length, diffrax.ForwardMode(), solver)

    reverse = jax.jit(jax.grad(loss, argnums=(0, 1)))(9.81, 1.0)
    forward = jax.jit(jax.jacfwd(plain, argnums=(0, 1)))(9.81, 1.0)
    np.testing.assert_allclose(forward, reverse, rtol=5e-16)  # measured 1.4e-16
    assert all(abs(float(x)) > 1e-4 for x in reverse)
    # The discrete adjoint against JAX's reverse mode of the plain scan, storing
    # every stage's input or one state per step: the same derivative.
    for keep in (4096, 0):
        scan = jax.jit(jax.grad(plain, argnums=(0, 1)))(9.81, 1.0,
                                                       cdiff.RK4(keep_stages=keep))
        np.testing.assert_allclose(scan, reverse, rtol=5e-16)
    # Forward mode with the default (reverse-mode) adjoint is refused by name.
    with pytest.raises(TypeError, match="adjoint=diffrax.ForwardMode"):
        jax.jacfwd(loss)(9.81, 1.0)


def test_adjoint_loop_is_reverse_mode_of_its_loop():
    # `adjoint_loop` (the replay of an event step's recorded changes: a count known
    # only at run time) against JAX's reverse mode of the same steps unrolled for a
    # concrete count: values and derivatives (closed-over and initial carry), alone
    # and in a batch of different counts.
    # private on purpose: the event route's internal replay loop (no public name)
    from cdiff._solver.adjoint import adjoint_loop

    xs = jnp.linspace(0.1, 0.8, 6)

    def step(theta):
        def f(c, x):
            a, b = c
            return jnp.sin(theta * a) + x * b, b * jnp.cos(x + a) + theta
        return f

    def looped(theta, c0, count):
        return sum(adjoint_loop(step(theta), c0, xs, count))

    def unrolled(theta, c0, count):
        c = c0
        for i in range(count):
            c = step(theta)(c, xs[i])
        return sum(c)

    c0 = (jnp.asarray(0.3), jnp.asarray(-0.2))
    grad = jax.jit(jax.value_and_grad(looped, argnums=(0, 1)))
    for count in (0, 1, 4, 6):
        value, (d_theta, d_c0) = grad(0.7, c0, jnp.asarray(count))
        ref_value, (ref_theta, ref_c0) = jax.value_and_grad(unrolled, argnums=(0, 1))(
            0.7, c0, count)
        np.testing.assert_allclose(value, ref_value, rtol=1e-15)
        np.testing.assert_allclose(d_theta, ref_theta, rtol=1e-14)
        np.testing.assert_allclose(d_c0, ref_c0, rtol=1e-14)
    counts = jnp.asarray([1, 4, 6])
    batch = jax.jit(jax.grad(lambda th: jnp.sum(jax.vmap(
        lambda n: looped(th, c0, n))(counts))))(0.7)
    ref = sum(jax.grad(unrolled)(0.7, c0, int(n)) for n in counts)
    np.testing.assert_allclose(batch, ref, rtol=1e-14)
    assert abs(float(ref)) > 0.1


def test_own_loop_only_for_plain_constant_rk4():
    steps = _routes._own_loop_steps
    constant = diffrax.ConstantStepSize()
    plain = cdiff.SaveAt(t0=True, steps=True)
    times = (0.0, 1.0, 0.1)
    assert steps(cdiff.RK4(), constant, plain, None, 10, times) == 10
    assert steps(cdiff.RK4(), constant, cdiff.SaveAt(ts=jnp.linspace(0, 1, 3)), None,
                 10, times) == 10
    # Anything else goes to diffrax.diffeqsolve.
    assert steps(diffrax.Tsit5(), constant, plain, None, 10, times) is None
    assert steps(cdiff.RK4(fast_paths=False), constant, plain, None, 10, times) is None
    projected = cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())
    assert steps(projected, constant, plain, None, 10, times) is None
    assert steps(cdiff.RK4(), constant, plain, diffrax.ForwardMode(), 10,
                 times) == 10
    assert steps(cdiff.RK4(), constant, plain, diffrax.RecursiveCheckpointAdjoint(),
                 10, times) is None
    assert steps(cdiff.RK4(), constant, cdiff.SaveAt(dense=True), None, 10,
                 times) is None
    assert steps(cdiff.RK4(), constant, cdiff.SaveAt(steps=2), None, 10,
                 times) is None
    # Save times and steps together: diffrax saves them in the order of time.
    assert steps(cdiff.RK4(), constant, cdiff.SaveAt(ts=jnp.linspace(0, 1, 3),
                                                     steps=True), None, 10,
                 times) is None
    assert steps(cdiff.RK4(), diffrax.PIDController(rtol=1e-6, atol=1e-6), plain,
                 None, 10, times) is None
    # A step size traced (vmap over dt): the number of steps is not known.
    seen = []
    jax.jit(lambda dt: seen.append(steps(cdiff.RK4(), constant, plain, None,
                                         10, (0.0, 1.0, dt))) or dt)(0.1)
    assert seen == [None]
    # Fewer max_steps than steps: diffrax reports the failure.
    assert steps(cdiff.RK4(), constant, plain, None, 9, times) is None
    # Long solves stay in the own loop (one checkpoint per block in reverse mode).
    many = (0.0, 1.0, 1.0 / 20_000)
    assert steps(cdiff.RK4(), constant, plain, None, 20_000, many) == 20_000


def test_blocks_and_save_plan():
    # private on purpose: the own RK4 loop's internal blocking and save plan
    from cdiff._solver.rk4 import blocks_of, save_plan

    assert blocks_of(100, nested=False) == (1, 100)
    assert blocks_of(100, nested=True) == (10, 10)
    for n in (3, 97, 101, 30_000, 65_537):
        blocks, block = blocks_of(n, nested=True)
        assert blocks * block >= n
        assert blocks * block - n <= max(block, n // 16)
    # Each save time is interpolated in the step (t_k, t_k+1] that holds it.
    plan = save_plan(TS, 0.0, 0.3, 30, 6, 5)
    steps_of = [next(k for k, row in enumerate(plan.per_step) if i in row)
                for i in range(len(TS))]
    grid = 0.3 * (np.arange(31) / 30)
    for t, k in zip(TS, steps_of):
        assert grid[k] < t <= grid[k + 1] or (t == 0.0 and k == 0)
    assert [steps_of[i] for i in (0, 1, 4, 5, 6)] == [0, 1, 15, 29, 29]
    assert plan.per_step.shape == (30, 2)  # two times in one step (0.1, 0.299-0.3)


def test_energy_error_against_the_initial_state_when_t0_is_not_saved():
    """`max_energy_error` compares with E(t0, q0, v0) (`Solution.energy0`), not with
    the first saved row, which is E(t1) when only t1 is saved."""
    q0, v0 = MODEL.initial_state()
    every = cdiff.simulate(MODEL, cdiff.UdwadiaKalaba(), q0, v0, t1=0.3, dt=0.01)
    last = cdiff.simulate(MODEL, cdiff.UdwadiaKalaba(), q0, v0, t1=0.3, dt=0.01,
                          saveat=cdiff.SaveAt(t1=True))
    e0 = float(MODEL.energy(0.0, q0, v0))
    assert float(last.energy0) == e0 == float(every.energy[0])
    drift = abs(float(every.energy[-1]) - e0)
    assert drift > 1e-9  # UK without energy correction drifts
    # The same steps in both runs: measured equal.
    assert float(last.max_energy_error) == drift
