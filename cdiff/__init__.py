"""cdiff: differentiable, batched simulation of constrained mechanical systems."""

import importlib.metadata as _metadata

# First, before anything can start JAX's backend (XLA reads XLA_FLAGS once): only
# where CDIFF_XLA_FLAGS=1 asks for it.
from ._compiler import configure_at_import as _configure_at_import

_configure_at_import()

from diffrax import SaveAt as SaveAt

from . import analysis as analysis
from . import control as control
from . import models as models
from . import studies as studies
from ._animate import animate as animate
from ._consistent import consistent_state as consistent_state
from ._formulation.base import AbstractFormulation as AbstractFormulation
from ._formulation.base import Context as Context
from ._formulation.base import Dynamics as Dynamics
from ._formulation.dae import AbstractDAEFormulation as AbstractDAEFormulation
from ._formulation.dae import GGL as GGL
from ._formulation.dae import IndexOne as IndexOne
from ._formulation.lagrange import Lagrange as Lagrange
from ._formulation.nullspace import NullSpace as NullSpace
from ._formulation.projection import Projection as Projection
from ._formulation.regularized import Regularized as Regularized
from ._formulation.udwadia_kalaba import UdwadiaKalaba as UdwadiaKalaba
from ._impact import Impact as Impact
from ._impact import impact as impact
from ._kinematics import (
    EnergyLaw as EnergyLaw,
    Kinematics as Kinematics,
    Terms as Terms,
    kinematics as kinematics,
)
from ._model import AbstractModel as AbstractModel
from ._results import RESULTS as RESULTS
from ._simulate import simulate as simulate
from ._solution import CONTACT_MODES as CONTACT_MODES
from ._solver.event_rules import EVENT_KINDS as EVENT_KINDS
from ._solution import Solution as Solution
from ._sketch import Sketch as Sketch
from ._solver.bdf import BDF as BDF
from ._projection import (
    AbstractProjection as AbstractProjection,
    GradientProjection as GradientProjection,
    NewtonProjection as NewtonProjection,
)
from ._solver.projected import Projected as Projected
from ._solver.rk4 import RK4 as RK4
from ._compiler import compiler_options as compiler_options
from ._compiler import configure_xla_flags as configure_xla_flags
from ._cache import use_compilation_cache as use_compilation_cache
from ._export import cached_jit as cached_jit

#: Former names: `DAEResults` (when only `cdiff.BDF` had codes of its own), the
#: state-feedback interface (with its siblings in `cdiff.control` now).
_RENAMED = {"DAEResults": ("cdiff.RESULTS", RESULTS),
            "AbstractStateFeedback": ("cdiff.control.AbstractStateFeedback",
                                      control.AbstractStateFeedback),
            "ControlAffine": ("cdiff.control.ControlAffine", control.ControlAffine)}


def __getattr__(name: str):
    if name in _RENAMED:
        new, value = _RENAMED[name]
        import warnings

        warnings.warn(f"cdiff.{name} is deprecated: use {new}", DeprecationWarning,
                      stacklevel=2)
        return value
    raise AttributeError(f"module 'cdiff' has no attribute {name!r}")

try:
    __version__ = _metadata.version("cdiff")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"

__all__ = [
    "AbstractDAEFormulation", "AbstractFormulation", "AbstractModel",
    "AbstractProjection", "BDF", "CONTACT_MODES", "Context", "EVENT_KINDS", "Dynamics", "EnergyLaw", "GGL", "GradientProjection", "Impact", "IndexOne",
    "Kinematics", "Lagrange", "NewtonProjection", "NullSpace", "Projected",
    "Projection", "RESULTS", "RK4", "Regularized", "SaveAt", "Sketch", "Solution",
    "Terms", "UdwadiaKalaba", "analysis", "animate", "cached_jit", "compiler_options", "configure_xla_flags",
    "consistent_state", "control", "impact", "kinematics", "models", "simulate", "studies",
    "use_compilation_cache",
]
