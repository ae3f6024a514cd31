"""Ball and free joints loaded from MJCF (issue 18's acceptance): `qpos` holds unit
quaternions (nq != nv), the model moves them by q' = T(q) v and the exact
exponential. A spherical pendulum on a ball joint against its minimal (theta, phi)
equations, a torque-free asymmetric body on a free joint against Euler's
equations, both solved by SciPy (DOP853, rtol = atol = 1e-12), and both models'
dynamics against MuJoCo's C engine.

MJX programs take seconds to compile: each model is evaluated by one jitted
function (module-scoped fixtures), and the tests read its results.
"""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mjx_jit

mujoco = pytest.importorskip("mujoco")
with contextlib.redirect_stdout(io.StringIO()):  # MJX's notice about Warp
    pytest.importorskip("mujoco.mjx")
integrate = pytest.importorskip("scipy.integrate")
Rotation = pytest.importorskip("scipy.spatial.transform").Rotation

import cdiff


# -- numpy helpers, independent of cdiff and MJX ----------------------------------------


def _quat_mul(u, v):
    """Hamilton product of (w, x, y, z) quaternions, numpy."""
    w1, x1, y1, z1 = u
    w2, x2, y2, z2 = v
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                     w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                     w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def _rotations(quats):
    """Rotation matrices of (w, x, y, z) quaternions (any norm), shape (T, 3, 3)."""
    quats = np.asarray(quats)
    return Rotation.from_quat(np.roll(quats, -1, axis=-1)).as_matrix()


def _wxyz(rotation):
    return np.roll(rotation.as_quat(), 1)


def _random_states(m, n, seed):
    """`n` random (qpos, qvel) of MjModel `m` with unit quaternions."""
    rng = np.random.default_rng(seed)
    qs, vs = rng.normal(size=(n, m.nq)), rng.normal(size=(n, m.nv))
    for kind, adr in zip(m.jnt_type, m.jnt_qposadr):
        if kind in (mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_BALL):
            a = adr + 3 if kind == mujoco.mjtJoint.mjJNT_FREE else adr
            qs[:, a:a + 4] /= np.linalg.norm(qs[:, a:a + 4], axis=1, keepdims=True)
    return qs, vs


def _evaluate(model, qs, vs, site, body):
    """cdiff's dynamics and kinematics at the states `qs`, `vs` (batched)."""
    def one(q, v):
        t = jnp.zeros((), q.dtype)
        return {"M": model.mass_matrix(t, q), "F": model.forces(t, q, v),
                "E": model.energy(t, q, v), "site": model.site_position(q, site),
                "site_vel": model.site_velocity(q, v, site),
                "omega": model.body_angular_velocity(q, v, body)}

    return jax.vmap(one)(qs, vs)


def _engine(xml, qs, vs, site, body):
    """The same quantities from MuJoCo's C engine, and the world velocity of
    `body`'s origin, [angular, linear], with its rotation."""
    m = mujoco.MjModel.from_xml_string(xml)
    m.opt.enableflags |= mujoco.mjtEnableBit.mjENBL_ENERGY
    d = mujoco.MjData(m)
    s = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, site)
    b = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, body)
    out = {k: [] for k in ("M", "F", "E", "site", "site_vel", "omega", "origin_vel",
                           "R")}
    for q, v in zip(qs, vs):
        d.qpos[:], d.qvel[:] = q, v
        mujoco.mj_forward(m, d)
        M = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, M)
        # [angular, linear] in the world frame, at the site and at the body's
        # origin (mjOBJ_XBODY; mjOBJ_BODY would give the centre of mass's).
        site_vel, body_vel = np.zeros(6), np.zeros(6)
        mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_SITE, s, site_vel, 0)
        mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_XBODY, b, body_vel, 0)
        for key, value in (("M", M), ("F", d.qfrc_passive - d.qfrc_bias),
                           ("E", d.energy.sum()), ("site", d.site_xpos[s]),
                           ("site_vel", site_vel[3:]), ("omega", body_vel[:3]),
                           ("origin_vel", body_vel[3:]),
                           ("R", d.xmat[b].reshape(3, 3))):
            out[key].append(np.array(value))
    return {k: np.array(v) for k, v in out.items()}


def _compare_with_engine(xml, evaluated, qs, vs, site, body, angular, linear=None):
    """`(errors, convention)`: max |cdiff - MuJoCo| per quantity (the energy's
    relative to its largest value), and how far MuJoCo's velocities are from the
    convention that the references below rely on: the angular part of a ball or
    free joint's qvel (slice `angular`) is the angular velocity in the body frame,
    and a free joint's linear part (slice `linear`) the world velocity of the body's
    origin."""
    ref = _engine(xml, qs, vs, site, body)
    convention = np.abs(np.einsum("nij,nj->ni", ref["R"], vs[:, angular])
                        - ref["omega"]).max()
    origin_vel = vs[:, linear] if linear is not None else 0.0  # a ball's is fixed
    convention = max(convention, np.abs(ref["origin_vel"] - origin_vel).max())
    errors = {k: float(np.abs(np.asarray(evaluated[k]) - ref[k]).max())
              for k in ("M", "F", "site", "site_vel", "omega")}
    errors["E"] = float(np.abs(np.asarray(evaluated["E"]) - ref["E"]).max()
                        / np.abs(ref["E"]).max())
    return errors, float(convention)


# -- the spherical pendulum --------------------------------------------------------------

# The pivot is the body's origin; the bob (mass m, centre of mass a distance L below
# the pivot along the body's -z axis) has the rotational inertia IC about its
# transverse axes and I3 about the rod: about the pivot the body is symmetric about
# the rod (transverse I1 = IC + m L^2, axial I3), a heavy symmetric top hanging down.
MASS, L, IC, I3, G = 1.5, 0.8, 0.05, 0.08, 9.81
I1 = IC + MASS * L**2
PENDULUM = f"""
<mujoco model="spherical-pendulum">
  <option gravity="0 0 {-G!r}"><flag contact="disable"/></option>
  <worldbody>
    <body name="rod">
      <joint name="pivot" type="ball"/>
      <inertial pos="0 0 {-L!r}" mass="{MASS!r}" diaginertia="{IC!r} {IC!r} {I3!r}"/>
      <geom type="sphere" pos="0 0 {-L!r}" size="0.05" mass="0"/>
      <site name="bob" pos="0 0 {-L!r}"/>
    </body>
  </worldbody>
</mujoco>
"""
T1 = 10.0
DT_PENDULUM = 2e-3
# Polar angle from the downward vertical, azimuth, their rates, and the spin
# omega_3 = omega . u about the rod (u the unit vector from the pivot to the bob).
THETA0, PHI0, THETA_DOT0, PHI_DOT0 = 1.0, 0.3, 0.2, 2.5
SPINS = {"no-spin": 0.0, "spin": 10.0}


def _pendulum_rhs(t, y, k):
    r"""The minimal equations in (theta, phi), u = (sin th cos ph, sin th sin ph,
    -cos th). The angular momentum about the pivot is H = I1 u x u' + I3 w3 u; the
    torque (m g L) e_z x u is normal to u, so w3 = omega . u is constant and
    H' = I1 u x u'' + I3 w3 u' = torque. Crossing with u (u . u'' = -|u'|^2):

        u'' = -|u'|^2 u + k u x u' - g' (e_z - u_z u),  k = I3 w3 / I1,
        g' = m g L / I1,

    whose components along e_theta = du/dth and e_phi = (du/dph) / sin th are

        th'' = sin th cos th ph'^2 + k sin th ph' - g' sin th,
        ph'' = -(2 cos th th' ph' + k th') / sin th.

    (k = 0: the spherical pendulum of moment of inertia I1 about the pivot.)"""
    th, _, dth, dph = y
    g = MASS * G * L / I1
    s, c = np.sin(th), np.cos(th)
    return [dth, dph, s * c * dph**2 + k * s * dph - g * s,
            -(2 * c * dth * dph + k * dth) / s]


def _rod(th, ph):
    return np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), -np.cos(th)], -1)


def _pendulum_start(spin):
    """qpos (the rotation taking the body's -z axis to u) and qvel (the angular
    velocity in the body frame: MuJoCo's convention, checked in
    test_pendulum_against_the_engine)."""
    rotation = Rotation.from_euler("ZY", [PHI0, -THETA0])  # Rz(phi) Ry(-theta)
    R = rotation.as_matrix()
    u = _rod(THETA0, PHI0)
    assert np.allclose(-R[:, 2], u, atol=1e-15)
    e_theta = np.array([np.cos(THETA0) * np.cos(PHI0), np.cos(THETA0) * np.sin(PHI0),
                        np.sin(THETA0)])
    e_phi = np.array([-np.sin(PHI0), np.cos(PHI0), 0.0])
    u_dot = THETA_DOT0 * e_theta + np.sin(THETA0) * PHI_DOT0 * e_phi
    omega = np.cross(u, u_dot) + spin * u  # world frame
    return _wxyz(rotation), R.T @ omega


def _pendulum_reference(ts, spin):
    y0 = [THETA0, PHI0, THETA_DOT0, PHI_DOT0]
    sol = integrate.solve_ivp(_pendulum_rhs, (0.0, float(ts[-1])), y0, method="DOP853",
                              rtol=1e-12, atol=1e-12, t_eval=ts, args=(I3 * spin / I1,))
    assert sol.success
    return sol.y.T


@mjx_jit
def _pendulum_program(model, q0, v0, qs, vs):
    """Both formulations' runs from (q0, v0) and `_evaluate` at (qs, vs)."""
    runs = {}
    for name, formulation in (("udwadia-kalaba", cdiff.UdwadiaKalaba()),
                              ("lagrange", cdiff.Lagrange())):
        sol = cdiff.simulate(model, formulation, q0, v0, t1=T1, dt=DT_PENDULUM)
        runs[name] = {"ts": sol.ts, "q": sol.q, "v": sol.v, "energy": sol.energy,
                      "succeeded": sol.succeeded,
                      "bob": jax.vmap(lambda q: model.site_position(q, "bob"))(sol.q)}
    return runs, _evaluate(model, qs, vs, "bob", "rod")


@pytest.fixture(scope="module")
def pendulum():
    """{spin: (runs, reference (theta, phi, rates) at the saved times)}, and the
    C-engine comparison's states and cdiff's values there."""
    model = cdiff.models.from_mujoco(PENDULUM)
    assert (model.nq, model.nv) == (4, 3) and model.ignored == ()
    qs, vs = _random_states(mujoco.MjModel.from_xml_string(PENDULUM), 4, seed=3)
    results, evaluated = {}, None
    for name, spin in SPINS.items():
        q0, v0 = _pendulum_start(spin)
        runs, evaluated = _pendulum_program(model, jnp.asarray(q0), jnp.asarray(v0),
                                            jnp.asarray(qs), jnp.asarray(vs))
        runs = jax.tree.map(np.asarray, runs)
        ts = runs["udwadia-kalaba"]["ts"]
        results[name] = (runs, _pendulum_reference(ts, spin))
    return results, (qs, vs, jax.tree.map(np.asarray, evaluated))


def _pendulum_energy(y, spin):
    th, _, dth, dph = y.T
    kinetic = 0.5 * I1 * (dth**2 + np.sin(th) ** 2 * dph**2) + 0.5 * I3 * spin**2
    return kinetic - MASS * G * L * np.cos(th)


# Bounds per spin, each 3 to 10 times the value measured (in the comment). RK4's
# truncation error dominates: with the spin the body frame turns at 10 rad/s, and
# the bob's error falls 17-fold from dt = 2e-3 to 1e-3 (1.3e-7 to 7.8e-9).
PENDULUM_BOUNDS = {
    # |bob - reference| (m), over 10 s: the bar is 1e-6.
    "bob": {"no-spin": 3e-9,  # measured 3.2e-10
            "spin": 1e-6},  # measured 1.3e-7
    # |E(0) - the reduced Lagrangian's energy| (J)
    "start": {"no-spin": 6e-15,  # measured 1.8e-15
              "spin": 1.5e-14},  # measured 4.4e-15
    # max_t |E(t) - E(0)| (J)
    "energy": {"no-spin": 2e-10,  # measured 4.8e-11
               "spin": 2e-7},  # measured 5.1e-8
    # max_t | |q| - 1 |
    "norm": {"no-spin": 1e-11,  # measured 2.5e-12
             "spin": 6e-10},  # measured 1.7e-10
    # max_t |omega . u - spin| (rad/s)
    "spin": {"no-spin": 1.5e-15,  # measured 3.8e-16
             "spin": 6e-15},  # measured 1.8e-15
}


@pytest.mark.parametrize("spin", sorted(SPINS))
@pytest.mark.parametrize("formulation", ["lagrange", "udwadia-kalaba"])
def test_spherical_pendulum_matches_the_minimal_equations(pendulum, spin, formulation):
    runs, ref = pendulum[0][spin]
    run = runs[formulation]
    assert run["succeeded"]
    expected = L * _rod(ref[:, 0], ref[:, 1])
    # The bob by MJX's kinematics (the site), and by rotating (0, 0, -L) by qpos.
    by_site = np.abs(run["bob"] - expected).max()
    by_quaternion = np.abs(_rotations(run["q"]) @ np.array([0.0, 0.0, -L])
                           - expected).max()
    assert by_site < PENDULUM_BOUNDS["bob"][spin], by_site
    assert by_quaternion < PENDULUM_BOUNDS["bob"][spin], by_quaternion
    # Away from the poles of (theta, phi): a conical, non-planar motion (measured:
    # theta in [0.54, 1.003] and [0.66, 1.004], phi through 39 and 36 rad).
    assert 0.5 < ref[:, 0].min() and ref[:, 0].max() < 1.01
    assert np.ptp(np.unwrap(ref[:, 1])) > 30.0


@pytest.mark.parametrize("spin", sorted(SPINS))
def test_spherical_pendulum_invariants(pendulum, spin):
    runs, ref = pendulum[0][spin]
    run = runs["udwadia-kalaba"]
    # The model's energy at the start is the reduced Lagrangian's (E(0) = -4.1 J,
    # -0.11 J: the potential energy cancels most of the kinetic).
    start = abs(run["energy"][0] - _pendulum_energy(ref[:1], SPINS[spin])[0])
    assert start < PENDULUM_BOUNDS["start"][spin], start
    drift = np.abs(run["energy"] - run["energy"][0]).max()
    assert drift < PENDULUM_BOUNDS["energy"][spin], drift
    norm = np.abs(np.linalg.norm(run["q"], axis=1) - 1).max()
    assert norm < PENDULUM_BOUNDS["norm"][spin], norm
    # The spin about the rod, omega . u = -(body-frame omega_z), is constant.
    spin_drift = np.abs(-run["v"][:, 2] - SPINS[spin]).max()
    assert spin_drift < PENDULUM_BOUNDS["spin"][spin], spin_drift
    # Lagrange's run is the same (no constraints: both solve M a = Q).
    other = runs["lagrange"]
    # Measured 0 (jax 0.10.2, default options and mjx_jit's, both builds): 4 ulp of
    # a unit quaternion. (9.3e-15 was seen with an XLA that compiled the two copies
    # of the program differently.)
    np.testing.assert_allclose(other["q"], run["q"], rtol=0,
                               atol=4 * np.finfo(float).eps)


def test_pendulum_against_the_engine(pendulum):
    qs, vs, evaluated = pendulum[1]
    errors, convention = _compare_with_engine(PENDULUM, evaluated, qs, vs, "bob", "rod",
                                              slice(0, 3))
    assert convention < 5e-16, convention  # measured 1.1e-16
    assert errors["M"] < 4e-15, errors  # measured 4.4e-16
    assert errors["F"] < 6e-15, errors  # measured 1.8e-15
    assert errors["E"] < 6e-16, errors  # measured 1.6e-16 (relative)
    assert errors["site"] < 1e-15, errors  # measured 1.1e-16
    assert errors["site_vel"] < 4e-15, errors  # measured 4.4e-16
    assert errors["omega"] < 1e-15, errors  # measured 3.3e-16


# -- the torque-free body ------------------------------------------------------------

# Principal moments 1, 2, 2.5 about axes rotated from the body frame (a non-diagonal
# fullinertia), the centre of mass off the body's origin, no gravity.
BODY_MASS = 2.0
COM = np.array([0.1, -0.2, 0.05])  # in the body frame
_AXES = Rotation.from_rotvec([0.3, -0.5, 0.7]).as_matrix()
INERTIA = _AXES @ np.diag([1.0, 2.0, 2.5]) @ _AXES.T  # about the centre of mass
_FULL = [INERTIA[0, 0], INERTIA[1, 1], INERTIA[2, 2], INERTIA[0, 1], INERTIA[0, 2],
         INERTIA[1, 2]]
FREE = f"""
<mujoco model="torque-free">
  <option gravity="0 0 0"/>
  <worldbody>
    <body name="block" pos="0.3 -0.1 1.0">
      <freejoint name="float"/>
      <inertial pos="{' '.join(repr(float(x)) for x in COM)}" mass="{BODY_MASS!r}"
                fullinertia="{' '.join(repr(float(x)) for x in _FULL)}"/>
      <site name="com" pos="{' '.join(repr(float(x)) for x in COM)}"/>
    </body>
  </worldbody>
</mujoco>
"""
DT_FREE = 1e-3
ORIGIN0 = np.array([-0.4, 0.2, 0.7])
ORIENTATION0 = Rotation.from_rotvec([0.2, 0.4, -0.3])
OMEGA0 = np.array([0.8, -1.1, 0.6])  # body frame, along no principal axis
V_COM = np.array([0.3, -0.2, 0.5])  # world frame


def _free_start():
    """qpos and qvel: the body origin's world velocity v_com - omega x (R c) and the
    body-frame angular velocity (MuJoCo's convention, checked in
    test_free_body_against_the_engine)."""
    R = ORIENTATION0.as_matrix()
    v_origin = V_COM - np.cross(R @ OMEGA0, R @ COM)
    return (np.concatenate([ORIGIN0, _wxyz(ORIENTATION0)]),
            np.concatenate([v_origin, OMEGA0]))


def _euler_rhs(t, y):
    """Euler's equations in the body frame, I w' = -w x (I w), and quaternion
    kinematics q' = q (0, w) / 2."""
    w, q = y[:3], y[3:]
    w_dot = np.linalg.solve(INERTIA, -np.cross(w, INERTIA @ w))
    return np.concatenate([w_dot, 0.5 * _quat_mul(q, np.concatenate([[0.0], w]))])


def _free_reference(ts):
    y0 = np.concatenate([OMEGA0, _wxyz(ORIENTATION0)])
    sol = integrate.solve_ivp(_euler_rhs, (0.0, float(ts[-1])), y0, method="DOP853",
                              rtol=1e-12, atol=1e-12, t_eval=ts)
    assert sol.success
    return sol.y[:3].T, sol.y[3:].T


@mjx_jit
def _free_program(model, q0, v0, qs, vs):
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=T1, dt=DT_FREE)
    run = {"ts": sol.ts, "q": sol.q, "v": sol.v, "energy": sol.energy,
           "succeeded": sol.succeeded,
           "com": jax.vmap(lambda q: model.site_position(q, "com"))(sol.q),
           "R": jax.vmap(lambda q: model.body_rotation(q, "block"))(sol.q)}
    return run, _evaluate(model, qs, vs, "com", "block")


@pytest.fixture(scope="module")
def free_body():
    model = cdiff.models.from_mujoco(FREE)
    assert (model.nq, model.nv) == (7, 6) and model.ignored == ()
    qs, vs = _random_states(mujoco.MjModel.from_xml_string(FREE), 4, seed=4)
    q0, v0 = _free_start()
    run, evaluated = _free_program(model, jnp.asarray(q0), jnp.asarray(v0),
                                   jnp.asarray(qs), jnp.asarray(vs))
    run = jax.tree.map(np.asarray, run)
    return run, _free_reference(run["ts"]), (qs, vs, jax.tree.map(np.asarray, evaluated))


def test_free_body_conserves_energy_and_momentum(free_body):
    run, _, _ = free_body
    assert run["succeeded"]
    omega = run["v"][:, 3:]
    # The energy at the start from the body's own terms (E0 = 2.7 J), then its
    # drift (the bar: 1e-9).
    E0 = 0.5 * BODY_MASS * V_COM @ V_COM + 0.5 * OMEGA0 @ INERTIA @ OMEGA0
    assert abs(run["energy"][0] - E0) < 5e-14 * E0  # measured 5.6e-15
    drift = np.abs(run["energy"] - run["energy"][0]).max()
    assert drift < 3e-13, drift  # measured 3.1e-14
    # Angular momentum about the centre of mass, world frame: R I omega_body
    # (|L| = 3.1 kg m^2/s; the bar: 1e-9).
    L_world = np.einsum("nij,jk,nk->ni", run["R"], INERTIA, omega)
    L_drift = np.abs(L_world - L_world[0]).max()
    assert L_drift < 5e-13, L_drift  # measured 5.4e-14
    norm = np.abs(np.linalg.norm(run["q"][:, 3:], axis=1) - 1).max()
    assert norm < 5e-14, norm  # measured 5.2e-15


def test_free_body_matches_euler_equations(free_body):
    run, (omega_ref, quat_ref), _ = free_body
    # The orientation: qpos's quaternion (normalised) and MJX's xmat.
    quat = run["q"][:, 3:] / np.linalg.norm(run["q"][:, 3:], axis=1, keepdims=True)
    quat_ref = quat_ref / np.linalg.norm(quat_ref, axis=1, keepdims=True)
    quat_error = np.abs(quat - quat_ref).max()
    rot_error = np.abs(run["R"] - _rotations(quat_ref)).max()
    omega_error = np.abs(run["v"][:, 3:] - omega_ref).max()
    assert quat_error < 1e-10, quat_error  # measured 1.1e-11
    assert rot_error < 6e-11, rot_error  # measured 1.7e-11
    assert omega_error < 7e-11, omega_error  # measured 7.2e-12
    # It tumbles: the body-frame angular velocity moves far from its start
    # (measured 2.25 rad/s at most).
    assert np.abs(omega_ref - OMEGA0).max() > 1.0
    # The centre of mass moves on the straight line.
    line = (ORIGIN0 + ORIENTATION0.as_matrix() @ COM) + run["ts"][:, None] * V_COM
    com_error = np.abs(run["com"] - line).max()
    assert com_error < 1.5e-13, com_error  # measured 3.9e-14


def test_free_body_against_the_engine(free_body):
    qs, vs, evaluated = free_body[2]
    errors, convention = _compare_with_engine(FREE, evaluated, qs, vs, "com", "block",
                                              slice(3, 6), slice(0, 3))
    assert convention < 2e-15, convention  # measured 2.2e-16
    assert errors["M"] < 4e-15, errors  # measured 4.4e-16
    assert errors["F"] < 2e-15, errors  # measured 6.7e-16
    assert errors["E"] < 6e-16, errors  # measured 1.9e-16 (relative)
    assert errors["site"] < 1e-15, errors  # measured 1.1e-16
    assert errors["site_vel"] < 2e-15, errors  # measured 2.2e-16
    assert errors["omega"] < 4e-15, errors  # measured 4.4e-16


MIXED = """
<mujoco>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="base" pos="0 0 1">
      <freejoint/>
      <geom type="box" size="0.1 0.2 0.05" mass="1"/>
      <body name="arm" pos="0 0 -0.3">
        <joint name="hinge" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03" mass="0.5"/>
        <body name="ball" pos="0 0 -0.3">
          <joint name="ball" type="ball"/>
          <geom type="sphere" size="0.05" mass="0.3"/>
          <body name="slider" pos="0.1 0 0">
            <joint name="slide" type="slide" axis="1 0 0"/>
            <geom type="sphere" size="0.02" mass="0.1"/>
            <body name="ball2" pos="0 0 -0.1">
              <joint name="ball2" type="ball"/>
              <geom type="sphere" size="0.02" mass="0.1"/>
            </body>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def test_mixed_joints_integrate_and_rate_as_mujoco():
    """A free, a hinge, a ball, a slide and a second ball joint in one chain
    (coordinates of every kind interleaved in `qpos`): `integrate_position`
    equals MuJoCo's `mj_integratePos`, and `position_rate` is its derivative at
    `dv = 0` (central differences), at a random state with unit quaternions."""
    m = mujoco.MjModel.from_xml_string(MIXED)
    model = cdiff.models.from_mujoco(MIXED)
    rng = np.random.default_rng(3)
    q = rng.normal(size=m.nq)
    free, ball = int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)
    kinds = [int(k) for k in m.jnt_type]
    assert sorted(kinds) == sorted([free, ball, ball, int(mujoco.mjtJoint.mjJNT_HINGE),
                                    int(mujoco.mjtJoint.mjJNT_SLIDE)])
    for j, kind in enumerate(kinds):
        a = int(m.jnt_qposadr[j]) + (3 if kind == free else 0)
        if kind in (free, ball):
            q[a:a + 4] /= np.linalg.norm(q[a:a + 4])
    dv = rng.normal(size=m.nv)
    expected = q.copy()
    mujoco.mj_integratePos(m, expected, dv, 1.0)
    got = jax.jit(lambda q, dv: model.integrate_position(q, dv))(jnp.asarray(q),
                                                                 jnp.asarray(dv))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-14)

    h = 1e-6
    step = jax.jit(lambda s: model.integrate_position(jnp.asarray(q), s * jnp.asarray(dv)))
    central = (np.asarray(step(h)) - np.asarray(step(-h))) / (2 * h)
    rate = jax.jit(lambda q, v: model.position_rate(0.0, q, v))(jnp.asarray(q),
                                                                jnp.asarray(dv))
    np.testing.assert_allclose(rate, central, rtol=0, atol=1e-8)
