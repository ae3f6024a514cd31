r"""Controllers for constrained mechanical systems (Aghili, Sec. 7; Yun & Sarkar,
Sec. IV-A).

Every controller is an `equinox.Module` that holds the model it controls (its own
copy, which may differ from the simulated plant) and is passed to
[`cdiff.simulate`][] as `control=`; `simulate` applies its input $u$ as
$E(t, q)u$ (`model.input_matrix`). A controller without state is called as
`u = controller(t, q, v)`; a [`cdiff.control.AbstractStatefulController`][]
declares a state (integrated with the mechanical state by the same solver, saved
in `Solution.controller_state`) and may read the plant's constraint
multipliers.

- [`cdiff.control.ProjectedInverseDynamics`][]: projected inverse-dynamics motion
  control with the (weighted) minimum-norm generalized force (eqs. 43-48).
- [`cdiff.control.HybridForceMotion`][]: motion control plus a PI loop on the
  measured constraint force towards desired multipliers (eqs. 49-52), a stateful
  controller (its integrator).
- [`cdiff.control.PassiveJoints`][]: wraps a controller so that the unactuated
  coordinates receive no force (eqs. 53-62), with the controllability check.
- [`cdiff.control.ComputedTorque`][]: computed-torque state feedback on Yun &
  Sarkar's control-affine form (eq. 28) of [`cdiff.NullSpace`][]. It is a
  [`cdiff.control.AbstractStateFeedback`][]: `NullSpace` calls its
  `feedback(t, system)` with the terms of $\dot x = f(x) + g(x)u$ at the state
  $(q, \nu)$ (a [`cdiff.control.ControlAffine`][]) instead of
  `controller(t, q, v)`.
- [`cdiff.control.AbstractStatefulController`][]: the interface of a controller
  with state (`init_state`, `input`, `state_rate`, and `measures` to read the
  multipliers).

**Controllers with state.** `simulate` has no second integration loop for a
controller's state $z$: it wraps the formulation so that the state the solver
integrates is $(y, z)$, $y$ the formulation's own, and every route (cdiff's RK4
loop, `diffrax.diffeqsolve` with any solver and step-size controller,
[`cdiff.Projected`][], [`cdiff.BDF`][] on an ODE formulation) integrates, saves
and differentiates $z$ with the mechanical state. A DAE formulation
([`cdiff.GGL`][], [`cdiff.IndexOne`][]) is refused with a stateful controller
(use an ODE formulation with `cdiff.BDF`).

**Measured multipliers.** A controller that declares `measures = True` reads the
plant's multipliers $\lambda$ as the formulation computes them
(`Solution.multipliers`). They depend on the input, which depends on them: an
algebraic loop (Aghili's eq. 50 assumes it closed instantly), closed at every
evaluation of the vector field by Newton's method on
$r(\lambda_m) = \lambda_m - \lambda(u(\lambda_m)) = 0$ from $\lambda_m = 0$, with
the exact $k \times k$ Jacobian $I - \partial\lambda/\partial\lambda_m$
(`jax.linearize` of the formulation's dynamics). The formulations' multipliers
are affine in the applied force, so one step is exact for a law affine in the
measurement ([`cdiff.control.HybridForceMotion`][]); a nonlinear law sets
`measurement_iterations`. The residual is checked at run time (an error, or a
result code with `throw=False`), and gradients flow through the Newton steps.
The loop is well posed where $I - \partial\lambda/\partial\lambda_m$ is
nonsingular ($I + G_F$ for `HybridForceMotion`).
"""

from ._base import AbstractController as AbstractController
from ._aghili import HybridForceMotion as HybridForceMotion
from ._aghili import PassiveJoints as PassiveJoints
from ._aghili import ProjectedInverseDynamics as ProjectedInverseDynamics
from .._formulation.controller import (
    AbstractStatefulController as AbstractStatefulController,
)
from .._formulation.nullspace import AbstractStateFeedback as AbstractStateFeedback
from .._formulation.nullspace import ControlAffine as ControlAffine
from ._yun_sarkar import ComputedTorque as ComputedTorque
