"""cdiff.studies.tune and cdiff.studies.identify: gradient descent through simulate."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cdiff


class _AngleTracker(eqx.Module):
    """Computed-torque PD control of the pendulum angle (R1 with gravity, unit mass
    and radius) toward phi_d(t) = 0.5 sin(2t), as a tangential force: the error
    follows e'' + kd e' + kp e = 0 from e'(0) = -1; the gains are the fields."""

    kp: jax.Array
    kd: jax.Array

    def __call__(self, t, q, v):
        phi = jnp.arctan2(q[1], q[0])
        omega = q[0] * v[1] - q[1] * v[0]
        e = 0.5 * jnp.sin(2 * t) - phi
        de = jnp.cos(2 * t) - omega
        tangent = jnp.stack([-q[1], q[0]])
        # Feed-forward of phi_d'' and of gravity's tangential part (g cos phi).
        acc = -2 * jnp.sin(2 * t) + self.kp * e + self.kd * de
        return (acc + 9.81 * jnp.cos(phi)) * tangent


def _tracking_loss(controller):
    model = cdiff.models.ParticleOnCircle(g=9.81, speed=0.0)
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 3.0, 61)
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=3.0, dt=1e-2,
                         control=controller, saveat=cdiff.SaveAt(ts=ts))
    phi = jnp.arctan2(sol.q[:, 1], sol.q[:, 0])
    return jnp.mean((phi - 0.5 * jnp.sin(2 * ts)) ** 2)


def test_tune_lowers_a_tracking_loss_tenfold():
    start = _AngleTracker(jnp.asarray(1.0), jnp.asarray(0.2))  # a poor start
    fit = cdiff.studies.tune(_tracking_loss, start, optax.adam(0.3), steps=20,
                             progress=False)
    assert fit.history.shape == (21,)
    assert fit.history[-1] < fit.history[0] / 10, fit.history[[0, -1]]
    # Stiffer gains track better: both grew.
    assert float(fit.params.kp) > 1.0 and float(fit.params.kd) > 0.2


def test_identify_slider_crank_mass_and_length_from_noisy_data():
    # The mass cancels from gravity-driven motion; a known torque on the crank
    # (generalized force on theta1) makes it observable.
    torque = jnp.zeros(6).at[2].set(2.0)
    ts = jnp.linspace(0.0, 2.0, 41)

    def observe(model):
        q0, v0 = model.initial_state()
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=2.0, dt=1e-2,
                             control=lambda t, q, v: torque,
                             saveat=cdiff.SaveAt(ts=ts))
        return model.observable(sol.q)[:, 0]

    truth = cdiff.models.SliderCrank(m=1.0, l=1.0)
    clean = observe(truth)
    noise = 0.01 * jnp.std(clean) * jax.random.normal(jax.random.key(0), clean.shape)
    guess = cdiff.models.SliderCrank(m=1.3, l=0.85)
    fit = cdiff.studies.identify(observe, guess, ["m", "l"], clean + noise,
                                 optax.adam(5e-2), steps=80, progress=False)
    assert abs(float(fit.params.m) - 1.0) < 0.01, float(fit.params.m)
    assert abs(float(fit.params.l) - 1.0) < 0.01, float(fit.params.l)
    # Down to the noise: 1% noise is 1e-4 of the data's variance.
    assert fit.history[-1] < 2e-4


def test_bad_arguments():
    model = cdiff.models.SliderCrank()
    with pytest.raises(ValueError, match="no field 'mass'"):
        cdiff.studies.identify(lambda m: jnp.zeros(3), model, ["mass"], np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        cdiff.studies.identify(lambda m: jnp.zeros(3) * m.l, model, ["l"], np.zeros(4))
    with pytest.raises(ValueError, match="steps"):
        cdiff.studies.tune(lambda p: p**2, jnp.asarray(1.0), steps=0)
    with pytest.raises(ValueError, match="no trainable"):
        cdiff.studies.tune(lambda p: 0.0, {"a": 1}, steps=1)
