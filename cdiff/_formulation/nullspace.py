"""Yun & Sarkar's null-space state-space formulation."""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._kinematics import kinematics
from .._linalg import PseudoInverse, cho_solve, cholesky, default_rtol, solve_triangular
from .._model import AbstractModel, apply_input, input_matrix
from .._results import error_if
from .base import (
    AbstractFormulation,
    Context,
    Dynamics,
    applied_forces,
    check_gains,

)
from .._mass import is_symmetric
from .projection import projector


class ControlAffine(eqx.Module):
    r"""Yun & Sarkar's control-affine state equation (eq. 28) at one state
    $x = (q, \nu)$ of [`cdiff.NullSpace`][]:

    $$\dot q = S\nu + \eta, \qquad \dot\nu = f_\nu(x) + g_\nu(x)\,u, \qquad
      \ddot q = S\dot\nu + \gamma,$$

    with $f_\nu = (S^TMS)^{-1}S^T(Q - M\gamma)$ and $g_\nu = (S^TMS)^{-1}S^TE$.
    This is what a [`cdiff.control.AbstractStateFeedback`][] controller receives.

    **Fields:** `q`, `nu` (the state), `qdot` (the velocity $S\nu + \eta$; the
    coordinates move at `model.position_rate(t, q, qdot)`), `S` (the null-space
    basis, `(nv, dof)`), `gamma` ($\dot S\nu + \dot\eta$), `drift` ($f_\nu$) and
    `gain` ($g_\nu$, `(dof, p)` for `p` inputs).
    """

    q: Float[Array, " nq"]
    nu: Float[Array, " dof"]
    qdot: Float[Array, " nv"]
    S: Float[Array, "nv dof"]
    gamma: Float[Array, " nv"]
    drift: Float[Array, " dof"]
    gain: Float[Array, "dof p"]


class AbstractStateFeedback(eqx.Module):
    r"""A state-feedback controller $u = u(t, x)$ on Yun & Sarkar's control-affine
    form $\dot x = f(x) + g(x)u$ (eq. 28), for [`cdiff.NullSpace`][].

    Pass it to [`cdiff.simulate`][] as `control=` with `NullSpace`: at every
    evaluation of the vector field, `NullSpace` calls `feedback(t, system)` with
    the [`cdiff.control.ControlAffine`][] terms at the current state $(q, \nu)$ and
    applies $E(t, q)u$. Subclasses implement `feedback`; see
    [`cdiff.control.ComputedTorque`][].
    """

    @abc.abstractmethod
    def feedback(self, t, system: ControlAffine) -> Float[Array, " p"]:
        """The input $u$ at time `t` and state `system` (a `ControlAffine`)."""

    def __call__(self, t, q, v):
        raise ValueError(
            f"cdiff: {type(self).__name__} is a state-feedback controller on "
            "Yun-Sarkar's null-space state (q, nu): simulate it with "
            "formulation=cdiff.NullSpace(...), which calls its `feedback`."
        )


class NullSpace(AbstractFormulation):
    r"""Yun & Sarkar's unified state space for holonomic and nonholonomic constraints.

    Holonomic constraints are replaced by $J\dot q + \alpha C = 0$ (eq. 17), so that
    together with Pfaffian nonholonomic constraints $B\dot q = b$ every constraint
    is a velocity constraint $A\dot q = a$ (eq. 20). With $S(q)$ a basis of the
    null space of $A$ and $\eta = A^+a$ (eq. 32), every admissible velocity is
    $\dot q = S\nu + \eta$ (eq. 24), and the state $x = (q, \nu)$ obeys the
    control-affine state equation (eq. 28)

    $$\dot q = S\nu + \eta, \qquad
      \dot\nu = (S^TMS)^{-1}S^T(Q - M\gamma) + (S^TMS)^{-1}S^TE\,u,
      \qquad \gamma = \dot S\nu + \dot\eta,$$

    exposed as `f(x)` and `g(x)` ([`cdiff.NullSpace.f`][], [`cdiff.NullSpace.g`][])
    and, term by term, as [`cdiff.control.ControlAffine`][] (`control_affine`) for
    controller design. ($Q$ carries $-V - G$ of the paper.) A state-feedback
    controller $u(t, x)$ ([`cdiff.control.AbstractStateFeedback`][], e.g.
    [`cdiff.control.ComputedTorque`][]) passed as `simulate(..., control=...)`
    receives these terms at every evaluation.

    **The basis $S$.** The paper takes the first columns of $U$ in the SVD of
    $H = I - A^+A$ (eqs. 33-35) at every step and warns that the choice can jump.
    cdiff takes that SVD basis once, at the initial configuration, and then
    *transports* it: the state is $(q, \nu, R)$ with $R$ an orthonormal basis
    carried along; within a step $S(q) = P(q)R$ with $P = I - A^+A$ (a smooth
    function of $q$), and after each step $R \leftarrow P(q)R\,L^{-T}$,
    $\nu \leftarrow L^T\nu$ with $LL^T = (P R)^T(P R)$ (the same velocity in the
    re-orthonormalised basis). The basis turns with the null space, never jumps,
    and $\nu$ is continuous along the trajectory. `Solution.state` holds
    $(q, \nu, R)$.

    **Unilateral rows** ([`cdiff.AbstractModel.unilateral`][]) held as equalities
    join $A$. Their number changes at events, $\nu$ keeps its `dof` entries: at
    each event the basis is taken afresh by eqs. 33-35, with a zero column for
    each direction the held rows remove (its entry of $\nu$ stays 0), and $\nu$
    refitted to the velocity after the event (eq. 36).

    **$\gamma$ without numerical differentiation.** $\gamma = \dot S\nu + \dot\eta$
    is the exact time derivative of $S(q)\nu + \eta(t, q)$ at fixed $\nu$, by
    forward-mode autodiff, valid for any basis. The paper instead uses
    $A^+(\dot a - \dot A\dot q)$ (eqs. 37-39), which is only the row-space part
    of $\gamma$: it drops $N\dot S\nu$, which is zero for cdiff's transported
    basis where $R$ lies in the null space ($P\dot PP = 0$) but not for a basis
    that turns within the null space, such as a fresh SVD basis at every step.

    **Initial state.** $\nu_0$ is the least-squares solution of
    $\dot q_0 = S\nu_0 + \eta$ (eq. 36), so any $\dot q_0$ is accepted; the
    velocity actually simulated is $S\nu_0 + \eta$ (the admissible part).

    **Arguments:**

    - `alpha`: the holonomic gain of eq. 17 (1/s): holonomic errors decay as
      $e^{-\alpha t}$ (eq. 18). May be traced (vmap).
    - `dof`: the number of degrees of freedom $n - \operatorname{rank}A$ (the
      dimension of $\nu$). Static. Inferred from the initial configuration when it
      is concrete; pass it when `q0` is traced (under `jax.vmap`/`jit`).
    - `rtol`: relative singular-value threshold of the pseudoinverse of $A$.

    !!! warning

        Nonholonomic constraints must be Pfaffian (affine in $\dot q$); the rank
        of $A$ must stay constant (no kinematic singularities).

    ??? cite "References"

        X. Yun, N. Sarkar, *Unified formulation of robotic systems with holonomic
        and nonholonomic constraints*, IEEE Trans. Robotics and Automation 14
        (1998), eqs. 17-39.
    """

    supports_unilateral: ClassVar[bool] = True
    state_feedback: ClassVar[bool] = True  # calls AbstractStateFeedback.feedback

    alpha: float | jax.Array = 0.0
    dof: int | None = eqx.field(static=True, default=None)
    rtol: float | None = eqx.field(static=True, default=None)

    stepwise: ClassVar[bool] = True  # end_step re-orthonormalises R

    def __check_init__(self):
        check_gains("NullSpace", alpha=self.alpha, dof=self.dof, rtol=self.rtol)

    # --- the velocity constraint A qdot = a (eq. 20) ------------------------------

    def _constraint(self, model: AbstractModel, t, q, nv: int):
        """`A(t, q)` and `a(t, q)` of eq. 20 (`nv`: the number of velocities)."""
        zero = jnp.zeros(nv, q.dtype)
        kin = kinematics(model, t, q, zero)
        # Holonomic rows: J qdot = b_q - alpha C (eq. 17, with -dC/dt for
        # time-dependent constraints). Nonholonomic rows (Pfaffian): B qdot = -Phi_v(0).
        a = jnp.concatenate([kin.b_q - self.alpha * kin.phi_q, -kin.phi_v])
        return kin.A_v, a

    def _basis(self, model, t, q, R):
        A, a = self._constraint(model, t, q, R.shape[0])
        pinv = PseudoInverse(A, self.rtol)
        S = jax.vmap(pinv.null_project, in_axes=1, out_axes=1)(R)
        return S, pinv.solve(a), pinv

    def _admissible(self, model, t, q, nu, R):
        S, eta, _ = self._basis(model, t, q, R)
        return S @ nu + eta

    # --- state --------------------------------------------------------------------

    def bind(self, model, t0, q0, v0):
        if self.dof is not None:
            return self
        A, _ = self._constraint(model, jnp.asarray(t0, q0.dtype), q0, v0.shape[0])
        if isinstance(A, jax.core.Tracer):
            raise ValueError(
                "NullSpace: the initial configuration is traced (inside jax.jit, "
                "jax.vmap or jax.grad), so the number of degrees of freedom cannot be "
                "read from it: pass NullSpace(dof=n - rank(A))."
            )
        sv = np.linalg.svd(np.asarray(A), compute_uv=False)
        rtol = default_rtol(A.dtype) if self.rtol is None else self.rtol
        rank = int(np.sum(sv > rtol * sv.max(initial=0.0)))
        return NullSpace(self.alpha, dof=A.shape[1] - rank, rtol=self.rtol)

    def init_state(self, t0, q0, v0, context: Context):
        n = v0.shape[0]
        if self.dof is None or not 0 < self.dof <= n:
            raise ValueError(f"NullSpace: dof must be in 1..{n}, got {self.dof}")
        model = context.model
        R = self._svd_basis(model, t0, q0, n)
        return q0, self._fit_nu(model, t0, q0, R, v0), R

    def restart(self, t, q, v, context: Context):
        """After an event (an impact, a unilateral row taken or released): a fresh
        basis of the null space of the rows now held, and nu fitted to `v`."""
        R = self._svd_basis(context.model, t, q, v.shape[0])
        return q, self._fit_nu(context.model, t, q, R, v), R

    def _svd_basis(self, model, t, q, n: int):
        """Eqs. 33-35: the first `dof` left singular vectors of H = I - A^+ A, those
        of singular value 0 (where held unilateral rows leave fewer than `dof`
        directions) set to zero columns. Only the basis depends on this choice, not
        the motion: no gradient through the SVD."""
        A, _ = self._constraint(model, t, q, n)
        # (No derivative enters the SVD, whose rule is long to compile.)
        H = jax.lax.stop_gradient(projector(PseudoInverse(A, self.rtol)))
        U, s, _ = jnp.linalg.svd(H)
        return jnp.where(s[: self.dof] > 0.5, U[:, : self.dof], 0.0)

    def _fit_nu(self, model, t, q, R, v):
        """Eq. 36: the least-squares nu with S nu + eta = v (S has full column
        rank but for zero columns, whose nu is 0: normal equations). S nu + eta is
        then the Euclidean projection of v onto the admissible velocities (eta lies
        in the row space of A)."""
        S, eta, _ = self._basis(model, t, q, R)
        return cho_solve(cholesky(_regular(S.T @ S, R)), S.T @ (v - eta))

    def coordinates(self, t, y, context: Context):
        q, nu, R = y
        return q, self._admissible(context.model, t, q, nu, R)

    def project(self, t, y, context: Context, projection):
        r"""Post-step projection ([`cdiff.Projected`][]): `q` onto the holonomic
        constraints by `projection.position`; the velocity needs no projection
        (every $S\nu + \eta$ is admissible), so $\nu$ is refitted by eq. 36 to
        keep the integrator's velocity as closely as the new configuration
        allows."""
        q, nu, R = y
        model = context.model
        v = self._admissible(model, t, q, nu, R)
        q = projection.position(model, t, q, throw=context.throw)
        return q, self._fit_nu(model, t, q, R, v), R

    def end_step(self, t, y, context: Context):
        """Re-orthonormalise the transported basis; the velocity is unchanged."""
        q, nu, R = y
        S, _, _ = self._basis(context.model, t, q, R)
        L = cholesky(_regular(S.T @ S, R))
        R = solve_triangular(L, S.T).T  # S L^{-T} (zero columns stay zero)
        return q, L.T @ nu, R

    # --- dynamics (eq. 28) ----------------------------------------------------------

    def _terms(self, t, q, nu, R, context: Context):
        model = context.model
        S, eta, pinv = self._basis(model, t, q, R)
        qdot = S @ nu + eta
        t = jnp.asarray(t, q.dtype)
        # gamma = d/dt (S(q) nu + eta(t, q)) at fixed nu, along q' = T(q) qdot:
        # forward-mode autodiff.
        _, gamma = jax.jvp(
            lambda t, q: self._admissible(model, t, q, nu, R),
            (t, q),
            (jnp.ones_like(t), model.position_rate(t, q, qdot)),
        )
        # Symmetry only: the factorisation below (of S^T M S, all that the
        # dynamics use) is the definiteness check.
        M = model.mass_matrix(t, q)
        M = error_if(M, ~is_symmetric(M), f"cdiff: {type(model).__name__}."
                     "mass_matrix(t, q) is not symmetric at a state reached by the "
                     "solver.", throw=context.throw)
        SMS = _regular(S.T @ M @ S, R)
        chol = cholesky(SMS)
        chol = error_if(
            chol,
            ~jnp.all(jnp.isfinite(chol)),
            "cdiff.NullSpace: S^T M S is not positive definite: the transported "
            "null-space basis P(q) R lost rank within a step (the rank of the "
            "constraint Jacobian changed, or the step is too large).",
            throw=context.throw,
        )
        return S, qdot, gamma, M, chol, pinv

    def control_affine(self, t, x, context: Context) -> ControlAffine:
        r"""The terms of the control-affine state equation (eq. 28) at the state
        `x = (q, nu, R)`: $\dot q = S\nu + \eta$,
        $\dot\nu = f_\nu(x) + g_\nu(x)u$ (see [`cdiff.control.ControlAffine`][])."""
        q, nu, R = x
        return self._control_affine(t, q, nu, self._terms(t, q, nu, R, context),
                                    context)

    def _control_affine(self, t, q, nu, terms, context: Context) -> ControlAffine:
        """`control_affine` from the quantities `_terms` computed."""
        S, qdot, gamma, M, chol, _ = terms
        model = context.model
        Q = model.forces(t, q, qdot)
        E = input_matrix(model, t, q)
        drift = cho_solve(chol, S.T @ (Q - M @ gamma))
        gain = cho_solve(chol, S.T @ E)
        return ControlAffine(q, nu, qdot, S, gamma, drift, gain)

    def f(self, t, x, context: Context):
        r"""The drift $f(x)$ of $\dot x = f(x) + g(x)u$ (eq. 28), without control,
        as `(qdot, nudot, zeros)` matching `x = (q, nu, R)`."""
        sys = self.control_affine(t, x, context)
        qdot = context.model.position_rate(t, x[0], sys.qdot)
        return qdot, sys.drift, jnp.zeros_like(x[2])

    def g(self, t, x, context: Context):
        """The input matrix $g(x)$ of eq. 28, as `(zeros (nq, nu), (S^TMS)^{-1}S^TE,
        zeros)` matching `x = (q, nu, R)`."""
        q, _, R = x
        gain = self.control_affine(t, x, context).gain
        p = gain.shape[1]
        return (
            jnp.zeros((q.shape[0], p), q.dtype),
            gain,
            jnp.zeros(R.shape + (p,), q.dtype),
        )

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        del frozen
        q, nu, R = y
        model = context.model
        terms = self._terms(t, q, nu, R, context)
        S, qdot, gamma, M, chol, pinv = terms
        if isinstance(context.control, AbstractStateFeedback):
            # State feedback u(t, x) on eq. 28, from the terms computed above.
            sys = self._control_affine(t, q, nu, terms, context)
            u = jnp.asarray(context.control.feedback(t, sys), dtype=q.dtype)
            F = model.forces(t, q, qdot) + apply_input(model, t, q, u)
        else:
            F = applied_forces(context, t, q, qdot)
        nudot = cho_solve(chol, S.T @ (F - M @ gamma))
        force = M @ (S @ nudot + gamma) - F  # in the row space of A
        rate = (model.position_rate(t, q, qdot), nudot, jnp.zeros_like(R))
        return Dynamics(rate, force, pinv.multipliers(pinv.C @ force))


def _regular(G, R):
    """The Gram matrix `G` of the basis `S = P R` with 1 on the diagonal of R's zero
    columns (directions that held unilateral rows removed), whose components of
    nu are then constant."""
    dead = jnp.sum(R * R, axis=0) < 0.25
    return G + jnp.diag(dead.astype(G.dtype))
