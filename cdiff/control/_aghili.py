r"""Aghili's projection-based controllers (Sec. 7 of *Control and simulation of
motion of constrained multibody systems based on projection matrix formulation*).

**Sign conventions.** cdiff writes the dynamics as

$$M(q)\ddot q = Q(t, q, \dot q) + E(t, q)u + Q_c, \qquad A\ddot q = b,$$

with $Q$ the model's `forces` (gravity, Coriolis and centrifugal terms, springs),
$E$ its `input_matrix`, $Q_c = A^T\lambda$ the constraint force
(`Solution.constraint_force`, `Solution.multipliers`) and $A = A_v$, $b = b_v$ the
acceleration-level constraints of [`cdiff.kinematics`][] (holonomic rows, then
nonholonomic ones). Aghili writes $M\ddot q + h = f - \mathcal F$ (eq. 19), so

$$h = -Q, \qquad f = Eu, \qquad \mathcal F = -Q_c = -A^T\lambda .$$

Multipliers and desired multipliers are in cdiff's sign throughout (comparable with
`Solution.multipliers`). $P = I - A^+A$ (eq. 15) is computed with cdiff's smooth
pseudoinverse ([`cdiff._linalg.PseudoInverse`][]), whose gradients stay finite where
$A$ changes rank.

**From generalized force to input.** A controller first computes a generalized
force $f$ (`generalized_force(t, q, v)`) and then returns the input $u$ with
$Eu = f$: $u = f$ when the model keeps the default identity `input_matrix`, the
least-squares solution $u = E^+f$ otherwise. If $f$ is not in the range of $E$
(an underactuated model whose force needs the unactuated coordinates) the result
would not be $f$: a run-time check (`eqx.error_if`) raises then; wrap the
controller in [`cdiff.control.PassiveJoints`][].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float

from .._formulation.projection import projector
from .._kinematics import kinematics, velocity_size
from .._linalg import MassFactor, PseudoInverse, default_rtol
from .._model import AbstractModel, input_matrix
from .._formulation.controller import AbstractStatefulController
from ._base import (
    AbstractController,
    ControllerTerms,
    apply_gain,
    check_gain,
    controller_terms,
    default_tol,
    gain_matrix,
    second_order,
    to_input,
)

def _motion_acceleration(ctrl, t, q, v, terms: ControllerTerms):
    r"""The auxiliary input $u_p$ of eq. 44: an admissible acceleration
    ($Au_p = b$) whose tangential part imposes the PD error law (see
    `ProjectedInverseDynamics`)."""
    q_d, v_d, a_d = (jnp.asarray(x).astype(q.dtype) for x in ctrl.reference(t))
    pinv = terms.pinv
    qdd_perp = pinv.solve(terms.b)  # (I - P) qdd = C qdot = A^+ b   (eqs. 13, 16)
    if ctrl.coordinates is None:
        alpha = a_d + apply_gain(ctrl.gd, v_d - v) + apply_gain(ctrl.gp, q_d - q)
        return qdd_perp + pinv.null_project(alpha)
    theta = ctrl.coordinates
    th_d, dth_d, jdot_d = second_order(theta, q_d, v_d)
    ddth_d = jax.jvp(theta, (q_d,), (a_d,))[1] + jdot_d
    th, dth, jdot = second_order(theta, q, v)
    alpha = ddth_d + apply_gain(ctrl.gd, dth_d - dth) + apply_gain(ctrl.gp, th_d - th)
    J = jnp.atleast_2d(jax.jacfwd(theta)(q))
    JP = jax.vmap(pinv.null_project)(J)  # J P (P symmetric)
    lam = PseudoInverse(JP, ctrl.rtol)  # Lambda = (J P)^+, eq. 38
    return qdd_perp + lam.solve(alpha - jdot - J @ qdd_perp)


def _weighted_projection(weight, A, x, rtol=None):
    r"""$\Pi x = W^{1/2}P_WW^{-1/2}x = x - A^T(AW^{-1}A^T)^+AW^{-1}x$ with
    $P_W = I - A_W^+A_W$, $A_W = AW^{-1/2}$ (eq. 47), computed with the Cholesky
    factor $W = LL^T$ in place of $W^{1/2}$ (the same operator)."""
    W = jnp.asarray(weight).astype(x.dtype)
    if W.ndim < 2:
        W = jnp.diag(jnp.broadcast_to(W, x.shape))
    wf = MassFactor(W)
    C = wf.weight(A)  # A L^{-T}
    y = PseudoInverse(C, rtol).null_project(wf.transpose_unweight(x))  # P_W L^-1 x
    return wf.times_R_transpose(y)  # L y


# ---------------------------------------------------------------------------
# Controllers.
# ---------------------------------------------------------------------------


class _MotionController(AbstractController):
    """What the motion controllers share: the commanded acceleration $u_p$ of
    eq. 44 and the force computed with it (`_force_and_terms`)."""

    def motion_acceleration(self, t, q, v):
        r"""The commanded acceleration $u_p$ (eq. 44; $\ddot q = u_p$ in closed
        loop)."""
        return _motion_acceleration(self, t, q, v, controller_terms(self.model, t, q, v,
                                                          self.rtol))

    def generalized_force(self, t, q, v):
        """The generalized force $f$ (see the class docstring)."""
        return self._force_and_terms(t, q, v)[0]


class ProjectedInverseDynamics(_MotionController):
    r"""Projected inverse-dynamics motion control (PIDC, Aghili eqs. 43-46), with
    the weighted minimum-norm force of eqs. 47-48.

    **Control law** (Aghili's $h = -Q$, see the module docstring):

    $$f_\parallel = h_\parallel + PMu_p = P(Mu_p - Q) \qquad (43)$$

    and $f = f_\parallel$ ($f_\perp = 0$): among all generalized forces producing
    the same motion ($f + A^T\mu$ for any $\mu$, since $P$ removes $A^T\mu$ from
    eq. 21) it has the least Euclidean norm (eq. 46), and $(I - P)f = 0$.

    **Auxiliary input** $u_p$ (eq. 44). The closed loop satisfies
    $PM(\ddot q - u_p) = 0$ (eq. 21 with eq. 43). If $u_p$ is admissible,
    $Au_p = b$ (the acceleration-level constraints, the constraint term
    $\ddot q_\perp = C\dot q = A^+b$ of eqs. 13 and 16), then $\ddot q - u_p \in
    \mathcal N(A)$, where $PM$ is injective (Theorem 4's argument), and the closed
    loop is exactly $\ddot q = u_p$. cdiff builds $u_p = A^+b + (\text{tangential
    part})$ in one of two ways:

    - `coordinates=None` (default): tracking in the generalized coordinates with
      the error projected onto $\mathcal N(A)$: with $e = q_d - q$,
      $u_p = A^+b + P(\ddot q_d + G_D\dot e + G_Pe)$ and hence
      $P(q)\,(\ddot e + G_D\dot e + G_Pe) = 0$: the tangential part of the error
      follows the PD law. (Its normal part is of second order in $e$ because both
      $q$ and $q_d$ lie on the constraint manifold; where $P$ is constant, e.g.
      linear constraints, $Pe$ follows the law exactly.)
    - `coordinates=theta`, a function $\theta(q) \in \mathbb R^k$ that charts the
      constraint manifold (Aghili's independent coordinates, eq. 38; $k$ the number
      of degrees of freedom): with $J = \partial\theta/\partial q$,
      $\Lambda = (JP)^+$ ($\mathcal R(\Lambda) = \mathcal N(A)$, eq. 41) and
      $e = \theta(q_d) - \theta(q)$,
      $u_p = A^+b + \Lambda(\ddot\theta_d + G_D\dot e + G_Pe - \dot J\dot q -
      JA^+b)$, which is eq. 44 written without $\dot\Lambda$; then
      $\ddot e + G_D\dot e + G_Pe = 0$ exactly (eq. 45). $\theta_d$ and its
      derivatives come from the reference by the chain rule.

    **Weighted norm** (eqs. 47-48). With `weight` $W$ (symmetric positive
    definite, `(n, n)`, or a vector for a diagonal $W$) the force is expressed in
    the scaled coordinates $f_W = W^{-1/2}f$, $\dot q_W = W^{1/2}\dot q$,
    $A_W = AW^{-1/2}$, $P_W = I - A_W^+A_W$, and eq. 43 applied there gives
    $f = W^{1/2}P_WW^{-1/2}(Mu_p - Q)$. It produces the same motion and minimises
    $\|f\|_W^2 = f^TW^{-1}f$ (eq. 47; its optimality condition is
    $AW^{-1}f = 0$). E.g. $W^{1/2} = \mathrm{diag}(f_{max})$ normalises each
    component by its actuator limit. $W^{1/2}$ is replaced by the Cholesky factor
    of $W$, which gives the same operator.

    **Arguments:**

    - `model`: the controlled [`cdiff.AbstractModel`][] (the controller's own copy:
      its inverse dynamics use it).
    - `reference`: `reference(t) -> (q_d, v_d, a_d)`, the desired motion in the
      generalized coordinates, admissible: on the constraints at position,
      velocity and acceleration level ($A(q_d)a_d = b(q_d, v_d)$).
    - `gp`, `gd`: the PD gains $G_P, G_D > 0$ (scalars, vectors for diagonal
      gains, or matrices), of size $n$ (`coordinates=None`) or $k$.
    - `weight`: $W$ of eq. 47, or `None` (the Euclidean norm).
    - `coordinates`: optional chart $\theta(q)$ (above).
    - `rtol`: relative singular-value threshold of the pseudoinverses.
    - `tol`: relative tolerance of the run-time check $Eu = f$.
    """

    model: AbstractModel
    reference: Callable
    gp: Any
    gd: Any
    weight: Any = None
    coordinates: Callable | None = None
    rtol: float | None = eqx.field(static=True, default=None)
    tol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        name = type(self).__name__
        check_gain(name, "gp", self.gp, allow_zero=False)
        check_gain(name, "gd", self.gd, allow_zero=False)

    def _force_and_terms(self, t, q, v):
        r"""$f = P(Mu_p - Q)$ (eq. 43), or its weighted version (eq. 47)."""
        terms = controller_terms(self.model, t, q, v, self.rtol)
        u_p = _motion_acceleration(self, t, q, v, terms)
        x = terms.M @ u_p - terms.Q
        if self.weight is None:
            return terms.pinv.null_project(x), terms
        return _weighted_projection(self.weight, terms.A, x, self.rtol), terms


class HybridForceMotion(AbstractStatefulController):
    r"""Hybrid motion/constraint-force control (Aghili eqs. 49-52), with a PI loop
    on the measured constraint force.

    The motion channel is [`cdiff.control.ProjectedInverseDynamics`][]'s $u_p$
    (same `reference`, `gp`, `gd`, `coordinates`); the impotent component
    $f_\perp$ sets the constraint force. In cdiff's signs ($h = -Q$,
    $\mathcal F = -Q_c$, module docstring) eqs. 43 and 49 read

    $$f_\parallel = P(Mu_p - Q), \qquad
      f_\perp = (I - P)(Mu_p - Q) - A^T\lambda_c,$$

    where $(I - P)(Mu_p - Q)$ is eq. 49's feed-forward
    $h_\perp + \mu(f_\parallel - h_\parallel + C_c\dot q)$ (it cancels the
    constraint force that the motion alone produces; equal because $M_cu_p =
    PMu_p + C_c\dot q$ for the admissible $u_p$) and $A^T\lambda_c$ is the
    commanded constraint force ($-u_{\mathcal F}$). So
    $f = Mu_p - Q - A^T\lambda_c$ (eq. 52). $M$, $Q$, $A$, $b$ are those of the
    controller's `model`, evaluated at the plant's state: the model may differ
    from the simulated plant (masses, lengths, forces), with the same numbers of
    coordinates and constraint rows (checked before tracing).

    **The PI loop** (eq. 50), in multiplier space:

    $$\lambda_c = \lambda_d + G_Fe_\lambda + G_Iz, \qquad
      e_\lambda = \lambda_d - \lambda, \qquad \dot z = e_\lambda,$$

    with $\lambda$ the plant's multipliers as the formulation computes them
    (`measures = True`: the algebraic loop they form with the input is solved at
    every evaluation, exactly, since the law is affine in $\lambda$; see
    [`cdiff.control.AbstractStatefulController`][]) and $z$ the integrator, the
    controller's state, integrated by the solver from $z(t_0)$ = `integral0`
    and saved in `Solution.controller_state`. ($e_f = A^Te_\lambda$ is
    Aghili's $\mathcal F_d - \mathcal F$ up to the sign convention.)

    **Closed loop.** The plant $M_p\ddot q = Q_p + f + A_p^T\lambda$,
    $A_p\ddot q = b_p$ answers the force with the multipliers
    $\lambda = \lambda_c + \delta$ when the controller's constraint Jacobian is
    the plant's ($A = A_p$), where

    $$\delta = (A_pM_p^{-1}A_p^T)^{-1}\big(b_p - A_pM_p^{-1}(Mu_p - Q + Q_p)\big)$$

    is what the model's error adds to the commanded multipliers ($\delta = 0$ for
    a perfect model, where $A u_p = b$; by eq. 32 the plant then realises
    $\lambda = \lambda_c$, for $A$ of full row rank, otherwise only the
    $\mathcal R(A)$ part, Remark 5). With the loop closed,

    $$(I + G_F)\,e_\lambda = -G_Iz - \delta, \qquad
      (I + G_F)\,\dot e_\lambda + G_Ie_\lambda = -\dot\delta .$$

    - Perfect model ($\delta = 0$): eq. 50's law exactly, $e_\lambda(t) =
      -Ke^{-K(t - t_0)}z_0$ with $K = (I + G_F)^{-1}G_I$
      (`predicted_force_error`); from $z_0 = 0$ there is no error at all, and
      `gf`, `gi` have no effect.
    - Without integral action ($G_I = 0$) the error follows the model's error,
      $e_\lambda = -(I + G_F)^{-1}\delta$, and stays where $\delta$ settles.
    - With $G_I > 0$ it decays at eq. 50's rate $K$ once $\delta$ is constant
      (e.g. a regulated motion at rest).

    A formulation's multipliers include its constraint stabilisation
    (Baumgarte's gains of [`cdiff.Lagrange`][], the $\Delta$ correction of
    [`cdiff.UdwadiaKalaba`][]): $\delta$ then also holds that force, of the size
    of the constraint drift. The loop is well posed for every $G_F \ge 0$
    ($I - \partial\lambda/\partial\lambda_m = I + G_F$); with a controller
    Jacobian $A \ne A_p$ (other link lengths) the loop gain is
    $S = (A_pM_p^{-1}A_p^T)^{-1}A_pM_p^{-1}A^T$ instead of $I$ and needs
    $I + SG_F$ nonsingular.

    The force errors and the motion errors are decoupled (Sec. 7.3): with
    $A = A_p$ the commanded $A^T\lambda_c$ changes only the multipliers, so the
    motion does not depend on the force loop; with a perfect model it follows the
    law of `ProjectedInverseDynamics` whatever $\lambda_d$.

    **Arguments:**

    - `model`, `reference`, `gp`, `gd`, `coordinates`, `rtol`, `tol`: as in
      [`cdiff.control.ProjectedInverseDynamics`][] (no `weight`: the total force
      is fixed by the motion and the constraint force together). `model` is the
      controller's model, which need not be the simulated one.
    - `force_reference`: `force_reference(t) -> lambda_d`, desired multipliers,
      one per row of $A_v$, in cdiff's sign ($Q_{c,d} = A_v^T\lambda_d$, as
      `Solution.multipliers`).
    - `gf`, `gi`: PI gains $G_F \ge 0$, $G_I \ge 0$ (scalars, vectors or
      matrices in multiplier space); differentiable fields (e.g. for
      [`cdiff.studies.tune`][]).
    - `integral0`: $z(t_0)$, shape `(k,)`, or `None` for zero.
    """

    model: AbstractModel
    reference: Callable
    gp: Any
    gd: Any
    force_reference: Callable
    gf: Any = 0.0
    gi: Any = 0.0
    integral0: Any = None
    coordinates: Callable | None = None
    rtol: float | None = eqx.field(static=True, default=None)
    tol: float | None = eqx.field(static=True, default=None)

    measures: ClassVar[bool] = True

    def __check_init__(self):
        name = type(self).__name__
        check_gain(name, "gp", self.gp, allow_zero=False)
        check_gain(name, "gd", self.gd, allow_zero=False)
        check_gain(name, "gf", self.gf, allow_zero=True)
        check_gain(name, "gi", self.gi, allow_zero=True)

    def _lambda_d(self, t, dtype):
        return jnp.asarray(self.force_reference(t)).astype(dtype)

    def init_state(self, t0, q0, v0):
        r"""$z(t_0)$: `integral0`, or zeros (one per row of the force reference)."""
        del v0
        k = jax.eval_shape(self.force_reference, t0).shape[0]
        if self.integral0 is None:
            return jnp.zeros((k,), q0.dtype)
        return jnp.broadcast_to(jnp.asarray(self.integral0).astype(q0.dtype), (k,))

    def motion_acceleration(self, t, q, v):
        r"""The commanded acceleration $u_p$ (eq. 44; $\ddot q = u_p$ in closed
        loop with a perfect model)."""
        return _motion_acceleration(self, t, q, v, controller_terms(self.model, t, q, v,
                                                          self.rtol))

    def commanded_multipliers(self, t, state, measurement):
        r"""$\lambda_c = \lambda_d + G_F(\lambda_d - \lambda_m) + G_Iz$ (eq. 50)
        for the measured multipliers $\lambda_m$ and the integrator $z$."""
        lam_d = self._lambda_d(t, measurement.dtype)
        return (lam_d + apply_gain(self.gf, lam_d - measurement)
                + apply_gain(self.gi, state.astype(measurement.dtype)))

    def generalized_force(self, t, q, v, state, measurement):
        r"""$f = f_\parallel + f_\perp = Mu_p - Q - A^T\lambda_c$ (eqs. 43, 49,
        52) with the controller model's $M, Q, A$."""
        name = type(self).__name__
        shape = jax.eval_shape(self.model.mass_matrix, t, q).shape
        if shape != (v.shape[0],) * 2:
            raise ValueError(
                f"{name}: the controller's model {type(self.model).__name__} has a "
                f"mass matrix of shape {shape} at the plant's state with "
                f"{v.shape[0]} velocities; the controller's model and the simulated "
                "one must have the same coordinates."
            )
        terms = controller_terms(self.model, t, q, v, self.rtol)
        measurement = jnp.asarray(measurement).astype(q.dtype)
        if measurement.shape != terms.b.shape:
            raise ValueError(
                f"{name}: the plant has {measurement.shape[0]} constraint rows (A_v) "
                f"and the controller's model {type(self.model).__name__} "
                f"{terms.b.shape[0]}; they must have the same constraints."
            )
        lam_c = self.commanded_multipliers(t, state, measurement)
        if lam_c.shape != terms.b.shape:
            raise ValueError(
                f"{name}: force_reference(t) has shape "
                f"{jnp.shape(self.force_reference(t))}; the model has "
                f"{terms.b.shape[0]} constraint rows (A_v)"
            )
        u_p = _motion_acceleration(self, t, q, v, terms)
        x = terms.M @ u_p - terms.Q
        f_par = terms.pinv.null_project(x)  # eq. 43
        f_perp = (x - f_par) - terms.A.T @ lam_c  # eq. 49, cdiff's signs
        return f_par + f_perp

    def input(self, t, q, v, state, measurement):
        """The input $u$ with $Eu = f$ (module docstring)."""
        f = self.generalized_force(t, q, v, state, measurement)
        return to_input(self.model, t, q, f, self.tol, type(self).__name__)

    def state_rate(self, t, q, v, state, measurement):
        r"""$\dot z = e_\lambda = \lambda_d - \lambda_m$."""
        del q, v
        return (self._lambda_d(t, measurement.dtype) - measurement).astype(state.dtype)

    def _decay(self, k: int, dtype):
        """$K = (I + G_F)^{-1}G_I$."""
        eye = jnp.eye(k, dtype=dtype)
        return jnp.linalg.solve(eye + gain_matrix(self.gf, k, dtype),
                                gain_matrix(self.gi, k, dtype))

    def predicted_force_error(self, t, t0=0.0):
        r"""The multiplier error of a perfect model (controller model = plant):
        $e_\lambda(t) = -Ke^{-K(t - t_0)}z_0$, $K = (I + G_F)^{-1}G_I$, from
        $z(t_0)$ = `integral0` (the closed form of eq. 50's law; zero for
        `integral0=None`). A reference for a simulation, not used by it."""
        lam_d = jnp.asarray(self.force_reference(t))
        dtype = jnp.result_type(lam_d.dtype, float)
        k = lam_d.shape[0]
        if self.integral0 is None:
            return jnp.zeros((k,), dtype)
        z0 = jnp.broadcast_to(jnp.asarray(self.integral0).astype(dtype), (k,))
        K = self._decay(k, dtype)
        dt = jnp.asarray(t).astype(dtype) - jnp.asarray(t0).astype(dtype)
        return -K @ (jsl.expm(-K * dt) @ z0)


class PassiveJoints(AbstractController):
    r"""Control with passive (unactuated) coordinates (Aghili eqs. 53-62).

    Wraps a controller whose generalized force $f_0$ (`generalized_force`, e.g.
    $f_\parallel$ of eq. 43) produces the desired motion, and adds the impotent
    force $f_\perp = (I - P)\eta$ (eq. 54) that cancels the unactuated
    components: with $B$ the orthogonal projector onto the actuator space
    (eq. 53),

    $$Q = I - B - P + BP = (I - B)(I - P), \quad
      H = -(I - P)Q^+(I - B), \quad f = (I + H)f_0 \qquad (55\text{-}60)$$

    ($\eta = -Q^+(I - B)f_0$, the minimum-norm solution of
    $Q\eta = -(I - B)f_0$, eq. 57, which also minimises $\|f_\perp\|$). Since
    $f_\perp \in \mathcal N(A)^\perp$ the motion is unchanged and
    $(I - B)f = 0$. A force controller's $f_\perp$ is overwritten (constraint
    force control is generally lost, as the paper notes).

    **Controllability** (eqs. 56, 62). $Q\eta = -(I - B)f_0$ is solvable for every
    motion iff $\mathcal R((I - B)P) \subseteq \mathcal R((I - B)(I - P))$
    (eq. 56), which is equivalent to eq. 62,
    $\mathcal N \cap \mathcal B^\perp \subseteq \mathcal N^\perp \cap
    \mathcal B^\perp$, i.e. $\mathcal N(A) \cap \mathcal B^\perp = \{0\}$: no
    admissible motion may move the passive coordinates only ($B$ restricted to
    $\mathcal N(A)$ is injective). An unconstrained model with a passive
    coordinate, or no actuated coordinate at all, fails it.

    - Before tracing: `check(t, q)` raises `ValueError` (naming eq. 62) where the
      condition fails at a concrete state (smallest singular value of $B$ on
      $\mathcal N(A)$ below `tol`); call it on the initial state. The constructor
      also rejects, when `actuated` is given, a mask without actuated entries and
      a passive coordinate on a model without constraints.
    - At run time: `eqx.error_if` raises where the residual of eq. 55,
      $\|(I - B)f\|$, exceeds `tol` $\|f_0\|$.

    **Arguments:**

    - `controller`: the motion controller (a [`cdiff.control.AbstractController`][]; its
      `model` is used).
    - `actuated`: boolean mask of the actuated coordinates, shape `(n,)`:
      $B = \mathrm{diag}(\text{actuated})$ (eq. 53). Default `None`: the actuator
      space is the range of `model.input_matrix(t, q)`, $B = EE^+$.
    - `tol`: relative tolerance of both checks (default 1e-6 in float64).
    - `rtol`: relative singular-value threshold of the pseudoinverses.
    """

    controller: AbstractController
    actuated: Any = eqx.field(default=None, converter=lambda x: None if x is None
                              else jnp.asarray(x, dtype=bool))
    tol: float | None = eqx.field(static=True, default=None)
    rtol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if not isinstance(self.controller, AbstractController):
            raise TypeError(
                "PassiveJoints: `controller` must be a controller without state (a "
                f"cdiff.control.AbstractController), got "
                f"{type(self.controller).__name__}; its f_perp is overwritten, so "
                "wrap the motion controller (e.g. ProjectedInverseDynamics) instead "
                "of HybridForceMotion."
            )
        if self.actuated is None or isinstance(self.actuated, jax.core.Tracer):
            return
        mask = np.asarray(self.actuated)
        if mask.ndim != 1:
            raise ValueError(
                f"PassiveJoints: `actuated` must be a 1-D mask, got shape {mask.shape}"
            )
        if not mask.any():
            raise ValueError(
                "PassiveJoints: `actuated` has no actuated coordinate (B = 0): "
                "Aghili's controllability condition (eq. 62, N(A) ∩ B⊥ = {0}) fails "
                "for any model that can move."
            )
        if not mask.all():
            model = self.model
            q = jax.ShapeDtypeStruct(mask.shape, jnp.result_type(float))
            t = jax.ShapeDtypeStruct((), jnp.result_type(float))
            m = jax.eval_shape(model.holonomic, t, q).shape[0]
            p = jax.eval_shape(model.nonholonomic, t, q, q).shape[0]
            if m + p == 0:
                passive = np.flatnonzero(~mask.astype(bool)).tolist()
                raise ValueError(
                    f"PassiveJoints: {type(model).__name__} has no constraints, so "
                    f"the passive coordinates {passive} can move on their own: "
                    "Aghili's controllability condition (eq. 62, N(A) ∩ B⊥ = {0}, "
                    "with N(A) = R^n) fails; an unconstrained system needs every "
                    "coordinate actuated."
                )

    @property
    def model(self) -> AbstractModel:
        """The controlled model (the wrapped controller's)."""
        return self.controller.model

    def actuator_projector(self, t, q) -> Float[Array, "n n"]:
        r"""$B$: `diag(actuated)`, or $EE^+$ (the orthogonal projector onto the
        range of the input matrix)."""
        n = velocity_size(self.model, q)
        if self.actuated is not None:
            mask = jnp.broadcast_to(jnp.asarray(self.actuated), (n,))
            return jnp.diag(mask.astype(q.dtype))
        t = jnp.asarray(t, dtype=q.dtype)
        E = input_matrix(self.model, t, q)
        pinv = PseudoInverse(E.T, self.rtol)
        return E @ jax.vmap(pinv.multipliers)(E).T  # E (E^T E)^+ E^T

    def generalized_force(self, t, q, v):
        """The generalized force $f$ (see the class docstring)."""
        return self._force_and_terms(t, q, v)[0]

    def _force_and_terms(self, t, q, v):
        r"""$f = (I + H)f_0$ (eq. 60), checked against eq. 55's residual."""
        f0, terms = self.controller._force_and_terms(t, q, v)
        P = projector(terms.pinv)
        eye = jnp.eye(velocity_size(self.model, q), dtype=q.dtype)
        B = self.actuator_projector(t, q)
        Qm = (eye - B) @ (eye - P)  # = I - B - P + BP
        eta = -PseudoInverse(Qm, self.rtol).solve((eye - B) @ f0)  # eq. 57
        f = f0 + (eye - P) @ eta  # eqs. 54, 58-60
        tol = default_tol(q.dtype) if self.tol is None else self.tol
        residual = jnp.linalg.norm((eye - B) @ f)
        f = eqx.error_if(
            f,
            residual > tol * jnp.linalg.norm(f0),
            "cdiff.control.PassiveJoints: the passive coordinates cannot be freed of "
            "force at a state reached by the solver: Aghili's controllability "
            "condition (eq. 62, N(A) ∩ B⊥ = {0}; eq. 56) fails there (an admissible "
            "motion moves only passive coordinates). Actuate more coordinates or "
            "avoid this configuration.",
        )
        return f, terms

    def check(self, t, q, v=None) -> None:
        r"""Raise `ValueError` if eq. 62 fails at the concrete state `(t, q)`
        (`v`, default zero, matters for nonholonomic constraints only): the
        smallest singular value of $B$ restricted to $\mathcal N(A)$ (an
        orthonormal basis from the SVD of $A$, rank threshold `rtol` $\|A\|_F$)
        must exceed `tol`. Call it outside `jit`, e.g. on the initial state."""
        q = jnp.asarray(q)
        if not jnp.issubdtype(q.dtype, jnp.floating):
            q = q.astype(jnp.result_type(float))
        nv = velocity_size(self.model, q)
        v = jnp.zeros(nv, q.dtype) if v is None else jnp.asarray(v, dtype=q.dtype)
        t = jnp.asarray(t, dtype=q.dtype)
        A = np.asarray(kinematics(self.model, t, q, v).A_v)
        B = np.asarray(self.actuator_projector(t, q))
        n = nv
        rtol = default_rtol(q.dtype) if self.rtol is None else self.rtol
        if A.shape[0]:
            _, s, vt = np.linalg.svd(A)
            rank = int(np.sum(s > rtol * np.linalg.norm(A)))
            null = vt[rank:].T
        else:
            null = np.eye(n)
        if null.shape[1] == 0:
            return  # no admissible motion: nothing to control
        _, s, wt = np.linalg.svd(B @ null)
        sigma = float(s[-1]) if s.size == null.shape[1] else 0.0
        tol = default_tol(q.dtype) if self.tol is None else self.tol
        if not sigma > tol:
            direction = null @ wt[-1]
            direction = direction / np.max(np.abs(direction))
            raise ValueError(
                "PassiveJoints: not controllable at "
                f"t = {float(t):.6g}, q = {np.array2string(np.asarray(q), precision=6)}:"
                " Aghili's condition eq. 62 (N(A) ∩ B⊥ = {0}, equivalently eq. 56 "
                "R((I-B)P) ⊆ R((I-B)(I-P))) fails: the admissible motion "
                f"{np.array2string(direction, precision=4)} moves only passive "
                f"coordinates (smallest singular value of B on N(A) = {sigma:.3g}, "
                f"tol = {tol:.3g}). Actuate more coordinates or avoid this "
                "configuration."
            )
