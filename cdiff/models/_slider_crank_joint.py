"""R3: the slider-crank in joint coordinates (Aghili 2005, Sec. 8)."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel, check_positive
from .._sketch import Sketch, pivot, segment, stack_points
from ._reference import Reference, solve_minimal


def _minimal_rhs(t, y, g_over_l):
    r"""Lagrange's equation in $q_1$ on the branch $q_2 = 2\pi - 2q_1$:
    $(1 + 4\sin^2 q_1)\ddot q_1 + 2\sin 2q_1\,\dot q_1^2 + (g/l)\cos q_1 = 0$."""
    q1, w = y
    acc = -(2.0 * jnp.sin(2.0 * q1) * w**2 + g_over_l * jnp.cos(q1)) / (
        1.0 + 4.0 * jnp.sin(q1) ** 2
    )
    return jnp.stack([w, acc])


class SliderCrankJoint(AbstractModel):
    r"""Slider-crank in joint coordinates: a two-link arm with point masses `m` at
    the link ends and equal lengths `l`, whose end point C slides on the horizontal
    line through the crank pivot (Aghili, Sec. 8, eqs. 63-69, Fig. 3).

    Coordinates $q = [q_1, q_2]$: the crank angle and the rod's angle relative to
    the crank. The open chain (the loop cut at C) has, with $c_{12} =
    \cos(q_1 + q_2)$ etc. (eq. 66, gravity along $-y$),

    $$M = ml^2\begin{bmatrix} 3 + 2c_2 & 1 + c_2 \\ 1 + c_2 & 1\end{bmatrix},\quad
      h = \begin{bmatrix} -ml^2 s_2(\dot q_2^2 + 2\dot q_1\dot q_2)
      + mlg(c_{12} + 2c_1) \\ ml^2 s_2\dot q_1^2 + mlg\,c_{12}\end{bmatrix},$$

    and `forces` returns $-h$ (cdiff's $M\ddot q = Q + \dots$). One holonomic
    constraint, the height of C (eqs. 64-65): $\Phi = l(s_1 + s_{12})$, whose
    Jacobian $A = l[c_1 + c_{12},\ c_{12}]$ (eq. 67) cdiff takes by autodiff.
    Energy $\tfrac12\dot q^TM\dot q + mgl(2s_1 + s_{12})$.

    **Parameters.** The paper gives none: $m = l = 1$, $g = 9.81$.

    **Branches and singularities.** $\Phi = 0$ has two branches: the paper's
    $q_2 = 2\pi - 2q_1$ (eq. 68; C at $x = 2lc_1$) and the folded $q_2 = \pi$ (C at
    the pivot). They cross where $c_1 = 0$, the singular configurations where
    $A = 0$ (there $A = lc_1[2, 1]$ on the paper's branch, $\sigma(A) =
    \sqrt5\,l|c_1|$). These are $q_1 = \pm\pi/2 + 2k\pi$, the odd multiples of
    $\pi/2$: eq. 63 prints $q_1 = n\pi/2$ for every $n \ne 0$, but at
    $q_1 = \pm\pi$ ($n = \pm2$) $A = l[-2, -1] \ne 0$.

    **Eqs. 68-69 as printed have their cases swapped:** off the singular
    configurations $P = I - A^+A$ is the rank-one projector
    $\begin{bmatrix} 1/5 & -2/5 \\ -2/5 & 4/5\end{bmatrix}$ (and
    $M_c'' = ml^2\begin{bmatrix} 1 & (1 + c_2)/5 \\ 0 & (3 - 2c_2)/5\end{bmatrix}$
    for $\gamma = ml^2$), and $P = I$, $M_c'' = M$ where $|c_1| < \epsilon/(l\sqrt5)$
    (the constraint "virtually removed"); the paper prints the rank-one matrices
    under $|c_1| < \epsilon$. Its remark $C \equiv 0$ holds on the branch
    ($\dot A\dot q = 0$ there).

    !!! warning

        cdiff's pseudoinverse uses a relative threshold, which does nothing for
        this single constraint row: $P$ becomes the identity only where $A$ is at
        round-off ($|c_1| \lesssim 10^{-16}$), not below the paper's $\epsilon$.
        [`cdiff.Projection`][] alone (no stabilisation) carries its drift into the
        singular passages, where it is amplified by $1/|c_1|$: from the default
        start it stops with non-finite values at the 3rd passage (dt = 1e-3) or
        the 4th (dt = 1e-2). With a post-step projection,
        `cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection())`, it passes them all.

    **Start** (the paper gives none): $q_1 = \pi/4$ at rest on the paper's branch,
    $q_2 = 3\pi/2$, the start of the slider-crank R2 (Braun & Goldfarb). The crank
    then swings between $\pi/4$ and $-5\pi/4$ and passes the singular
    configuration $q_1 = -\pi/2$ every 2.33 s (twice per period), first at
    $t = 1.16$ s: ten passages by $t = 22.1$ s. (`initial_state(w1=...)` with
    $|\dot q_1| > 1.39$ rad/s makes it turn over, through $+\pi/2$ as well.)

    **Exact reference** (derived here; the paper has no simulation): on the branch
    $q_2 = 2\pi - 2q_1$ the rod's end stays at $y = 0$ and $\dot q = \dot q_1[1, -2]$,
    so $T = \tfrac12 ml^2(1 + 4s_1^2)\dot q_1^2$, $V = mgl\,s_1$ and Lagrange's
    equation is
    $(1 + 4s_1^2)\ddot q_1 + 2\sin 2q_1\,\dot q_1^2 + (g/l)c_1 = 0$
    (independent of $m$), solved with `solve_minimal` (Dopri8 at 1e-12).

    **Observable:** the slider position $x_C = l(c_1 + c_{12})$, the quantity
    compared in R2; unlike $q_2$ it does not depend on the $2\pi$ with which the
    branch is written, and unlike $q_1$ it is what a user of the mechanism sees.
    """

    m: float | jnp.ndarray = 1.0
    l: float | jnp.ndarray = 1.0
    g: float | jnp.ndarray = 9.81

    default_t1: ClassVar[float] = 24.0
    default_dt: ClassVar[float] = 1e-2

    def __check_init__(self):
        check_positive(self, ("m", "l"))

    def mass_matrix(self, t, q):
        c2 = jnp.cos(q[1])
        ml2 = self.m * self.l**2
        return (ml2 * jnp.stack([jnp.stack([3 + 2 * c2, 1 + c2]),
                                 jnp.stack([1 + c2, jnp.ones_like(c2)])])
                ).astype(q.dtype)

    def forces(self, t, q, v):
        """$-h$ of eq. 66."""
        q1, q2 = q
        w1, w2 = v
        s2, c1, c12 = jnp.sin(q2), jnp.cos(q1), jnp.cos(q1 + q2)
        ml2, mlg = self.m * self.l**2, self.m * self.l * self.g
        h = jnp.stack([
            -ml2 * s2 * (w2**2 + 2 * w1 * w2) + mlg * (c12 + 2 * c1),
            ml2 * s2 * w1**2 + mlg * c12,
        ])
        return (-h).astype(q.dtype)

    def holonomic(self, t, q):
        """The height of C, eqs. 64-65."""
        q1, q2 = q
        return jnp.stack([self.l * (jnp.sin(q1) + jnp.sin(q1 + q2))]).astype(q.dtype)

    def energy(self, t, q, v):
        q1, q2 = q
        potential = self.m * self.g * self.l * (2 * jnp.sin(q1) + jnp.sin(q1 + q2))
        return (0.5 * v @ self.mass_matrix(t, q) @ v + potential).astype(q.dtype)

    def initial_state(self, q1=jnp.pi / 4, w1=0.0):
        """A consistent start on the paper's branch $q_2 = 2\\pi - 2q_1$: crank
        angle `q1` (default $\\pi/4$) and crank rate `w1` (default 0, at rest)."""
        q1 = jnp.asarray(q1, dtype=float)
        w1 = jnp.asarray(w1, dtype=float)
        return (jnp.stack([q1, 2 * jnp.pi - 2 * q1]),
                jnp.stack([w1, -2 * w1]))

    def slider(self, q):
        """The slider position $x_C = l(\\cos q_1 + \\cos(q_1 + q_2))$."""
        return self.l * (jnp.cos(q[..., 0]) + jnp.cos(q[..., 0] + q[..., 1]))

    def observable(self, q):
        """The slider position (see the class docstring for why)."""
        return self.slider(q)[..., None]

    observable_names: ClassVar[tuple[str, ...]] = ("slider x_C [m]",)

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][]: points `[pivot, elbow, C]`
        (the two point masses at the link ends), links `(0, 1)` and `(1, 2)` of
        length `l`. On the constraint C is on $y = 0$."""
        q1, q12 = q[0], q[0] + q[1]
        z = jnp.zeros_like(q1)
        xa, ya = self.l * jnp.cos(q1), self.l * jnp.sin(q1)
        points = stack_points((z, z), (xa, ya),
                              (xa + self.l * jnp.cos(q12), ya + self.l * jnp.sin(q12)))
        return Sketch(points, ((0, 1), (1, 2)))

    def scenery(self) -> list[np.ndarray]:
        """The crank's pivot and the slider's track $y = 0$, $|x| \\le 2.2\\,l$."""
        reach = 2.2 * float(self.l)
        return [segment((-reach, 0.0), (reach, 0.0)), pivot(0.0, 0.0)]

    def reference(self, ts, q1=None, w1=None):
        """Exact solution at `ts` on the paper's branch, mapped to $(q, \\dot q)$.

        `q1`, `w1` default to `initial_state()`'s crank angle and rate."""
        q0, v0 = self.initial_state()
        q1 = q0[0] if q1 is None else q1
        w1 = v0[0] if w1 is None else w1
        y0 = jnp.stack([jnp.asarray(q1), jnp.asarray(w1)]).astype(jnp.float64)
        th, om = solve_minimal(_minimal_rhs, y0, ts, self.g / self.l).T
        q = jnp.stack([th, 2 * jnp.pi - 2 * th], axis=-1)
        v = jnp.stack([om, -2 * om], axis=-1)
        return Reference(jnp.asarray(ts), q, v)

