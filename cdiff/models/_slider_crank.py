"""R2: the slider-crank in absolute coordinates (Braun & Goldfarb 2012, Sec. 4.1)."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel
from .._sketch import Sketch, pivot, segment, stack_points
from ._reference import MinimalODE, Reference, solve_minimal


class SliderCrank(AbstractModel):
    r"""Slider-crank with two uniform links of length `l` and mass `m`
    (Braun & Goldfarb, Sec. 4.1, eqs. 21-24, Figs. 1-4).

    Coordinates $q = [x_1, y_1, \theta_1, x_2, y_2, \theta_2]$: centres of mass and
    absolute angles of the crank and the connecting rod. Five holonomic
    constraints (eq. 22): the crank pinned at the origin, the two links pinned
    together, and the rod's far end on the horizontal slide $y = 0$.
    $M = \mathrm{diag}(m, m, ml^2/12, m, m, ml^2/12)$, gravity along $-y$.

    The crank passes $\theta_1 = -\pi/2$ (both links vertical), a kinematic
    singularity where the constraint Jacobian loses rank.

    **Exact reference** (eq. 24): on the branch $\theta_2 = -\theta_1$,
    $\ddot\theta_1 + \frac{3}{5 - 3\cos 2\theta_1}(\sin 2\theta_1\,\dot\theta_1^2
    + \frac{g}{l}\cos\theta_1) = 0$, and the slider is at $x_s = 2l\cos\theta_1$.
    """

    m: float | jnp.ndarray = 1.0
    l: float | jnp.ndarray = 1.0
    g: float | jnp.ndarray = 9.81

    # The paper's run (Figs. 1-3): used by the command line.
    default_t1: ClassVar[float] = 100.0
    default_dt: ClassVar[float] = 1e-2

    def mass_matrix(self, t, q):
        m, l = self.m, self.l
        d = jnp.stack([m, m, m * l**2 / 12, m, m, m * l**2 / 12])
        return jnp.diag(jnp.broadcast_to(d, (6,)).astype(q.dtype))

    def forces(self, t, q, v):
        w = self.m * self.g
        z = jnp.zeros_like(w)
        return jnp.stack([z, -w, z, z, -w, z]).astype(q.dtype)

    def holonomic(self, t, q):
        x1, y1, th1, x2, y2, th2 = q
        h = self.l / 2
        return jnp.stack(
            [
                x1 - h * jnp.cos(th1),
                y1 - h * jnp.sin(th1),
                x1 + h * jnp.cos(th1) - x2 + h * jnp.cos(th2),
                y1 + h * jnp.sin(th1) - y2 + h * jnp.sin(th2),
                y2 + h * jnp.sin(th2),
            ]
        )

    def energy(self, t, q, v):
        M = self.mass_matrix(t, q)
        return 0.5 * v @ M @ v + self.m * self.g * (q[1] + q[4])

    def initial_state(self):
        """The paper's start: crank at 45 degrees, at rest (Fig. 1)."""
        r2 = jnp.sqrt(2.0)
        l = jnp.asarray(self.l, dtype=float)
        q0 = jnp.array([r2 / 4, r2 / 4, jnp.pi / 4, 3 * r2 / 4, r2 / 4, -jnp.pi / 4])
        q0 = q0 * jnp.array([l, l, 1.0, l, l, 1.0])
        return q0, jnp.zeros(6)

    def slider(self, q):
        """Horizontal slider position $x_s = x_2 + (l/2)\\cos\\theta_2$."""
        return q[..., 3] + self.l / 2 * jnp.cos(q[..., 5])

    def observable(self, q):
        """The quantity the paper compares with the exact solution: the slider."""
        return self.slider(q)[..., None]

    observable_names: ClassVar[tuple[str, ...]] = ("slider x_s [m]",)

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][]: each link from its own centre
        and angle, points `[crank start, crank end, rod start, rod end]` (the
        slider), links `(0, 1)` and `(2, 3)` of length `l`. On the constraints the
        crank starts at the origin, the crank's end is the rod's start and the
        slider is on $y = 0$."""
        h = self.l / 2
        x1, y1, th1, x2, y2, th2 = q
        c1, s1 = h * jnp.cos(th1), h * jnp.sin(th1)
        c2, s2 = h * jnp.cos(th2), h * jnp.sin(th2)
        points = stack_points((x1 - c1, y1 - s1), (x1 + c1, y1 + s1),
                              (x2 - c2, y2 - s2), (x2 + c2, y2 + s2))
        return Sketch(points, ((0, 1), (2, 3)))

    def scenery(self) -> list[np.ndarray]:
        """The crank's pivot and the slider's track $y = 0$, $|x| \\le 2.2\\,l$."""
        reach = 2.2 * float(self.l)
        return [segment((-reach, 0.0), (reach, 0.0)), pivot(0.0, 0.0)]

    def reference(self, ts, theta0=jnp.pi / 4, omega0=0.0):
        """Exact solution (eq. 24) at `ts`, mapped to the six absolute coordinates."""
        y0 = jnp.stack([jnp.asarray(theta0, float), jnp.asarray(omega0, float)])
        q, v = self.minimal_state(solve_minimal(_minimal_rhs, y0, ts,
                                                args=self.g / self.l))
        return Reference(jnp.asarray(ts), q, v)

    def minimal_ode(self) -> MinimalODE:
        r"""Eq. 24 for $y = (\theta_1, \dot\theta_1)$ from the paper's start
        ($\pi/4$, at rest): the unconstrained formulation of Fig. 4(d)."""
        dtype = jnp.result_type(float)
        return MinimalODE(_minimal_rhs, jnp.array([jnp.pi / 4, 0.0], dtype),
                          jnp.asarray(self.g / self.l, dtype), self.minimal_state)

    def minimal_state(self, y):
        r"""`(q, v)` of the branch $\theta_2 = -\theta_1$ from $y = (\theta_1,
        \dot\theta_1)$ (leading axes allowed)."""
        th, om = y[..., 0], y[..., 1]
        h = self.l / 2
        c, s = jnp.cos(th), jnp.sin(th)
        q = jnp.stack([h * c, h * s, th, 3 * h * c, h * s, -th], axis=-1)
        v = jnp.stack(
            [-h * s * om, h * c * om, om, -3 * h * s * om, h * c * om, -om], axis=-1
        )
        return q, v


def _minimal_rhs(t, y, g_over_l):
    """Eq. 24 as a first-order system (module level, so compiled solves are reused)."""
    th, om = y
    acc = -3.0 / (5.0 - 3.0 * jnp.cos(2 * th)) * (
        jnp.sin(2 * th) * om**2 + g_over_l * jnp.cos(th)
    )
    return jnp.stack([om, acc])
