"""Aghili's projection-matrix formulation of constrained dynamics."""

from __future__ import annotations

from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._linalg import PseudoInverse, cho_solve, cholesky
from .base import (
    AbstractFormulation,
    Context,
    Dynamics,
    applied_forces,
    check_gains,

)
from .._mass import checked_mass

Inertia = Literal["Mc", "Mc_sym", "Mc_gamma"]


def projector(pinv: PseudoInverse) -> Float[Array, "n n"]:
    r"""$P = I - A^+A$ (Aghili eq. 15), the orthogonal projector onto the null space
    of $A$, from the factorised pseudoinverse of $A$ (`pinv.C` is $A$)."""
    n = pinv.C.shape[1]
    return jax.vmap(pinv.null_project)(jnp.eye(n, dtype=pinv.C.dtype))


def constraint_inertia(
    M: Float[Array, "n n"], P: Float[Array, "n n"], inertia: Inertia, gamma=None
) -> tuple[Float[Array, "n n"], Float[Array, "n n"]]:
    r"""The constraint inertia matrix and its coupling to $\ddot q_\perp$.

    Returns `(Mc, K)` such that the direct dynamics read
    $M_c\ddot q = P(Q + Eu) + K\ddot q_\perp$ with $\ddot q_\perp = (I-P)\ddot q$:

    - `"Mc"` (eqs. 22-24): $M_c = M + PM - (PM)^T$, $K = M$ (positive definite,
      not symmetric);
    - `"Mc_sym"` (eqs. 27-28): $M_c' = PMP + (I-P)M(I-P)$, $K = (I - 2P)M$
      (symmetric positive definite);
    - `"Mc_gamma"` (eq. 29): $M_c'' = PM + \gamma(I - P)$, $K = \gamma I$
      (invertible, neither symmetric nor definite); `gamma` defaults to
      $\|M\|_2$.
    """
    eye = jnp.eye(M.shape[0], dtype=M.dtype)
    if inertia == "Mc":
        PM = P @ M
        return M + PM - PM.T, M
    if inertia == "Mc_sym":
        Q = eye - P
        return P @ M @ P + Q @ M @ Q, (eye - 2 * P) @ M
    if inertia == "Mc_gamma":
        if gamma is None:
            # The result does not depend on gamma mathematically: no gradient.
            gamma = jax.lax.stop_gradient(jnp.max(jnp.linalg.eigvalsh(M)))
        return P @ M + gamma * (eye - P), gamma * eye
    raise ValueError(
        f"inertia must be one of 'Mc', 'Mc_sym', 'Mc_gamma', got {inertia!r}"
    )


class Projection(AbstractFormulation):
    r"""Aghili's projection-matrix formulation (direct dynamics without multipliers).

    With $A = A_v$ the stacked constraint Jacobian (holonomic and Pfaffian
    nonholonomic rows), $P = I - A^+A$ (eqs. 4, 15) projects onto the null space
    of the constraints. The acceleration splits into $P\ddot q$, fixed by the
    projected dynamics $PM\ddot q = P(Q + Eu)$ (eq. 21), and
    $\ddot q_\perp = (I - P)\ddot q = A^+b_v$, fixed by the constraints
    ($C\dot q = -A^+\dot A\dot q$, eq. 16, with the time-dependent and nonholonomic
    terms of $b_v$ added). Together:

    $$M_c\ddot q = P(Q + Eu) + C_c\dot q \qquad (22)$$

    with one of the three constraint inertia matrices of
    `constraint_inertia` (eqs. 23, 28, 29; chosen by `inertia`), all
    invertible whatever the rank of $A$ (Theorem 2, Propositions 1-2). The
    constraint force (eq. 32, with cdiff's sign: $M\ddot q = Q + Eu + Q_c$) is
    $Q_c = (I - P)(M\ddot q - Q - Eu)$, and the multipliers are
    $\lambda = A^{+T}Q_c$, unique only when $A$ has full row rank (Remark 4).

    The pseudoinverse is cdiff's smooth one (`cdiff/_linalg.py`): singular values
    of $A$ below about `rtol` $\|A\|_F$ (or below $\sqrt{\text{damping}}$) are
    dropped, so at a kinematic singularity where *some* rows of $A$ lose rank $P$
    switches to the larger null space and the dynamics stay finite. A relative
    threshold cannot act on a single row ($\sigma = \|A\|_F$): for a one-row
    Jacobian that vanishes at the singularity (R3) $P$ becomes the identity only
    where $\|A\|^2 \lesssim$ `damping`, Aghili's absolute SVD threshold
    $\epsilon^2$ of eq. 68 (the constraint is "virtually removed"). $A^+$ is not
    mass-weighted: as the paper notes, $P$ then depends on the units of the
    coordinates.

    There is no stabilisation: the constraint errors drift. Pair it with a
    post-step projection (`cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())`,
    Aghili eq. 37).

    **Arguments:**

    - `inertia`: `"Mc"` (eq. 23, default), `"Mc_sym"` (eq. 28) or `"Mc_gamma"`
      (eq. 29).
    - `gamma`: the scalar of eq. 29 (units of mass); default $\|M\|_2$.
    - `rtol`: relative singular-value threshold of the pseudoinverse of $A$.
    - `damping`: absolute threshold of the pseudoinverse, the square of a singular
      value (units of $A^2$); default 0.

    ??? cite "References"

        F. Aghili, *A unified approach for inverse and direct dynamics of
        constrained multibody systems based on linear projection operator:
        applications to control and simulation*, IEEE Trans. Robotics 21 (2005),
        eqs. 4, 13-16, 21-32.
    """

    supports_unilateral: ClassVar[bool] = True

    inertia: str = eqx.field(static=True, default="Mc")
    gamma: float | None = None
    rtol: float | None = eqx.field(static=True, default=None)
    damping: float = 0.0

    def __check_init__(self):
        if self.inertia not in ("Mc", "Mc_sym", "Mc_gamma"):
            raise ValueError(
                "Projection(inertia=...) must be 'Mc' (eq. 23), 'Mc_sym' (eq. 28) or "
                f"'Mc_gamma' (eq. 29), got {self.inertia!r}"
            )
        if self.gamma is not None and self.inertia != "Mc_gamma":
            raise ValueError("gamma is the parameter of inertia='Mc_gamma' (eq. 29)")
        check_gains("Projection", gamma=self.gamma, rtol=self.rtol,
                    damping=self.damping)

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        del frozen
        q, v = y
        model = context.model
        terms = model.terms(t, q, v)
        M, _ = checked_mass(model, t, q, terms, throw=context.throw)
        f = applied_forces(context, t, q, v, terms)
        kin = terms.kinematics
        pinv = PseudoInverse(kin.A_v, self.rtol, self.damping)
        P = projector(pinv)
        qdd_perp = pinv.solve(kin.b_v)  # (I - P) qdd = C qdot, eq. 16
        Mc, K = constraint_inertia(M, P, self.inertia, self.gamma)
        if self.inertia == "Mc_sym":
            qdd = cho_solve(cholesky(Mc), P @ f + K @ qdd_perp)
        else:
            qdd = jnp.linalg.solve(Mc, P @ f + K @ qdd_perp)
        force = (M @ qdd - f) - P @ (M @ qdd - f)  # eq. 32
        qdot = model.position_rate(t, q, v)
        return Dynamics((qdot, qdd), force, pinv.multipliers(kin.A_v @ force))
