"""R5: a two-link arm with its end point on a circle (Yun & Sarkar 1998, V-B)."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel, check_positive
from .._sketch import Sketch, circle, pivot, stack_points
from ._reference import Reference, solve_minimal


def _minimal_rhs(t, y, args):
    r"""The welded arm as a compound pendulum about the pivot:
    $I\ddot\theta_1 = \tau - g\,(m_1 l_{c1} + m_2 l_1)\cos\theta_1
    - g\,m_2 l_{c2}\cos(\theta_1 - \delta)$."""
    th, om = y
    inertia, k1, k2, delta, torque = args
    acc = (torque - k1 * jnp.cos(th) - k2 * jnp.cos(th - delta)) / inertia
    return jnp.stack([om, acc])


class TwoLinkOnCircle(AbstractModel):
    r"""Planar two-link arm with its end point on a circle about the base pivot,
    link 2 modelled as a free body joined to link 1 by constraints (Yun & Sarkar,
    Sec. V-B, eqs. 46-54, Figs. 4-5).

    Coordinates $q = [\theta_1, x_2, y_2, \theta_2]$: the angle of link 1 (hinged
    at the origin), the centre of mass and the absolute angle of link 2. The
    unconstrained equations (eqs. 46-49) are $I_1\ddot\theta_1 = \tau_1 -
    m_1 g l_{c1}\cos\theta_1$, $m_2\ddot x_2 = 0$, $m_2\ddot y_2 = -m_2 g$,
    $I_2\ddot\theta_2 = 0$: $M = \mathrm{diag}(I_1, m_2, m_2, I_2)$, and the
    input matrix maps the single torque $\tau_1$ to $\theta_1$ (shape `(4, 1)`).
    ($I_1$ is about the pivot, $I_2$ about link 2's centre of mass.)

    Three holonomic constraints (eq. 53):

    - $c_1 = x_2 - l_{c2}\cos\theta_2 - l_1\cos\theta_1$,
      $c_2 = y_2 - l_{c2}\sin\theta_2 - l_1\sin\theta_1$: the revolute joint,
      $p_B - p_A = 0$ with $p_A = l_1(\cos\theta_1, \sin\theta_1)$ (eq. 50) and
      $p_B = (x_2 - l_{c2}\cos\theta_2, y_2 - l_{c2}\sin\theta_2)$ (eq. 51);
    - $c_3 = l_3^2 - l_1^2 - l_2^2 + 2l_1l_2\cos(\pi + \theta_1 - \theta_2)$: the
      end point $p_A + l_2(\cos\theta_2, \sin\theta_2)$ at distance $l_3$ from the
      pivot (eq. 52, the law of cosines; $c_3 = l_3^2 - |p_A + l_2e_2|^2$).

    **Derived because the extraction lost symbols:** the minus signs of eq. 53
    (printed as "0") were restored from the mechanics above and checked against
    the Jacobian printed in eq. 54, whose rows are $[l_1 s_1, 1, 0, l_{c2}s_2]$,
    $[-l_1c_1, 0, 1, -l_{c2}c_2]$ and $[J_{31}, 0, 0, J_{34}]$ with
    $J_{31} = -J_{34} = -2l_1l_2\sin(\pi + \theta_1 - \theta_2)$ (cdiff takes the
    Jacobian by autodiff). The paper's initial state is lost; the two starts of
    `initial_state` are chosen here.

    **Parameters** (Sec. V-B): $L_1 = 2$, $L_{c1} = 1$, $L_2 = 1$, $L_{c2} = 0.5$ m,
    $m_1 = 10$, $m_2 = 6$ kg, $I_1 = 3$, $I_2 = 2$ kg m², $l_3 = 2.5$ m, $g = 9.81$;
    the paper uses $\alpha = 5$ and a step of 0.01 s.

    **One degree of freedom.** $c_3 = 0$ fixes the angle between the links,
    $\theta_1 - \theta_2 = \pm\delta$ with $\cos\delta = (l_3^2 - l_1^2 -
    l_2^2)/(2l_1l_2) = 0.3125$ ($\delta = 1.2530$ rad): on the constraints the arm
    is one rigid body swinging about the pivot (a compound pendulum, not the
    "double pendulum" of the paper's text). This model uses the branch
    $\theta_2 = \theta_1 - \delta$ (link 2 turned clockwise from link 1).

    **Exact reference** (derived here): with $\theta_2 = \theta_1 - \delta$ the
    centre of mass of link 2 is at $r = l_1e_1 + l_{c2}e_2$, $|r|^2 = l_1^2 +
    l_{c2}^2 + 2l_1l_{c2}\cos\delta$ constant, so Lagrange's equation in
    $\theta_1$ is
    $(I_1 + I_2 + m_2|r|^2)\ddot\theta_1 = \tau_1 - g(m_1l_{c1} + m_2l_1)
    \cos\theta_1 - g\,m_2l_{c2}\cos(\theta_1 - \delta)$,
    with an optional constant torque $\tau_1$ (`reference(ts, torque=...)`),
    solved with `solve_minimal` (Dopri8 at 1e-13). ($I_{tot} = 34.25$ kg m² for the
    default parameters.)

    **Observable:** the two link angles $\theta_1, \theta_2$, the joint-angle
    trajectories of the paper's Fig. 5.
    """

    l1: float | jnp.ndarray = 2.0
    lc1: float | jnp.ndarray = 1.0
    l2: float | jnp.ndarray = 1.0
    lc2: float | jnp.ndarray = 0.5
    m1: float | jnp.ndarray = 10.0
    m2: float | jnp.ndarray = 6.0
    I1: float | jnp.ndarray = 3.0
    I2: float | jnp.ndarray = 2.0
    l3: float | jnp.ndarray = 2.5
    g: float | jnp.ndarray = 9.81

    default_t1: ClassVar[float] = 5.0
    default_dt: ClassVar[float] = 1e-2

    def __check_init__(self):
        check_positive(self, ("l1", "l2", "m2", "I1", "I2", "l3"))
        values = [self.l1, self.l2, self.l3]
        if not any(isinstance(x, jax.core.Tracer) for x in values):
            l1, l2, l3 = (np.asarray(x, dtype=float) for x in values)
            if not np.all((np.abs(l1 - l2) < l3) & (l3 < l1 + l2)):
                raise ValueError(
                    f"TwoLinkOnCircle: the circle of radius l3={l3} cannot be reached "
                    f"by links l1={l1}, l2={l2} without a fully stretched or folded "
                    "arm (need |l1 - l2| < l3 < l1 + l2)"
                )

    @property
    def delta(self):
        r"""The fixed angle $\theta_1 - \theta_2$ on the constraints (rad)."""
        cos = (self.l3**2 - self.l1**2 - self.l2**2) / (2 * self.l1 * self.l2)
        return jnp.arccos(cos)

    def mass_matrix(self, t, q):
        d = jnp.stack([self.I1, self.m2, self.m2, self.I2])
        return jnp.diag(jnp.broadcast_to(d, (4,)).astype(q.dtype))

    def forces(self, t, q, v):
        """Gravity of eqs. 46-49 (the torque enters through `input_matrix`)."""
        w1, w2 = self.m1 * self.g * self.lc1, self.m2 * self.g
        z = jnp.zeros_like(w2)
        return jnp.stack([-w1 * jnp.cos(q[0]), z, -w2, z]).astype(q.dtype)

    def input_matrix(self, t, q):
        """The joint torque $\\tau_1$ acts on $\\theta_1$ only, shape `(4, 1)`."""
        return jnp.asarray([[1.0], [0.0], [0.0], [0.0]], dtype=q.dtype)

    def holonomic(self, t, q):
        """Eq. 53 (signs restored): $[c_1, c_2, c_3]$."""
        th1, x2, y2, th2 = q
        l1, l2, lc2 = self.l1, self.l2, self.lc2
        return jnp.stack([
            x2 - lc2 * jnp.cos(th2) - l1 * jnp.cos(th1),
            y2 - lc2 * jnp.sin(th2) - l1 * jnp.sin(th1),
            self.l3**2 - l1**2 - l2**2 + 2 * l1 * l2 * jnp.cos(jnp.pi + th1 - th2),
        ]).astype(q.dtype)

    def energy(self, t, q, v):
        potential = self.g * (self.m1 * self.lc1 * jnp.sin(q[0]) + self.m2 * q[2])
        return (0.5 * v @ self.mass_matrix(t, q) @ v + potential).astype(q.dtype)

    def end_point(self, q):
        """The end point of link 2, $(x_2, y_2) + (l_2 - l_{c2})e_2$."""
        r = self.l2 - self.lc2
        return jnp.stack([q[..., 1] + r * jnp.cos(q[..., 3]),
                          q[..., 2] + r * jnp.sin(q[..., 3])], axis=-1)

    def _on_branch(self, th, om):
        """$(q, \\dot q)$ of the rigid arm at angle `th` and rate `om`."""
        th2 = th - self.delta
        x2 = self.l1 * jnp.cos(th) + self.lc2 * jnp.cos(th2)
        y2 = self.l1 * jnp.sin(th) + self.lc2 * jnp.sin(th2)
        q = jnp.stack([th, x2, y2, th2], axis=-1)
        v = jnp.stack([om, -y2 * om, x2 * om, om], axis=-1)
        return q, v

    def initial_state(self, violated: bool = False):
        r"""The start, at rest.

        - `violated=False` (default): consistent, link 1 horizontal
          ($\theta_1 = 0$) and $\theta_2 = -\delta$, the start of `reference`.
        - `violated=True`: the paper's scenario (Sec. V-B, Fig. 5: links
          disconnected, end point off the circle; its values are lost in the
          extraction, these are chosen here): $q = [0, 2.35, -0.6, -1.2]$, which
          gives $c = [0.169, -0.134, -0.200]$ for the default parameters.
        """
        if violated:
            return jnp.array([0.0, 2.35, -0.6, -1.2]), jnp.zeros(4)
        q, v = self._on_branch(jnp.asarray(0.0), jnp.asarray(0.0))
        return q.astype(float), v.astype(float)

    def observable(self, q):
        """The link angles $\\theta_1, \\theta_2$ (Fig. 5, top right)."""
        return q[..., jnp.array([0, 3])]

    observable_names: ClassVar[tuple[str, ...]] = ("theta1 [rad]", "theta2 [rad]")

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][]: points `[pivot, end of link 1,
        start of link 2, end point]`, links `(0, 1)` of length `l1` and `(2, 3)` of
        length `l2`, each from its own coordinates. On the constraints the two
        links meet ($p_A = p_B$) and the end point is on the circle of radius
        `l3`."""
        th1, x2, y2, th2 = q
        z = jnp.zeros_like(th1)
        c2, s2 = jnp.cos(th2), jnp.sin(th2)
        r = self.l2 - self.lc2
        points = stack_points(
            (z, z), (self.l1 * jnp.cos(th1), self.l1 * jnp.sin(th1)),
            (x2 - self.lc2 * c2, y2 - self.lc2 * s2), (x2 + r * c2, y2 + r * s2),
        )
        return Sketch(points, ((0, 1), (2, 3)))

    def scenery(self) -> list[np.ndarray]:
        """The base pivot and the circle of radius `l3` the end point must follow."""
        return [circle((0.0, 0.0), self.l3), pivot(0.0, 0.0)]

    def reference(self, ts, theta0=None, omega0=None, torque=0.0):
        """Exact solution at `ts` from the consistent start (or from `theta0`,
        `omega0`), with an optional constant joint torque `torque` (N m)."""
        q0, v0 = self.initial_state()
        theta0 = q0[0] if theta0 is None else theta0
        omega0 = v0[0] if omega0 is None else omega0
        y0 = jnp.stack([jnp.asarray(theta0), jnp.asarray(omega0)]).astype(jnp.float64)
        delta = self.delta
        r2 = self.l1**2 + self.lc2**2 + 2 * self.l1 * self.lc2 * jnp.cos(delta)
        args = (
            self.I1 + self.I2 + self.m2 * r2,
            self.g * (self.m1 * self.lc1 + self.m2 * self.l1),
            self.g * self.m2 * self.lc2,
            delta,
            torque,
        )
        # rtol = atol = 1e-13: the energy (swing ~ 200 J) then stays within 5e-9 J
        # over 10 s (2.7e-8 J at the default 1e-12).
        th, om = solve_minimal(_minimal_rhs, y0, ts, args, rtol=1e-13, atol=1e-13).T
        q, v = self._on_branch(th, om)
        return Reference(jnp.asarray(ts), q, v)
