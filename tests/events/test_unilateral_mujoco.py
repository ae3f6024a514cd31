"""Loaded MJCF models with limits against MuJoCo's soft limits as they converge to a
plastic stop: a double pendulum whose elbow falls onto its range, a four-bar (a
closed loop) whose crank swings onto its limit and stays there, a spherical
pendulum against its ball joint's cone, and a double pendulum whose fixed tendon
reaches both ends of its range."""

import equinox as eqx
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


def mujoco_qpos(xml, timeconst, times, qvel=None, dt=1e-5):
    """MuJoCo's qpos at `times` from qpos0 and `qvel`, with the limits (and any
    equality) soft at time constant `timeconst` (RK4 at `dt`), and the smallest qpos
    it passed through. The MJCF strings below give the limits damping ratio 20 and
    impedance 0.9999: heavily damped, towards a plastic stop as the time constant
    goes to zero (MuJoCo's default damping ratio 1 leaves a limit with a rebound
    instead)."""
    m = mujoco.MjModel.from_xml_string(xml.format(dt=dt, timeconst=timeconst))
    d = mujoco.MjData(m)
    if qvel is not None:
        d.qvel[:] = qvel
    out, lowest = [], np.full(m.nq, np.inf)
    for t_end in times:
        while d.time < t_end - dt / 2:
            mujoco.mj_step(m, d)
            lowest = np.minimum(lowest, d.qpos)
        out.append(d.qpos.copy())
    return out, lowest


def test_a_keyframe_outside_a_range_is_refused_naming_the_joint():
    """A MuJoCo model (a pytree of arrays) started behind one of its joint ranges:
    a ValueError naming the joint and the range, before anything is compiled."""
    model = cdiff.models.from_mujoco(XML.format(dt=1e-3, timeconst=0.02))
    with pytest.raises(ValueError, match=r"row\(s\) \[0\] \(joint 'elbow' lower "
                                          r"\(range -0.6\)\)"):
        cdiff.simulate(model, cdiff.UdwadiaKalaba(), jnp.array([0.0, -0.7]),
                       jnp.zeros(2), t1=0.01, dt=1e-3)


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
    # After the plastic impact the elbow swings back off its limit (its multiplier
    # would pull at once, so it is released at the impact): no saved row holds it,
    # and the lower row's value grows from zero.
    assert not np.asarray(sol.active).any()
    g = np.asarray(sol.unilateral[:, 0])
    after = np.asarray(sol.ts) > float(events.t[0])
    assert 0 <= g[after][0] < 1e-4 and np.all(np.diff(g[after][:20]) > 0)
    assert abs(float(events.q[0, 1]) + 0.6) < 1e-12
    (stiff,), stiff_low = mujoco_qpos(XML, 4e-5, [T])
    (soft,), _ = mujoco_qpos(XML, 2e-4, [T])
    # The reference's own error: the difference between its two stiffnesses.
    own = np.abs(stiff - soft)
    assert np.all(np.abs(q[-1] - stiff) <= own), (q[-1], stiff, soft)
    assert stiff_low[1] < -0.6  # the soft limit is penetrated


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
    stiff, _ = mujoco_qpos(FOUR_BAR, 4e-5, (T_BEFORE, T_END), V0)
    soft, _ = mujoco_qpos(FOUR_BAR, 2e-4, (T_BEFORE, T_END), V0)
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
    (stiff,), _ = mujoco_qpos(xml, 4e-5, [t1], v0)
    (soft,), _ = mujoco_qpos(xml, 2e-4, [t1], v0)
    # Within the reference's own error (and round-off, where the two agree).
    own = np.abs(stiff - soft) + 1e-12
    assert np.all(np.abs(np.asarray(sol.q[-1]) - stiff) <= own), (sol.q[-1], stiff, soft)


MARGINS = """<mujoco><compiler angle="radian"/><option timestep="1e-4">
<flag contact="disable"/></option>
<worldbody>
  <body name="slider"><joint name="slide" type="slide" axis="0 0 1" range="-0.3 0.2"
      limited="true" margin="0.1"/><geom type="sphere" size="0.05" mass="1"/>
    <site name="s0"/></body>
  <body name="arm" pos="1 0 0"><joint name="hinge" axis="0 1 0" range="-0.5 0.5"
      limited="true" margin="0.05"/><geom type="capsule" fromto="0 0 0 0.3 0 0"
      size="0.02"/><site name="s1" pos="0.3 0 0"/></body>
  <body name="ball" pos="2 0 0"><joint name="cone" type="ball" range="0 0.6"
      limited="true" margin="0.02"/><geom type="capsule" fromto="0 0 0 0 0 -0.4"
      size="0.02"/></body></worldbody>
<tendon><spatial name="rope" limited="true" range="0.5 1.2" margin="0.03">
  <site site="s0"/><site site="s1"/></spatial></tendon></mujoco>"""


def test_limit_margins_are_honoured_as_mujoco_holds_them():
    """A joint's or tendon's `margin` moves its limit: MuJoCo's constraint holds
    where its `efc_pos - efc_margin` is zero (a slide joint with range -0.3 and
    margin 0.1 rests at -0.2), and every row of cdiff's `unilateral` equals that
    quantity of MuJoCo's own limit rows, for the slide, hinge, ball cone and
    tendon, at states inside each margin."""
    m = mujoco.MjModel.from_xml_string(MARGINS)
    model = cdiff.models.from_mujoco(MARGINS)
    assert not any("margin" in entry for entry in model.ignored)
    d = mujoco.MjData(m)
    axis = np.array([0.3, 1.0, 0.2]) / np.linalg.norm([0.3, 1.0, 0.2])
    theta = 0.59  # within the cone's margin (0.6 - 0.02)
    d.qpos[:] = np.concatenate([[-0.25, 0.47], [np.cos(theta / 2)],
                                np.sin(theta / 2) * axis])
    mujoco.mj_forward(m, d)
    limits = np.isin(d.efc_type, [mujoco.mjtConstraint.mjCNSTR_LIMIT_JOINT,
                                  mujoco.mjtConstraint.mjCNSTR_LIMIT_TENDON])
    expected = np.sort(d.efc_pos[limits] - d.efc_margin[limits])
    rows = eqx.filter_jit(lambda model, q: model.unilateral(0.0, q))
    g = np.asarray(rows(model, jnp.asarray(d.qpos)))
    # MuJoCo lists the limit rows within their margin: cdiff's negative rows.
    assert expected.size == 4 and np.all(expected < 0)
    np.testing.assert_allclose(np.sort(g[g < 0]), expected, rtol=0, atol=1e-12)
    labels = model.unilateral_labels()
    assert labels[0] == "joint 'slide' lower (range -0.3, margin 0.1)"
    # The slide joint falling onto its range under gravity rests at -0.2 in
    # MuJoCo (stiff, damped limit), where cdiff's row is zero.
    m.jnt_solref[0] = [2e-3, 1.0]
    d = mujoco.MjData(m)
    for _ in range(5000):
        mujoco.mj_step(m, d)
    assert abs(d.qpos[0] + 0.2) < 1e-3
    q_rest = jnp.asarray(np.concatenate([[-0.2, 0.0, 1.0], np.zeros(3)]))
    assert abs(float(rows(model, q_rest)[0])) < 1e-15


def _mjx_sites(jaxpr) -> int:
    """How many calls of MJX's one jitted evaluation (`_mjx_stages`) a program
    holds, through every nested loop, cond and custom rule."""
    from jax.extend import core as jcore
    n = 0
    for eqn in jaxpr.eqns:
        if "_mjx_stages" in str(eqn.params.get("name", "")):
            n += 1
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, jcore.ClosedJaxpr):
                    n += _mjx_sites(sub.jaxpr)
                elif isinstance(sub, jcore.Jaxpr):
                    n += _mjx_sites(sub)
    return n


def test_an_event_program_holds_few_copies_of_the_dynamics():
    """XLA's compile time of a loaded model is about proportional to the copies of
    MJX's evaluation its program holds. With a joint range (rows that may be
    reached), the search is the event loop alone, which evaluates the dynamics
    once per iteration, and the gradient applies every step by the replay of
    what the search recorded: the forward program holds 3 copies, as without the
    range (the step's stages, the checks before it, the saved diagnostics), and
    the gradient's 10 (8 without; one of them a forward evaluation whose output
    XLA drops). A change that adds copies back fails here."""
    model = cdiff.models.from_mujoco(XML.format(dt=1e-3, timeconst=0.02))

    def final(mass):
        sol = cdiff.simulate(model.tree_replace({"body_mass": mass}),
                             cdiff.UdwadiaKalaba(), jnp.array([0.0, 0.3]), jnp.zeros(2),
                             t1=0.02, dt=1e-3, saveat=cdiff.SaveAt(t1=True))
        return jnp.sum(sol.q[-1] ** 2)

    mass = model.mjx_model.body_mass
    assert _mjx_sites(jax.make_jaxpr(final)(mass).jaxpr) <= 3
    assert _mjx_sites(jax.make_jaxpr(jax.grad(final))(mass).jaxpr) <= 10
