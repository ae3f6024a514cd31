"""What every module of the package uses: the import of the optional packages
mujoco and MJX, the values of MuJoCo's enums, the static records of a loaded
model's joints and equality constraints, and `_warn`, which attributes a warning
to the user's line."""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import equinox as eqx

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


class _Equality(NamedTuple):
    label: str  # for messages: "weld equality 'name'" or "weld equality 3"
    kind: str  # connect, weld, joint or tendon
    index: int  # in MuJoCo's equality list
    obj1: int
    obj2: int
    site: bool  # connect/weld between sites rather than bodies
    rows: int


# Frames of these packages are skipped when a warning names the caller's line.
_WRAPPERS = tuple(str(Path(mod.__file__).parent) for mod in (eqx,))
_CDIFF = str(Path(__file__).resolve().parents[2])  # cdiff/ (this is models/_mujoco/)


def _warn(message: str) -> None:
    """A `UserWarning` attributed to the first frame outside cdiff, equinox,
    jaxtyping and beartype: the user's line (a method call on a Module and runtime
    type checks add frames of their own, so no fixed `stacklevel` finds it)."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if not (name.startswith((_CDIFF, *_WRAPPERS, "<frozen", "<@beartype"))
                or "jaxtyping" in name):
            break
        frame = frame.f_back
    globals_ = frame.f_globals
    warnings.warn_explicit(message, UserWarning, frame.f_code.co_filename,
                           frame.f_lineno, module=globals_.get("__name__"),
                           registry=globals_.setdefault("__warningregistry__", {}),
                           module_globals=globals_)
