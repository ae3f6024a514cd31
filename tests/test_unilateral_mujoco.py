"""Loaded MJCF models with limits against MuJoCo's soft limits as they converge to a
plastic stop: a double pendulum whose elbow falls onto its range, a four-bar (a
closed loop) whose crank swings onto its limit and stays there, a spherical
pendulum against its ball joint's cone, and a double pendulum whose fixed tendon
reaches both ends of its range."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff

mujoco = pytest.importorskip("mujoco")

XML = """<mujoco model="limited double pendulum"><compiler angle="radian"/>
<option timestep="{dt}" integrator="RK4"><flag contact="disable"/></option>
<default><geom type="capsule" size="0.04" density="1000"/></default>
<worldbody><body name="upper"><joint name="shoulder" type="hinge" axis="0 1 0"/>
  <geom fromto="0 0 0 0.5 0 0"/>
  <body name="lower" pos="0.5 0 0">
   <joint name="elbow" type="hinge" axis="0 1 0" range="-0.6 0.6" limited="true"
          solreflimit="{timeconst} 20" solimplimit="0.9999 0.9999 0.001 0.5 2"/>
   <geom fromto="0 0 0 0.5 0 0"/></body></body></worldbody></mujoco>"""
T = 0.3


def mujoco_reference(timeconst, dt=1e-5):
    """MuJoCo's state at T: a soft limit of time constant `timeconst`, damping ratio
    20 and impedance 0.9999 (heavily damped: towards a plastic stop as the time
    constant goes to zero; MuJoCo's default damping ratio 1 leaves the limit with
    a rebound instead)."""
    m = mujoco.MjModel.from_xml_string(XML.format(dt=dt, timeconst=timeconst))
    d = mujoco.MjData(m)
    lowest = np.inf
    for _ in range(round(T / dt)):
        mujoco.mj_step(m, d)
        lowest = min(lowest, d.qpos[1])
    return d.qpos.copy(), lowest


def test_double_pendulum_on_its_elbow_limit_matches_mujoco():
    model = cdiff.models.from_mujoco(XML.format(dt=1e-3, timeconst=0.02))
    assert model.ignored == ()
    sol = jax.jit(lambda: cdiff.simulate(model, cdiff.UdwadiaKalaba(), jnp.zeros(2),
                                         jnp.zeros(2), t1=T, dt=1e-3))()
    assert sol.result == cdiff.RESULTS.successful
    events = sol.stats["events"]
    # Two rows, the elbow's lower and upper limits: the lower one is hit.
    assert int(events.count) == 1 and events.rows[0].tolist() == [True, False]
    q = np.asarray(sol.q)
    # Exact limit: no saved state or event state beyond it.
    assert q[:, 1].min() >= -0.6 - 1e-10 and float(sol.max_penetration) < 1e-10
    # After the plastic impact the elbow swings back off its limit (the limit would
    # pull at the step's end, so it is released there): no saved row holds it, and
    # the lower row's value grows from zero.
    assert not np.asarray(sol.active).any()
    g = np.asarray(sol.unilateral[:, 0])
    after = np.asarray(sol.ts) > float(events.t[0])
    assert 0 <= g[after][0] < 1e-4 and np.all(np.diff(g[after][:20]) > 0)
    assert abs(float(events.q[0, 1]) + 0.6) < 1e-12
    stiff, stiff_low = mujoco_reference(4e-5)
    soft, _ = mujoco_reference(2e-4)
    # The reference's own error: the difference between its two stiffnesses.
    own = np.abs(stiff - soft)
    assert np.all(np.abs(q[-1] - stiff) <= own), (q[-1], stiff, soft)
    assert stiff_low < -0.6  # the soft limit is penetrated


FOUR_BAR = """<mujoco model="four-bar with a stop"><compiler angle="radian"/>
<option timestep="{dt}" integrator="RK4"><flag contact="disable"/></option>
<default><geom type="capsule" size="0.05" contype="0" conaffinity="0"/></default>
<worldbody>
  <body name="crank"><joint name="crank" axis="0 1 0" range="-0.35 0.35"
      limited="true" solreflimit="{timeconst} 20"
      solimplimit="0.9999 0.9999 0.001 0.5 2"/>
    <geom fromto="0 0 0 0 0 1" mass="1"/>
    <body name="coupler" pos="0 0 1"><joint name="coupler" axis="0 1 0"/>
      <geom fromto="0 0 0 2 0 0.5" mass="2"/></body></body>
  <body name="rocker" pos="2 0 0"><joint name="rocker" axis="0 1 0"/>
    <geom fromto="0 0 0 0 0 1.5" mass="1.5"/></body></worldbody>
<equality><connect name="pin" body1="coupler" body2="rocker" anchor="2 0 0.5"
  solref="{timeconst} 1" solimp="0.9999 0.9999 0.001 0.5 2"/></equality></mujoco>"""
V0 = np.array([0.5, -0.5, 1 / 3])  # on the loop's velocity constraint at q = 0
T_BEFORE, T_END = 0.45, 0.8


def four_bar_reference(timeconst, dt=1e-5):
    """MuJoCo's states at T_BEFORE and T_END, with the limit and the loop's pin both
    soft at time constant `timeconst` (the limit heavily damped)."""
    m = mujoco.MjModel.from_xml_string(FOUR_BAR.format(dt=dt, timeconst=timeconst))
    d = mujoco.MjData(m)
    d.qvel[:] = V0
    out = []
    for t_end in (T_BEFORE, T_END):
        while d.time < t_end - dt / 2:
            mujoco.mj_step(m, d)
        out.append(d.qpos.copy())
    return out


def test_four_bar_on_its_crank_limit_matches_mujoco():
    """The crank swings up onto its upper limit (0.35 rad), where gravity holds it:
    before the impact and at rest on the limit, cdiff's state lies within the
    difference between MuJoCo at time constants 4e-5 and 2e-4; the loop stays
    closed to round-off and the limit pushes."""
    model = cdiff.models.from_mujoco(FOUR_BAR.format(dt=1e-3, timeconst=0.02))
    assert model.ignored == ()
    q0, _ = model.initial_state()
    sol = jax.jit(lambda: cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0,
                                         jnp.asarray(V0), t1=T_END, dt=1e-3))()
    assert sol.result == cdiff.RESULTS.successful
    events = sol.stats["events"]
    assert int(events.count) == 1 and events.rows[0].tolist() == [False, True]
    assert T_BEFORE < float(events.t[0]) < T_END
    assert float(sol.max_penetration) < 1e-10
    assert float(sol.max_constraint_error) < 1e-12
    ts = np.asarray(sol.ts)
    before, end = (int(np.argmin(np.abs(ts - t))) for t in (T_BEFORE, T_END))
    stiff = four_bar_reference(4e-5)
    soft = four_bar_reference(2e-4)
    for i, a, b in zip((before, end), stiff, soft):
        own = np.abs(a - b)
        assert np.all(np.abs(np.asarray(sol.q[i]) - a) <= own), (sol.q[i], a, b)
    # At rest on the upper limit, which pushes.
    assert abs(float(sol.q[-1, 0]) - 0.35) < 1e-12
    assert bool(sol.active[-1, 1]) and float(sol.unilateral_multipliers[-1, 1]) > 0


BALL = """<mujoco model="spherical pendulum in a cone"><compiler angle="radian"/>
<option timestep="{dt}" integrator="RK4"><flag contact="disable"/></option>
<default><geom type="capsule" size="0.04" density="1000"/></default>
<worldbody><body name="rod"><joint name="ball" type="ball" range="0 0.5"
  limited="true" solreflimit="{timeconst} 20"
  solimplimit="0.9999 0.9999 0.001 0.5 2"/>
  <geom fromto="0 0 0 0 0 -0.8"/></body></worldbody></mujoco>"""
TENDON = """<mujoco model="double pendulum with a tendon"><compiler angle="radian"/>
<option timestep="{dt}" integrator="RK4"><flag contact="disable"/></option>
<default><geom type="capsule" size="0.04" density="1000"/></default>
<worldbody><body name="upper"><joint name="shoulder" type="hinge" axis="0 1 0"/>
  <geom fromto="0 0 0 0.5 0 0"/>
  <body name="lower" pos="0.5 0 0"><joint name="elbow" type="hinge" axis="0 1 0"/>
   <geom fromto="0 0 0 0.5 0 0"/></body></body></worldbody>
<tendon><fixed name="sum" limited="true" range="-0.3 1.0"
  solreflimit="{timeconst} 20" solimplimit="0.9999 0.9999 0.001 0.5 2">
  <joint joint="shoulder" coef="0.5"/><joint joint="elbow" coef="1"/></fixed>
</tendon></mujoco>"""


def final_reference(xml, timeconst, v0, t1, dt=1e-5):
    """MuJoCo's qpos at `t1` from qpos0 and `v0`, limits soft at `timeconst`."""
    m = mujoco.MjModel.from_xml_string(xml.format(dt=dt, timeconst=timeconst))
    d = mujoco.MjData(m)
    d.qvel[:] = v0
    for _ in range(round(t1 / dt)):
        mujoco.mj_step(m, d)
    return d.qpos.copy()


@pytest.mark.parametrize("xml, v0, rows, impacts", [
    # A swing out of the plane: the rod hits the cone (rotation angle 0.5) and
    # leaves it at once (gravity pulls it back).
    (BALL, [3.0, 1.0, 0.0], [0.5], [[True]]),
    # From the horizontal: the tendon 0.5 shoulder + elbow reaches its lower end,
    # then its upper one.
    (TENDON, [0.0, 0.0], [0.3, 1.0], [[True, False], [False, True]]),
], ids=["ball-cone", "tendon-range"])
def test_ball_cone_and_tendon_range_match_mujoco(xml, v0, rows, impacts):
    t1 = 0.6
    model = cdiff.models.from_mujoco(xml.format(dt=1e-3, timeconst=0.02))
    assert model.ignored == ()
    q0, _ = model.initial_state()
    np.testing.assert_allclose(np.asarray(model.unilateral(0.0, q0)), rows, rtol=1e-12)
    sol = jax.jit(lambda: cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0,
                                         jnp.asarray(v0), t1=t1, dt=1e-3))()
    assert sol.result == cdiff.RESULTS.successful
    events = sol.stats["events"]
    assert np.asarray(events.rows[:int(events.count)]).tolist() == impacts
    assert float(sol.max_penetration) < 1e-10
    stiff = final_reference(xml, 4e-5, v0, t1)
    soft = final_reference(xml, 2e-4, v0, t1)
    # Within the reference's own error (and round-off, where the two agree).
    own = np.abs(stiff - soft) + 1e-12
    assert np.all(np.abs(np.asarray(sol.q[-1]) - stiff) <= own), (sol.q[-1], stiff, soft)
