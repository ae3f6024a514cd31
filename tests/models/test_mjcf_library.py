"""The mechanisms shipped as MJCF files (cdiff/models/mjcf/) against their
independent references: the files themselves through MuJoCo's C engine, then
through cdiff.models.from_mujoco and cdiff.simulate."""

from __future__ import annotations

import functools
import warnings

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mjx_jit

import cdiff

# No public names: the hand-derived equations and references of the library's
# mechanisms (the tests' independent references) live in the private module.
from cdiff.models import _library as library

mujoco = pytest.importorskip("mujoco")

NAMES = sorted(cdiff.models.MJCF_LIBRARY)
# The conservative reductions (A05's dampers dissipate: tests/models/test_mjcf_flyball.py
# checks its reference).
REDUCTIONS = [n for n in NAMES
              if cdiff.models.MJCF_LIBRARY[n].reference_kind == "reduction"
              and n != "iftomm-a05-flyball-governor"]

# nq, equality rows, and the rows that are identically zero (the out-of-plane rows
# of the planar connects), as each file's header describes.
LAYOUT = {
    "slider-crank-mjcf": (3, 3, [2]),
    "double-four-bar-mjcf": (5, 6, [2, 5]),
    "iftomm-a01-simple-pendulum": (1, 0, []),
    "iftomm-a02-n-four-bar": (81, 120, list(range(2, 120, 3))),
    "iftomm-a03-andrews-squeezer": (7, 9, [2, 5, 8]),
    "iftomm-a04-bricard": (6, 6, []),
    "iftomm-a05-flyball-governor": (4, 0, []),
}


@functools.cache
def _compiled(name):
    m = mujoco.MjModel.from_xml_path(str(cdiff.models.mjcf_path(name)))
    m.opt.jacobian = mujoco.mjtJacobian.mjJAC_DENSE
    return m


def _forward(name, qpos=None, qvel=None):
    """MuJoCo's mj_forward at the keyframe, or at (qpos, qvel):
    (data, equality residuals, their rates J qvel, total energy)."""
    m = _compiled(name)
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, 0)
    if qpos is not None:
        d.qpos[:], d.qvel[:] = qpos, qvel
    mujoco.mj_forward(m, d)
    eq = d.efc_type == mujoco.mjtConstraint.mjCNSTR_EQUALITY
    jac = d.efc_J.reshape(-1, m.nv)[eq]
    return d, d.efc_pos[eq].copy(), jac @ d.qvel, float(d.energy.sum())


def test_registry():
    for name, entry in cdiff.models.MJCF_LIBRARY.items():
        assert entry.path.is_file(), entry.path
        assert cdiff.models.mjcf_path(name) == entry.path
        assert (entry.reference is None) == (entry.reference_kind == "conservation")
    with pytest.raises(KeyError, match="slider-crank-mjcf"):
        cdiff.models.mjcf_path("no-such-mechanism")
    with pytest.raises(ValueError, match="0.03"):
        library.andrews_squeezer_reference([0.02])
    # R4 is the N four-bar mechanism with N = 2.
    # Exact: 3 * 7 / (2 * 9) and 7 / 6, one rounding of the same quotient each.
    assert library.n_four_bar_ode_coefficient(2) == 7 / 6


# The keyframes' constraint residual where it is not exactly zero.
KEYFRAME_RESIDUAL = {"slider-crank-mjcf": 1e-15,  # measured 2.2e-16
                     "iftomm-a03-andrews-squeezer": 2e-17}  # measured 4.8e-18


@pytest.mark.parametrize("name", NAMES)
def test_file_compiles_and_keyframe_is_consistent(name):
    nq, rows, zero_rows = LAYOUT[name]
    m = _compiled(name)
    assert (m.nq, m.nkey) == (nq, 1)
    d, residual, rate, _ = _forward(name)
    assert residual.shape == (rows,)
    # Exactly zero but for R2 and A03 (no rows in A01 and A05; R4, A02 and A04 at
    # their defining pose or the parallelogram's alternating +-pi/2).
    worst = np.abs(residual).max(initial=0.0)
    if name in KEYFRAME_RESIDUAL:
        assert worst < KEYFRAME_RESIDUAL[name], worst
    else:
        assert worst == 0.0
    assert np.abs(residual[zero_rows]).max(initial=0.0) == 0.0
    # Exact: the keyframes are at rest, or on the parallelogram motion whose
    # alternating rates (+-1) cancel exactly (measured 0).
    assert np.abs(rate).max(initial=0.0) == 0.0
    # The out-of-plane rows stay zero away from the keyframe too.
    rng = np.random.default_rng(0)
    _, residual, _, _ = _forward(name, d.qpos + 0.3 * rng.standard_normal(nq),
                                 np.zeros(nq))
    assert np.abs(residual[zero_rows]).max(initial=0.0) == 0.0
    if rows:  # A01 and A05 have no constraints to violate
        assert np.abs(residual).max() > 1e-3


# Energy scale for the relative bound below: |E(0)|, or m g l for A01 (E(0) = 0).
_ENERGY_SCALE = {"iftomm-a01-simple-pendulum": 9.81}
# Per reduction, over 20 times: max |residual|, max |rate| (0: A01 has no rows) and
# the largest relative energy change (the reference's own tolerance, rtol = atol =
# 1e-12). Measured in the comments.
MOTION_BOUNDS = {
    "double-four-bar-mjcf": (1.5e-15, 6e-15, 3e-10),  # 4.4e-16, 1.8e-15, 7.0e-11
    "iftomm-a01-simple-pendulum": (0, 0, 2e-10),  # 4.6e-11
    "iftomm-a02-n-four-bar": (2e-14, 5e-14, 1e-9),  # 7.1e-15, 2.3e-14, 2.5e-10
    "slider-crank-mjcf": (1.5e-15, 4e-15, 1.5e-10),  # 4.4e-16, 1.1e-15, 3.4e-11
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reference_is_a_motion_of_the_file(name):
    """The reduction's states lie on the file's constraint manifold (positions and
    velocities) and keep the energy MuJoCo computes for the file: the reduction
    and the file describe the same mechanism."""
    entry = cdiff.models.MJCF_LIBRARY[name]
    ts = np.linspace(0.0, entry.t1, 21)[1:]
    ref = entry.reference(ts)
    _, _, _, e0 = _forward(name)
    scale = _ENERGY_SCALE.get(name, abs(e0))
    worst = np.zeros(3)
    for q, v in zip(np.asarray(ref.q), np.asarray(ref.v)):
        _, residual, rate, energy = _forward(name, q, v)
        worst = np.maximum(worst, [np.abs(residual).max(initial=0.0),
                                   np.abs(rate).max(initial=0.0),
                                   abs(energy - e0) / scale])
    residual_bound, rate_bound, energy_bound = MOTION_BOUNDS[name]
    if residual_bound:
        assert worst[0] < residual_bound
        assert worst[1] < rate_bound
    else:
        assert worst[0] == worst[1] == 0.0
    assert worst[2] < energy_bound


def test_andrews_published_state_is_a_motion_of_the_file():
    """The IVP test set's state at 0.03 s satisfies the file's constraints, and the
    file's energy has grown by the motor's work, tau (beta - beta_0)."""
    name = "iftomm-a03-andrews-squeezer"
    d0, _, _, e0 = _forward(name)
    ref = library.andrews_squeezer_reference()
    _, residual, rate, energy = _forward(name, ref.q[0], ref.v[0])
    work = 0.033 * (ref.q[0, 0] - d0.qpos[0])
    # Measured: 7.5e-17, 9.9e-10 (velocities ~1e3 rad/s), 2.2e-10 (work 0.52 J).
    assert np.abs(residual).max() < 2e-16
    assert np.abs(rate).max() < 2e-9
    assert abs(energy - e0 - work) < 5e-10


def _hairer_wanner(y, yp):
    """Mass matrix and forces of Andrews' squeezer in Hairer & Wanner's coordinates
    (Solving ODEs II, Sec. VII.7; the IVP test set's andrews.f)."""
    m1, m2, m3, m4, m5, m6, m7 = .04325, .00365, .02373, .00706, .07050, .00706, .05498
    i1, i2, i3, i4, i5, i6, i7 = (2.194e-6, 4.410e-7, 5.255e-6, 5.667e-7, 1.169e-5,
                                  5.667e-7, 1.912e-5)
    xb, yb, xc, yc, c0, l0 = -0.03635, .03273, .014, .072, 4530.0, 7785e-5
    da, e, ea, rr, ra = 115e-4, 2e-2, 1421e-5, 7e-3, 92e-5
    sa, sb, sc, sd, ta, tb = 1874e-5, 1043e-5, 18e-3, 2e-2, 2308e-5, 916e-5
    u, ua, ub, zf, zt, fa, mom = 4e-2, 1228e-5, 449e-5, 2e-2, 4e-2, 1421e-5, 33e-3
    _, th, ga, ph, _, om, _ = y  # M and f do not depend on beta, delta, epsilon
    bep, thp, _, php, dep, omp, epp = yp
    s, c = np.sin, np.cos
    m = np.zeros((7, 7))
    m[0, 0] = m1 * ra**2 + m2 * (rr**2 - 2 * da * rr * c(th) + da**2) + i1 + i2
    m[1, 0] = m2 * (da**2 - da * rr * c(th)) + i2
    m[1, 1] = m2 * da**2 + i2
    m[2, 2] = m3 * (sa**2 + sb**2) + i3
    m[3, 3] = m4 * (e - ea) ** 2 + i4
    m[4, 3] = m4 * ((e - ea) ** 2 + zt * (e - ea) * s(ph)) + i4
    m[4, 4] = (m4 * (zt**2 + 2 * zt * (e - ea) * s(ph) + (e - ea) ** 2)
               + m5 * (ta**2 + tb**2) + i4 + i5)
    m[5, 5] = m6 * (zf - fa) ** 2 + i6
    m[6, 5] = m6 * ((zf - fa) ** 2 - u * (zf - fa) * s(om)) + i6
    m[6, 6] = (m6 * ((zf - fa) ** 2 - 2 * u * (zf - fa) * s(om) + u**2)
               + m7 * (ua**2 + ub**2) + i6 + i7)
    m = np.tril(m) + np.tril(m, -1).T
    xd, yd = sd * c(ga) + sc * s(ga) + xb, sd * s(ga) - sc * c(ga) + yb
    length = np.hypot(xd - xc, yd - yc)
    fx, fy = -c0 * (length - l0) / length * np.array([xd - xc, yd - yc])
    f = np.array([
        mom - m2 * da * rr * thp * (thp + 2 * bep) * s(th),
        m2 * da * rr * bep**2 * s(th),
        fx * (sc * c(ga) - sd * s(ga)) + fy * (sd * c(ga) + sc * s(ga)),
        m4 * zt * (e - ea) * dep**2 * c(ph),
        -m4 * zt * (e - ea) * php * (php + 2 * dep) * c(ph),
        -m6 * u * (zf - fa) * epp**2 * c(om),
        m6 * u * (zf - fa) * omp * (omp + 2 * epp) * c(om),
    ])
    return m, f


def test_andrews_file_has_hairer_wanners_equations():
    """MuJoCo's mass matrix and forces (spring, motor, velocity terms) of the file
    are Hairer & Wanner's, at random states."""
    name = "iftomm-a03-andrews-squeezer"
    m = _compiled(name)
    order = [0, 1, 2, 4, 3, 6, 5]  # Hairer & Wanner's y_k is qpos[order[k]]
    rng = np.random.default_rng(1)
    for _ in range(5):
        q = m.qpos0 + 0.3 * rng.standard_normal(7)
        v = 10 * rng.standard_normal(7)
        d, _, _, _ = _forward(name, q, v)
        mass = np.zeros((7, 7))
        mujoco.mj_fullM(m, d, mass)
        force = d.qfrc_passive + d.qfrc_actuator - d.qfrc_bias
        mass_hw, force_hw = _hairer_wanner(q[order], v[order])
        # Measured: relative 1.0e-15 and 9.6e-16 at most.
        np.testing.assert_allclose(mass[np.ix_(order, order)], mass_hw,
                                   rtol=0, atol=2e-15 * np.abs(mass_hw).max())
        np.testing.assert_allclose(force[order], force_hw,
                                   rtol=0, atol=1e-15 * np.abs(force_hw).max())


# -- through cdiff.models.from_mujoco and cdiff.simulate -----------------------------

# Tracing and compiling one simulation of a from_mujoco model costs 25 s (A01) to
# 150 s (A03) here, against a few seconds for a hand-written model: R2's test is
# marked slow, R4's and A03's `acceptance` (outside the default run: `pytest -m
# acceptance`; the files themselves are checked against their references above).
# A02 and A04 (10 minutes and more) are run by cdiff.studies.acceptance.


@functools.cache
def _model(name):
    pytest.importorskip("mujoco.mjx")
    from cdiff.models import from_mujoco

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of the files is left out
        return from_mujoco(cdiff.models.mjcf_path(name))


@pytest.mark.parametrize("name", NAMES)
def test_from_mujoco_loads_every_file(name):
    nq, rows, _ = LAYOUT[name]
    model = _model(name)
    assert (model.nq, model.nv, sum(e.rows for e in model.equalities)) == (nq, nq, rows)
    assert model.ignored == ()


def _tight(model, q0, v0, t1):
    """`model` from `(q0, v0)` to `t1` with UdwadiaKalaba and Dopri8 at
    rtol = atol = 1e-12, saved at 1, 2, ..., 10 times t1 / 10."""
    ts = jnp.linspace(0.0, t1, 11)
    return mjx_jit(lambda model, q0, v0: cdiff.simulate(
        model, cdiff.UdwadiaKalaba(), q0, v0, t1=t1, dt=1e-3,
        solver=diffrax.Dopri8(),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
        saveat=cdiff.SaveAt(ts=ts), max_steps=4096))(model, q0, v0)


@pytest.mark.slow
def test_mjcf_slider_crank_is_braun_goldfarbs():
    """R2 from slider_crank.xml and the hand-written cdiff.models.SliderCrank, both
    solved tightly: the same slider position and crank angle, and eq. 24's."""
    t1 = 1.0
    model = _model("slider-crank-mjcf")
    sol = _tight(model, *model.initial_state(), t1)
    crank = cdiff.models.SliderCrank()
    hand = _tight(crank, *crank.initial_state(), t1)
    ref = library.slider_crank_reference(sol.ts[1:])
    mjcf = np.stack([sol.q[1:, 1], sol.q[1:, 0]], -1)  # slider, crank angle
    hand_obs = np.stack([crank.slider(hand.q[1:]), hand.q[1:, 2]], -1)
    ref_obs = np.stack([ref.q[:, 1], ref.q[:, 0]], -1)
    # Measured: 8.3e-12 against the hand-written model, 1.7e-11 against eq. 24.
    assert np.abs(mjcf - hand_obs).max() < 2.5e-11
    assert np.abs(mjcf - ref_obs).max() < 5e-11
    assert np.abs(sol.q[1:] - ref.q).max() < 5e-11


@pytest.mark.acceptance
def test_mjcf_double_four_bar_is_braun_goldfarbs():
    """R4 from double_four_bar.xml and the hand-written cdiff.models.DoubleFourBar,
    both solved tightly: the same crank angle and third joint, and the exact
    parallelogram motion. Up to 0.5 s: the linkage reaches its singular horizontal
    configuration near 0.75 s, where a step-size controller at 1e-12 stalls."""
    t1 = 0.5
    model = _model("double-four-bar-mjcf")
    sol = _tight(model, *model.initial_state(), t1)
    four_bar = cdiff.models.DoubleFourBar()
    hand = _tight(four_bar, *four_bar.initial_state(), t1)
    ref = library.double_four_bar_reference(sol.ts[1:])
    # crank 1's angle, joint 3 (crank 3's tip: its pivot at x = 2, its angle qpos[4])
    th3 = sol.q[1:, 4]
    mjcf = np.c_[sol.q[1:, 0], 2 + np.cos(th3), np.sin(th3)]
    hand_obs = np.c_[np.arctan2(hand.q[1:, 1], hand.q[1:, 0]), hand.q[1:, 4:6]]
    # Measured: 2.9e-11 (angle) and 2.7e-11 (joint 3) against the hand-written
    # model, 3.3e-11 against the exact motion.
    assert np.abs(mjcf[:, 0] - hand_obs[:, 0]).max() < 1e-10
    assert np.abs(mjcf[:, 1:] - hand_obs[:, 1:]).max() < 1e-10
    assert np.abs(sol.q[1:] - ref.q).max() < 1e-10


def test_mjcf_simple_pendulum():
    """IFToMM A01 with RK4 at the suggested step: P1 against the pendulum ODE."""
    name = "iftomm-a01-simple-pendulum"
    model = _model(name)
    sol = mjx_jit(lambda model, q0, v0: cdiff.simulate(
        model, cdiff.UdwadiaKalaba(), q0, v0, t1=2.0, dt=1e-3))(
            model, *model.initial_state())
    ref = library.simple_pendulum_reference(sol.ts[1:])
    # Measured: 4.6e-11 (angle), 3.5e-12 J.
    assert np.abs(sol.q[1:] - ref.q).max() < 1e-10
    assert float(sol.max_energy_error) < 1e-11


@pytest.mark.acceptance
def test_mjcf_andrews_squeezer():
    """IFToMM A03 with RK4 at the suggested step to 0.03 s: the seven angles
    against the IVP test set's published values, and the energy balance."""
    name = "iftomm-a03-andrews-squeezer"
    model = _model(name)
    q0, v0 = model.initial_state()
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=library.A03_T,
                         dt=1e-5, saveat=cdiff.SaveAt(t0=True, t1=True))
    ref = library.andrews_squeezer_reference()
    balance = sol.energy[-1] - sol.energy[0] - 0.033 * (sol.q[-1, 0] - q0[0])
    # Measured: 1.3e-9 rad (beta has turned by 15.9 rad), 4.9e-7 rad/s (rates up to
    # 1.4e3 rad/s), 2.5e-10 J (the motor's work is 0.52 J).
    assert np.abs(sol.q[-1] - ref.q[0]).max() < 3e-9
    assert np.abs(sol.v[-1] - ref.v[0]).max() < 1e-6
    assert abs(float(balance)) < 5e-10
