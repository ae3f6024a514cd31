"""IFToMM A02, the N four-bar mechanism, in natural coordinates: a mid-size
model (2N + 2 coordinates, 2N + 1 constraints) with banded structure."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel
from .._sketch import Sketch
from ._reference import MinimalODE, Reference, solve_minimal


def _rhs(t, y, c_g_over_l):
    th, om = y
    return jnp.stack([om, -c_g_over_l * jnp.cos(th)])


class NFourBar(AbstractModel):
    r"""The N four-bar mechanism (IFToMM benchmark A02, Gonzalez et al. 2006) in
    natural coordinates: $2N + 1$ uniform links of length `l` and mass `m`,
    $N + 1$ cranks pinned to the ground at $x = 0, l, \dots, Nl$ and $N$ couplers
    joining their tips. [`cdiff.models.DoubleFourBar`][] is $N = 2$.

    Coordinates $q = [x_0, y_0, \dots, x_N, y_N]$: the crank tips ($2N + 2$).
    Constraints, ordered along the chain (crank $0$, coupler $0$, crank $1$, ...,
    crank $N$, so that the constraint Jacobian is banded):
    $(x_i - il)^2 + y_i^2 = l^2$ and $(x_{i+1} - x_i)^2 + (y_{i+1} - y_i)^2 = l^2$.
    The mass matrix is constant and block-tridiagonal: each crank puts $m/3$ on its
    tip, each coupler $\tfrac m6\left[\begin{smallmatrix}2&1\\1&2\end{smallmatrix}\right]$
    on its two ends (x and y decouple). Gravity puts $mg/2$ of every link on each of
    its moving ends.

    Whenever all links are horizontal the mechanism passes a kinematic singularity
    (the number of degrees of freedom jumps from 1 to $N + 1$).

    **Exact reference:** started as a parallelogram, every crank turns together,
    $\ddot\theta = -c\,\tfrac gl\cos\theta$ with $c = \frac{3(3N+1)}{2(4N+1)}$
    (`cdiff.models.n_four_bar_ode_coefficient`). The benchmark's start: cranks
    vertical, every tip moving at 1 m/s along $+x$.

    **Arguments:** `n` (static: the number of four-bar windows, default 40 as in the
    benchmark), `m`, `l`, `g`.
    """

    n: int = eqx.field(static=True, default=40)
    m: float | jnp.ndarray = 1.0
    l: float | jnp.ndarray = 1.0
    g: float | jnp.ndarray = 9.81

    default_t1: ClassVar[float] = 10.0
    default_dt: ClassVar[float] = 1e-3

    def __check_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"NFourBar: n must be a positive integer, got {self.n!r}")

    def _weights(self, dtype):
        """Each tip's share of the links' mass, in units of m: the diagonal of M
        (per coordinate pair) and the gravity load."""
        k = self.n + 1
        inner = np.ones(k)
        inner[[0, -1]] = 2 / 3
        load = np.full(k, 1.5)
        load[[0, -1]] = 1.0
        return jnp.asarray(inner, dtype), jnp.asarray(load, dtype)

    def mass_matrix(self, t, q):
        diag, _ = self._weights(q.dtype)
        k = self.n + 1
        blocks = np.diag(np.ones(k - 1), 1) + np.diag(np.ones(k - 1), -1)
        M = jnp.diag(diag) + jnp.asarray(blocks / 6, q.dtype)
        return jnp.asarray(self.m, q.dtype) * jnp.kron(M, jnp.eye(2, dtype=q.dtype))

    def forces(self, t, q, v):
        _, load = self._weights(q.dtype)
        fy = -jnp.asarray(self.m * self.g, q.dtype) * load
        return jnp.stack([jnp.zeros_like(fy), fy], axis=-1).reshape(-1)

    def holonomic(self, t, q):
        p = q.reshape(-1, 2)
        l = jnp.asarray(self.l, q.dtype)
        pivots = l * jnp.arange(self.n + 1, dtype=q.dtype)
        crank = (p[:, 0] - pivots) ** 2 + p[:, 1] ** 2 - l**2
        d = p[1:] - p[:-1]
        coupler = jnp.sum(d**2, axis=-1) - l**2
        rows = jnp.stack([crank[:-1], coupler], axis=-1).reshape(-1)
        return jnp.concatenate([rows, crank[-1:]])

    def energy(self, t, q, v):
        _, load = self._weights(q.dtype)
        potential = self.m * self.g * jnp.sum(load * q[1::2])
        return 0.5 * v @ (self.mass_matrix(t, q) @ v) + potential

    def initial_state(self):
        """The benchmark's start: cranks vertical, tips moving at 1 m/s along +x."""
        return self.minimal_state(self.minimal_ode().y0)

    def minimal_state(self, y):
        """`(q, v)` of the parallelogram motion from $y = (\\theta, \\dot\\theta)$
        of the cranks (leading axes allowed)."""
        th, om = y[..., 0:1], y[..., 1:2]
        l = self.l
        pivots = l * jnp.arange(self.n + 1, dtype=y.dtype)
        x = pivots + l * jnp.cos(th)
        xy = jnp.stack([x, jnp.broadcast_to(l * jnp.sin(th), x.shape)], axis=-1)
        tip_rate = l * om[..., None] * jnp.stack([-jnp.sin(th), jnp.cos(th)], axis=-1)
        rate = jnp.broadcast_to(tip_rate, xy.shape)  # every tip moves alike
        q = xy.reshape(*y.shape[:-1], -1)
        v = rate.reshape(*y.shape[:-1], -1)
        return q, v

    def minimal_ode(self) -> MinimalODE:
        r"""$\ddot\theta = -c\,(g/l)\cos\theta$ for the cranks' angle, from the
        benchmark's start."""
        c = 3 * (3 * self.n + 1) / (2 * (4 * self.n + 1))
        dtype = jnp.result_type(float)
        y0 = jnp.array([np.pi / 2, -1.0], dtype) / jnp.array([1.0, self.l], dtype)
        return MinimalODE(_rhs, y0, jnp.asarray(c * self.g / self.l, dtype),
                          self.minimal_state)

    def reference(self, ts) -> Reference:
        """The exact parallelogram motion at `ts` (the minimal ODE solved to
        `rtol = atol = 1e-12`), in the model's coordinates."""
        ode = self.minimal_ode()
        y = solve_minimal(ode.rhs, ode.y0.astype(jnp.float64), ts,
                          ode.args.astype(jnp.float64))
        q, v = self.minimal_state(y)
        return Reference(jnp.asarray(ts), q, v)

    def observable(self, q):
        """The benchmark's output: point B0, the first crank's tip."""
        return q[..., 0:2]

    observable_names: ClassVar[tuple[str, ...]] = ("x_B0 [m]", "y_B0 [m]")

    def sketch(self, q) -> Sketch:
        """Points: the N + 1 pivots, then the N + 1 tips; links: cranks and couplers."""
        k = self.n + 1
        p = q.reshape(*q.shape[:-1], k, 2)
        pivots = jnp.stack([self.l * jnp.arange(k, dtype=q.dtype),
                            jnp.zeros(k, q.dtype)], axis=-1)
        pivots = jnp.broadcast_to(pivots, p.shape)
        points = jnp.concatenate([pivots, p], axis=-2)
        links = tuple((i, k + i) for i in range(k)) + tuple(
            (k + i, k + i + 1) for i in range(k - 1))
        return Sketch(points, links)
