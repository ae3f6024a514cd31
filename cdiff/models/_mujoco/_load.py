"""Loading and refusing: [`cdiff.models.from_mujoco`][] reads an MJCF or URDF
file, an XML string, a `mujoco.MjModel` or a `mujoco.MjSpec`, refuses what cdiff
cannot represent (each element named), warns about what MuJoCo simulates and
cdiff does not, and builds the [`cdiff.models.MuJoCoModel`][]."""

from __future__ import annotations

import copy
import os

import numpy as np

from ._common import (
    _BALL,
    _BIAS_AFFINE,
    _BIAS_NONE,
    _CONNECT,
    _DYN_NONE,
    _EQ_KINDS,
    _GAIN_FIXED,
    _HINGE,
    _OBJ_SITE,
    _SLIDE,
    _TRN_JOINT,
    _TRN_JOINTINPARENT,
    _TRN_SITE,
    _TRN_TENDON,
    _WELD,
    _Equality,
    _Joint,
    _mujoco,
    _warn,
)
from ._model import MuJoCoModel


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
