r"""State feedback on Yun & Sarkar's control-affine form (Sec. IV-A, eq. 28)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._formulation.nullspace import AbstractStateFeedback, ControlAffine
from .._linalg import PseudoInverse
from ._base import apply_gain, check_gain, default_tol, second_order


class ComputedTorque(AbstractStateFeedback):
    r"""Computed-torque (input-output linearising) state feedback on Yun &
    Sarkar's control-affine form $\dot x = f(x) + g(x)u$, $x = (q, \nu)$ (eq. 28),
    for [`cdiff.NullSpace`][].

    **Law.** With outputs $y = h(q) \in \mathbb R^k$ (`output`, e.g. the joint
    angles to track; $k \le$ the number of degrees of freedom) and $H =
    \partial h/\partial q$, the state equation gives
    $\ddot y = H(S\dot\nu + \gamma) + \dot H\dot q$ and $\dot\nu = f_\nu + g_\nu u$
    ([`cdiff.control.ControlAffine`][]), so

    $$\ddot y = D(x)\,u + c(x), \qquad D = HSg_\nu, \qquad
      c = H(Sf_\nu + \gamma) + \dot H\dot q .$$

    The controller asks for $\ddot y = w = \ddot y_d + G_D(\dot y_d - \dot y) +
    G_P(y_d - y)$ and returns the least-norm solution $u = D^+(w - c)$. In closed
    loop the output error $e = y_d - y$ then follows

    $$\ddot e + G_D\dot e + G_Pe = 0$$

    exactly, whatever the null-space basis (the law is the computed torque on
    $\nu$, $\dot\nu = (HS)^+(w - c')$, mapped through $g_\nu$). With $k$ equal to
    the number of degrees of freedom and $HS$ invertible this is full state
    feedback linearisation of the constrained system; with nonholonomic
    constraints the system is not input-state linearisable, and output tracking
    is what one can ask for (the paper's remark after eq. 29).

    For the default $E = I$ the least-norm $u$ lies in the null space of $A$
    ($g_\nu = (S^TMS)^{-1}S^T$): it is the minimum-norm generalized force, the
    same force as [`cdiff.control.ProjectedInverseDynamics`][] with
    `coordinates=output` (tested).

    **Arguments:**

    - `output`: `output(q) -> y`, shape `(k,)` (a scalar output is taken as `(1,)`).
    - `reference`: `reference(t) -> (y_d, dy_d, ddy_d)`, the desired output and its
      first two time derivatives.
    - `gp`, `gd`: the PD gains $G_P, G_D > 0$ (scalars, vectors for diagonal gains,
      or `(k, k)` matrices).
    - `rtol`: relative singular-value threshold of $D^+$.
    - `tol`: relative tolerance of the run-time check $Du = w - c$: if $D$ has
      lost rank (the outputs cannot be moved independently by the inputs, e.g. an
      underactuated $E$ or $k$ larger than the degrees of freedom) the simulation
      stops with an error naming it.

    ??? cite "References"

        X. Yun, N. Sarkar, *Unified formulation of robotic systems with holonomic
        and nonholonomic constraints*, IEEE Trans. Robotics and Automation 14
        (1998), Sec. IV-A, eqs. 24-29.
    """

    output: Callable
    reference: Callable
    gp: Any
    gd: Any
    rtol: float | None = eqx.field(static=True, default=None)
    tol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        check_gain("ComputedTorque", "gp", self.gp, allow_zero=False)
        check_gain("ComputedTorque", "gd", self.gd, allow_zero=False)

    def _output(self, q):
        return jnp.atleast_1d(self.output(q))

    def feedback(self, t, system: ControlAffine):
        q, qdot = system.q, system.qdot
        y_d, dy_d, ddy_d = (jnp.atleast_1d(jnp.asarray(x)).astype(q.dtype)
                            for x in self.reference(t))
        y, dy, hdot_qdot = second_order(self._output, q, qdot)
        if y_d.shape != y.shape:
            raise ValueError(
                f"cdiff.control.ComputedTorque: reference(t) gives y_d of shape "
                f"{y_d.shape} but output(q) has shape {y.shape}"
            )
        w = ddy_d + apply_gain(self.gd, dy_d - dy) + apply_gain(self.gp, y_d - y)
        H = jax.jacfwd(self._output)(q)
        HS = H @ system.S
        D = HS @ system.gain
        c = HS @ system.drift + H @ system.gamma + hdot_qdot
        r = w - c
        u = PseudoInverse(D, self.rtol).solve(r)
        tol = default_tol(q.dtype) if self.tol is None else self.tol
        residual = jnp.linalg.norm(D @ u - r)
        return eqx.error_if(
            u,
            residual > tol * (jnp.linalg.norm(r) + jnp.linalg.norm(c)),
            "cdiff.control.ComputedTorque: the decoupling matrix H S g(x) has lost "
            "rank, so the outputs cannot follow the commanded accelerations (too "
            "many outputs for the degrees of freedom, outputs that do not chart the "
            "motion, or inputs that cannot move them).",
        )
