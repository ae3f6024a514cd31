"""A loaded MJCF model with a joint limit against MuJoCo's soft limit as it converges
to a plastic stop: a double pendulum whose elbow falls onto its range."""

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
