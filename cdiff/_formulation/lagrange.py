"""Lagrange multipliers at acceleration level with Baumgarte stabilisation."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .base import (
    AbstractFormulation,
    Context,
    Dynamics,
    check_gains,
    constrained_acceleration,
    free_motion,
)


class Lagrange(AbstractFormulation):
    r"""Index-1 Lagrange-multiplier formulation with Baumgarte stabilisation.

    Solves $M\ddot q = Q + Eu + A_v^T\lambda$ together with the acceleration-level
    constraints, whose right-hand sides carry Baumgarte's feedback:

    $$\ddot\Phi_q + 2\alpha\dot\Phi_q + \beta^2\Phi_q = 0, \qquad
      \dot\Phi_v + \alpha\Phi_v = 0$$

    (Costa-Castelló, Griñó & Basañez, eqs. 24-25; the nonholonomic form is Yun &
    Sarkar's eq. 17 applied one level up). The KKT system
    $\begin{bmatrix} M & A_v^T \\ A_v & 0\end{bmatrix}$ is solved by its Schur
    complement $A_v M^{-1} A_v^T\lambda = r$ through the Cholesky factor of $M$ and
    cdiff's smooth pseudoinverse (`cdiff/_linalg.py`), so redundant or
    rank-deficient constraints give finite multipliers rather than NaN: the
    minimum-norm ones plus round-off along the null space of $A_v^T$ (see
    `multipliers` in [`cdiff.Solution`][]).

    With `alpha = beta = 0` the position and velocity constraint errors drift
    (they are only enforced at acceleration level).

    !!! warning "Kinematic singularities"

        Where the constraint Jacobian loses rank the KKT system is singular, and
        whatever constraint error the state carries there is amplified (the
        component of the right-hand side along the vanishing singular direction is
        divided by a singular value passing through zero). The linear solve itself
        stays finite, but a trajectory that reaches a singular configuration with a
        sizeable error can be thrown off: on the slider-crank (R2, RK4, 100 s) at
        dt = 1e-2, `alpha = beta = 0` stops with non-finite values at the first
        singular passage after its drift has grown (t = 12.6 s), while
        `alpha = beta = 10` passes every one (slider error 1.3e-4); at dt = 5e-2 no
        gain pair of a 5 x 5 sweep over [1, 20] tracks the exact solution. Use
        [`cdiff.UdwadiaKalaba`][] through singularities.

    **Arguments:**

    - `alpha`: velocity gain $\alpha \ge 0$ (1/s). May be a traced array (vmap).
    - `beta`: position gain $\beta \ge 0$ (1/s). May be a traced array (vmap).
    - `rtol`: relative singular-value threshold of the pseudoinverse (default
      $10\sqrt{\varepsilon_{mach}}$).

    ??? cite "References"

        J. Baumgarte, *Stabilization of constraints and integrals of motion in
        dynamical systems*, Comput. Methods Appl. Mech. Eng. 1 (1972).
        R. Costa-Castelló, R. Griñó, L. Basañez, *DAE methods in constrained
        robotics system simulation* (1998), eqs. 24-25.
    """

    supports_unilateral: ClassVar[bool] = True

    alpha: float | jnp.ndarray = 0.0
    beta: float | jnp.ndarray = 0.0
    rtol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        check_gains("Lagrange", alpha=self.alpha, beta=self.beta, rtol=self.rtol)

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        del frozen
        q, v = y
        mf, a, kin = free_motion(context, t, q, v)
        baumgarte = jnp.concatenate(
            [2 * self.alpha * kin.dphi_q + self.beta**2 * kin.phi_q,
             self.alpha * kin.phi_v]
        )
        r_v = kin.b_v - kin.A_v @ a - baumgarte
        y_v, lam, _ = constrained_acceleration(mf, kin.A_v, r_v, self.rtol)
        force = mf.times_R_transpose(y_v)  # = A_v^T lambda
        qdot = context.model.position_rate(t, q, v)
        return Dynamics((qdot, a + mf.unweight(y_v)), force, lam)
