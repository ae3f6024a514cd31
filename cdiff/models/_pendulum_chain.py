"""A planar chain of pendulums in Cartesian coordinates: a mid-size model with a
diagonal mass matrix and a banded constraint Jacobian."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel
from .._sketch import Sketch
from ._reference import MinimalODE, Reference, solve_minimal


def _rhs(t, y, args):
    """The chain's minimal ODE in absolute link angles (see `PendulumChain`)."""
    g_over_l, counts = args
    n = counts.shape[0]
    th, om = y[:n], y[n:]
    diff = th[:, None] - th[None, :]
    M = counts * jnp.cos(diff)
    rhs = -counts * jnp.sin(diff) @ om**2 - g_over_l * jnp.diag(counts) * jnp.cos(th)
    return jnp.concatenate([om, jnp.linalg.solve(M, rhs)])


class PendulumChain(AbstractModel):
    r"""A planar chain of `n` point masses `m` joined by massless rods of length
    `l`, hanging from a pivot at the origin, in Cartesian coordinates
    $q = [x_1, y_1, \dots, x_n, y_n]$ ($2n$ coordinates, $n$ constraints, gravity
    along $-y$):

    $M = mI$, $Q = -mg\,[0, 1, 0, 1, \dots]$, $\;x_1^2 + y_1^2 = l^2$,
    $(x_i - x_{i-1})^2 + (y_i - y_{i-1})^2 = l^2$.

    **Start:** the chain straight at angle `angle0` (radians from $+x$, default
    $-\pi/6$), at rest.

    **Reference:** the minimal ODE in the absolute link angles $\theta_j$
    ($p_i = l\sum_{j \le i}(\cos\theta_j, \sin\theta_j)$): with $c_{jk} = n -
    \max(j, k)$ (0-based; the number of masses beyond both links),
    $\sum_k c_{jk}\cos(\theta_j - \theta_k)\ddot\theta_k = -\sum_k c_{jk}
    \sin(\theta_j - \theta_k)\dot\theta_k^2 - \tfrac gl\,c_{jj}\cos\theta_j$,
    solved to `rtol = atol = 1e-12`.

    **Arguments:** `n` (static, default 100), `m`, `l`, `g`, `angle0`.
    """

    n: int = eqx.field(static=True, default=100)
    m: float | jnp.ndarray = 1.0
    l: float | jnp.ndarray = 1.0
    g: float | jnp.ndarray = 9.81
    angle0: float | jnp.ndarray = -np.pi / 6

    default_t1: ClassVar[float] = 1.0
    default_dt: ClassVar[float] = 1e-4

    def __check_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"PendulumChain: n must be a positive integer, got {self.n!r}")

    def mass_matrix(self, t, q):
        return jnp.asarray(self.m, q.dtype) * jnp.eye(q.shape[0], dtype=q.dtype)

    def forces(self, t, q, v):
        w = jnp.asarray(self.m * self.g, q.dtype)
        return jnp.stack([jnp.zeros(self.n, q.dtype), -w * jnp.ones(self.n, q.dtype)],
                         axis=-1).reshape(-1)

    def holonomic(self, t, q):
        p = q.reshape(-1, 2)
        d = jnp.diff(p, axis=0, prepend=jnp.zeros((1, 2), q.dtype))
        return jnp.sum(d**2, axis=-1) - jnp.asarray(self.l, q.dtype) ** 2

    def energy(self, t, q, v):
        return 0.5 * self.m * jnp.sum(v**2) + self.m * self.g * jnp.sum(q[1::2])

    def initial_state(self):
        """The chain straight at `angle0`, at rest."""
        dtype = jnp.result_type(float)
        y0 = self.minimal_ode().y0
        return self.minimal_state(y0.astype(dtype))

    def minimal_state(self, y):
        """`(q, v)` from the link angles and rates $y = (\\theta, \\dot\\theta)$
        (leading axes allowed)."""
        th, om = y[..., : self.n], y[..., self.n :]
        c, s = jnp.cos(th), jnp.sin(th)
        x, yy = self.l * jnp.cumsum(c, -1), self.l * jnp.cumsum(s, -1)
        dx, dy = -self.l * jnp.cumsum(s * om, -1), self.l * jnp.cumsum(c * om, -1)
        q = jnp.stack([x, yy], axis=-1).reshape(*y.shape[:-1], -1)
        v = jnp.stack([dx, dy], axis=-1).reshape(*y.shape[:-1], -1)
        return q, v

    def minimal_ode(self) -> MinimalODE:
        """The minimal ODE above for $y = (\\theta, \\dot\\theta)$, from the start."""
        dtype = jnp.result_type(float)
        j = np.arange(self.n)
        counts = jnp.asarray(self.n - np.maximum(j[:, None], j[None, :]), dtype)
        th0 = jnp.full(self.n, self.angle0, dtype)
        y0 = jnp.concatenate([th0, jnp.zeros(self.n, dtype)])
        return MinimalODE(_rhs, y0, (jnp.asarray(self.g / self.l, dtype), counts),
                          self.minimal_state)

    def reference(self, ts) -> Reference:
        """The motion at `ts` from the minimal ODE, in the model's coordinates."""
        ode = self.minimal_ode()
        args = (ode.args[0].astype(jnp.float64), ode.args[1].astype(jnp.float64))
        y = solve_minimal(ode.rhs, ode.y0.astype(jnp.float64), ts, args)
        q, v = self.minimal_state(y)
        return Reference(jnp.asarray(ts), q, v)

    def observable(self, q):
        """The last mass's position."""
        return q[..., -2:]

    observable_names: ClassVar[tuple[str, ...]] = ("x_n [m]", "y_n [m]")

    def sketch(self, q) -> Sketch:
        """Points: the pivot, then the masses; links along the chain."""
        p = q.reshape(*q.shape[:-1], self.n, 2)
        pivot = jnp.zeros((*q.shape[:-1], 1, 2), q.dtype)
        return Sketch(jnp.concatenate([pivot, p], axis=-2),
                      tuple((i, i + 1) for i in range(self.n)))
