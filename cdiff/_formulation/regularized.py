r"""Petzold's regularised least-squares constraint force (Costa-Castello eqs. 32-35)."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._linalg import PseudoInverse
from .base import AbstractFormulation, Context, Dynamics, free_motion


class Regularized(AbstractFormulation):
    r"""The constraint force as a regularised least-squares problem, which stays
    defined where the reduction index matrix $\varphi = GM^{-1}G^T$ is singular
    (Costa-Castello §3.2, after Petzold, Ren & Maly 1993; eqs. 32-35).

    Instead of demanding $\ddot\Phi = 0$, the force $f$ minimises the constraint
    value predicted one step $h$ ahead, $M_c = \Phi + h\dot\Phi + \tfrac12
    h^2\ddot\Phi$ (eq. 34), with a penalty on $\|f\|$ (eq. 33):

    $$f = -\left(\varphi^T\varphi + \epsilon I\right)^{-1}\varphi^T
      \left(GM^{-1}Q - b + \tfrac{2}{h}\dot\Phi + \tfrac{2}{h^2}\Phi\right),
      \qquad \ddot q = M^{-1}(Q + G^Tf)$$

    (eq. 35; $B = M^{-1}G^T$ so $GB = \varphi$, and $G\ddot q = b$ are the
    acceleration-level constraints). Where $\varphi$ is regular and $\epsilon \to
    0$ this is Baumgarte's stabilisation with gains $2/h$ and $2/h^2$ (eq. 25,
    critically placed poles $(-1 \pm i)/h$); where $\varphi$ is singular the
    directions of its kernel get no force (they minimise $\|f\|$), so the
    integration passes through the singular configuration.

    **Two corrections to the printed equations**, derived from eq. 34: the
    right-hand side of eq. 35 lost its minus sign and the factor $M^{-1}$ of
    $GM^{-1}Q$ in the extraction, and $\ddot\Phi$ contains the curvature term
    $\dot G\dot q$ (in $-b$) that the printed eq. 34 omits; without it the
    constraint settles at $\Phi \approx \tfrac{h^2}{2}\dot G\dot q$ instead of 0.
    Nonholonomic rows enter the same least squares as $\dot\Phi_v +
    \tfrac{2}{h}\Phi_v = 0$.

    The regularised equations are stiff for small $h$ (poles of modulus
    $\sqrt2/h$): with [`cdiff.RK4`][] take `dt` below about $h$, or integrate with
    [`cdiff.BDF`][].

    **Arguments:**

    - `eps`: the regularisation $\epsilon > 0$ (units of $\varphi^2$), default
      1e-8. Singular values of $\varphi$ below $\sqrt\epsilon$ are filtered out.
    - `h`: the prediction horizon $h > 0$ (s), default 1e-2.
    """

    supports_unilateral: ClassVar[bool] = True

    eps: float | jnp.ndarray = 1e-8
    h: float | jnp.ndarray = 1e-2

    def __check_init__(self):
        for name in ("eps", "h"):
            x = getattr(self, name)
            if isinstance(x, (int, float)) and not (np.isfinite(x) and x > 0):
                raise ValueError(f"Regularized: {name} must be positive, got {x}")

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        del frozen
        q, v = y
        mf, a, kin = free_motion(context, t, q, v)
        h = self.h
        B = jax.vmap(mf.solve)(kin.A_v).T  # M^-1 A_v^T
        phi = kin.A_v @ B
        r = kin.A_v @ a - kin.b_v + jnp.concatenate([
            2 / h * kin.dphi_q + 2 / h**2 * kin.phi_q,
            2 / h * kin.phi_v,
        ])
        f = -PseudoInverse(phi, rtol=0.0, damping=self.eps, refine=False).solve(r)
        qdot = context.model.position_rate(t, q, v)
        return Dynamics((qdot, a + B @ f), kin.A_v.T @ f, f)
