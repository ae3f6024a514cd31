"""The model: [`cdiff.models.MuJoCoModel`][] and its API (MJX's dynamics at a
state, the equality constraints' residuals, joint and tendon limits, the energy,
coordinates with quaternions, kinematic helpers, parameters)."""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..._model import AbstractModel
from ._common import (
    _BIAS_AFFINE,
    _FREE,
    _HINGE,
    _SLIDE,
    _Equality,
    _Joint,
    _mujoco,
    _warn,
)
from ._quaternion import (
    _quat_conj,
    _quat_exp,
    _quat_mul,
    _rotation_angle,
    _rotation_angle_squared,
    _vee,
)
from ._terms import _equality_residuals, _impl, _mjx_stages, _MJXTerms


class _Indices(NamedTuple):
    qpos: np.ndarray
    dofs: np.ndarray


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

    def _inherited(self, names: tuple[str, ...]) -> set[str]:
        """Those of the methods `names` that this model's class does not override:
        its terms compute them from their MJX pass, the others by autodiff."""
        cls = type(self)
        return {name for name in names if getattr(cls, name) is getattr(MuJoCoModel,
                                                                         name)}

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
        return _equality_residuals(self.mjx_model, d, q, self.equalities)

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
