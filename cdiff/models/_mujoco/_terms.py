"""The terms of a model's equations of motion at one state, from one MJX pass:
`_mjx_stages` (MJX's stages, one jitted function for every caller), the
equality constraints' residuals (`_frame_residuals`, every connect and weld in
one batched computation, and `_coupling_residual`, the joint and tendon
couplings) and `_MJXTerms`, which builds their Jacobians and velocity-product
terms as MuJoCo builds `efc_J`, the energy law and the rest from that pass."""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._kinematics import (
    EnergyLaw,
    Terms,
    _nonholonomic_kinematics,
    assemble,
    jacobian,
)
from ._common import _FREE, _HINGE, _SLIDE, _Equality, _mujoco
from ._quaternion import (
    _pure,
    _quat_conj,
    _quat_mul,
    _quat_sandwich,
    _rotation_vector,
)


def _impl(d):
    """The fields of MJX's data that are specific to its JAX implementation
    (`actuator_moment`, ...)."""
    return getattr(d, "_impl", d)


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


# -- the equality constraints' residuals ----------------------------------------------


def _equality_order(equalities) -> tuple[list, list, np.ndarray]:
    """`(frames, couplings, order)`: the connects and welds, the joint and tendon
    couplings, and the permutation that takes their rows (the frames' first) to
    the order of `equalities`."""
    frames = [e for e in equalities if e.kind in ("connect", "weld")]
    couplings = [e for e in equalities if e.kind not in ("connect", "weld")]
    rows, kept = [], 0
    for e in frames:
        count = 6 if e.kind == "weld" else 3
        rows.append(list(range(kept, kept + count)))
        kept += count
    coupling_rows = iter(range(kept, kept + len(couplings)))
    frame_rows = iter(rows)
    order = []
    for e in equalities:
        order.extend(next(frame_rows) if e.kind in ("connect", "weld")
                     else [next(coupling_rows)])
    return frames, couplings, np.asarray(order)


class _Frames(NamedTuple):
    """The connects and welds at a state (`_frame_residuals`)."""

    phi: Any  # their residuals, (rows,)
    bodies: np.ndarray  # the body of each anchor, (2n,): the frames' first, then second
    points: Any  # the anchors' world positions, (2n, 3)
    welds: np.ndarray  # the indices of the welds among the frames, (w,)
    q1: Any  # the welds' frame orientations, (w, 4): the first,
    q2bar: Any  # the second's conjugate,
    scale: Any  # and their torquescale, (w,)
    keep: np.ndarray  # which of the (n, 6) rows, flattened, are theirs (a connect 3)


def _frame_residuals(m, d, frames: list[_Equality]) -> _Frames:
    """The residuals of the connects and welds `frames` at MJX's data `d`, every
    one in one batched computation, and the anchors and orientations that their
    Jacobians are built on: a connect's $p_1 - p_2$ (3 rows), a weld's
    $p_1 - p_2$ and the vector part of $\\bar q_2\\otimes q_1$ times its
    `torquescale` (6 rows), as MuJoCo's `efc_pos`. The one function for both the
    model's `holonomic` and `_MJXTerms`'s rows."""
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
    phi = jnp.zeros((n, 6), d.cdof.dtype).at[:, :3].set(points[:n] - points[n:])
    w = np.nonzero(weld)[0]
    q1 = q2bar = scale = None
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
        phi = phi.at[w, 3:].set(jax.vmap(_quat_mul)(q2bar, q1)[:, 1:]
                                * scale[:, None])
    keep = np.concatenate([6 * i + np.arange(6 if weld[i] else 3)
                           for i in range(n)])
    return _Frames(phi.reshape(6 * n)[keep], bodies, points, w, q1, q2bar, scale,
                   keep)


def _coupling_residual(m, d, q, e: _Equality):
    """The residual $x_1 - p(x_2)$ of a joint or tendon equality, shape `(1,)`,
    with MuJoCo's quartic $p$: joint positions relative to `qpos0`, tendon
    lengths to `tendon_length0`."""
    data = m.eq_data[e.index]
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


def _equality_residuals(m, d, q, equalities: tuple[_Equality, ...]):
    """The residuals of `equalities` (MuJoCo's `efc_pos` rows of type equality),
    in their order, shape `(m,)`."""
    if not equalities:
        return jnp.zeros((0,), dtype=q.dtype)
    frames, couplings, order = _equality_order(equalities)
    phi = [_frame_residuals(m, d, frames).phi] if frames else []
    phi += [_coupling_residual(m, d, q, e) for e in couplings]
    return jnp.concatenate(phi)[order]


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

    def __init__(self, model, t, q, v=None):
        super().__init__(model, t, q, v)
        self._own = model._inherited(("mass_matrix", "forces", "input_matrix",
                                      "holonomic", "energy", "position_rate"))
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
        frames, couplings, order = _equality_order(model.equalities)
        phi, A, b = [], [], []
        if frames:
            phi_f, A_f, b_f = self._frame_rows(frames)
            phi.append(phi_f)
            A.append(A_f)
            b.append(b_f)
        for e in couplings:
            A_e, b_e = self._coupling_row(e)
            phi.append(_coupling_residual(model.mjx_model, self.data, q, e))
            A.append(A_e[None])
            b.append(None if b_e is None else b_e[None])
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
        """The rows of the connects and welds: residuals `phi` `(rows,)`
        (`_frame_residuals`), `A` `(rows, nv)` and `b` `(rows,)` (or `None`), in
        the order of `frames`."""
        m, d, v = self.model.mjx_model, self.data, self.v
        n = len(frames)
        f = _frame_residuals(m, d, frames)
        J_p, J_w, acc, alpha = self._points(f.bodies, f.points)
        A = jnp.zeros((n, 6, m.nv), d.cdof.dtype)
        A = A.at[:, :3].set(jnp.swapaxes(J_p[:n] - J_p[n:], 1, 2))
        b = None if v is None else jnp.zeros((n, 6), d.cdof.dtype).at[:, :3].set(
            acc[n:] - acc[:n])
        w = f.welds
        if w.size:
            b1, b2 = f.bodies[w], f.bodies[n + w]
            dW = jnp.swapaxes(J_w[w] - J_w[n + w], 1, 2)
            K = jax.vmap(_quat_sandwich)(f.q2bar, f.q1)
            A = A.at[w, 3:].set(0.5 * f.scale[:, None, None] * (K @ dW))
            if v is not None:
                b = b.at[w, 3:].set(jax.vmap(_weld_bias)(
                    f.q1, f.q2bar, d.cvel[b1, :3], d.cvel[b2, :3], alpha[w],
                    alpha[n + w]) * -f.scale[:, None])
        A = A.reshape(6 * n, m.nv)[f.keep]
        return f.phi, A, None if b is None else b.reshape(6 * n)[f.keep]

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
