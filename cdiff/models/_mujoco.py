"""Models loaded from MuJoCo (MJCF, URDF, `mujoco.MjSpec`): MJX's rigid-body
dynamics with MuJoCo's equality constraints as exact holonomic constraints."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import os
import sys
import warnings
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._kinematics import (
    EnergyLaw,
    Terms,
    _nonholonomic_kinematics,
    assemble,
    jacobian,
)
from .._model import AbstractModel

_INSTALL = 'pip install "cdiff[mujoco]"'

# Values of MuJoCo's enums (stable in its C API): mjtJoint, mjtEq, mjtTrn (2 and 5
# are slider-crank and body transmissions), mjtDyn, mjtGain, mjtBias, mjtObj.
_FREE, _BALL, _SLIDE, _HINGE = 0, 1, 2, 3
_CONNECT, _WELD = 0, 1
_TRN_JOINT, _TRN_JOINTINPARENT, _TRN_TENDON, _TRN_SITE = 0, 1, 3, 4
_DYN_NONE, _GAIN_FIXED, _BIAS_NONE, _BIAS_AFFINE = 0, 0, 0, 1
_OBJ_SITE = 6
_EQ_KINDS = {0: ("connect", 3), 1: ("weld", 6), 2: ("joint", 1), 3: ("tendon", 1)}


def _mujoco():
    """`(mujoco, mujoco.mjx)`, imported on first use. MJX's import prints a notice
    about its optional Warp backend to stdout; it is swallowed."""
    try:
        import mujoco

        with contextlib.redirect_stdout(io.StringIO()):
            from mujoco import mjx
    except ImportError as e:
        raise ImportError(
            f"cdiff's MuJoCo models need the packages mujoco and mujoco-mjx: {_INSTALL}"
        ) from e
    return mujoco, mjx


class _Joint(NamedTuple):
    type: int
    qposadr: int
    dofadr: int


class _Indices(NamedTuple):
    qpos: np.ndarray
    dofs: np.ndarray


class _Equality(NamedTuple):
    label: str  # for messages: "weld equality 'name'" or "weld equality 3"
    kind: str  # connect, weld, joint or tendon
    index: int  # in MuJoCo's equality list
    obj1: int
    obj2: int
    site: bool  # connect/weld between sites rather than bodies
    rows: int


def _impl(d):
    """The fields of MJX's data that are specific to its JAX implementation
    (`actuator_moment`, ...)."""
    return getattr(d, "_impl", d)


def _quat_mul(u, v):
    """The quaternion product `u * v` (w, x, y, z; leading axes broadcast)."""
    u0, u1, u2, u3 = _components(u)
    v0, v1, v2, v3 = _components(v)
    return jnp.stack([
        u0 * v0 - u1 * v1 - u2 * v2 - u3 * v3,
        u0 * v1 + u1 * v0 + u2 * v3 - u3 * v2,
        u0 * v2 - u1 * v3 + u2 * v0 + u3 * v1,
        u0 * v3 + u1 * v2 - u2 * v1 + u3 * v0,
    ], axis=-1)


def _components(u):
    """The four components of quaternions `u` along its last axis (static slices,
    which trace far faster than indexing)."""
    return [jax.lax.index_in_dim(u, i, axis=-1, keepdims=False) for i in range(4)]


def _quat_conj(u):
    return u * jnp.array([1.0, -1.0, -1.0, -1.0], dtype=u.dtype)


def _quat_exp(omega):
    r"""$(\cos\tfrac\theta2, \tfrac{\sin(\theta/2)}{\theta}\,\omega)$ with
    $\theta = |\omega|$, smooth at $\omega = 0$ (Taylor branch with a safe square
    root, so that its gradient is finite there too)."""
    theta2 = omega @ omega
    small = theta2 < 1e-4
    theta = jnp.sqrt(jnp.where(small, 1.0, theta2))
    # Series to theta^4: the first neglected terms are below 1e-17 for theta^2 < 1e-4.
    c = jnp.where(small, 1 - theta2 / 8 + theta2**2 / 384, jnp.cos(theta / 2))
    s = jnp.where(small, 0.5 - theta2 / 48 + theta2**2 / 3840,
                  jnp.sin(theta / 2) / theta)
    return jnp.concatenate([c[None], s * omega])


def _rotation_angle_squared(quat):
    r"""$\theta^2$ of the rotation `quat` (unit, either sign), the squared norm of
    MuJoCo's `mju_quat2Vel`, smooth at the identity."""
    s2 = quat[1:] @ quat[1:]
    nonzero = s2 > 0
    s = jnp.sqrt(jnp.where(nonzero, s2, 1.0))
    theta = 2 * jnp.arctan2(s, jnp.abs(quat[0]))
    return jnp.where(nonzero, theta**2, 0.0)


def _vee(omega_hat):
    """The vector of the skew-symmetric part of a 3x3 matrix."""
    a = 0.5 * (omega_hat - omega_hat.T)
    return jnp.stack([a[2, 1], a[0, 2], a[1, 0]])


def _rotation_angle(quat):
    r"""The angle $\theta = 2\,\mathrm{atan2}(\|x\|, |w|) \in [0, \pi]$ of the
    rotations `quat` ($w, x$; any norm; leading axes), as MuJoCo's ball-joint limit
    (`mju_quat2Vel`). Its derivative at $\theta = 0$ (a cone's tip) is taken as
    zero."""
    xyz = quat[..., 1:]
    ss = jnp.sum(xyz * xyz, axis=-1)
    positive = ss > 0
    s = jnp.where(positive, jnp.sqrt(jnp.where(positive, ss, 1.0)), 0.0)
    return 2 * jnp.arctan2(s, jnp.abs(quat[..., 0]))


@jax.jit
def _mjx_stages(m, q, v):
    """MJX's stages at `(q, v)`: `kinematics`, `com_pos`, `tendon`,
    `transmission`, `crb`, `tendon_armature` and `fwd_velocity`.

    Every MJX evaluation of a model goes through this one jitted function with one
    signature, whatever part of the data the caller reads: MJX is written as
    thousands of scalar operations, and JAX traces a jitted function once per
    signature and reuses that trace in every program (the checks before tracing,
    the vector field, the per-step data, the solution's diagnostics) and in each
    of a formulation's derivatives. XLA then drops the stages a program does not
    read."""
    _, mjx = _mujoco()
    # MJX relies on NumPy's implicit dtype promotion (bool * float, ...).
    with jax.numpy_dtype_promotion("standard"):
        d = mjx.make_data(m).replace(qpos=q)
        d = mjx.kinematics(m, d)
        d = mjx.com_pos(m, d)
        d = mjx.tendon(m, d)
        d = mjx.transmission(m, d)
        d = mjx.crb(m, d)
        d = mjx.tendon_armature(m, d)
        d = mjx.fwd_velocity(m, d.replace(qvel=v))
    return d


class MuJoCoModel(AbstractModel):
    r"""A MuJoCo model (MJCF, URDF or `mujoco.MjSpec`) with exact equality
    constraints. Build it with [`cdiff.models.from_mujoco`][].

    The dynamics are MuJoCo's, computed by MJX: $M(q)$ is the joint-space inertia
    (armature included), $Q$ = `qfrc_passive` $-$ `qfrc_bias` (gravity and its
    compensation, Coriolis/centrifugal, joint and tendon springs and dampers, plus
    the affine bias of the actuators) and $E(q)$ maps `ctrl` to joint forces. Every
    active equality constraint (`eq_active0`) becomes exact holonomic residuals,
    instead of MuJoCo's soft constraint:

    - `connect`: the difference of the two anchors' world positions (3 rows);
    - `weld`: the position difference and the vector part of the relative
      quaternion $\bar q_2 \otimes q_1 \otimes$ `relpose`, times `torquescale`
      (6 rows, as MuJoCo's `efc_pos`; `torquescale = 0` leaves 3 zero rows);
    - `joint` and `tendon`: $x_1 - p(x_2)$ with MuJoCo's quartic $p$, joint
      positions relative to `qpos0` and tendon lengths to `tendon_length0`.

    Formulations read all of this at a state from one MJX pass (`terms`): the
    constraint Jacobians and their velocity-product terms come from MJX's body
    Jacobians and bias accelerations, as MuJoCo builds `efc_J`, not from autodiff
    through the kinematic tree.

    `q` is MuJoCo's `qpos` (`nq`) and `v` its `qvel` (`nv`): ball and free joints
    hold unit quaternions and local angular velocities, mapped by
    `position_rate` and `integrate_position`. Kinematics normalise the
    quaternions, so nothing depends on their norm.

    **Parameters.** `mjx_model` is the `mjx.Model`; its arrays (`body_mass`,
    `body_pos`, `body_inertia`, `dof_damping`, `opt.gravity`, ...) are pytree
    leaves, so `jax.grad` and `jax.vmap` work over them. Replace them with
    `model.tree_replace({"body_mass": ..., "opt.gravity": ...})` or
    `eqx.tree_at`. Integer and structural fields are static.

    **Custom constraints.** Subclass it and use the kinematic helpers
    (`body_position`, `site_position`, `site_velocity`,
    `body_angular_velocity`, the Jacobians, or `mjx_data` for anything else that
    MJX computes). A disk of radius `r` rolling on the plane $z = 0$:

    ```python
    class RollingDisk(cdiff.models.MuJoCoModel):
        def nonholonomic(self, t, q, v):
            # The disk's material point at the contact, a radius below its centre
            # (the radius is a parameter: the size of its cylinder geom), does not
            # slide on the plane z = 0.
            r = self.mjx_model.geom_size[0, 0]
            centre = self.site_velocity(q, v, "centre")
            omega = self.body_angular_velocity(q, v, "disk")
            return (centre + jnp.cross(omega, jnp.array([0.0, 0.0, -r])))[:2]

    model = cdiff.models.from_mujoco("disk.xml", cls=RollingDisk)
    ```

    **Joint and tendon limits** are unilateral rows (`unilateral(t, q)`: two per
    limited hinge or slide joint, $q_j - \ell_j \ge 0$ and $u_j - q_j \ge 0$; one
    per limited ball joint, the cone $u_j - \theta_j \ge 0$ on its rotation
    angle; two per limited tendon, on its length), enforced exactly by
    [`cdiff.simulate`][] with plastic impacts (`restitution` 0; MuJoCo's soft
    limits tend to that as `solreflimit` goes to zero with heavy damping).
    MuJoCo's `margin` is not used.

    Not simulated (from_mujoco warns and lists them in `ignored`): contacts,
    friction loss, control and force ranges, inactive equalities.
    """

    mjx_model: Any
    name: str = eqx.field(static=True)
    nq: int = eqx.field(static=True)
    nv: int = eqx.field(static=True)
    nu: int = eqx.field(static=True)
    joints: tuple[_Joint, ...] = eqx.field(static=True)
    equalities: tuple[_Equality, ...] = eqx.field(static=True)
    body_names: tuple[str, ...] = eqx.field(static=True)
    site_names: tuple[str, ...] = eqx.field(static=True)
    joint_names: tuple[str, ...] = eqx.field(static=True)
    actuator_names: tuple[str, ...] = eqx.field(static=True)
    keyframe_names: tuple[str, ...] = eqx.field(static=True)
    #: Descriptions of what MuJoCo would simulate and cdiff does not.
    ignored: tuple[str, ...] = eqx.field(static=True)
    # Switches of MuJoCo's options, decided at load time: which actuators act, and
    # whether gravity, its compensation and the passive forces are on.
    _actuated: tuple[bool, ...] = eqx.field(static=True)
    _gravity: bool = eqx.field(static=True)
    _gravcomp: bool = eqx.field(static=True)
    _passive: bool = eqx.field(static=True)
    # (joint index, qpos address) of each limited hinge or slide joint; of each
    # limited ball joint; the index of each limited tendon.
    _limits: tuple[tuple[int, int], ...] = eqx.field(static=True)
    _ball_limits: tuple[tuple[int, int], ...] = eqx.field(static=True, default=())
    _tendon_limits: tuple[int, ...] = eqx.field(static=True, default=())

    def __repr__(self) -> str:
        """A summary: the fields (MJX's model, hundreds of arrays) would fill a
        screen; `mjx_model` shows them."""
        rows = [e.label for e in self.equalities]
        return (f"{type(self).__name__}({self.name!r}, nq={self.nq}, nv={self.nv}, "
                f"nu={self.nu}, equalities={rows}, ignored={len(self.ignored)})")

    # -- MJX stages -----------------------------------------------------------------

    def mjx_data(self, q, v=None):
        """MJX's data at `(q, v)` after `mjx.kinematics`, `mjx.com_pos`,
        `mjx.tendon`, `mjx.transmission`, `mjx.crb`, `mjx.tendon_armature`
        (positions, Jacobians, the mass matrix) and `mjx.fwd_velocity`
        (`qfrc_bias`, `qfrc_passive`).

        **Arguments:**

        - `q`: `qpos`, shape `(nq,)`.
        - `v`: `qvel`, shape `(nv,)`, or `None` for zero velocity.

        **Returns:** an `mjx.Data`.
        """
        return self._data(q, v)

    def _data(self, q, v=None):
        # Shapes named here, before MJX's own text about its arguments.
        if jnp.shape(q) != (self.nq,):
            raise ValueError(
                f"MuJoCoModel: q has shape {jnp.shape(q)}, but this model's qpos has "
                f"nq = {self.nq} entries (and qvel nv = {self.nv}); a ball joint "
                "takes 4 (a quaternion), a free joint 7.")
        if v is not None and jnp.shape(v) != (self.nv,):
            raise ValueError(
                f"MuJoCoModel: v has shape {jnp.shape(v)}, but this model's qvel has "
                f"nv = {self.nv} entries (qpos: nq = {self.nq}).")
        return _mjx_stages(self.mjx_model, q, jnp.zeros(self.nv, q.dtype) if v is None
                           else v)

    def _full_m(self, d):
        _, mjx = _mujoco()
        with jax.numpy_dtype_promotion("standard"):
            return mjx.full_m(self.mjx_model, d)

    # -- the model API --------------------------------------------------------------

    @property
    def conservative(self) -> bool:
        """`False` when forces that MuJoCo's energy leaves out act: joint or tendon
        damping (with passive forces on) or an actuator's affine bias (a position or
        velocity servo). A traced damping (a sweep over it) counts as damping."""
        m = self.mjx_model
        damping = [m.dof_damping, m.tendon_damping] if self._passive else []
        for x in damping:
            if isinstance(x, jax.core.Tracer) or np.any(np.asarray(x) != 0):
                return False
        biased = np.asarray(self._actuated, bool) & (
            np.asarray(m.actuator_biastype) == _BIAS_AFFINE)
        return not np.any(biased)

    def terms(self, t, q, v=None) -> _MJXTerms:
        """The terms of the equations of motion at `(t, q, v)` from one MJX pass
        (see `_MJXTerms`): the constraint Jacobians from MJX's body Jacobians and
        their velocity-product terms from its bias accelerations, instead of
        autodiff through the kinematic tree."""
        return _MJXTerms(self, t, q, v)

    def mass_matrix(self, t, q):
        """MuJoCo's joint-space inertia (armature included), shape `(nv, nv)`."""
        return self._full_m(self._data(q))

    def forces(self, t, q, v):
        """`qfrc_passive - qfrc_bias` plus the actuators' affine bias, shape
        `(nv,)`."""
        return self._forces(self._data(q, v), v)

    def _forces(self, d, v):
        m = self.mjx_model
        qfrc = d.qfrc_passive - d.qfrc_bias
        if self._gravcomp and np.any(m.jnt_actgravcomp):
            # Gravity compensation that MuJoCo routes through the actuators.
            routed = jnp.asarray(m.jnt_actgravcomp[m.dof_jntid], qfrc.dtype)
            qfrc = qfrc + d.qfrc_gravcomp * routed
        biased = np.asarray(self._actuated, bool) & (
            m.actuator_biastype == _BIAS_AFFINE)
        if np.any(biased):
            moment = _impl(d).actuator_moment
            prm = m.actuator_biasprm
            bias = prm[:, 0] + prm[:, 1] * d.actuator_length + prm[:, 2] * (moment @ v)
            qfrc = qfrc + moment.T @ jnp.where(biased, bias, 0.0)
        return qfrc

    def input_matrix(self, t, q):
        """The actuators' moments times their gains, shape `(nv, nu)`: `ctrl`
        enters as $E u$, without MuJoCo's `ctrlrange` clamping or force limits."""
        if self.nu == 0:
            return jnp.zeros((self.nv, 0), dtype=q.dtype)
        return self._input_matrix(self._data(q))

    def _input_matrix(self, d):
        m = self.mjx_model
        gain = jnp.where(np.asarray(self._actuated, bool), m.actuator_gainprm[:, 0],
                         0.0)
        return _impl(d).actuator_moment.T * gain

    def unilateral(self, t, q):
        r"""The limits, as MuJoCo's: of each limited hinge and slide joint two rows
        (lower, upper), $q_j - \ell_j - \mu_j \ge 0$ and $u_j - \mu_j - q_j \ge 0$;
        of each limited ball joint one, its cone $u_j - \mu_j - \theta_j \ge 0$
        with $\theta_j$ the angle of its rotation from the reference (as MuJoCo's
        `mju_quat2Vel`); of each limited tendon two, $L_k - \ell_k - \mu_k \ge 0$
        and $u_k - \mu_k - L_k \ge 0$ on its length. In that order. $\mu$ is the
        joint's or tendon's `margin` (default 0): MuJoCo's limit holds at the
        margin's distance from the range (its `efc_pos - efc_margin` is zero at
        rest), and so does cdiff's row."""
        m = self.mjx_model
        rows = [jnp.zeros((0,), dtype=q.dtype)]
        if self._limits:
            joint, adr = (np.array(x) for x in zip(*self._limits))
            lo, hi = (m.jnt_range[joint, i].astype(q.dtype) for i in (0, 1))
            margin = m.jnt_margin[joint].astype(q.dtype)
            x = q[adr]
            rows.append(jnp.stack([x - lo - margin, hi - margin - x],
                                  axis=1).reshape(-1))
        if self._ball_limits:
            joint, adr = (np.array(x) for x in zip(*self._ball_limits))
            quat = q[adr[:, None] + np.arange(4)]
            rows.append((m.jnt_range[joint, 1] - m.jnt_margin[joint]).astype(q.dtype)
                        - _rotation_angle(quat))
        if self._tendon_limits:
            tendon = np.array(self._tendon_limits)
            length = self._data(q).ten_length[tendon]
            lo, hi = (m.tendon_range[tendon, i].astype(q.dtype) for i in (0, 1))
            margin = m.tendon_margin[tendon].astype(q.dtype)
            rows.append(jnp.stack([length - lo - margin, hi - margin - length],
                                  axis=1).reshape(-1))
        return jnp.concatenate(rows)

    def unilateral_labels(self) -> tuple[str, ...]:
        """A name for each row of `unilateral`, in its order (e.g. `"joint 'elbow'
        lower (range -0.6)"`), for messages."""
        m = self.mjx_model

        def joint(j):
            name = self.joint_names[j]
            return f"joint {name!r}" if name else f"joint {j}"

        def margin(x):
            return f", margin {float(x):g}" if float(x) else ""

        labels = []
        for j, _ in self._limits:
            lo, hi = (float(x) for x in np.asarray(m.jnt_range[j]))
            labels += [f"{joint(j)} lower (range {lo:g}{margin(m.jnt_margin[j])})",
                       f"{joint(j)} upper (range {hi:g}{margin(m.jnt_margin[j])})"]
        for j, _ in self._ball_limits:
            labels.append(f"{joint(j)} cone (range {float(m.jnt_range[j, 1]):g}"
                          f"{margin(m.jnt_margin[j])})")
        for k in self._tendon_limits:
            lo, hi = (float(x) for x in np.asarray(m.tendon_range[k]))
            labels += [f"tendon {k} lower (range {lo:g}{margin(m.tendon_margin[k])})",
                       f"tendon {k} upper (range {hi:g}{margin(m.tendon_margin[k])})"]
        return tuple(labels)

    def holonomic(self, t, q):
        """The active equality constraints' residuals (MuJoCo's `efc_pos` rows of
        type equality), shape `(m,)`."""
        if not self.equalities:
            return jnp.zeros((0,), dtype=q.dtype)
        d = self._data(q)
        return self._holonomic(d, q)

    def _holonomic(self, d, q):
        if not self.equalities:
            return jnp.zeros((0,), dtype=q.dtype)
        return jnp.concatenate([self._equality(d, q, e) for e in self.equalities])

    def _equality(self, d, q, e: _Equality):
        m = self.mjx_model
        data = m.eq_data[e.index]
        if e.kind in ("connect", "weld"):
            # MuJoCo's engine_core_constraint.c: the weld's anchor of body 1 is
            # data[3:6] and that of body 2 data[0:3]; the connect's the other way.
            a1, a2 = (data[0:3], data[3:6]) if e.kind == "connect" else (data[3:6],
                                                                          data[0:3])
            if e.site:
                p1, p2 = d.site_xpos[e.obj1], d.site_xpos[e.obj2]
            else:
                p1 = d.xmat[e.obj1] @ a1 + d.xpos[e.obj1]
                p2 = d.xmat[e.obj2] @ a2 + d.xpos[e.obj2]
            if e.kind == "connect":
                return p1 - p2
            if e.site:
                b1, b2 = m.site_bodyid[e.obj1], m.site_bodyid[e.obj2]
                q1 = _quat_mul(d.xquat[b1], m.site_quat[e.obj1])
                q2 = _quat_mul(d.xquat[b2], m.site_quat[e.obj2])
            else:
                q1 = _quat_mul(d.xquat[e.obj1], data[6:10])  # relpose
                q2 = d.xquat[e.obj2]
            rot = _quat_mul(_quat_conj(q2), q1)[1:]
            return jnp.concatenate([p1 - p2, rot * data[10]])  # torquescale
        if e.kind == "joint":
            adr = m.jnt_qposadr
            x1 = q[adr[e.obj1]] - m.qpos0[adr[e.obj1]]
            x2 = q[adr[e.obj2]] - m.qpos0[adr[e.obj2]] if e.obj2 >= 0 else None
        else:  # tendon
            x1 = d.ten_length[e.obj1] - m.tendon_length0[e.obj1]
            x2 = (d.ten_length[e.obj2] - m.tendon_length0[e.obj2]
                  if e.obj2 >= 0 else None)
        poly = data[0]
        if x2 is not None:
            poly = poly + x2 * (data[1] + x2 * (data[2] + x2 * (data[3]
                                                                + x2 * data[4])))
        return (x1 - poly)[None]

    def energy(self, t, q, v):
        """Kinetic plus potential energy: $\\tfrac12 v^TMv$, gravity, joint and
        tendon springs, as MuJoCo's `mj_energyPos` and `mj_energyVel`, except
        that a body's gravity compensation (`gravcomp`) lowers its weight here:
        MuJoCo's `mj_energyPos` counts the full weight, which the compensating
        force then does work against, so its energy is not conserved on such a
        model while this one is."""
        d = self._data(q)
        return self._energy(d, v, self._full_m(d))

    def _energy(self, d, v, M):
        m = self.mjx_model
        energy = 0.5 * v @ M @ v
        if self._gravity:
            mass = m.body_mass
            if self._gravcomp:
                mass = mass * (1 - m.body_gravcomp)
            energy = energy - jnp.sum(mass[1:] * (d.xipos[1:] @ m.opt.gravity))
        if self._passive:
            for k, j in zip(m.jnt_stiffness, self.joints):
                x, x0 = d.qpos[j.qposadr:], m.qpos_spring[j.qposadr:]
                if j.type in (_SLIDE, _HINGE):
                    energy = energy + 0.5 * k * (x[0] - x0[0]) ** 2
                    continue
                if j.type == _FREE:
                    energy = energy + 0.5 * k * jnp.sum((x[:3] - x0[:3]) ** 2)
                    x, x0 = x[3:], x0[3:]
                # d.qpos holds the normalised quaternions (mjx.kinematics).
                rel = _quat_mul(_quat_conj(x0[:4]), x[:4])
                energy = energy + 0.5 * k * _rotation_angle_squared(rel)
            if m.ntendon:
                lower, upper = m.tendon_lengthspring[:, 0], m.tendon_lengthspring[:, 1]
                length = d.ten_length
                stretch = jnp.where(length > upper, length - upper,
                                    jnp.where(length < lower, length - lower, 0.0))
                energy = energy + 0.5 * jnp.sum(m.tendon_stiffness * stretch**2)
        return energy

    # -- coordinates with quaternions -----------------------------------------------

    def position_rate(self, t, q, v):
        r"""$\dot q = T(q)\,v$, shape `(nq,)`: `v` for hinge and slide joints,
        $\tfrac12 q\otimes(0, \omega)$ for a ball joint (ω in the child frame, as
        MuJoCo), the linear velocity (world frame) then that for a free joint. For
        unit quaternions, the derivative of `integrate_position(q, h * v)` at
        `h = 0`."""
        if self.nq == self.nv:
            return v
        plain, quats, order = self._coordinates()
        omega = v[quats.dofs]
        pure = jnp.concatenate([jnp.zeros((*omega.shape[:-1], 1), v.dtype), omega], -1)
        rates = 0.5 * _quat_mul(q[quats.qpos], pure)
        return jnp.concatenate([v[plain.dofs], rates.reshape(-1)])[order]

    def integrate_position(self, q, dv):
        r"""The configuration reached from `q` by the velocity-space displacement
        `dv` (shape `(nv,)`) in unit time, as MuJoCo's `mj_integratePos` with
        `dt = 1`: `q + dv` for hinge and slide joints, $\bar q\otimes\exp(\omega/2)$
        ($\bar q$ normalised) for ball and free joints; smooth at `dv = 0`."""
        if self.nq == self.nv:
            return q + dv
        plain, quats, order = self._coordinates()
        quat = q[quats.qpos]
        quat = quat / jnp.linalg.norm(quat, axis=-1, keepdims=True)
        turned = _quat_mul(quat, jax.vmap(_quat_exp)(dv[quats.dofs]))
        return jnp.concatenate([q[plain.qpos] + dv[plain.dofs],
                                turned.reshape(-1)])[order]

    def _coordinates(self):
        """Static index arrays of the coordinates: `plain` (hinge, slide and a free
        joint's position: `qpos` and dof indices, shape `(k,)`) and `quats` (ball
        and free joints' quaternions, `qpos` shape `(n, 4)`, their angular
        velocities' dofs shape `(n, 3)`), and `order`, the permutation that takes
        `[plain coordinates, quaternions]` to `qpos` order."""
        plain_q, plain_v, quat_q, quat_v = [], [], [], []
        for j in self.joints:
            a, b = j.qposadr, j.dofadr
            if j.type in (_SLIDE, _HINGE):
                plain_q.append(a)
                plain_v.append(b)
                continue
            if j.type == _FREE:
                plain_q += [a, a + 1, a + 2]
                plain_v += [b, b + 1, b + 2]
                a, b = a + 3, b + 3
            quat_q.append([a, a + 1, a + 2, a + 3])
            quat_v.append([b, b + 1, b + 2])
        order = np.argsort(np.concatenate([plain_q, np.ravel(quat_q)]).astype(int))
        return (_Indices(np.array(plain_q, int), np.array(plain_v, int)),
                _Indices(np.array(quat_q, int).reshape(-1, 4),
                         np.array(quat_v, int).reshape(-1, 3)), order)

    # -- kinematic helpers ----------------------------------------------------------

    def _id(self, kind: str, names: tuple[str, ...], name) -> int:
        if isinstance(name, (int, np.integer)):
            if not 0 <= name < len(names):
                raise ValueError(f"{kind} id {name} out of range: {self.name} has "
                                 f"{len(names)} {kind}s")
            return int(name)
        if name not in names:
            known = ", ".join(repr(n) for n in names if n)
            raise ValueError(f"no {kind} named {name!r} in {self.name} (named "
                             f"{kind}s: {known or 'none'})")
        return names.index(name)

    def body_position(self, q, name):
        """World position of a body's frame (MuJoCo's `xpos`), shape `(3,)`.
        `name`: the body's name or id."""
        return self._data(q).xpos[self._id("body", self.body_names, name)]

    def body_rotation(self, q, name):
        """World orientation of a body's frame (MuJoCo's `xmat`), shape `(3, 3)`."""
        return self._data(q).xmat[self._id("body", self.body_names, name)]

    def site_position(self, q, name):
        """World position of a site (MuJoCo's `site_xpos`), shape `(3,)`."""
        return self._data(q).site_xpos[self._id("site", self.site_names, name)]

    def site_rotation(self, q, name):
        """World orientation of a site (MuJoCo's `site_xmat`), shape `(3, 3)`."""
        return self._data(q).site_xmat[self._id("site", self.site_names, name)]

    def _rate(self, f, q, v):
        """The derivative of `f(q)` along $\\dot q = T(q)\\,v$, and `f(q)`."""
        value, rate = jax.jvp(f, (q,), (self.position_rate(0.0, q, v),))
        return rate, value

    def _jacobian(self, velocity, q):
        eye = jnp.eye(self.nv, dtype=q.dtype)
        return jax.vmap(lambda e: velocity(q, e), out_axes=1)(eye)

    def site_velocity(self, q, v, name):
        """World linear velocity of a site, shape `(3,)`."""
        return self._rate(lambda q: self.site_position(q, name), q, v)[0]

    def body_angular_velocity(self, q, v, name):
        """World angular velocity of a body, shape `(3,)`."""
        rate, rot = self._rate(lambda q: self.body_rotation(q, name), q, v)
        return _vee(rate @ rot.T)

    def site_jacobian(self, q, name):
        """Translational Jacobian of a site (MuJoCo's `mj_jacSite`), shape
        `(3, nv)`: `site_velocity(q, v, name) = site_jacobian(q, name) @ v`."""
        return self._jacobian(lambda q, v: self.site_velocity(q, v, name), q)

    def body_angular_jacobian(self, q, name):
        """Rotational Jacobian of a body (MuJoCo's `mj_jacBody`), shape `(3, nv)`:
        `body_angular_velocity(q, v, name) = body_angular_jacobian(q, name) @ v`."""
        return self._jacobian(lambda q, v: self.body_angular_velocity(q, v, name), q)

    # -- state and parameters -------------------------------------------------------

    def initial_state(self):
        """`(q0, v0)`: the first keyframe's `qpos` and `qvel` if the model has one,
        else `qpos0` and zero velocities. Not projected onto the constraints: warns
        (`UserWarning`) when they are violated by more than 1e-6."""
        m = self.mjx_model
        if m.nkey:
            q0 = jnp.asarray(m.key_qpos[0], dtype=m.qpos0.dtype)
            v0 = jnp.asarray(m.key_qvel[0], dtype=m.qpos0.dtype)
            label = (f"keyframe {self.keyframe_names[0]!r}" if self.keyframe_names[0]
                     else "keyframe 0")
        else:
            q0, v0 = m.qpos0, jnp.zeros(self.nv, dtype=m.qpos0.dtype)
            label = "qpos0 (the model has no keyframe)"
        if self.equalities and not isinstance(q0, jax.core.Tracer):
            residual = np.abs(np.asarray(eqx.filter_jit(self.holonomic)(0.0, q0)))
            if residual.size and residual.max() > 1e-6:
                row = int(residual.argmax())
                labels = [e.label for e in self.equalities for _ in range(e.rows)]
                _warn(
                    f"{self.name}: {label} violates the equality constraints by "
                    f"{residual.max():.3g} (largest residual, {labels[row]}); "
                    "project it onto the constraints before simulating: "
                    "q0, v0 = cdiff.consistent_state(model, q0, v0)")
        return q0, v0

    def tree_replace(self, params: dict[str, Any]) -> MuJoCoModel:
        """A copy with parameters of `mjx_model` replaced, by dotted name (as
        `mjx.Model.tree_replace`): `{"body_mass": masses, "opt.gravity": g}`.

        **Raises:** `TypeError` for a static field, `ValueError` for an unknown
        field or a change of shape.
        """
        for key, value in params.items():
            old = self.mjx_model
            for part in key.split("."):
                if not hasattr(old, part):
                    raise ValueError(f"mjx.Model has no field {key!r}")
                old = getattr(old, part)
            if not isinstance(old, jax.Array):
                raise TypeError(f"{key!r} is static in mjx.Model, not a parameter: "
                                f"load a modified model instead")
            if jnp.shape(value) != old.shape:
                raise ValueError(f"{key!r} has shape {old.shape}, got "
                                 f"{jnp.shape(value)}")
        return eqx.tree_at(lambda s: s.mjx_model, self,
                           self.mjx_model.tree_replace(params))


# -- the terms at one state from one MJX pass -----------------------------------------

_WRAP_SPHERE, _WRAP_CYLINDER = 4, 5  # mjtWrap: wrapping around geoms


def _chain(m) -> np.ndarray:
    """`(nbody, nv)` booleans: whether each dof moves each body (its joint is on
    the body or on an ancestor)."""
    parent = np.asarray(m.body_parentid)
    ancestor = np.zeros((parent.size, parent.size), bool)
    for b in range(parent.size):
        a = b
        while True:
            ancestor[b, a] = True
            if a == 0:
                break
            a = parent[a]
    return ancestor[:, np.asarray(m.dof_bodyid)]


def _quat_sandwich(a, b):
    r"""The 3x3 matrix $K$ with $K\omega = \operatorname{vec}(a\otimes(0,\omega)
    \otimes b)$."""
    eye = jnp.eye(3, dtype=a.dtype)
    return jax.vmap(lambda w: _quat_mul(_quat_mul(a, jnp.concatenate(
        [jnp.zeros((1,), a.dtype), w])), b)[1:], out_axes=1)(eye)


def _pure(w):
    """The quaternion $(0, w)$."""
    return jnp.concatenate([jnp.zeros((1,), w.dtype), w])


def _rotation_vector(quat):
    r"""The rotation vector $\theta\,u$ of the unit quaternion `quat` (either sign:
    the shorter rotation), as MuJoCo's `mju_quat2Vel` with `dt = 1`; the gradient
    of $\tfrac12\theta^2$ (`_rotation_angle_squared`) with respect to a rotation
    in the quaternion's own frame."""
    quat = quat * jnp.where(quat[0] < 0, -1.0, 1.0)
    s2 = quat[1:] @ quat[1:]
    nonzero = s2 > 0
    s = jnp.sqrt(jnp.where(nonzero, s2, 1.0))
    # theta / sin(theta / 2), and its limit 2 / cos(theta / 2) at theta = 0.
    ratio = jnp.where(nonzero, 2 * jnp.arctan2(s, quat[0]) / s, 2 / quat[0])
    return ratio * quat[1:]


def _weld_bias(q1, q2bar, w1, w2, alpha1, alpha2):
    r"""$\operatorname{vec}(\bar q_2\otimes[\tfrac12(0, \Delta\alpha) +
    \tfrac14((0,\Delta\omega)(0,\omega_1) - (0,\omega_2)(0,\Delta\omega))]\otimes
    q_1)$: the weld rotation's second derivative at $\dot v = 0$, before
    `torquescale`."""
    dw = w1 - w2
    inner = (0.5 * _pure(alpha1 - alpha2)
             + 0.25 * (_quat_mul(_pure(dw), _pure(w1))
                       - _quat_mul(_pure(w2), _pure(dw))))
    return _quat_mul(_quat_mul(q2bar, inner), q1)[1:]


class _MJXTerms(Terms):
    r"""A [`cdiff.models.MuJoCoModel`][]'s terms at one state from one MJX pass.

    One call of MJX's stages (`kinematics`, `com_pos`, `tendon`,
    `transmission`, `crb`, `tendon_armature` and, with `v`, `fwd_velocity`)
    gives every term; XLA drops what a formulation does not read. The equality
    constraints' rows are built as MuJoCo builds `efc_J`:

    - A point $p$ fixed on body $b$ has the velocity Jacobian
      $J_p = [\,c_i^{lin} + c_i^{rot}\times(p - \bar c)\,]_i$ over the dofs $i$
      that move $b$, with `cdof` $c_i$ (spatial motion about the subtree centre
      of mass $\bar c$ of $b$'s tree), and the rotational Jacobian
      $J_\omega = [c_i^{rot}]_i$ (MJX's `support.jac`).
    - Its velocity-product term (bias acceleration at $\dot v = 0$) is
      $\dot J_p v = a^{lin} + \alpha\times(p - \bar c) + \omega\times\dot p$ with
      the body's spatial bias acceleration $(\alpha, a) = \sum_i \dot c_i v_i$
      (`cdof_dot`, the term of MuJoCo's `mj_rne` at zero acceleration and
      gravity), its spatial velocity $(\omega, \cdot)$ (`cvel`) and the point's
      velocity $\dot p = J_p v$: a point's classical acceleration from a spatial
      one (Featherstone, *Rigid Body Dynamics Algorithms*, 2008, eq. 2.47; MuJoCo's
      `mj_objectAcceleration`).
    - `connect` and the weld's position rows: $\Phi = p_1 - p_2$,
      $A = J_{p_1} - J_{p_2}$, $b = -(\dot J_{p_1}v - \dot J_{p_2}v)$.
    - The weld's rotation rows, $\Phi = \tau\operatorname{vec}(\bar q_2\otimes
      q_1)$ with world-frame angular velocities ($\dot q_k = \tfrac12
      (0,\omega_k)\otimes q_k$): $\dot\Phi = \tfrac\tau2\operatorname{vec}(\bar q_2
      \otimes(0, \Delta\omega)\otimes q_1)$, $\Delta\omega = \omega_1 - \omega_2$,
      so $A = \tfrac\tau2 K(\bar q_2, q_1)(J_{\omega_1} - J_{\omega_2})$, and
      $b = -\tau\operatorname{vec}\big(\bar q_2\otimes[\tfrac12(0, \Delta\alpha)
      + \tfrac14((0,\Delta\omega)(0,\omega_1) - (0,\omega_2)(0,\Delta\omega))]
      \otimes q_1\big)$.
    - `joint` and `tendon`: $\Phi = x_1 - p(x_2)$, $A = J_1 - p'(x_2)J_2$,
      $b = -(\dot J_1v - p'(x_2)\dot J_2v - p''(x_2)(J_2v)^2)$, with unit rows for
      joints ($\dot J = 0$) and MJX's `ten_J` and `tendon_dot` for tendons.

    The energy law uses the power balance instead of a derivative: with
    $E = \tfrac12 v^TMv + V(q)$, $A_e = Mv$ and, since the velocity-product
    forces $c$ in `qfrc_bias` satisfy $v^Tc = \tfrac12 v^T\dot Mv$,
    $-b_e = v^T$`qfrc_bias` $ - \dot V_g + \dot V$: gravity's power on the full
    masses (in `qfrc_bias`) traded for that on the masses that $E$ counts
    (less gravity compensation), plus the springs' $\dot V$.

    What a subclass overrides (`holonomic`, `nonholonomic`, `energy`, ...) is
    derived by autodiff from its method, as by [`cdiff.Terms`][]; so are
    tendon equalities on tendons that wrap around geoms (MJX has no `tendon_dot`
    for them) and an energy law at a coordinate rate other than `v`.
    """

    one_pass: ClassVar[bool] = True  # every term from one MJX pass

    def __init__(self, model: MuJoCoModel, t, q, v=None):
        super().__init__(model, t, q, v)
        cls = type(model)
        self._own = {name for name in ("mass_matrix", "forces", "input_matrix",
                                       "holonomic", "energy", "position_rate")
                     if getattr(cls, name) is getattr(MuJoCoModel, name)}
        m = model.mjx_model
        wraps = np.zeros(0, int)
        for e in model.equalities:
            if e.kind == "tendon":
                for i in (e.obj1, e.obj2):
                    if i >= 0:
                        adr, num = m.tendon_adr[i], m.tendon_num[i]
                        wraps = np.append(wraps, m.wrap_type[adr:adr + num])
        wrapped = np.isin(wraps, [_WRAP_SPHERE, _WRAP_CYLINDER]).any()
        self._exact_rows = {"holonomic", "position_rate"} <= self._own and not wrapped

    @functools.cached_property
    def data(self):
        """MJX's data at the state after every stage (`MuJoCoModel.mjx_data`)."""
        return self.model._data(self.q, self.v)

    @functools.cached_property
    def mass_matrix(self):
        if "mass_matrix" not in self._own:
            return super().mass_matrix
        return self.model._full_m(self.data)

    @functools.cached_property
    def forces(self):
        if "forces" not in self._own:
            return super().forces
        return self.model._forces(self.data, self._velocity())

    @functools.cached_property
    def input_matrix(self):
        if "input_matrix" not in self._own:
            return super().input_matrix
        if self.model.nu == 0:
            return jnp.zeros((self.model.nv, 0), dtype=self.q.dtype)
        return self.model._input_matrix(self.data)

    @functools.cached_property
    def holonomic(self):
        if "holonomic" not in self._own:
            return super().holonomic
        return self.model._holonomic(self.data, self.q)

    @functools.cached_property
    def _rows(self):
        """`(phi_q, A_q, b_qv)` of the equality constraints (`b_qv` `None`
        without `v`), every connect and weld in one batched computation."""
        model, q, v = self.model, self.q, self.v
        nv, dtype = model.nv, q.dtype
        if not model.equalities:
            empty = jnp.zeros((0,), dtype)
            return empty, jnp.zeros((0, nv), dtype), empty
        frames = [e for e in model.equalities if e.kind in ("connect", "weld")]
        couplings = [e for e in model.equalities if e.kind not in ("connect", "weld")]
        phi, A, b, order = [], [], [], []
        if frames:
            phi_f, A_f, b_f, rows = self._frame_rows(frames)
            phi.append(phi_f)
            A.append(A_f)
            b.append(b_f)
        offset = sum(len(r) for r in rows) if frames else 0
        coupling_rows = iter(range(offset, offset + len(couplings)))
        frame_rows = iter(rows) if frames else iter(())
        for e in model.equalities:
            order.extend(next(frame_rows) if e.kind in ("connect", "weld")
                         else [next(coupling_rows)])
        for e in couplings:
            A_e, b_e = self._coupling_row(e)
            phi.append(model._equality(self.data, q, e))
            A.append(A_e[None])
            b.append(None if b_e is None else b_e[None])
        order = np.asarray(order)
        phi = jnp.concatenate(phi)[order]
        A = jnp.concatenate(A)[order]
        b = None if v is None else jnp.concatenate(b)[order]
        return phi, A, b

    @functools.cached_property
    def holonomic_jacobian(self):
        if not self._exact_rows:
            return super().holonomic_jacobian
        phi, A, _ = self._rows
        return phi, A

    @functools.cached_property
    def kinematics(self):
        if not self._exact_rows:
            return super().kinematics
        v = self._velocity()
        phi, A, b = self._rows
        return assemble((phi, A @ v, A, b),
                        _nonholonomic_kinematics(self.model, self.t, self.q, v), v)

    @functools.cached_property
    def residuals(self):
        if not self._exact_rows:
            return super().residuals
        v = self._velocity()
        phi, A, _ = self._rows
        return phi, jnp.concatenate([A @ v, self.model.nonholonomic(self.t, self.q, v)])

    @functools.cached_property
    def velocity_constraints(self):
        if not self._exact_rows:
            return super().velocity_constraints
        v = self._velocity()
        _, A, _ = self._rows
        phi_v, A_vv = jacobian(lambda v: self.model.nonholonomic(self.t, self.q, v), v)
        return jnp.concatenate([A @ v, phi_v]), jnp.concatenate([A, A_vv])

    @functools.cached_property
    def energy(self):
        if "energy" not in self._own:
            return super().energy
        return self.model._energy(self.data, self._velocity(), self.mass_matrix)

    def energy_law(self, qdot=None):
        if qdot is not None or not {"energy", "mass_matrix"} <= self._own:
            return super().energy_law(qdot)
        v = self._velocity()
        return EnergyLaw(self.energy, self.mass_matrix @ v, -self._power(v))

    # -- pieces --------------------------------------------------------------------

    @functools.cached_property
    def _bias(self):
        """The bodies' spatial bias accelerations $\\sum_i \\dot c_i v_i$ over the
        dofs that move them, `(nbody, 6)` (rotation first, as `cvel`)."""
        d, v = self.data, self._velocity()
        chain = jnp.asarray(self._chain, v.dtype)
        return chain @ (d.cdof_dot * v[:, None])

    @functools.cached_property
    def _chain(self):
        return _chain(self.model.mjx_model)

    def _points(self, bodies, points):
        """`(J_p, J_omega, Jdot_p v, Jdot_omega v)` of points fixed on `bodies`
        (static ids, shape `(P,)`), at `points` `(P, 3)`: Jacobians `(P, nv, 3)`,
        bias accelerations `(P, 3)` (`None` without `v`)."""
        d = self.data
        mask = jnp.asarray(self._chain[bodies], d.cdof.dtype)[..., None]
        root = np.asarray(self.model.mjx_model.body_rootid)[bodies]
        offset = points - d.subtree_com[root]
        rot, lin = d.cdof[None, :, :3], d.cdof[None, :, 3:]
        J_p = (lin + jnp.cross(rot, offset[:, None])) * mask
        J_w = rot * mask
        if self.v is None:
            return J_p, J_w, None, None
        alpha, acc = self._bias[bodies, :3], self._bias[bodies, 3:]
        omega = d.cvel[bodies, :3]
        velocity = d.cvel[bodies, 3:] + jnp.cross(omega, offset)
        return (J_p, J_w, acc + jnp.cross(alpha, offset) + jnp.cross(omega, velocity),
                alpha)

    def _frame_rows(self, frames: list[_Equality]):
        """The rows of the connects and welds: residuals `phi` `(rows,)` (as
        `MuJoCoModel._equality`), `A` `(rows, nv)`, `b` `(rows,)` (or `None`) and,
        per equality, the indices of its rows."""
        m, d, v = self.model.mjx_model, self.data, self.v
        n = len(frames)
        data = m.eq_data[np.array([e.index for e in frames])]
        site = np.array([e.site for e in frames])
        weld = np.array([e.kind == "weld" for e in frames])
        obj = np.array([[e.obj1, e.obj2] for e in frames])
        site_obj = np.where(site[:, None], obj, 0)
        bodies = (np.where(site[:, None], np.asarray(m.site_bodyid)[site_obj], obj)
                  if m.nsite else obj)
        # MuJoCo's engine_core_constraint.c: the weld's anchor of body 1 is
        # data[3:6] and that of body 2 data[0:3]; the connect's the other way.
        anchors = jnp.where(weld[:, None, None],
                            jnp.stack([data[:, 3:6], data[:, 0:3]], 1),
                            jnp.stack([data[:, 0:3], data[:, 3:6]], 1))
        points = jnp.einsum("epij,epj->epi", d.xmat[bodies], anchors) + d.xpos[bodies]
        if m.nsite:
            points = jnp.where(site[:, None, None], d.site_xpos[site_obj], points)
        bodies, points = bodies.T.reshape(-1), jnp.swapaxes(points, 0, 1).reshape(-1, 3)
        J_p, J_w, acc, alpha = self._points(bodies, points)
        phi = jnp.zeros((n, 6), d.cdof.dtype).at[:, :3].set(points[:n] - points[n:])
        A = jnp.zeros((n, 6, m.nv), d.cdof.dtype)
        A = A.at[:, :3].set(jnp.swapaxes(J_p[:n] - J_p[n:], 1, 2))
        b = None if v is None else jnp.zeros((n, 6), d.cdof.dtype).at[:, :3].set(
            acc[n:] - acc[:n])
        w = np.nonzero(weld)[0]
        if w.size:
            identity = jnp.array([1.0, 0.0, 0.0, 0.0], d.cdof.dtype)
            rel1, rel2 = data[w, 6:10], jnp.broadcast_to(identity, (w.size, 4))
            if m.nsite:
                rel1 = jnp.where(site[w, None], m.site_quat[site_obj[w, 0]], rel1)
                rel2 = jnp.where(site[w, None], m.site_quat[site_obj[w, 1]], rel2)
            b1, b2 = bodies[w], bodies[n + w]
            q1 = jax.vmap(_quat_mul)(d.xquat[b1], rel1)
            q2bar = jax.vmap(_quat_conj)(jax.vmap(_quat_mul)(d.xquat[b2], rel2))
            scale = data[w, 10]  # torquescale
            dW = jnp.swapaxes(J_w[w] - J_w[n + w], 1, 2)
            phi = phi.at[w, 3:].set(jax.vmap(_quat_mul)(q2bar, q1)[:, 1:]
                                    * scale[:, None])
            K = jax.vmap(_quat_sandwich)(q2bar, q1)
            A = A.at[w, 3:].set(0.5 * scale[:, None, None] * (K @ dW))
            if v is not None:
                b = b.at[w, 3:].set(jax.vmap(_weld_bias)(
                    q1, q2bar, d.cvel[b1, :3], d.cvel[b2, :3], alpha[w],
                    alpha[n + w]) * -scale[:, None])
        rows, kept = [], 0
        for i, e in enumerate(frames):
            count = 6 if e.kind == "weld" else 3
            rows.append(list(range(kept, kept + count)))
            kept += count
        keep = np.concatenate([6 * i + np.arange(6 if weld[i] else 3)
                               for i in range(n)])
        A = A.reshape(6 * n, m.nv)[keep]
        return (phi.reshape(6 * n)[keep], A,
                None if b is None else b.reshape(6 * n)[keep], rows)

    def _coupling_row(self, e: _Equality):
        """`(A, b)` of a joint or tendon coupling $x_1 - p(x_2)$ (`b` `None`
        without `v`)."""
        m, d, q, v = self.model.mjx_model, self.data, self.q, self.v
        data = m.eq_data[e.index]
        nv = self.model.nv
        if e.kind == "joint":
            def coordinate(j):
                x = q[m.jnt_qposadr[j]] - m.qpos0[m.jnt_qposadr[j]]
                row = jnp.zeros(nv, q.dtype).at[m.jnt_dofadr[j]].set(1.0)
                return x, row, jnp.zeros((), q.dtype)
        else:
            if v is not None:
                jdot_v = self._tendon_dot @ v

            def coordinate(j):
                x = d.ten_length[j] - m.tendon_length0[j]
                return x, _impl(d).ten_J[j], None if v is None else jdot_v[j]
        _, J1, c1 = coordinate(e.obj1)
        A, b = J1, None if v is None else -c1
        if e.obj2 >= 0:
            x2, J2, c2 = coordinate(e.obj2)
            slope = data[1] + x2 * (2 * data[2] + x2 * (3 * data[3] + x2 * 4 * data[4]))
            A = A - slope * J2
            if v is not None:
                curvature = 2 * data[2] + x2 * (6 * data[3] + x2 * 12 * data[4])
                b = b + slope * c2 + curvature * (J2 @ v) ** 2
        return A, b

    @functools.cached_property
    def _tendon_dot(self):
        """MJX's $\\dot J$ of the tendon lengths, `(ntendon, nv)` (spatial tendons
        through sites; zero for fixed tendons)."""
        from mujoco.mjx._src import smooth

        with jax.numpy_dtype_promotion("standard"):
            return smooth.tendon_dot(self.model.mjx_model, self.data)

    def _power(self, v):
        r"""$\tfrac{d}{dt}E$ at $\dot v = 0$: $v^T$`qfrc_bias` less gravity's power
        on what gravity compensation carries, plus the springs' $\dot V$."""
        model, m, d = self.model, self.model.mjx_model, self.data
        power = v @ d.qfrc_bias
        if model._gravity and model._gravcomp:
            root = np.asarray(m.body_rootid)
            offset = d.xipos - d.subtree_com[root]
            velocity = d.cvel[:, 3:] + jnp.cross(d.cvel[:, :3], offset)
            power = power + jnp.sum(m.body_mass * m.body_gravcomp
                                    * (velocity @ m.opt.gravity))
        if model._passive:
            for k, j in zip(m.jnt_stiffness, model.joints):
                x, x0 = d.qpos[j.qposadr:], m.qpos_spring[j.qposadr:]
                w = v[j.dofadr:]
                if j.type in (_SLIDE, _HINGE):
                    power = power + k * (x[0] - x0[0]) * w[0]
                    continue
                if j.type == _FREE:
                    power = power + k * (x[:3] - x0[:3]) @ w[:3]
                    x, x0, w = x[3:], x0[3:], w[3:]
                rel = _quat_mul(_quat_conj(x0[:4]), x[:4])
                power = power + k * _rotation_vector(rel) @ w[:3]
            if m.ntendon:
                lower, upper = m.tendon_lengthspring[:, 0], m.tendon_lengthspring[:, 1]
                length = d.ten_length
                stretch = jnp.where(length > upper, length - upper,
                                    jnp.where(length < lower, length - lower, 0.0))
                power = power + jnp.sum(m.tendon_stiffness * stretch
                                        * (_impl(d).ten_J @ v))
        return power


# -- loading ------------------------------------------------------------------------


def _load(source):
    mujoco, _ = _mujoco()
    if isinstance(source, mujoco.MjModel):
        return source
    if isinstance(source, mujoco.MjSpec):
        try:
            return source.compile()
        except Exception as e:  # MuJoCo raises ValueError, or others
            raise ValueError(f"MuJoCo could not compile the MjSpec: {e}") from e
    if isinstance(source, str) and source.lstrip().startswith("<"):
        try:
            return mujoco.MjModel.from_xml_string(source)
        except Exception as e:
            raise ValueError(f"MuJoCo could not load the XML string: {e}") from e
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise ValueError(f"no such MuJoCo model file: {path!r}")
        try:
            return mujoco.MjModel.from_xml_path(path)
        except Exception as e:
            raise ValueError(f"MuJoCo could not load {path!r}: {e}") from e
    raise TypeError(
        "from_mujoco expects an MJCF or URDF path, an XML string, a mujoco.MjModel "
        f"or a mujoco.MjSpec; got {type(source).__name__}"
    )


def _names(mujoco, m, obj, n):
    return tuple(mujoco.mj_id2name(m, obj, i) or "" for i in range(n))


# Frames of these packages are skipped when a warning names the caller's line.
_WRAPPERS = tuple(str(Path(mod.__file__).parent) for mod in (eqx,))
_CDIFF = str(Path(__file__).resolve().parent.parent)


def _warn(message: str) -> None:
    """A `UserWarning` attributed to the first frame outside cdiff, equinox,
    jaxtyping and beartype: the user's line (a method call on a Module and runtime
    type checks add frames of their own, so no fixed `stacklevel` finds it)."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_CDIFF) or name.startswith(_WRAPPERS)
                or "jaxtyping" in name or name.startswith(("<frozen", "<@beartype"))):
            break
        frame = frame.f_back
    globals_ = frame.f_globals
    warnings.warn_explicit(message, UserWarning, frame.f_code.co_filename,
                           frame.f_lineno, module=globals_.get("__name__"),
                           registry=globals_.setdefault("__warningregistry__", {}),
                           module_globals=globals_)


def _labels(kind, names, ids):
    return [f"{kind} {names[i]!r}" if names[i] else f"{kind} {i}" for i in ids]


def _field(m, name, n):
    """`m.name`, or `n` zeros where this version of MuJoCo does not have it."""
    return getattr(m, name, np.zeros(n))


def _nonzero_rows(a):
    """Whether each row of `a` (any shape) has a nonzero entry."""
    a = np.asarray(a)
    return (a != 0).reshape(a.shape[0], -1).any(axis=1) if a.size \
        else np.zeros(a.shape[0], bool)


def _contact_pairs(mujoco, m, geom_labels):
    """MuJoCo's candidate contacts: explicit `<pair>`s and the geom pairs that
    pass its contype/conaffinity, weld, parent and `<exclude>` filters."""
    pairs = _labels("pair", _names(mujoco, m, mujoco.mjtObj.mjOBJ_PAIR, m.npair),
                    range(m.npair))
    ct, ca = m.geom_contype, m.geom_conaffinity
    ok = ((ct[:, None] & ca[None, :]) | (ca[:, None] & ct[None, :])) != 0
    ok &= np.triu(np.ones_like(ok), 1).astype(bool)
    body = m.geom_bodyid
    weld = m.body_weldid[body]
    ok &= weld[:, None] != weld[None, :]
    if not m.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_FILTERPARENT:
        parent = m.body_weldid[m.body_parentid[weld]]
        related = ((weld[:, None] == parent[None, :])
                   | (parent[:, None] == weld[None, :]))
        ok &= ~(related & (weld[:, None] != 0) & (weld[None, :] != 0))
    lo, hi = np.minimum.outer(body, body), np.maximum.outer(body, body)
    ok &= ~np.isin((lo << 16) + hi, m.exclude_signature)
    g1, g2 = m.pair_geom1, m.pair_geom2  # listed above as pairs
    ok[np.minimum(g1, g2), np.maximum(g1, g2)] = False
    return pairs + [f"{geom_labels[i]} / {geom_labels[j]}"
                    for i, j in zip(*np.nonzero(ok))]


def _check(mujoco, m) -> tuple[list[str], list[str]]:
    """`(refused, ignored)`: what cdiff cannot represent, and what MuJoCo would
    simulate but cdiff does not (inequality constraints, control clamping)."""
    obj, dis = mujoco.mjtObj, mujoco.mjtDisableBit
    flags = m.opt.disableflags
    label = {kind: _labels(kind, _names(mujoco, m, o, n), range(n)) for kind, o, n in (
        ("joint", obj.mjOBJ_JOINT, m.njnt), ("tendon", obj.mjOBJ_TENDON, m.ntendon),
        ("actuator", obj.mjOBJ_ACTUATOR, m.nu), ("equality", obj.mjOBJ_EQUALITY, m.neq),
        ("geom", obj.mjOBJ_GEOM, m.ngeom), ("flex", obj.mjOBJ_FLEX, m.nflex),
        ("plugin", obj.mjOBJ_PLUGIN, m.nplugin))}
    refused, ignored = [], []

    def listed(kind, which):
        """The labels of the objects of `kind` selected by a mask or indices."""
        which = np.asarray(which)
        ids = np.nonzero(which)[0] if which.dtype == bool else np.unique(which)
        return [label[kind][i] for i in ids]

    def refuse(what, kind, which):
        if names := listed(kind, which):
            refused.append(f"{what}: {', '.join(names)}")

    def ignore(what, names):
        if names:
            ignored.append(f"{what}: {', '.join(names)}")

    if bool(flags & dis.mjDSBL_SPRING) != bool(flags & dis.mjDSBL_DAMPER):
        refused.append("option flag spring or damper disabled alone (MJX then drops "
                       "every passive force, MuJoCo only the disabled ones)")
    refuse("flexes", "flex", np.ones(m.nflex, bool))
    refuse("plugins", "plugin", np.ones(m.nplugin, bool))
    eq_on = not flags & (dis.mjDSBL_EQUALITY | dis.mjDSBL_CONSTRAINT)
    active = m.eq_active0.astype(bool) & eq_on
    refuse("equality constraints other than connect, weld, joint and tendon",
           "equality", active & ~np.isin(m.eq_type, list(_EQ_KINDS)))
    # An equality to a mocap body constrains to a pose set at run time.
    mocap = m.body_mocapid >= 0
    frames = np.isin(m.eq_type, [_CONNECT, _WELD])
    on_site = m.eq_objtype == _OBJ_SITE
    on_mocap = np.zeros(m.neq, bool)
    for ids in (m.eq_obj1id, m.eq_obj2id):
        bodies = np.clip(ids, 0, None)
        if m.nsite:
            bodies = np.where(on_site, m.site_bodyid[np.clip(ids, 0, m.nsite - 1)],
                              bodies)
        on_mocap |= frames & mocap[bodies]
    refuse("equality constraints to mocap bodies (moved at run time)", "equality",
           active & on_mocap)

    gain, bias = m.actuator_gaintype, m.actuator_biastype
    refuse("actuators with a slider-crank or body transmission (not in MJX)",
           "actuator", ~np.isin(m.actuator_trntype, [_TRN_JOINT, _TRN_JOINTINPARENT,
                                                     _TRN_SITE, _TRN_TENDON]))
    refuse("actuators with activation dynamics", "actuator",
           m.actuator_dyntype != _DYN_NONE)
    refuse("actuators whose gain is not fixed", "actuator", gain != _GAIN_FIXED)
    refuse("actuators whose bias is not affine", "actuator",
           ~np.isin(bias, [_BIAS_NONE, _BIAS_AFFINE]))
    for field in ("damping", "dampingpoly", "armature", "delay"):
        refuse(f"actuators with {field} (not in MJX)", "actuator",
               _nonzero_rows(_field(m, f"actuator_{field}", m.nu)))
    # MJX wraps the setpoint of servos on ball joints and rotational sites.
    servo = ((gain == _GAIN_FIXED) & (bias == _BIAS_AFFINE)
             & (m.actuator_gainprm[:, 0] == -m.actuator_biasprm[:, 1]))
    on_joint = np.isin(m.actuator_trntype, [_TRN_JOINT, _TRN_JOINTINPARENT])
    on_ball = on_joint & (m.jnt_type[np.clip(m.actuator_trnid[:, 0], 0, None)]
                          == _BALL) if m.njnt else on_joint
    on_ref_site = ((m.actuator_trntype == _TRN_SITE)
                   & (m.actuator_trnid[:, 1] >= 0)
                   & np.all(m.actuator_gear[:, :3] == 0, axis=1))
    refuse("servos with a wrapped setpoint (ball joint or rotational site)",
           "actuator", servo & (on_ball | on_ref_site))
    refuse("joints with polynomial stiffness (not in MJX)", "joint",
           _nonzero_rows(_field(m, "jnt_stiffnesspoly", m.njnt)))
    refuse("joints with polynomial damping (not in MJX)", "joint",
           m.dof_jntid[_nonzero_rows(_field(m, "dof_dampingpoly", m.nv))])
    # MJX's dense M couples the trees, MuJoCo's sparse M cannot: they disagree.
    refuse("tendons with armature that span several kinematic trees", "tendon",
           (_field(m, "tendon_armature", m.ntendon) > 0)
           & (_field(m, "tendon_treenum", m.ntendon) > 1))
    refuse("tendons with polynomial stiffness or damping (not in MJX)", "tendon",
           _nonzero_rows(_field(m, "tendon_stiffnesspoly", m.ntendon))
           | _nonzero_rows(_field(m, "tendon_dampingpoly", m.ntendon)))
    if m.opt.density > 0 or m.opt.viscosity > 0:
        refuse("geoms with the ellipsoid fluid model (not in MJX)", "geom",
               m.geom_fluid[:, 0] > 0)

    constraints = not flags & dis.mjDSBL_CONSTRAINT
    if constraints and not flags & dis.mjDSBL_CONTACT:
        ignore("contacts", _contact_pairs(mujoco, m, label["geom"]))
    if constraints and not flags & dis.mjDSBL_FRICTIONLOSS:
        ignore("friction loss", listed("joint", m.dof_jntid[m.dof_frictionloss > 0])
               + listed("tendon", m.tendon_frictionloss > 0))
    if not flags & dis.mjDSBL_ACTUATION:
        if not flags & dis.mjDSBL_CLAMPCTRL:
            ignore("control ranges", listed("actuator",
                                            m.actuator_ctrllimited.astype(bool)))
        ignore("actuator force ranges",
               listed("actuator", m.actuator_forcelimited.astype(bool)))
        ignore("joint actuator-force ranges",
               listed("joint", m.jnt_actfrclimited.astype(bool)))
        ignore("tendon actuator-force ranges",
               listed("tendon", m.tendon_actfrclimited.astype(bool)))
    if eq_on:
        ignore("inactive equality constraints (eq_active0 = false)",
               listed("equality", ~active))
    return refused, ignored


def _mjx_copy(mujoco, m):
    """A copy of `m` that MJX loads whatever its collision geometry and options:
    cdiff needs neither collisions nor MuJoCo's integrator and solver."""
    c = copy.copy(m)
    c.geom_contype[:] = 0
    c.geom_conaffinity[:] = 0
    c.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    c.opt.enableflags = 0
    c.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    c.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return c


def from_mujoco(source, *, cls: type[MuJoCoModel] = MuJoCoModel,
                **fields) -> MuJoCoModel:
    """Load a MuJoCo model as a [`cdiff.models.MuJoCoModel`][].

    **Arguments:**

    - `source`: the path of an MJCF or URDF file, an MJCF string (a `str` starting
      with `<`), a `mujoco.MjModel` or a `mujoco.MjSpec` (compiled here).
    - `cls`: the class to build, a subclass of `MuJoCoModel` that adds
      constraints; `fields`: the values of the fields that it adds.

    **Returns:** the model, with the MJX model's arrays as float64 leaves when
    `jax_enable_x64` is set.

    **Raises:** `ValueError` for a file that does not exist or does not load
    (quoting MuJoCo's message), and for elements that cdiff cannot represent
    (flexes, plugins, actuators with activation dynamics or non-fixed gains,
    equality constraints other than connect, weld, joint and tendon, ...), each
    named. Warns (one `UserWarning` listing them by name) about what MuJoCo
    simulates as inequality constraints or clamping and cdiff does not: contacts,
    friction loss, control and force ranges. Joint limits (hinge, slide, ball) and
    tendon limits are the model's unilateral rows.
    """
    if not (isinstance(cls, type) and issubclass(cls, MuJoCoModel)):
        raise TypeError(f"cls must be a subclass of MuJoCoModel, got {cls!r}")
    mujoco, mjx = _mujoco()
    m = _load(source)
    # The model's name is the first of MuJoCo's names.
    label = m.names.split(b"\0", 1)[0].decode() or "MuJoCo model"
    refused, ignored = _check(mujoco, m)
    if refused:
        raise ValueError(f"cdiff cannot represent these elements of {label}: "
                         + "; ".join(refused))
    try:
        mx = mjx.put_model(_mjx_copy(mujoco, m))
    except NotImplementedError as e:
        raise ValueError(f"MJX cannot load {label}: {e}") from e
    if ignored:
        _warn(f"{label}: not simulated by cdiff (MuJoCo treats them as inequality "
              "constraints or clamps): " + "; ".join(ignored))

    obj, dis = mujoco.mjtObj, mujoco.mjtDisableBit
    flags = m.opt.disableflags
    eq_names = _names(mujoco, m, obj.mjOBJ_EQUALITY, m.neq)
    equalities = []
    if not flags & (dis.mjDSBL_EQUALITY | dis.mjDSBL_CONSTRAINT):
        for i in np.nonzero(m.eq_active0)[0]:
            kind, rows = _EQ_KINDS[int(m.eq_type[i])]
            equalities.append(_Equality(
                _labels(f"{kind} equality", eq_names, [i])[0], kind, int(i),
                int(m.eq_obj1id[i]), int(m.eq_obj2id[i]),
                bool(m.eq_objtype[i] == _OBJ_SITE), rows))
    actuation = not flags & dis.mjDSBL_ACTUATION
    # MuJoCo's option disableactuator: a bit per actuator group 0 to 30.
    actuated = tuple(bool(actuation and not (0 <= g <= 30
                                             and (m.opt.disableactuator >> g) & 1))
                     for g in m.actuator_group)
    # _check refuses springs or dampers disabled alone.
    passive = not flags & dis.mjDSBL_SPRING
    gravity = not flags & dis.mjDSBL_GRAVITY
    limits_on = not flags & (dis.mjDSBL_LIMIT | dis.mjDSBL_CONSTRAINT)
    return cls(
        **fields,
        mjx_model=mx,
        name=label,
        nq=int(m.nq),
        nv=int(m.nv),
        nu=int(m.nu),
        joints=tuple(_Joint(int(t), int(a), int(b)) for t, a, b in
                     zip(m.jnt_type, m.jnt_qposadr, m.jnt_dofadr)),
        equalities=tuple(equalities),
        body_names=_names(mujoco, m, obj.mjOBJ_BODY, m.nbody),
        site_names=_names(mujoco, m, obj.mjOBJ_SITE, m.nsite),
        joint_names=_names(mujoco, m, obj.mjOBJ_JOINT, m.njnt),
        actuator_names=_names(mujoco, m, obj.mjOBJ_ACTUATOR, m.nu),
        keyframe_names=_names(mujoco, m, obj.mjOBJ_KEY, m.nkey),
        ignored=tuple(ignored),
        _actuated=actuated,
        _gravity=bool(gravity),
        _gravcomp=bool(m.ngravcomp and gravity and passive),
        _passive=bool(passive),
        _limits=tuple((int(j), int(m.jnt_qposadr[j])) for j in range(m.njnt)
                      if m.jnt_limited[j] and m.jnt_type[j] in (_SLIDE, _HINGE)
                      and limits_on),
        _ball_limits=tuple((int(j), int(m.jnt_qposadr[j])) for j in range(m.njnt)
                           if m.jnt_limited[j] and m.jnt_type[j] == _BALL
                           and limits_on),
        _tendon_limits=tuple(int(k) for k in range(m.ntendon)
                             if m.tendon_limited[k] and limits_on),
    )
