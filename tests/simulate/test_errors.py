"""Bad input fails early and clearly: no silent NaN, no silent wrong answer.

Trace-time problems raise a ValueError naming the offending model method and the
shapes; run-time problems inside jit raise through `eqx.error_if` or end the solve
with a non-successful result code.
"""

import re
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Exploding, FreeParticle

import cdiff

# private on purpose: the model validator's counts (nq, m, p), read only inside cdiff
from cdiff._model import check_model

LAGRANGE = cdiff.Lagrange()


def _simulate(model, q0, v0, **kwargs):
    kwargs = {"t1": 0.1, "dt": 0.05, **kwargs}
    return cdiff.simulate(model, LAGRANGE, q0, v0, **kwargs)


# FreeParticle's subclasses below break one method at a time.


class FixedMass(FreeParticle):
    """Valid only for nq = 2: its mass matrix is always 2 x 2."""


class Holonomic2D(FreeParticle):
    def holonomic(self, t, q):
        return jnp.reshape(q, (2, 1))


class Nonholonomic2D(FreeParticle):
    def nonholonomic(self, t, q, v):
        return jnp.outer(q, v)


class WideMass(FreeParticle):
    def mass_matrix(self, t, q):
        return jnp.ones((2, 3), dtype=q.dtype)


class VectorEnergy(FreeParticle):
    def energy(self, t, q, v):
        return 0.5 * v * v


class BadForces(FreeParticle):
    def forces(self, t, q, v):
        return jnp.zeros(3, dtype=q.dtype)


class BadInput(FreeParticle):
    def input_matrix(self, t, q):
        return jnp.ones((3, 1), dtype=q.dtype)


class Raising(FreeParticle):
    def holonomic(self, t, q):
        return q[0] @ q  # a 0-d @ 1-d: fails when traced


def _raises_value_error(*needles, call):
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def test_valid_model_passes_and_counts():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    assert check_model(model, 0.0, q0, v0) == (6, 5, 0)
    assert check_model(FreeParticle(), 0.0, jnp.zeros(2), jnp.zeros(2)) == (2, 0, 0)


# --- shapes ------------------------------------------------------------------------


def test_q0_shape_does_not_match_mass_matrix():
    # SliderCrank's mass matrix is 6 x 6 whatever q is.
    model = cdiff.models.SliderCrank()
    _raises_value_error(
        "SliderCrank.mass_matrix", "(6, 6)", "(4, 4)", "(4,)",
        call=lambda: _simulate(model, jnp.zeros(4), jnp.zeros(4)),
    )
    _raises_value_error(
        "FixedMass.mass_matrix", "(2, 2)", "(3, 3)",
        call=lambda: _simulate(FixedMass(), jnp.zeros(3), jnp.zeros(3)),
    )


def test_q0_of_the_wrong_length_is_named_before_position_rate():
    """q0 of 3 entries for a model of 2 velocities that keeps q' = v: the message
    names q0's shape and the model's velocities, not position_rate."""
    msg = _raises_value_error(
        "q0 has shape (3,)", "nv = 2", "q0 must have shape (2,)",
        call=lambda: _simulate(FixedMass(), jnp.zeros(3), jnp.zeros(2)))
    assert "must override position_rate" not in msg


class CircleParticle(FreeParticle):
    def holonomic(self, t, q):
        return jnp.array([q @ q - 1.0])


@pytest.mark.parametrize("q0, v0, saveat, words", [
    ([2.0, 0.0], [0.0, 0.0], None, "max |Phi(t0, q0)| = 3 (positions)"),
    ([1.0, 0.0], [1.0, 0.0], cdiff.SaveAt(t1=True), "= 2 (velocities)"),
])
def test_a_start_off_the_constraints_is_named(q0, v0, saveat, words):
    """A start off the circle, or moving off it: the run keeps that error, so it is
    named with the residual and consistent_state as the fix (read from the saved
    t0 row, or evaluated where t0 is not saved). A consistent start says
    nothing."""
    with pytest.warns(UserWarning, match="consistent_state") as caught:
        _simulate(CircleParticle(), jnp.array(q0), jnp.array(v0), saveat=saveat)
    assert words in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _simulate(CircleParticle(), jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]),
                  saveat=saveat)


def test_v0_shape_differs_from_q0():
    model = cdiff.models.SliderCrank()
    q0, _ = model.initial_state()
    _raises_value_error("v0", "(6,)", "(5,)",
                        call=lambda: _simulate(model, q0, jnp.zeros(5)))
    _raises_value_error("v0", "(2,)", "(2, 1)",
                        call=lambda: _simulate(FreeParticle(), jnp.zeros(2),
                                               jnp.zeros((2, 1))))


def test_q0_not_1d():
    _raises_value_error("q0", "1-D", "(1, 2)",
                        call=lambda: _simulate(FreeParticle(), jnp.zeros((1, 2)),
                                               jnp.zeros((1, 2))))


@pytest.mark.parametrize(
    "model, needles",
    [
        (Holonomic2D(), ["Holonomic2D.holonomic", "1-D", "(2, 1)"]),
        (Nonholonomic2D(), ["Nonholonomic2D.nonholonomic", "1-D", "(2, 2)"]),
        (WideMass(), ["WideMass.mass_matrix", "(2, 3)", "(2, 2)"]),
        (VectorEnergy(), ["VectorEnergy.energy", "scalar", "(2,)"]),
        (BadForces(), ["BadForces.forces", "(3,)", "(2,)"]),
        (BadInput(), ["BadInput.input_matrix", "(3, 1)"]),
        (Raising(), ["Raising.holonomic", "(2,)"]),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, cdiff.AbstractModel) else "",
)
def test_bad_model_method(model, needles):
    _raises_value_error(*needles,
                        call=lambda: _simulate(model, jnp.zeros(2), jnp.zeros(2)))


def test_formulation_type_checked():
    with pytest.raises(TypeError, match="formulation"):
        cdiff.simulate(FreeParticle(), "lagrange", jnp.zeros(2), jnp.zeros(2),
                       t1=1.0, dt=0.1)


# --- non-finite values -------------------------------------------------------------


@pytest.mark.parametrize("which", ["q0", "v0"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_initial_state(which, bad):
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    if which == "q0":
        q0 = q0.at[2].set(bad)
    else:
        v0 = v0.at[4].set(bad)
    msg = _raises_value_error(which, "non-finite",
                              call=lambda: _simulate(model, q0, v0))
    assert re.search(r"nan|inf", msg, re.IGNORECASE)


def test_nan_model_field():
    model = cdiff.models.SliderCrank(m=float("nan"))
    q0, v0 = cdiff.models.SliderCrank().initial_state()
    _raises_value_error("SliderCrank", ".m", "non-finite",
                        call=lambda: _simulate(model, q0, v0))


# --- times and step sizes ----------------------------------------------------------


@pytest.mark.parametrize("dt", [0.0, -0.1, float("inf"), float("nan")])
def test_nonpositive_dt(dt):
    _raises_value_error("dt", "positive",
                        call=lambda: _simulate(FreeParticle(), jnp.zeros(2),
                                               jnp.zeros(2), dt=dt))


@pytest.mark.parametrize("dtype, t0", [(jnp.float32, 1e5), (jnp.float64, 1e13)])
def test_dt_below_the_time_resolution_at_t0(dtype, t0):
    """float32 times near 1e5 are 0.0078 apart, float64 ones near 1e13 0.002: steps
    of 1e-3 cannot be represented there, some round to zero length (the solve ended
    as "non-finite values" with ts = [t0, t0])."""
    q0 = jnp.zeros(2, dtype)
    with pytest.raises(ValueError, match="below the time resolution") as info:
        _simulate(FreeParticle(), q0, q0, t0=t0, t1=t0 + 1.0, dt=1e-3)
    assert "t0 = 0" in str(info.value) and f"{np.dtype(dtype).name}" in str(info.value)
    # Control: the same step from t0 = 0 runs.
    assert _simulate(FreeParticle(), q0, q0, t1=0.01, dt=1e-3).succeeded


@pytest.mark.parametrize("t1", [0.0, -1.0])
def test_t1_not_after_t0(t1):
    _raises_value_error("t1", "t0",
                        call=lambda: _simulate(FreeParticle(), jnp.zeros(2),
                                               jnp.zeros(2), t1=t1))
    _raises_value_error("t1", "t0",
                        call=lambda: _simulate(FreeParticle(), jnp.zeros(2),
                                               jnp.zeros(2), t0=2.0, t1=t1 + 2.0))


def test_nonfinite_t1():
    _raises_value_error("finite",
                        call=lambda: _simulate(FreeParticle(), jnp.zeros(2),
                                               jnp.zeros(2), t1=float("inf")))


def _free_run(q0, dt, t1):
    return cdiff.simulate(FreeParticle(), LAGRANGE, q0, jnp.ones(2), t1=t1, dt=dt,
                          max_steps=4).q


# One compiled batch of two runs serves every traced-input check below. Under
# `eqx.filter_jit` a failed `eqx.error_if` raises `eqx.EquinoxRuntimeError`.
_traced_runs = eqx.filter_jit(jax.vmap(_free_run))
_GOOD = dict(q0=jnp.zeros((2, 2)), dt=jnp.asarray([0.05, 0.1]),
             t1=jnp.asarray([0.2, 0.2]))


def test_traced_dt_needs_max_steps():
    def run(dt):
        return cdiff.simulate(FreeParticle(), LAGRANGE, jnp.zeros(2), jnp.ones(2),
                              t1=0.2, dt=dt).q

    with pytest.raises(ValueError, match="max_steps"):
        jax.vmap(run)(jnp.asarray([0.05, 0.1]))
    with pytest.raises(ValueError, match="max_steps"):
        jax.jit(run)(jnp.asarray(0.1))
    # With it, the same computation works: the free particle moves at unit speed.
    q = _traced_runs(**_GOOD)
    assert q.shape == (2, 5, 2)
    # RK4 is exact for free motion, and the steps reach 0.2 (measured: exactly).
    np.testing.assert_array_equal(q[0, -1], [0.2, 0.2])
    np.testing.assert_array_equal(q[1, 2], [0.2, 0.2])
    assert np.all(np.isinf(np.asarray(q[1, 3:])))  # unused rows


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(dt=jnp.asarray([0.05, -0.1])), "dt must be positive"),
        (dict(dt=jnp.asarray([0.05, 0.0])), "dt must be positive"),
        (dict(dt=jnp.asarray([0.05, jnp.inf])), "dt must be positive and finite"),
        (dict(t1=jnp.asarray([0.2, -1.0])), "t1 must be greater than t0"),
        (dict(q0=jnp.asarray([[0.0, 0.0], [jnp.nan, 0.0]])), "initial state"),
        (dict(q0=jnp.asarray([[0.0, jnp.inf], [0.0, 0.0]])), "initial state"),
    ],
)
def test_traced_bad_input_inside_jit(bad, match):
    with pytest.raises(eqx.EquinoxRuntimeError, match=match):
        jax.block_until_ready(_traced_runs(**{**_GOOD, **bad}))


# --- run-time failures -------------------------------------------------------------


class Shrinking(cdiff.AbstractModel):
    """M = diag(1, 1 - rate t): positive definite only until t = 1 / rate."""

    rate: float = 1.0

    def mass_matrix(self, t, q):
        d = jnp.stack([jnp.ones_like(t), 1 - self.rate * t])
        return jnp.diag(d).astype(q.dtype)


# Under plain `jax.jit` the same failure surfaces as `jax.errors.JaxRuntimeError`
# (a RuntimeError) on the first call but as a ValueError once the function has
# run successfully and JAX dispatches it through its C++ fast path (jax 0.10).
JIT_RUNTIME_ERRORS = (RuntimeError, ValueError)


@jax.jit
def _shrinking(model):
    return cdiff.simulate(model, LAGRANGE, jnp.zeros(2), jnp.ones(2), t1=2.0,
                          dt=0.1).q


def test_mass_matrix_loses_definiteness_inside_jit():
    # Control: while M stays positive definite (t < 1/rate = 4) all is well.
    q = _shrinking(Shrinking(rate=0.25))
    assert np.all(np.isfinite(np.asarray(q)))
    with pytest.raises(JIT_RUNTIME_ERRORS) as info:
        jax.block_until_ready(_shrinking(Shrinking(rate=1.0)))
    msg = str(info.value)
    assert "positive definite" in msg and "Shrinking.mass_matrix" in msg


def test_mass_matrix_loses_definiteness_eagerly():
    """An eager solve is compiled with its model checks returning a result code (no
    host callback, so that JAX's persistent cache keeps it); a solve ended by one
    is run again with the checks raising, which names the cause."""
    with pytest.raises(RuntimeError, match="positive definite") as info:
        cdiff.simulate(Shrinking(rate=1.0), LAGRANGE, jnp.zeros(2), jnp.ones(2),
                       t1=2.0, dt=0.1)
    assert "Shrinking.mass_matrix" in str(info.value)
    sol = cdiff.simulate(Shrinking(rate=1.0), LAGRANGE, jnp.zeros(2), jnp.ones(2),
                         t1=2.0, dt=0.1, throw=False)
    assert sol.result == cdiff.RESULTS.nonfinite


class IndefiniteOnCircle(cdiff.AbstractModel):
    """A point on the unit circle whose mass matrix diag(1, -1) is indefinite."""

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.array([1.0, -1.0], q.dtype))

    def holonomic(self, t, q):
        return jnp.atleast_1d(q @ q - 1.0)


@pytest.mark.parametrize("projection", [
    cdiff.NewtonProjection(mass_weighted=True), cdiff.GradientProjection(metric="mass")],
    ids=["newton", "gradient"])
def test_projection_mass_check_follows_throw(projection):
    """A mass-weighted projection checks the mass matrix: with `throw` (the
    default, as in `simulate`) a failed check raises naming the model; without,
    it returns NaN, which `simulate(..., throw=False)` reports as a result code."""
    model, q = IndefiniteOnCircle(), jnp.array([1.1, 0.2])
    with pytest.raises(JIT_RUNTIME_ERRORS, match="IndefiniteOnCircle.mass_matrix"):
        jax.block_until_ready(projection.position(model, 0.0, q))
    assert np.all(np.isnan(np.asarray(projection.position(model, 0.0, q, throw=False))))
    plain = cdiff.NewtonProjection(iterations=6).position(model, 0.0, q)  # no mass
    assert abs(float(plain @ plain) - 1.0) < 1e-12


class Skewed(cdiff.AbstractModel):
    """M = [[2, skew], [0, 2]]: symmetric only for skew = 0."""

    skew: float = 0.0

    def mass_matrix(self, t, q):
        return jnp.array([[2.0, self.skew], [0.0, 2.0]], dtype=q.dtype)


@pytest.mark.parametrize("formulation", [cdiff.UdwadiaKalaba(), cdiff.Projection()],
                         ids=["udwadia-kalaba", "projection"])
def test_non_symmetric_mass_matrix_is_refused(formulation):
    run = eqx.filter_jit(lambda model: cdiff.simulate(
        model, formulation, jnp.zeros(2), jnp.ones(2), t1=0.2, dt=0.1).q)
    assert np.all(np.isfinite(np.asarray(run(Skewed(skew=0.0)))))
    with pytest.raises(eqx.EquinoxRuntimeError, match="not symmetric"):
        jax.block_until_ready(run(Skewed(skew=0.5)))


def test_model_checks_honour_throw_false():
    """With throw=False a mass matrix that loses definiteness, or NullSpace's basis
    losing rank, ends the solve with a result code instead of raising."""
    sol = cdiff.simulate(Shrinking(rate=1.0), LAGRANGE, jnp.zeros(2), jnp.ones(2),
                         t1=2.0, dt=0.1, throw=False)
    assert sol.result == cdiff.RESULTS.nonfinite
    ts = np.asarray(sol.ts)
    assert ts[np.isfinite(ts)].max() < 1.0 + 1e-12  # M is singular at t = 1
    # NullSpace: the slider-crank at dt = 0.5 loses the basis' rank (it raised).
    model = cdiff.models.SliderCrank()
    sol = cdiff.simulate(model, cdiff.NullSpace(), *model.initial_state(), t1=50.0,
                         dt=0.5, throw=False)
    assert sol.result == cdiff.RESULTS.nonfinite


def test_blow_up_raises():
    with pytest.raises(RuntimeError, match="Nonfinite"):
        cdiff.simulate(Exploding(), LAGRANGE, jnp.zeros(2), jnp.zeros(2),
                       t1=2.0, dt=0.1)


@jax.jit
def _exploding_no_throw(model):
    return cdiff.simulate(model, LAGRANGE, jnp.zeros(2), jnp.zeros(2),
                          t1=2.0, dt=0.1, throw=False)


def test_blow_up_without_throw_reports_result():
    sol = _exploding_no_throw(Exploding(rate=1000.0))
    assert sol.result != cdiff.RESULTS.successful
    assert sol.result == cdiff.RESULTS.nonfinite
    assert "Nonfinite" in sol.message and not bool(sol.succeeded)
    # Control: a mild force runs to the end and reports success.
    ok = _exploding_no_throw(Exploding(rate=1.0))
    assert ok.message == "" and ok.result == cdiff.RESULTS.successful
    assert bool(ok.succeeded)
    # Results print under their public name, a success as such.
    assert repr(ok.result) == "cdiff.RESULTS<successful>"
    assert repr(sol.result).startswith("cdiff.RESULTS<Nonfinite")
    # A batch's messages: '' for the successes.
    both = jax.vmap(_exploding_no_throw)(Exploding(rate=jnp.array([1.0, 1000.0])))
    assert both.message.startswith("['' 'Nonfinite")
    assert np.all(np.isfinite(np.asarray(ok.q)))
    # x'' = e^t from rest: x(2) = e^2 - 1 - 2 (RK4, dt = 0.1).
    np.testing.assert_allclose(ok.q[-1], np.full(2, np.exp(2.0) - 3.0), rtol=1e-6)


def test_energy_correction_refuses_a_controller():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    with pytest.raises(ValueError, match="energy_correction"):
        cdiff.simulate(model, cdiff.UdwadiaKalaba(energy_correction=True), q0, v0,
                       t1=0.1, dt=1e-2, control=lambda t, q, v: jnp.zeros(6))


# -- finite blow-ups: the divergence test --------------------------------------------

# R2 with Udwadia-Kalaba at dt = 0.4, far above RK4's stability limit: the state is
# finite at t = 3.2 s but of size 3e99 (measured), non-finite one step later; its
# constraint residuals exceed 1e8 from t = 2.8 s.
_R2 = cdiff.models.SliderCrank()
_BLOW_UP = {"t1": 3.2, "dt": 0.4}


@pytest.mark.parametrize(("saveat", "first"),
                         [(None, 2.8), (cdiff.SaveAt(ts=jnp.array([1.0, 3.2])), 3.2)],
                         ids=["own-loop", "diffrax"])
def test_finite_blow_up_is_reported_as_diverged(saveat, first):
    q0, v0 = _R2.initial_state()
    kw = {**_BLOW_UP, "saveat": saveat, "throw": False}
    off = cdiff.simulate(_R2, cdiff.UdwadiaKalaba(), q0, v0, divergence=None, **kw)
    # What a blow-up looked like before the test: finite garbage, "success".
    assert off.message == "" and np.isfinite(np.asarray(off.q)).all()
    assert np.abs(np.asarray(off.q)).max() > 1e90
    sol = cdiff.simulate(_R2, cdiff.UdwadiaKalaba(), q0, v0, **kw)
    assert sol.result == cdiff.RESULTS.diverged and not bool(sol.succeeded)
    assert "diverged" in sol.message and f"First at t = {first} s" in sol.message
    # A grid time, 3.2 * (7 / 8): measured 4.4e-16, one ulp of 2.8 (0 at t1 = 3.2).
    assert float(sol.stats["t_diverged"]) == pytest.approx(first, rel=6e-16, abs=0)
    with pytest.raises(RuntimeError, match="diverged"):
        cdiff.simulate(_R2, cdiff.UdwadiaKalaba(), q0, v0,
                       **{**kw, "throw": True})


def test_divergence_per_trajectory_under_vmap():
    q0, v0 = _R2.initial_state()

    @jax.jit
    def run(dt):
        return cdiff.simulate(_R2, cdiff.UdwadiaKalaba(), q0, v0, t1=3.2, dt=dt,
                              max_steps=64, throw=False)

    sol = jax.vmap(run)(jnp.array([0.05, 0.4]))
    assert np.array_equal(np.asarray(sol.succeeded), [True, False])
    assert np.array_equal(np.asarray(sol.result == cdiff.RESULTS.diverged),
                          [False, True])
    t_div = np.asarray(sol.stats["t_diverged"])
    # A grid time, 3.2 * (7 / 8): measured 4.4e-16, one ulp of 2.8.
    assert np.isinf(t_div[0]) and t_div[1] == pytest.approx(2.8, rel=6e-16, abs=0)


def test_divergence_test_in_the_bdf_route_and_bad_values():
    model = cdiff.models.ParticleOnCircle()
    q0, v0 = model.initial_state()
    kw = {"t1": 0.1, "dt": 1e-3, "solver": cdiff.BDF(1e-8, 1e-8), "throw": False}
    assert cdiff.simulate(model, cdiff.GGL(), q0, v0, **kw).message == ""
    # |q| = 1 already exceeds 0.5 times the initial size (1): diverged at t0.
    sol = cdiff.simulate(model, cdiff.GGL(), q0, v0, divergence=0.5, **kw)
    assert sol.result == cdiff.RESULTS.diverged
    assert float(sol.stats["t_diverged"]) == 0.0
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="divergence must be a positive"):
            cdiff.simulate(model, cdiff.GGL(), q0, v0, divergence=bad, **kw)


@pytest.mark.parametrize(
    "make, error, words",
    [
        # A type: named by cdiff, or first by the suite's jaxtyping hook.
        (lambda: cdiff.Lagrange("x"), TypeError, "Lagrange: `alpha` must be a real"),
        (lambda: cdiff.Lagrange(1.0, -2.0), ValueError, "`beta` must be finite and"),
        (lambda: cdiff.Lagrange(jnp.array([1.0, jnp.inf])), ValueError, "`alpha`"),
        (lambda: cdiff.NullSpace(alpha=float("nan")), ValueError, "NullSpace: `alpha`"),
        (lambda: cdiff.UdwadiaKalaba(energy_damping=-1.0), ValueError,
         "UdwadiaKalaba: `energy_damping`"),
        (lambda: cdiff.UdwadiaKalaba(rtol="tight"), TypeError, "`rtol` must be a real"),
        (lambda: cdiff.Projection(damping=-1e-3), ValueError, "Projection: `damping`"),
    ],
)
def test_bad_formulation_parameters_are_named(make, error, words):
    with pytest.raises(error) as info:
        make()
    name = re.search(r"`(\w+)`", words).group(1)
    assert words in str(info.value) or (
        error is TypeError and f"parameter '{name}'" in str(info.value))


def test_step_counts_are_checked_before_tracing():
    particle, q0, v0 = FreeParticle(), jnp.zeros(2), jnp.ones(2)
    for bad in (0, -1):  # (a float or a bool: a type error)
        with pytest.raises(ValueError, match="max_steps must be a positive integer"):
            _simulate(particle, q0, v0, max_steps=bad)
    with pytest.raises(ValueError, match=r"max_steps=3 is fewer than .* = 4 constant"):
        _simulate(particle, q0, v0, t1=0.2, max_steps=3)
    # dt = 1e-12 over 10 s: 1e13 steps, more than a loop counter holds.
    with pytest.raises(ValueError, match="more than a solve can take"):
        _simulate(particle, q0, v0, t1=10.0, dt=1e-12)
    # 1e9 saved steps would not fit in memory (they used to fail inside XLA).
    with pytest.raises(ValueError, match="GiB; raise dt, or save fewer rows"):
        _simulate(particle, q0, v0, t1=10.0, dt=1e-8)


def test_too_few_max_steps_for_a_traced_dt_is_a_result_code():
    """Under vmap over dt a short member stops at max_steps with its own result
    code; the others run (it used to fail the whole batch with a grid message)."""

    @jax.jit
    def run(dt):
        return cdiff.simulate(FreeParticle(), LAGRANGE, jnp.zeros(2), jnp.ones(2),
                              t1=0.2, dt=dt, max_steps=4, throw=False)

    sol = jax.vmap(run)(jnp.array([0.05, 0.01]))
    assert np.array_equal(np.asarray(sol.result == cdiff.RESULTS.successful),
                          [True, False])
    assert np.array_equal(np.asarray(sol.result == cdiff.RESULTS.max_steps_reached),
                          [False, True])
    # Free motion at unit speed: RK4 is exact, and four steps of 0.05 reach 0.2.
    np.testing.assert_array_equal(sol.q[0, -1], [0.2, 0.2])


def test_forward_mode_through_diffrax_names_the_adjoint():
    model = cdiff.models.ParticleOnCircle()
    q0, v0 = model.initial_state()

    def final(q0, solver=diffrax.Tsit5(), **kw):  # Tsit5: diffrax's loop
        return cdiff.simulate(model, LAGRANGE, q0, v0, t1=0.1, dt=0.05,
                              solver=solver,
                              saveat=cdiff.SaveAt(ts=jnp.array([0.1])), **kw).q[-1]

    with pytest.raises(TypeError, match=r"adjoint=diffrax\.ForwardMode\(\)"):
        jax.jacfwd(final)(q0)
    forward = jax.jacfwd(lambda q: final(q, adjoint=diffrax.ForwardMode()))(q0)
    h = 1e-6
    central = np.stack([(final(q0 + h * e) - final(q0 - h * e)) / (2 * h)
                        for e in np.eye(2)], axis=-1)
    # The central differences' round-off, ~eps_mach / h (measured 6.9e-11).
    np.testing.assert_allclose(forward, central, rtol=0, atol=2.5e-10)
    # cdiff's own RK4 loop (the default solver): reverse mode is its discrete
    # adjoint, so jax.jacfwd also needs ForwardMode (a plain scan), and says so.
    with pytest.raises(TypeError, match=r"adjoint=diffrax\.ForwardMode\(\)"):
        jax.jacfwd(lambda q: final(q, solver=None))(q0)
    own = jax.jacfwd(lambda q: final(q, solver=None,
                                     adjoint=diffrax.ForwardMode()))(q0)
    central = np.stack([(final(q0 + h * e, None) - final(q0 - h * e, None)) / (2 * h)
                        for e in np.eye(2)], axis=-1)
    np.testing.assert_allclose(own, central, rtol=0, atol=4e-10)  # measured 9.8e-11


def test_traced_dt_needs_no_max_steps_when_the_rows_do_not_depend_on_it():
    """As in diffrax: saving at given times under vmap over dt needs no max_steps
    (default 4096); a member needing more steps ends with max_steps_reached, whose
    message names max_steps, and the others are exact (a free particle) but for
    the round-off of the time steps (measured 2.8e-16 relative)."""

    def run(dt):
        return cdiff.simulate(FreeParticle(), LAGRANGE, jnp.zeros(2), jnp.ones(2),
                              t1=0.2, dt=dt, throw=False,
                              saveat=cdiff.SaveAt(ts=jnp.array([0.1, 0.2])))

    sol = jax.vmap(run)(jnp.array([0.05, 0.01, 0.2 / 5000]))
    assert np.array_equal(np.asarray(sol.result == cdiff.RESULTS.successful),
                          [True, True, False])
    assert np.asarray(sol.result == cdiff.RESULTS.max_steps_reached)[2]
    assert "max_steps" in cdiff.RESULTS[cdiff.RESULTS.max_steps_reached]
    np.testing.assert_allclose(sol.q[:2], [[[0.1, 0.1], [0.2, 0.2]]] * 2,
                               rtol=1e-15)
    # Saving every step still needs the bound, which fixes the number of rows.
    with pytest.raises(ValueError, match="max_steps"):
        jax.vmap(lambda dt: cdiff.simulate(FreeParticle(), LAGRANGE, jnp.zeros(2),
                                           jnp.ones(2), t1=0.2, dt=dt))(
            jnp.array([0.05, 0.1]))


class ParticleOnCircleWithoutEnergy(FreeParticle):
    def holonomic(self, t, q):
        return jnp.sum(q**2, keepdims=True) - 1.0


def test_energy_correction_needs_a_conservative_model_with_an_energy():
    uk = cdiff.UdwadiaKalaba(energy_correction=True)
    snakeboard = cdiff.models.Snakeboard()
    assert not snakeboard.conservative and cdiff.models.SliderCrank().conservative
    q0, v0 = snakeboard.initial_state()
    with pytest.raises(ValueError, match="Snakeboard is not conservative"):
        cdiff.simulate(snakeboard, uk, q0, v0, t1=0.1, dt=1e-2)
    with pytest.raises(ValueError, match="Snakeboard is not conservative"):
        cdiff.studies.step_size_study(snakeboard, {"UK + energy": uk}, [1e-2], 0.1,
                                      n_save=10, progress=False)
    with pytest.raises(ValueError, match="Snakeboard is not conservative"):
        cdiff.studies.gain_sweep(snakeboard, uk, {"energy_damping": [0.0, 1.0]},
                                 [1e-2], 0.1, n_save=10)
    model = ParticleOnCircleWithoutEnergy()
    assert model.energy(0.0, jnp.ones(2), jnp.ones(2)) is None
    with pytest.raises(ValueError, match="defines no energy"):
        cdiff.simulate(model, uk, jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]),
                       t1=0.1, dt=1e-2)


def test_loaded_models_declare_dissipation():
    """A MuJoCo model with damping is not conservative (MuJoCo's energy leaves the
    damping out); one without is."""
    pytest.importorskip("mujoco")
    from cdiff.models import MJCF_LIBRARY, from_mujoco

    flyball = MJCF_LIBRARY["iftomm-a05-flyball-governor"].path
    assert not from_mujoco(flyball).conservative
    assert from_mujoco(cdiff.models.mjcf_path("slider-crank-mjcf")).conservative


def test_bdf_refuses_stepwise_formulations_by_their_declaration():
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    for formulation in (cdiff.UdwadiaKalaba(), cdiff.NullSpace()):
        assert formulation.stepwise
        with pytest.raises(ValueError, match="per-step data"):
            cdiff.simulate(model, formulation, q0, v0, t1=0.1, dt=1e-2,
                           solver=cdiff.BDF())
    assert not cdiff.Lagrange().stepwise


def test_no_module_imports_the_drivers_private_names():
    """The driver's internals stay private: other modules use the setup (Problem)
    and the routes beside the solvers."""
    import ast
    import pathlib

    root = pathlib.Path(cdiff.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(
                    "_simulate"):
                offenders += [f"{path.name}: {a.name}" for a in node.names
                              if a.name.startswith("_")]
    assert not offenders


def test_study_rows_of_a_finite_blow_up_are_failures():
    """The step-size study's own loop applies simulate's divergence test: R2 at
    dt = 0.4 is finite but of size 3e99 at t = 3.2 s, and its row reads inf (it
    used to read the garbage); dt = 0.1 is a normal row."""
    study = cdiff.studies.step_size_study(
        _R2, {"UK": cdiff.UdwadiaKalaba()}, [0.4, 0.1], 3.2, n_save=8,
        time_each=False, progress=False)
    errors = np.asarray(study["max_constraint_error"])
    assert np.isinf(errors[0]) and np.isfinite(errors[1]) and errors[1] < 1e-2


def test_float32_by_default_is_said_once():
    """Without jax_enable_x64 (JAX's default, which the tests turn on) a solve runs
    in float32: the first one says so, once per process."""
    import subprocess
    import sys

    script = (
        "import warnings, jax.numpy as jnp, cdiff\n"
        "model = cdiff.models.ParticleOnCircle()\n"
        "q0, v0 = model.initial_state()\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2):\n"
        "        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=0.02,"
        " dt=1e-2)\n"
        "notes = [str(w.message) for w in caught if 'float32' in str(w.message)]\n"
        "print(sol.q.dtype, len(notes), notes[0][:40])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, check=True).stdout
    assert out.split()[:2] == ["float32", "1"], out
    assert "cdiff.simulate: simulating in float32" in out


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_is_refused_by_name(dtype):
    """It failed inside XLA ("Unsupported dtype float16") after overflow warnings."""
    q0 = jnp.zeros(2, dtype)
    with pytest.raises(ValueError, match=f"q0 has dtype {jnp.dtype(dtype).name}"):
        _simulate(FreeParticle(), q0, q0)
