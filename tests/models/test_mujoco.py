"""`cdiff.models.from_mujoco`: MJX's dynamics and exact equality constraints,
checked against MuJoCo's C engine.

MJX programs take seconds to compile, so each model is evaluated by one jitted
function (module-scoped fixtures) and the tests read its results.
"""

import contextlib
import io
import subprocess
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mjx_jit

mujoco = pytest.importorskip("mujoco")
with contextlib.redirect_stdout(io.StringIO()):  # MJX's notice about Warp
    pytest.importorskip("mujoco.mjx")

import cdiff

# Every joint type, springs, dampers and armature (joints and a tendon), fixed
# tendons, gravity compensation (passive, and through the actuators), five actuator
# kinds, and every supported equality: connect and weld between bodies and between
# sites, joint (quartic and single-joint) and tendon couplings, plus an inactive one.
SINK = """
<mujoco model="sink">
  <option gravity="0.3 -0.2 -9.81"/>
  <default><geom type="capsule" size="0.05" contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="arm" pos="0 0 1">
      <joint name="shoulder" axis="0 1 0" stiffness="2" springref="0.3" damping="0.1"
             armature="0.01"/>
      <geom fromto="0 0 0 1 0 0"/>
      <body name="forearm" pos="1 0 0" quat="0.9 0.1 0.3 0.2">
        <joint name="elbow" type="ball" stiffness="0.7" damping="0.05" armature="0.02"/>
        <geom fromto="0 0 0 0.2 0 -1"/>
        <site name="wrist" pos="0.2 0.05 -1" quat="0.8 0.2 -0.1 0.4"/>
        <body name="slider" pos="0.2 0 -1" gravcomp="0.3">
          <joint name="slide" type="slide" axis="1 0.2 0" stiffness="5" damping="0.2"/>
          <geom type="box" size="0.1 0.2 0.05"/>
        </body>
      </body>
    </body>
    <body name="block" pos="2 0 0.5" gravcomp="0.5">
      <joint name="float" type="free" stiffness="1.5" damping="0.1"
             actuatorgravcomp="true"/>
      <geom type="box" size="0.1 0.2 0.3"/>
      <site name="corner" pos="0.1 0.1 0.1" quat="0.7 0.1 0.5 0.3"/>
    </body>
    <body name="wheel1" pos="0 1 0">
      <joint name="w1" axis="0 1 0" damping="0.3"/>
      <geom fromto="0 0 0 0.3 0 0"/>
    </body>
    <body name="wheel2" pos="0 2 0">
      <joint name="w2" axis="0 1 0"/>
      <geom fromto="0 0 0 0.3 0 0"/>
    </body>
    <body name="wheel3" pos="0 3 0">
      <joint name="w3" axis="0 0 1" ref="0.2"/>
      <geom fromto="0 0 0 0.3 0 0"/>
    </body>
  </worldbody>
  <tendon>
    <fixed name="t1" armature="0.05">
      <joint joint="slide" coef="1"/><joint joint="shoulder" coef="0.5"/>
    </fixed>
    <fixed name="t2" stiffness="3" springlength="0.1 0.2" damping="0.4">
      <joint joint="w2" coef="-2"/>
    </fixed>
  </tendon>
  <equality>
    <connect name="pin" body1="slider" body2="block" anchor="0.1 0 0"/>
    <connect name="pin-sites" site1="wrist" site2="corner"/>
    <weld name="glue" body1="block" body2="arm" relpose="0.1 0.2 0.3 0.9 0.1 0.2 0.3"
          torquescale="2"/>
    <weld name="glue-sites" site1="corner" site2="wrist" torquescale="0.5"/>
    <joint name="gear" joint1="w3" joint2="w1" polycoef="0.1 2 0.3 -0.2 0.05"/>
    <tendon name="belt" tendon1="t1" tendon2="t2" polycoef="0.05 1 0.2 0 0"/>
    <joint name="hold" joint1="w2"/>
    <connect name="off" body1="wheel1" body2="wheel2" anchor="0 0 0" active="false"/>
  </equality>
  <actuator>
    <motor name="motor" joint="shoulder" gear="2"/>
    <position name="servo" joint="slide" kp="10" kv="1"/>
    <velocity name="damper" joint="w2" kv="3"/>
    <motor name="pull" tendon="t1" gear="1.5"/>
    <general name="twist" joint="elbow" gear="0.3 -0.2 0.5" biastype="affine"
             biasprm="0.1 0 0"/>
  </actuator>
</mujoco>
"""

# A planar four-bar in 3D: hinges about y, the coupler pinned to the rocker by a
# connect whose y row vanishes identically (a redundant constraint everywhere).
FOUR_BAR = """
<mujoco model="four-bar">
  <default><geom type="capsule" size="0.05" contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="crank">
      <joint name="crank" axis="0 1 0"/>
      <geom fromto="0 0 0 0 0 1" mass="1"/>
      <body name="coupler" pos="0 0 1">
        <joint name="coupler" axis="0 1 0"/>
        <geom fromto="0 0 0 2 0 0.5" mass="2"/>
      </body>
    </body>
    <body name="rocker" pos="2 0 0">
      <joint name="rocker" axis="0 1 0"/>
      <geom fromto="0 0 0 0 0 1.5" mass="1.5"/>
    </body>
  </worldbody>
  <equality>
    <connect name="pin" body1="coupler" body2="rocker" anchor="2 0 0.5"/>
  </equality>
</mujoco>
"""

# A disk of radius 0.5 upright on the plane: position, heading and spin.
DISK = """
<mujoco model="disk">
  <worldbody>
    <body name="disk" pos="0 0 0.5">
      <joint name="x" type="slide" axis="1 0 0"/>
      <joint name="y" type="slide" axis="0 1 0"/>
      <joint name="heading" axis="0 0 1"/>
      <joint name="spin" axis="0 1 0"/>
      <geom type="cylinder" size="0.5 0.05" zaxis="0 1 0" contype="0"
            conaffinity="0"/>
      <site name="centre"/>
    </body>
  </worldbody>
</mujoco>
"""




def _random_state(m, seed):
    """Random `qpos` (unit quaternions), `qvel` and `ctrl` of MjModel `m`."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=m.nq)
    free, ball = int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)
    for kind, adr in zip(m.jnt_type, m.jnt_qposadr):
        if kind in (free, ball):
            a = adr + 3 if kind == free else adr
            q[a:a + 4] /= np.linalg.norm(q[a:a + 4])
    return q, rng.normal(size=m.nv), rng.normal(size=m.nu)


# -- the sink against the C engine ----------------------------------------------------


@mjx_jit
def _evaluate_sink(model, q, v, h):
    t = jnp.zeros((), q.dtype)
    zero = jnp.zeros_like(v)
    return {
        "M": model.mass_matrix(t, q),
        "F": model.forces(t, q, v),
        "B": model.input_matrix(t, q),
        "H": model.holonomic(t, q),
        "E": model.energy(t, q, v),
        # A site on the free body, the body of the ball joint.
        "site_pos": model.site_position(q, "corner"),
        "site_rot": model.site_rotation(q, "corner"),
        "site_jac": model.site_jacobian(q, "corner"),
        "body_pos": model.body_position(q, "forearm"),
        "body_rot": model.body_rotation(q, "forearm"),
        "body_jac": model.body_angular_jacobian(q, "forearm"),
        "qdot": model.position_rate(t, q, v),
        "qdot_fd": (model.integrate_position(q, h * v)
                    - model.integrate_position(q, -h * v)) / (2 * h),
        "step": model.integrate_position(q, v),
        "T": jax.vmap(lambda e: model.position_rate(t, q, e), out_axes=1)(
            jnp.eye(v.shape[0], dtype=v.dtype)),
        "T_fwd": jax.jacfwd(lambda dv: model.integrate_position(q, dv))(zero),
        "T_rev": jax.jacrev(lambda dv: model.integrate_position(q, dv))(zero),
    }


@pytest.fixture(scope="module")
def sink():
    """`(m, d, out, u)`: the C engine's MjModel and MjData at a random state, cdiff's
    values there, and the control."""
    with pytest.warns(UserWarning, match="inactive equality.*'off'"):
        model = cdiff.models.from_mujoco(SINK)
    m = mujoco.MjModel.from_xml_string(SINK)
    m.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_ENERGY
    q, v, u = _random_state(m, seed=1)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:], d.ctrl[:] = q, v, u
    mujoco.mj_forward(m, d)
    out = _evaluate_sink(model, jnp.asarray(q), jnp.asarray(v), 1e-6)
    return m, d, jax.tree.map(np.asarray, out), u


def test_sink_structure():
    with pytest.warns(UserWarning):
        model = cdiff.models.from_mujoco(SINK)
    assert (model.nq, model.nv, model.nu) == (16, 14, 5)
    assert [e.label for e in model.equalities] == [
        "connect equality 'pin'", "connect equality 'pin-sites'",
        "weld equality 'glue'", "weld equality 'glue-sites'",
        "joint equality 'gear'", "tendon equality 'belt'", "joint equality 'hold'",
    ]
    assert model.mjx_model.body_mass.dtype == jnp.float64


def test_state_of_the_wrong_size_names_nq_and_nv():
    """A q0 or v0 of the wrong length is named with the model's nq and nv before
    MJX sees it (MJX's own text names its internal arguments)."""
    with pytest.warns(UserWarning):
        model = cdiff.models.from_mujoco(SINK)
    q, v = jnp.zeros(model.nq), jnp.zeros(model.nv)
    with pytest.raises(ValueError, match=r"q has shape \(15,\).*nq = 16"):
        cdiff.simulate(model, cdiff.UdwadiaKalaba(), q[:-1], v, t1=0.01, dt=1e-3)
    with pytest.raises(ValueError, match=r"v has shape \(16,\).*nv = 14"):
        model.forces(0.0, q, jnp.zeros(16))
    with pytest.raises(ValueError, match="nq = 16"):
        cdiff.consistent_state(model, 0.0, q[:-2])


def test_short_reprs():
    """`print(model)` and `print(sol)` summarise (they printed about 400 lines of
    MJX's model)."""
    model = cdiff.models.from_mujoco(FOUR_BAR)
    text = repr(model)
    assert text.startswith("MuJoCoModel(") and "nq=" in text and len(text) < 300
    q0, v0 = jnp.zeros(model.nq), jnp.zeros(model.nv)
    q0, v0 = cdiff.consistent_state(model, q0, v0)
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=0.02, dt=1e-2)
    text = repr(sol)
    assert text.startswith("Solution(successful, t 0 to 0.02, ts 3,"), text
    assert "max |Phi_q|" in text and text.count("\n") == 0 and len(text) < 300


def test_mass_matrix(sink):
    m, d, out, _ = sink
    M = np.zeros((m.nv, m.nv))
    mujoco.mj_fullM(m, d, M)
    assert np.abs(out["M"] - M).max() < 1e-14  # measured 3.6e-15


def test_forces_and_actuators(sink):
    m, d, out, u = sink
    expected = d.qfrc_passive - d.qfrc_bias + d.qfrc_actuator
    assert np.abs(out["F"] + out["B"] @ u - expected).max() < 5e-14  # measured 1.4e-14
    assert out["B"].shape == (m.nv, m.nu)


def test_equality_residuals(sink):
    _, d, out, _ = sink
    rows = d.efc_type == mujoco.mjtConstraint.mjCNSTR_EQUALITY
    # 3 + 3 (connects), 6 + 6 (welds, torquescale included), 1 + 1 + 1.
    assert np.array_equal(d.efc_id[rows], np.repeat(np.arange(7),
                                                    [3, 3, 6, 6, 1, 1, 1]))
    assert np.abs(out["H"] - d.efc_pos[rows]).max() < 1e-15  # measured 2.2e-16


def test_energy(sink):
    m, d, out, _ = sink
    # MuJoCo's potential leaves out gravity compensation; cdiff's includes it, so that
    # the energy is conserved under the forces.
    compensated = m.body_mass * m.body_gravcomp * (d.xipos @ m.opt.gravity)
    expected = d.energy.sum() + compensated.sum()
    # Measured 1.4e-16 relative (one ulp of |E| = 396).
    assert abs(out["E"] - expected) < 1e-15 * abs(expected)


def test_kinematic_helpers(sink):
    m, d, out, _ = sink
    site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, "corner")
    body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "forearm")
    jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
    mujoco.mj_jacSite(m, d, jacp, None, site)
    mujoco.mj_jacBody(m, d, None, jacr, body)
    assert np.abs(out["site_pos"] - d.site_xpos[site]).max() < 2e-16  # measured 5.6e-17
    # Measured 0 in both builds (the same arithmetic as the C engine, not by
    # construction): one ulp of a unit rotation's entries, of the largest coordinate.
    ulp = np.finfo(float).eps
    np.testing.assert_allclose(out["site_rot"], d.site_xmat[site].reshape(3, 3),
                               rtol=0, atol=ulp)
    body_pos = d.xpos[body]
    np.testing.assert_allclose(out["body_pos"], body_pos, rtol=0,
                               atol=ulp * np.abs(body_pos).max())
    np.testing.assert_allclose(out["body_rot"], d.xmat[body].reshape(3, 3), rtol=0,
                               atol=ulp)
    assert np.abs(out["site_jac"] - jacp).max() < 1e-16  # measured 2.1e-17
    assert np.abs(out["body_jac"] - jacr).max() < 1e-15  # measured 3.3e-16


def test_position_rate(sink):
    _, d, out, _ = sink
    # Central differences of integrate_position(q, h v), h = 1e-6.
    assert np.abs(out["qdot"] - out["qdot_fd"]).max() < 2e-10  # measured 6.1e-11
    assert np.array_equal(out["qdot"][:1], d.qvel[:1])  # the hinge: q' = v
    # T(q) is integrate_position's derivative at 0, finite in both modes (measured 0
    # in both builds; integrate_position renormalises q, which may move it by an
    # ulp: |T| <= 1).
    ulp = np.finfo(float).eps
    np.testing.assert_allclose(out["T_fwd"], out["T"], rtol=0, atol=ulp)
    np.testing.assert_allclose(out["T_rev"], out["T"], rtol=0, atol=ulp)


def test_integrate_position(sink):
    m, d, out, _ = sink
    qpos = d.qpos.copy()
    mujoco.mj_integratePos(m, qpos, d.qvel, 1.0)
    assert np.abs(out["step"] - qpos).max() < 1e-15  # measured 2.2e-16


# -- transformations ------------------------------------------------------------------

# Two pendula pinned together at their tips (kept small: the derivatives through MJX
# are compiled once each).
PAIR = """
<mujoco model="pair">
  <default><geom type="capsule" size="0.05" contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="left">
      <joint name="left" axis="0 1 0"/>
      <geom fromto="0 0 0 0 0 -1" mass="1"/>
    </body>
    <body name="right" pos="1 0 0">
      <joint name="right" axis="0 1 0" damping="0.2"/>
      <geom fromto="0 0 0 0 0 -1" mass="2"/>
    </body>
  </worldbody>
  <equality><connect body1="left" body2="right" anchor="0 0 -1"/></equality>
</mujoco>
"""


def test_jit_vmap_grad():
    model = cdiff.models.from_mujoco(PAIR)
    q, v, t = jnp.array([0.3, -0.4]), jnp.array([0.5, 1.0]), jnp.zeros(())

    def outputs(mass, pos):
        # A parameter by name, another with eqx.tree_at.
        m = eqx.tree_at(lambda m: m.mjx_model.body_pos,
                        model.tree_replace({"body_mass": mass}), pos)
        return m.mass_matrix(t, q), m.forces(t, q, v), m.holonomic(t, q)

    def norm2(M, F, H):
        return jnp.sum(M * M) + jnp.sum(F * F) + jnp.sum(H * H)

    @mjx_jit
    def run(mass, pos, h):
        # The right pendulum's mass and height, perturbed by +-h, and its mass doubled.
        masses = jnp.stack([mass, mass.at[2].add(h), mass.at[2].add(-h), mass, mass,
                            mass.at[2].multiply(2)])
        poses = jnp.stack([pos, pos, pos, pos.at[2, 2].add(h), pos.at[2, 2].add(-h),
                           pos])
        batch = jax.vmap(outputs)(masses, poses)
        grads = jax.grad(lambda p: norm2(*outputs(*p)))((mass, pos))
        return batch, jax.vmap(norm2)(*batch), grads

    mass, pos = model.mjx_model.body_mass, model.mjx_model.body_pos
    h = 1e-5
    (Ms, Fs, Hs), norms, (g_mass, g_pos) = run(mass, pos, h)
    # The unperturbed row is MuJoCo's.
    m = mujoco.MjModel.from_xml_string(PAIR)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = q, v
    mujoco.mj_forward(m, d)
    M0 = np.zeros((2, 2))
    mujoco.mj_fullM(m, d, M0)
    # Measured 0 in both builds (MJX repeats the C engine's arithmetic here, not by
    # construction): one ulp of each quantity.
    ulp = np.finfo(float).eps
    np.testing.assert_allclose(Ms[0], M0, rtol=0, atol=ulp * np.abs(M0).max())
    F0 = d.qfrc_passive - d.qfrc_bias
    np.testing.assert_allclose(Fs[0], F0, rtol=0, atol=ulp * np.abs(F0).max())
    np.testing.assert_allclose(Hs[0], d.efc_pos, rtol=0, atol=ulp)
    assert np.array_equal(Hs[5], Hs[0])  # the constraint does not depend on masses
    assert np.abs(Ms[5] - Ms[0]).max() > 0.1  # the right pendulum's mass matters
    # Gradients against central differences (h = 1e-5).
    fd = (norms[1] - norms[2]) / (2 * h)
    assert abs(g_mass[2] - fd) < 3e-11 * abs(fd)  # measured 7.3e-12 (both builds)
    fd = (norms[3] - norms[4]) / (2 * h)
    assert abs(g_pos[2, 2] - fd) < 4e-10 * abs(fd)  # measured 9.4e-11 (both builds)
    assert np.all(np.isfinite(g_pos)) and np.all(np.isfinite(g_mass))


# -- simulation of a closed loop ------------------------------------------------------


@mjx_jit
def _four_bar_run(model, q0, v0):
    """The trajectory (Solution's diagnostics, unused, are compiled away) and, at
    every step, max |Phi_q|, max |dPhi_q/dt| and the energy."""
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=1.0, dt=1e-3)

    def errors(q, v):
        phi, dphi = jax.jvp(lambda q: model.holonomic(0.0, q), (q,), (v,))
        return jnp.abs(phi).max(), jnp.abs(dphi).max(), model.energy(0.0, q, v)

    return sol.q, jax.vmap(errors)(sol.q, sol.v)


def test_four_bar_simulation():
    model = cdiff.models.from_mujoco(FOUR_BAR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # qpos0 closes the loop: no warning
        q0, _ = model.initial_state()
    # A velocity on the constraints: at q0 = 0 the pin's Jacobian is
    # [[1.5, 0.5, -1.5], [0, 0, 0], [-2, -2, 0]] (the y row vanishes: rank 2 of 3).
    v0 = jnp.array([1.0, -1.0, 2.0 / 3.0]) * 2.0
    qs, (phi, dphi, energy) = _four_bar_run(model, q0, v0)
    # Exact: at q0 = 0 the Jacobian's entries are exact and v0 (2/3 * 2 * 1.5 rounds
    # to 2) lies in its null space.
    assert dphi[0] == 0.0
    assert phi.max() < 2e-11  # measured 5e-12
    assert dphi.max() < 3e-9  # measured 6e-10
    assert np.abs(energy - energy[0]).max() < 5e-7  # measured 1e-7 (E0 = 46.2 J)
    assert float(qs[-1, 0] - q0[0]) > 4.0  # the crank turns on: measured 4.5 rad


# -- custom constraints ---------------------------------------------------------------


class RollingDisk(cdiff.models.MuJoCoModel):
    """The docstring's example: the disk rolls without slipping."""

    def nonholonomic(self, t, q, v):
        r = self.mjx_model.geom_size[0, 0]
        centre = self.site_velocity(q, v, "centre")
        omega = self.body_angular_velocity(q, v, "disk")
        return (centre + jnp.cross(omega, jnp.array([0.0, 0.0, -r])))[:2]


def test_rolling_disk_subclass():
    model = cdiff.models.from_mujoco(DISK, cls=RollingDisk)
    assert isinstance(model, RollingDisk)
    q = jnp.array([0.3, -0.2, 0.7, 1.1])
    v = jnp.array([0.4, -0.3, 0.9, 2.0])
    slip = mjx_jit(lambda model, q, v: model.nonholonomic(0.0, q, v))(model, q, v)
    # Rolling: x' = r spin' cos(heading), y' = r spin' sin(heading).
    expected = v[:2] - 0.5 * v[3] * jnp.array([jnp.cos(q[2]), jnp.sin(q[2])])
    assert np.abs(slip - expected).max() < 1e-15  # measured 2.2e-16


# -- loading: sources, warnings and errors --------------------------------------------


def test_sources(tmp_path):
    path = tmp_path / "four_bar.xml"
    path.write_text(FOUR_BAR)
    spec = mujoco.MjSpec.from_string(FOUR_BAR)
    for source in (str(path), path, mujoco.MjModel.from_xml_string(FOUR_BAR), spec):
        model = cdiff.models.from_mujoco(source)
        assert model.joint_names == ("crank", "coupler", "rocker")
    urdf = tmp_path / "arm.urdf"
    urdf.write_text("""<robot name="arm">
      <link name="base"/>
      <link name="link"><inertial><mass value="1"/>
        <inertia ixx="0.1" ixy="0" ixz="0" iyy="0.1" iyz="0" izz="0.1"/></inertial>
      </link>
      <joint name="hinge" type="continuous"><parent link="base"/><child link="link"/>
        <axis xyz="0 0 1"/></joint>
    </robot>""")
    model = cdiff.models.from_mujoco(urdf)
    assert model.joint_names == ("hinge",) and model.nq == 1


def test_bad_sources(tmp_path):
    with pytest.raises(ValueError, match="no such MuJoCo model file.*missing.xml"):
        cdiff.models.from_mujoco(tmp_path / "missing.xml")
    bad = tmp_path / "bad.xml"
    bad.write_text("<mujoco><worldbody><body></worldbody></mujoco>")
    with pytest.raises(ValueError, match="could not load.*bad.xml.*XML parse error"):
        cdiff.models.from_mujoco(bad)
    with pytest.raises(ValueError, match="could not load the XML string"):
        cdiff.models.from_mujoco("<mujoco><nonsense/></mujoco>")
    with pytest.raises(TypeError, match="MJCF or URDF path"):
        cdiff.models.from_mujoco(3.0)


def test_unsupported_elements():
    filtered = """<mujoco><worldbody><body><joint name="j"/><geom size="0.1"/></body>
      </worldbody><actuator><general name="slow" joint="j" dyntype="filter"
      dynprm="0.1"/></actuator></mujoco>"""
    with pytest.raises(ValueError, match="activation dynamics: actuator 'slow'"):
        cdiff.models.from_mujoco(filtered)
    mocap = """<mujoco><worldbody><body name="target" mocap="true"/>
      <body name="b"><freejoint/><geom size="0.1"/></body></worldbody>
      <equality><weld name="follow" body1="b" body2="target"/></equality></mujoco>"""
    with pytest.raises(ValueError, match="mocap.*'follow'"):
        cdiff.models.from_mujoco(mocap)
    # MJX drops every passive force when either kind is disabled, MuJoCo one kind.
    no_damper = """<mujoco><option><flag damper="disable"/></option><worldbody>
      <body><joint stiffness="1"/><geom size="0.1"/></body></worldbody></mujoco>"""
    with pytest.raises(ValueError, match="spring or damper disabled alone"):
        cdiff.models.from_mujoco(no_damper)


def test_tree_replace_errors():
    model = cdiff.models.from_mujoco(FOUR_BAR)
    with pytest.raises(TypeError, match="'jnt_type' is static"):
        model.tree_replace({"jnt_type": np.zeros(3)})
    with pytest.raises(ValueError, match="'body_mass' has shape"):
        model.tree_replace({"body_mass": jnp.ones(2)})
    with pytest.raises(ValueError, match="no field 'opt.gravitation'"):
        model.tree_replace({"opt.gravitation": jnp.ones(3)})
    g = model.tree_replace({"opt.gravity": jnp.array([0.0, 0.0, -1.0])})
    assert g.mjx_model.opt.gravity.tolist() == [0.0, 0.0, -1.0]


def test_ignored_elements_warning():
    xml = """<mujoco model="ignored"><worldbody>
      <geom name="floor" type="plane" size="5 5 0.1"/>
      <body name="b" pos="0 0 1">
        <joint name="hinge" range="-1 1" frictionloss="0.1"/>
        <geom name="ball" size="0.1"/>
      </body></worldbody>
      <actuator><motor name="motor" joint="hinge" ctrlrange="-1 1"/></actuator>
      </mujoco>"""
    with pytest.warns(UserWarning) as record:
        model = cdiff.models.from_mujoco(xml)
    assert len(record) == 1
    message = str(record[0].message)
    for part in ("contacts: geom 'floor' / geom 'ball'",
                 "friction loss: joint 'hinge'", "control ranges: actuator 'motor'"):
        assert part in message
    # The hinge's range is a pair of unilateral rows, not an ignored element.
    assert "limits" not in message and len(model.ignored) == 3
    rows = model.unilateral(0.0, jnp.array([0.25]))
    one = np.deg2rad(1.0)  # MJCF angles are in degrees unless the compiler says
    np.testing.assert_allclose(np.asarray(rows), [0.25 + one, one - 0.25], rtol=1e-12)


def test_keyframe_warning():
    xml = """<mujoco><worldbody><body name="b"><joint name="j"/>
      <geom type="capsule" fromto="0 0 0 1 0 0" size="0.05"/></body></worldbody>
      <equality><connect name="tip" body1="b" body2="world" anchor="1 0 0"/></equality>
      <keyframe><key name="bent" qpos="0.5"/></keyframe></mujoco>"""
    model = cdiff.models.from_mujoco(xml)
    with pytest.warns(UserWarning, match="keyframe 'bent' violates.*connect "
                      "equality 'tip'"):
        q0, v0 = model.initial_state()
    assert q0.tolist() == [0.5] and v0.tolist() == [0.0]


def test_import_without_mujoco():
    code = """if True:
        import sys
        sys.modules["mujoco"] = None  # as if not installed
        import cdiff
        try:
            cdiff.models.from_mujoco("<mujoco/>")
        except ImportError as e:
            assert 'pip install "cdiff[mujoco]"' in str(e), e
        else:
            raise AssertionError("no ImportError")
    """
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_warnings_name_the_callers_line():
    """The load warning and the keyframe warning point at the line that called
    cdiff (not at equinox's or jaxtyping's wrappers), and the keyframe warning
    says how to project."""
    xml = """<mujoco><worldbody><body><joint name="a" frictionloss="0.1"/>
      <geom size="0.1"/><body pos="1 0 0"><joint name="b"/><geom size="0.1"/>
        <site name="s" pos="1 0 0"/></body></body><site name="w" pos="0 0 5"/>
      </worldbody><equality><connect site1="s" site2="w"/></equality>
      <keyframe><key name="start" qpos="0 0"/></keyframe></mujoco>"""
    with pytest.warns(UserWarning, match="not simulated") as loaded:
        model = cdiff.models.from_mujoco(xml)
    with pytest.warns(UserWarning, match=r"cdiff.consistent_state\(model") as started:
        model.initial_state()
    assert {w.filename for w in [*loaded, *started]} == {__file__}
