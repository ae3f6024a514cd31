"""R7: the snakeboard (Terze, Naudet & Lefeber 2003, Sec. 6)."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel, check_positive
from .._sketch import Sketch
from ._reference import Reference, solve_minimal


class Snakeboard(AbstractModel):
    r"""The snakeboard: a coupler with a rotor and two steerable wheel boards that
    cannot slip sideways (Terze, Naudet & Lefeber 2003, Sec. 6, eqs. 28-29,
    Figs. 3-7; reference mechanism R7).

    Coordinates $q = [x, y, \theta, \psi, \phi_b, \phi_f]$: the coupler's centre of
    mass, its heading, and the rotor, back and front wheel-board angles *relative
    to the coupler*. Kinetic energy
    $T = \tfrac12 m(\dot x^2 + \dot y^2) + \tfrac12 J\dot\theta^2
    + \tfrac12 J_r(\dot\theta + \dot\psi)^2
    + \tfrac12 J_w[(\dot\theta + \dot\phi_b)^2 + (\dot\theta + \dot\phi_f)^2]$,
    i.e. the constant mass matrix of eq. 28,

    $M = \begin{bmatrix} m & 0 & 0 & 0 & 0 & 0 \\ 0 & m & 0 & 0 & 0 & 0 \\
    0 & 0 & J + J_r + 2J_w & J_r & J_w & J_w \\ 0 & 0 & J_r & J_r & 0 & 0 \\
    0 & 0 & J_w & 0 & J_w & 0 \\ 0 & 0 & J_w & 0 & 0 & J_w \end{bmatrix}.$

    Two Pfaffian nonholonomic constraints (eq. 29): the wheel pairs, at distance
    $l$ behind and ahead of the centre of mass, do not slip sideways,

    $$-\sin(\phi_b + \theta)\dot x + \cos(\phi_b + \theta)\dot y
      - l\cos\phi_b\,\dot\theta = 0, \qquad
      -\sin(\phi_f + \theta)\dot x + \cos(\phi_f + \theta)\dot y
      + l\cos\phi_f\,\dot\theta = 0.$$

    Applied forces (Sec. 6 text): a force `force` (20 N) at the centre of mass
    along the coupler towards the front wheels, $(F\cos\theta, F\sin\theta)$;
    torsion springs `k_wheel` (0.1 Nm/rad) on the relative angles $\phi_b$,
    $\phi_f$ with rest angles `phi_b_rest`, `phi_f_rest` (the initial relative
    angles, as the paper says); a torsion spring `k_rotor` (1 Nm/rad) between
    coupler and rotor on $\psi$ with rest angle `psi_rest`. The multiplier
    equations are $M\ddot q = Q + B(q)^T\lambda$, $B\dot q = 0$, with
    $Q = [F\cos\theta, F\sin\theta, 0, -k_r(\psi - \psi_r),
    -k_w(\phi_b - \phi_{b,r}), -k_w(\phi_f - \phi_{f,r})]$.

    **What was corrected or chosen** (the printed equations are inconsistent):

    - eq. 29 prints $l\cos(\phi_b)\,\theta$ in the first constraint; the no-slip
      condition of the back wheels (velocity of the point
      $(x - l\cos\theta, y - l\sin\theta)$ normal to the wheel direction
      $\theta + \phi_b$) gives $\dot\theta$, as in the second row;
    - eq. 28 prints $\lambda_2\sin(\phi_f + \theta)$ in the $y$ equation; the
      equations here are derived from the constraint rows (the multiplier force is
      $B^T\lambda$), which gives $\lambda_2\cos(\phi_f + \theta)$ (with the printed
      sine the constraint force would do work on admissible motions). The
      paper's $\lambda$ is minus cdiff's multipliers (eq. 28 writes
      $M\ddot q + B^T\lambda = f$);
    - eq. 28 prints zero right-hand sides in the $\theta$, $\psi$, $\phi_b$,
      $\phi_f$ rows and $\ddot\phi_c$ for $\ddot\phi_f$ in the last one; the spring
      torques described in the text are added to the $\psi$, $\phi_b$, $\phi_f$
      rows (the springs act on relative angles, so not on $\theta$), and the
      force's components $f_x = F\cos\theta$, $f_y = F\sin\theta$ (printed
      "$f = (f_x - f_y)$") enter the $x$, $y$ rows;
    - the rotor spring's rest angle is not given: `psi_rest = 0`, so that the
      rotor, released at $\psi(0) = 0.2$ rad, oscillates and drives the board.

    The system is not conservative: the force along the coupler turns with it (it
    is not a gradient). `energy` is the kinetic energy plus the spring potentials;
    its rate is the force's power $F(\dot x\cos\theta + \dot y\sin\theta)$.

    **Reference** (`reference(ts)`): the paper's S1 is RK45 at tolerance 1e-13 on
    the multiplier form. Here: the index-1 multiplier (KKT) form written directly,
    independently of cdiff's formulations and kinematics: constraint rows
    $B(q) = \partial\Phi_v/\partial\dot q$, the term $\dot B\dot q$ by `jax.jvp`,
    $\begin{bmatrix} M & B^T \\ B & 0 \end{bmatrix}
    \begin{bmatrix}\ddot q \\ -\lambda\end{bmatrix}
    = \begin{bmatrix} Q \\ -\dot B\dot q\end{bmatrix}$ solved by
    `jnp.linalg.solve`, integrated by diffrax's Dopri8 at rtol = atol = 1e-12 in
    float64. No minimal-coordinate ODE is used (the constraints are not
    integrable). Over the paper's 2 s (speeds up to 5 m/s and 15 rad/s) it keeps
    the constraints to about 1e-10 (they are enforced at acceleration level only)
    and agrees with scipy's DOP853 at 1e-13 on eq. 28 written by hand to about
    1e-10 in $q$ and 1e-9 in $\dot q$ (tests/models/test_snakeboard.py).

    The constraint rows lose rank only where both wheel boards are perpendicular to
    the coupler ($\cos\phi_b = \cos\phi_f = 0$, $\phi_b \equiv \phi_f$ mod $\pi$),
    far from the paper's run.
    """

    m: float | jnp.ndarray = 6.0
    J: float | jnp.ndarray = 0.016
    Jw: float | jnp.ndarray = 0.0013
    Jr: float | jnp.ndarray = 0.072
    l: float | jnp.ndarray = 0.2
    force: float | jnp.ndarray = 20.0
    k_wheel: float | jnp.ndarray = 0.1
    k_rotor: float | jnp.ndarray = 1.0
    phi_b_rest: float | jnp.ndarray = 0.0
    phi_f_rest: float | jnp.ndarray = float(np.pi / 3)
    psi_rest: float | jnp.ndarray = 0.0
    # The paper's initial state (x = y = theta = 0, at rest).
    psi0: float | jnp.ndarray = 0.2
    phi_b0: float | jnp.ndarray = 0.0
    phi_f0: float | jnp.ndarray = float(np.pi / 3)

    # The paper's run (Sec. 6, S1-S4): used by the command line.
    #: Not conservative: `energy` changes by the work of the force (see `power`).
    conservative: ClassVar[bool] = False

    default_t1: ClassVar[float] = 2.0
    default_dt: ClassVar[float] = 1e-2

    def __check_init__(self):
        # The mass matrix must be positive definite.
        check_positive(self, ("m", "J", "Jw", "Jr"))

    def mass_matrix(self, t, q):
        m, J, Jw, Jr = (jnp.asarray(p, dtype=q.dtype) for p in
                        (self.m, self.J, self.Jw, self.Jr))
        z = jnp.zeros_like(m)
        return jnp.stack(
            [
                jnp.stack([m, z, z, z, z, z]),
                jnp.stack([z, m, z, z, z, z]),
                jnp.stack([z, z, J + Jr + 2 * Jw, Jr, Jw, Jw]),
                jnp.stack([z, z, Jr, Jr, z, z]),
                jnp.stack([z, z, Jw, z, Jw, z]),
                jnp.stack([z, z, Jw, z, z, Jw]),
            ]
        )

    def _spring_deflections(self, q):
        _, _, _, psi, phi_b, phi_f = q
        return (
            psi - jnp.asarray(self.psi_rest, q.dtype),
            phi_b - jnp.asarray(self.phi_b_rest, q.dtype),
            phi_f - jnp.asarray(self.phi_f_rest, q.dtype),
        )

    def forces(self, t, q, v):
        theta = q[2]
        F = jnp.asarray(self.force, q.dtype)
        kw = jnp.asarray(self.k_wheel, q.dtype)
        kr = jnp.asarray(self.k_rotor, q.dtype)
        d_psi, d_b, d_f = self._spring_deflections(q)
        z = jnp.zeros_like(theta)
        return jnp.stack(
            [F * jnp.cos(theta), F * jnp.sin(theta), z, -kr * d_psi, -kw * d_b,
             -kw * d_f]
        )

    def nonholonomic(self, t, q, v):
        _, _, theta, _, phi_b, phi_f = q
        xd, yd, thd = v[0], v[1], v[2]
        l = jnp.asarray(self.l, q.dtype)
        back = (-jnp.sin(phi_b + theta) * xd + jnp.cos(phi_b + theta) * yd
                - l * jnp.cos(phi_b) * thd)
        front = (-jnp.sin(phi_f + theta) * xd + jnp.cos(phi_f + theta) * yd
                 + l * jnp.cos(phi_f) * thd)
        return jnp.stack([back, front])

    def energy(self, t, q, v):
        """Kinetic energy plus the three spring potentials (J). Not conserved: its
        rate is the power `power(q, v)` of the force along the coupler."""
        d_psi, d_b, d_f = self._spring_deflections(q)
        kw = jnp.asarray(self.k_wheel, q.dtype)
        kr = jnp.asarray(self.k_rotor, q.dtype)
        kinetic = 0.5 * v @ self.mass_matrix(t, q) @ v
        return kinetic + 0.5 * kr * d_psi**2 + 0.5 * kw * (d_b**2 + d_f**2)

    def power(self, q, v):
        r"""Power of the force along the coupler, $F(\dot x\cos\theta +
        \dot y\sin\theta)$ (W): the rate of `energy` along any motion."""
        theta = q[..., 2]
        F = jnp.asarray(self.force, q.dtype)
        return F * (v[..., 0] * jnp.cos(theta) + v[..., 1] * jnp.sin(theta))

    def initial_state(self):
        """The paper's start: $x = y = \\theta = 0$, $\\psi = 0.2$ rad,
        $\\phi_b = 0$, $\\phi_f = \\pi/3$, at rest."""
        psi0, phi_b0, phi_f0 = (jnp.asarray(p, dtype=float) for p in
                                (self.psi0, self.phi_b0, self.phi_f0))
        z = jnp.zeros_like(psi0)
        q0 = jnp.stack([z, z, z, psi0, phi_b0, phi_f0])
        return q0, jnp.zeros_like(q0)

    def observable(self, q):
        """The coupler's position and heading $(x, y, \\theta)$."""
        return q[..., :3]

    observable_names: ClassVar[tuple[str, ...]] = ("x [m]", "y [m]", "theta [rad]")

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][], seen from above: points
        `[back axle, centre of mass, front axle]` (the coupler, links `(0, 1)` and
        `(1, 2)` of length `l`), then the ends of the back and the front wheel
        axles, `(3, 4)` and `(5, 6)`, each of length `l` across its wheels'
        rolling direction $\\theta + \\phi_{b,f}$, and of a bar on the rotor,
        `(7, 8)` of length `0.8 l` at angle $\\theta + \\psi$. No scenery (the
        ground is flat)."""
        x, y, theta, psi, phi_b, phi_f = q
        l = self.l
        heading = jnp.stack([jnp.cos(theta), jnp.sin(theta)])
        centre = jnp.stack([x, y])
        back, front = centre - l * heading, centre + l * heading

        def across(at, angle, half):
            d = half * jnp.stack([-jnp.sin(angle), jnp.cos(angle)])
            return at - d, at + d

        rotor = across(centre, theta + psi - jnp.pi / 2, 0.4 * l)
        points = jnp.stack([back, centre, front,
                            *across(back, theta + phi_b, 0.5 * l),
                            *across(front, theta + phi_f, 0.5 * l), *rotor])
        return Sketch(points, ((0, 1), (1, 2), (3, 4), (5, 6), (7, 8)))

    def reference(self, ts, q0=None, v0=None):
        """Tight-tolerance solution at `ts` of the index-1 multiplier form (see the
        class docstring), from `initial_state()` unless `q0`, `v0` are given
        (`v0` should satisfy the constraints: the index-1 form keeps, not
        restores, them). Always float64."""
        iq0, iv0 = self.initial_state()
        q0 = iq0 if q0 is None else q0
        v0 = iv0 if v0 is None else v0
        y0 = jnp.concatenate([jnp.asarray(q0), jnp.asarray(v0)]).astype(jnp.float64)
        if y0.shape != (12,):
            raise ValueError(
                f"Snakeboard.reference: q0 and v0 must have shape (6,), got "
                f"{jnp.shape(q0)} and {jnp.shape(v0)}"
            )
        ys = solve_minimal(_kkt_rhs, y0, ts, args=self)
        return Reference(jnp.asarray(ts), ys[:, :6], ys[:, 6:])


def _kkt_rhs(t, y, model: Snakeboard):
    """The index-1 multiplier form, written directly (module level, so the compiled
    reference solve is reused for every parameter value)."""
    q, v = y[:6], y[6:]
    zero = jnp.zeros_like(v)

    def rows(q):  # B(q): the constraints are Pfaffian, B(q) v = Phi_v(q, v)
        return jax.jacfwd(model.nonholonomic, argnums=2)(t, q, zero)

    B = rows(q)
    Bdot_v = jax.jvp(lambda q: rows(q) @ v, (q,), (v,))[1]  # (dB/dt) v
    M = model.mass_matrix(t, q)
    k = B.shape[0]
    kkt = jnp.block([[M, B.T], [B, jnp.zeros((k, k), y.dtype)]])
    rhs = jnp.concatenate([model.forces(t, q, v), -Bdot_v])
    qdd = jnp.linalg.solve(kkt, rhs)[:6]
    return jnp.concatenate([v, qdd])
