"""R1: a particle on a circle in Cartesian coordinates (Aghili, Sec. 5.4)."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel
from .._sketch import Sketch, circle, pivot, stack_points
from ._reference import Reference, solve_minimal


def _pendulum_rhs(t, y, g_over_rho):
    """Minimal ODE in the polar angle: $\\ddot\\varphi = -(g/\\rho)\\cos\\varphi$."""
    phi, om = y
    return jnp.stack([om, -g_over_rho * jnp.cos(phi)])


class ParticleOnCircle(AbstractModel):
    r"""Point mass `m` on a circle of radius `rho` centred at the origin
    (Aghili, Sec. 5.4, eqs. 33-35, Fig. 2).

    Coordinates $q = [q_1, q_2]$, $M = m I_2$, one holonomic constraint
    $\Phi = \sqrt{q_1^2 + q_2^2} - \rho$ with $A = q^T/\rho$. The projection onto the
    tangent is $P = I - A^+A = \epsilon_\parallel\epsilon_\parallel^T$ and the
    centripetal term is $C\dot q = -(\|\dot q\|^2/\rho)\,\epsilon_\perp$ (eq. 35); the
    constraint force is $f_\perp + m(\|\dot q\|^2/\rho)\,\epsilon_\perp$.

    An optional uniform gravity field `g` acts along $-q_2$ (force $[0, -mg]$,
    energy $\tfrac12 m\|\dot q\|^2 + m g q_2$). With `g = 0` (the default) the
    particle moves uniformly round the circle; with `g > 0` the system is a
    pendulum, compared against the minimal-coordinate ODE in the angle.

    **Exact reference:** with $q = \rho[\cos\varphi, \sin\varphi]$,
    $\ddot\varphi = -(g/\rho)\cos\varphi$, $\varphi(0) = 0$,
    $\dot\varphi(0) = \text{speed}/\rho$ (from `initial_state()`).
    """

    m: float | jnp.ndarray = 1.0
    rho: float | jnp.ndarray = 1.0
    g: float | jnp.ndarray = 0.0
    speed: float | jnp.ndarray = 1.0

    default_t1: ClassVar[float] = 20.0
    default_dt: ClassVar[float] = 1e-2

    def mass_matrix(self, t, q):
        m = jnp.asarray(self.m, dtype=q.dtype)
        return m * jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        w = self.m * self.g
        z = jnp.zeros_like(w)
        return jnp.stack([z, -w]).astype(q.dtype)

    def holonomic(self, t, q):
        r = jnp.sqrt(q[0] ** 2 + q[1] ** 2)
        return jnp.stack([r - self.rho]).astype(q.dtype)

    def energy(self, t, q, v):
        return 0.5 * self.m * (v @ v) + self.m * self.g * q[1]

    def initial_state(self):
        """Particle at $(\\rho, 0)$ moving counter-clockwise with speed `speed`."""
        rho = jnp.asarray(self.rho, dtype=float)
        speed = jnp.asarray(self.speed, dtype=float)
        q0 = jnp.stack([rho, jnp.zeros_like(rho)])
        v0 = jnp.stack([jnp.zeros_like(speed), speed])
        return q0, v0

    def observable(self, q):
        """The particle's position itself."""
        return q[..., :2]

    observable_names: ClassVar[tuple[str, ...]] = ("q1 [m]", "q2 [m]")

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][]: points `[centre, particle]`,
        joined by a radius (of length `rho` on the constraint)."""
        z = jnp.zeros_like(q[0])
        return Sketch(stack_points((z, z), (q[0], q[1])), ((0, 1),))

    def scenery(self) -> list[np.ndarray]:
        """The circle and its centre."""
        return [circle((0.0, 0.0), self.rho), pivot(0.0, 0.0)]

    def reference(self, ts, phi0=None, omega0=None):
        """Exact solution in the angle at `ts`, mapped to $q$ and $\\dot q$.

        By default the angle and its rate are read off `initial_state()`:
        $\\varphi_0 = \\operatorname{atan2}(q_2, q_1)$,
        $\\dot\\varphi_0 = (q_1\\dot q_2 - q_2\\dot q_1)/\\|q\\|^2$.
        """
        q0, v0 = self.initial_state()
        if phi0 is None:
            phi0 = jnp.arctan2(q0[1], q0[0])
        if omega0 is None:
            omega0 = (q0[0] * v0[1] - q0[1] * v0[0]) / (q0[0] ** 2 + q0[1] ** 2)
        y0 = jnp.stack([jnp.asarray(phi0), jnp.asarray(omega0)]).astype(jnp.float64)
        g_over_rho = jnp.asarray(self.g / self.rho, dtype=jnp.float64)
        phi, om = solve_minimal(_pendulum_rhs, y0, ts, g_over_rho).T
        rho = jnp.asarray(self.rho, dtype=jnp.float64)
        c, s = jnp.cos(phi), jnp.sin(phi)
        q = jnp.stack([rho * c, rho * s], axis=-1)
        v = jnp.stack([-rho * s * om, rho * c * om], axis=-1)
        return Reference(jnp.asarray(ts), q, v)
