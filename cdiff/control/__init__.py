r"""Controllers for constrained mechanical systems (Aghili, Sec. 7; Yun & Sarkar,
Sec. IV-A).

Every controller is an `equinox.Module` that holds the model it controls and is
passed to [`cdiff.simulate`][] as `control=`; `simulate` calls it as
`u = controller(t, q, v)` and applies $E(t, q)u$ (`model.input_matrix`).

- [`cdiff.control.ProjectedInverseDynamics`][]: projected inverse-dynamics motion
  control with the (weighted) minimum-norm generalized force (eqs. 43-48).
- [`cdiff.control.HybridForceMotion`][]: motion control plus control of the
  constraint force towards desired multipliers (eqs. 49-52).
- [`cdiff.control.PassiveJoints`][]: wraps a controller so that the unactuated
  coordinates receive no force (eqs. 53-62), with the controllability check.
- [`cdiff.control.ComputedTorque`][]: computed-torque state feedback on Yun &
  Sarkar's control-affine form (eq. 28) of [`cdiff.NullSpace`][]. It is a
  [`cdiff.AbstractStateFeedback`][]: `NullSpace` calls its `feedback(t, system)`
  with the terms of $\dot x = f(x) + g(x)u$ at the state $(q, \nu)$ instead of
  `controller(t, q, v)`.
"""

from ._aghili import AbstractController as AbstractController
from ._aghili import HybridForceMotion as HybridForceMotion
from ._aghili import PassiveJoints as PassiveJoints
from ._aghili import ProjectedInverseDynamics as ProjectedInverseDynamics
from ._yun_sarkar import ComputedTorque as ComputedTorque
