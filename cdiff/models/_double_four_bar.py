"""R4: the double four-bar linkage in joint coordinates (Braun & Goldfarb 2012,
Sec. 4.2)."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel
from .._sketch import Sketch, pivot, stack_points
from ._reference import MinimalODE, Reference, solve_minimal

# M / m: three ground-pivoted cranks (each m l^2/3 about its pivot, i.e. m/3 at
# its tip) and two couplers (m/6 [[2, 1], [1, 2]] on their two end points),
# assembled on the moving joints (x and y decouple).
_MASS = np.array(
    [
        [2 / 3, 0, 1 / 6, 0, 0, 0],
        [0, 2 / 3, 0, 1 / 6, 0, 0],
        [1 / 6, 0, 1, 0, 1 / 6, 0],
        [0, 1 / 6, 0, 1, 0, 1 / 6],
        [0, 0, 1 / 6, 0, 2 / 3, 0],
        [0, 0, 0, 1 / 6, 0, 2 / 3],
    ]
)


def _rhs(t, y, g_over_l):
    """Minimal ODE (Fig. 6 caption): $\\ddot\\theta = -(7g/6l)\\cos\\theta$."""
    th, om = y
    return jnp.stack([om, -7.0 / 6.0 * g_over_l * jnp.cos(th)])


class DoubleFourBar(AbstractModel):
    r"""Double four-bar linkage: five uniform links of length `l` and mass `m`
    (Braun & Goldfarb, Sec. 4.2, Figs. 5-7).

    Three cranks are pinned to the ground at $x = 0, l, 2l$ and joined at their
    tips by two couplers. Coordinates $q = [x_1, y_1, x_2, y_2, x_3, y_3]$: the
    moving joints. The unconstrained motion is $M\ddot q = Q$ with

    $M = m\begin{bmatrix} 2/3 & 0 & 1/6 & 0 & 0 & 0 \\ 0 & 2/3 & 0 & 1/6 & 0 & 0 \\
    1/6 & 0 & 1 & 0 & 1/6 & 0 \\ 0 & 1/6 & 0 & 1 & 0 & 1/6 \\
    0 & 0 & 1/6 & 0 & 2/3 & 0 \\ 0 & 0 & 0 & 1/6 & 0 & 2/3 \end{bmatrix}$,
    $Q = [0, -mg, 0, -\tfrac32 mg, 0, -mg]$,

    five holonomic constraints $x_1^2 + y_1^2 = l^2$, $(x_2 - l)^2 + y_2^2 = l^2$,
    $(x_3 - 2l)^2 + y_3^2 = l^2$, $(x_2 - x_1)^2 + (y_2 - y_1)^2 = l^2$,
    $(x_3 - x_2)^2 + (y_3 - y_2)^2 = l^2$, and energy
    $\tfrac12\dot q^T M\dot q + mg(y_1 + \tfrac32 y_2 + y_3)$.

    Whenever all links are horizontal ($y_1 = y_2 = y_3 = 0$) the linkage passes a
    kinematic singularity: the constraint Jacobian loses rank (the parallelogram
    can fold into a crossed configuration).

    **Exact reference** (Fig. 6 caption): the linkage stays a parallelogram, every
    moving joint at $(\text{pivot}_i + l\cos\theta, l\sin\theta)$, with $\theta$ the
    orientation of the base link and $\ddot\theta + \frac{7g}{6l}\cos\theta = 0$.
    (Kinetic energy $\tfrac32 ml^2\dot\theta^2$, potential $\tfrac72 mgl\sin\theta$.)
    The paper's start $q(0) = [0, l, l, l, 2l, l]$, $v(0) = [1, 0, 1, 0, 1, 0]$ is
    $\theta(0) = \pi/2$, $\dot\theta(0) = -1/l$ (the paper's $-1$ for $l = 1$).
    """

    m: float | jnp.ndarray = 1.0
    l: float | jnp.ndarray = 1.0
    g: float | jnp.ndarray = 9.81

    # The paper's run (Figs. 6-7): used by the command line.
    default_t1: ClassVar[float] = 1000.0
    default_dt: ClassVar[float] = 1e-2

    def mass_matrix(self, t, q):
        m = jnp.asarray(self.m, dtype=q.dtype)
        return m * jnp.asarray(_MASS, dtype=q.dtype)

    def forces(self, t, q, v):
        w = self.m * self.g
        z = jnp.zeros_like(w)
        return jnp.stack([z, -w, z, -1.5 * w, z, -w]).astype(q.dtype)

    def holonomic(self, t, q):
        x1, y1, x2, y2, x3, y3 = q
        l = self.l
        return jnp.stack(
            [
                x1**2 + y1**2 - l**2,
                (x2 - l) ** 2 + y2**2 - l**2,
                (x3 - 2 * l) ** 2 + y3**2 - l**2,
                (x2 - x1) ** 2 + (y2 - y1) ** 2 - l**2,
                (x3 - x2) ** 2 + (y3 - y2) ** 2 - l**2,
            ]
        ).astype(q.dtype)

    def energy(self, t, q, v):
        M = self.mass_matrix(t, q)
        return 0.5 * v @ M @ v + self.m * self.g * (q[1] + 1.5 * q[3] + q[5])

    def initial_state(self):
        """The paper's start (Fig. 6): links vertical, joints moving at 1 m/s in +x."""
        l = jnp.asarray(self.l, dtype=float)
        z = jnp.zeros_like(l)
        q0 = jnp.stack([z, l, l, l, 2 * l, l])
        v0 = jnp.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
        return q0, v0

    def observable(self, q):
        """The quantity shown against the exact solution: the third joint."""
        return q[..., 4:6]

    observable_names: ClassVar[tuple[str, ...]] = ("x3 [m]", "y3 [m]")

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][]: points `[pivot 1, pivot 2,
        pivot 3, joint 1, joint 2, joint 3]` (pivots at $x = 0, l, 2l$), links: the
        three cranks `(i, i + 3)` and the two couplers `(3, 4)`, `(4, 5)`, all of
        length `l` on the constraints."""
        x1, y1, x2, y2, x3, y3 = q
        z = jnp.zeros_like(x1)
        points = stack_points((z, z), (z + self.l, z), (z + 2 * self.l, z),
                              (x1, y1), (x2, y2), (x3, y3))
        return Sketch(points, ((0, 3), (1, 4), (2, 5), (3, 4), (4, 5)))

    def scenery(self) -> list[np.ndarray]:
        """The three ground pivots."""
        return [pivot(i * float(self.l), 0.0) for i in range(3)]

    def reference(self, ts, theta0=None, omega0=None):
        """Exact solution at `ts`, mapped to the six joint coordinates.

        By default $\\theta(0)$ and $\\dot\\theta(0)$ are read off the base link in
        `initial_state()`: $\\theta_0 = \\operatorname{atan2}(y_1, x_1)$,
        $\\dot\\theta_0 = (x_1\\dot y_1 - y_1\\dot x_1)/l^2$ (gives $\\pi/2$ and
        $-1/l$). The start must be a parallelogram state (all joints offset and
        moving alike), as the paper's is.
        """
        ode = self.minimal_ode()
        y0 = ode.y0
        if theta0 is not None:
            y0 = y0.at[0].set(theta0)
        if omega0 is not None:
            y0 = y0.at[1].set(omega0)
        q, v = self.minimal_state(solve_minimal(_rhs, y0.astype(jnp.float64), ts,
                                                ode.args.astype(jnp.float64)))
        return Reference(jnp.asarray(ts), q, v)

    def minimal_ode(self) -> MinimalODE:
        """$\\ddot\\theta + (7g/6l)\\cos\\theta = 0$ for $y = (\\theta, \\dot\\theta)$
        of the base link, from `initial_state()` (see `reference`): the
        unconstrained formulation of Figs. 6-7."""
        q0, v0 = self.initial_state()
        theta0 = jnp.arctan2(q0[1], q0[0])
        omega0 = (q0[0] * v0[1] - q0[1] * v0[0]) / (q0[0] ** 2 + q0[1] ** 2)
        dtype = jnp.result_type(float)
        return MinimalODE(_rhs, jnp.stack([theta0, omega0]).astype(dtype),
                          jnp.asarray(self.g / self.l, dtype), self.minimal_state)

    def minimal_state(self, y):
        """`(q, v)` of the parallelogram motion from $y = (\\theta, \\dot\\theta)$
        (leading axes allowed)."""
        th, om = y[..., 0], y[..., 1]
        c, s = self.l * jnp.cos(th), self.l * jnp.sin(th)
        dx, dy = -s * om, c * om
        q = jnp.stack([c, s, self.l + c, s, 2 * self.l + c, s], axis=-1)
        v = jnp.stack([dx, dy, dx, dy, dx, dy], axis=-1)
        return q, v
