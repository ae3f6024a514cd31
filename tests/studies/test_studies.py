"""cdiff.studies.tune and cdiff.studies.identify: gradient descent through simulate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cdiff


PENDULUM = cdiff.models.ParticleOnCircle(g=9.81, speed=0.0)  # R1 with gravity


def _angle(q):
    return jnp.arctan2(q[1], q[0])


def _reference(t):
    """phi_d(t) = 0.5 sin(2t) on the unit circle, with its derivatives."""
    phi, dphi, ddphi = 0.5 * jnp.sin(2 * t), jnp.cos(2 * t), -2 * jnp.sin(2 * t)
    u, n = jnp.stack([jnp.cos(phi), jnp.sin(phi)]), jnp.stack([-jnp.sin(phi),
                                                               jnp.cos(phi)])
    return u, dphi * n, ddphi * n - dphi**2 * u


def _tracking_loss(gains):
    """Aghili's projected inverse-dynamics control (eqs. 43-45) of the pendulum
    angle toward phi_d(t): the error follows e'' + gd e' + gp e = 0 from
    e'(0) = 1, so the loss falls as the gains grow."""
    gp, gd = gains
    controller = cdiff.control.ProjectedInverseDynamics(
        PENDULUM, _reference, gp, gd, coordinates=_angle)
    q0, v0 = PENDULUM.initial_state()
    ts = jnp.linspace(0.0, 3.0, 61)
    sol = cdiff.simulate(PENDULUM, cdiff.UdwadiaKalaba(), q0, v0, t1=3.0, dt=1e-2,
                         control=controller, saveat=cdiff.SaveAt(ts=ts))
    return jnp.mean((jax.vmap(_angle)(sol.q) - 0.5 * jnp.sin(2 * ts)) ** 2)


def test_tune_lowers_a_tracking_loss_tenfold():
    start = (jnp.asarray(1.0), jnp.asarray(0.2))  # a poor start
    fit = cdiff.studies.tune(_tracking_loss, start, optax.adam(0.3), steps=20,
                             progress=False)
    assert fit.history.shape == (21,)
    assert fit.history[-1] < fit.history[0] / 10, fit.history[[0, -1]]
    # Stiffer gains track better: both grew.
    gp, gd = fit.params
    assert float(gp) > 1.0 and float(gd) > 0.2


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


def test_table_save_keeps_every_dot_of_the_stem(tmp_path):
    """Two studies saved as `study_dt0.01` and `study_dt0.02` write four files
    (`Path.with_suffix` made both `study_dt0.csv`, the second overwriting the
    first); a stem given with its extension does not get a second one."""
    first = cdiff.studies.Table({"dt": np.array([0.01]), "err": np.array([1.0])})
    second = cdiff.studies.Table({"dt": np.array([0.02]), "err": np.array([2.0])})
    paths = first.save(tmp_path / "study_dt0.01") + second.save(tmp_path / "study_dt0.02")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "study_dt0.01.csv", "study_dt0.01.npz", "study_dt0.02.csv", "study_dt0.02.npz"]
    assert [p.name for p in paths] == ["study_dt0.01.csv", "study_dt0.01.npz",
                                       "study_dt0.02.csv", "study_dt0.02.npz"]
    assert np.load(tmp_path / "study_dt0.01.npz")["err"][0] == 1.0
    assert np.load(tmp_path / "study_dt0.02.npz")["err"][0] == 2.0
    assert [p.name for p in first.save(tmp_path / "named.csv")] == ["named.csv",
                                                                   "named.npz"]
