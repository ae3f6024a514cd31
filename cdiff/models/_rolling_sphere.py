"""R6: a sphere rolling on a sphere (Yun & Sarkar 1998, Sec. V-A)."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel, check_positive
from ._reference import Reference, solve_minimal


def _direction(lat, lon):
    """Unit vector at latitude `lat` (positive below the equator), longitude `lon`."""
    return jnp.stack(
        [jnp.cos(lat) * jnp.cos(lon), jnp.cos(lat) * jnp.sin(lon), -jnp.sin(lat)]
    )


class RollingSphere(AbstractModel):
    r"""A sphere (mass `m`, radius `r`, $I = \tfrac25 mr^2$) rolling without slipping
    on the outside of a fixed sphere of radius `R`, without gravity
    (Yun & Sarkar, Sec. V-A, eqs. 40-45 and Figs. 1-3; reference mechanism R6).

    **Coordinates** $q = [\rho, \lambda, \mu, \phi, \theta, \psi]$: the small
    sphere's centre $p = \rho\,u(\lambda, \mu)$,
    $u = [\cos\lambda\cos\mu, \cos\lambda\sin\mu, -\sin\lambda]$ (latitude
    $\lambda$ measured *below* the equator, as in the paper's $z = -\rho\sin\lambda$),
    in a fixed frame whose origin is the large sphere's initial centre, and the
    z-x-z body Euler angles, $R = R_z(\phi)R_x(\theta)R_z(\psi)$.

    **Dynamics** (the paper's kinetic energy of Sec. V-A, which reproduces):
    $T = \tfrac12 m(\dot\rho^2 + \rho^2\dot\lambda^2 + \rho^2\cos^2\lambda\,\dot\mu^2)
    + \tfrac12 I(\dot\phi^2 + \dot\theta^2 + \dot\psi^2 + 2\dot\phi\dot\psi\cos\theta)$,
    so $M = \mathrm{diag}(m, m\rho^2, m\rho^2\cos^2\lambda) \oplus
    I\,[[1, 0, \cos\theta], [0, 1, 0], [\cos\theta, 0, 1]]$ and the
    velocity-dependent forces $Q = -V$ of Lagrange's equations are written out by
    hand in `forces` (the paper does not print $V$); the tests check both against
    `jax.hessian`/`jax.jacfwd` of $T$ computed from the rotation matrix.

    **Constraints.** The large sphere's centre is $c(t) = 0$ for
    $t < t_\text{displace}$ and $c(t) =$ `displacement` after it (the paper's
    "contact broken by displacing the large sphere" at 5 s, a step in a
    time-dependent constraint). With $n = (p - c)/|p - c|$:

    - holonomic (eq. 41 with the moving centre): $|p - c(t)| - (R + r) = 0$;
    - nonholonomic (rolling): the point $p - rn$ of the small sphere nearest the
      large one has zero tangential velocity,
      $e_i\cdot(\dot p - r\,\omega\times n) = 0$ for the two tangent vectors
      $e_\mu = e_z\times n$, $e_\lambda = e_\mu\times n$; $\dot p$ comes from
      `jax.jvp` of $p(q)$, $\omega$ from the Euler rates. Written with the actual
      $n$, the rows stay meaningful out of contact, where the paper's unified
      formulation enforces them too (from the start).

    The rolling rows are *derived*, not taken from the paper's eqs. 44-45, which
    are garbled in the available text: as printed they do not contain the
    longitude $\mu$, but rolling is invariant under a rotation of everything about
    $e_z$ ($\mu\to\mu + a$, $\phi\to\phi + a$), so the rows must depend on
    $\phi - \mu$; and the second printed row has no $\dot\phi$ term. For the
    undisplaced sphere ($n = u$, $\delta = \phi - \mu$) the derived rows are
    $\rho\dot\lambda - r(\dot\theta\sin\delta - \dot\psi\sin\theta\cos\delta) = 0$
    and $\rho\cos\lambda\,\dot\mu - r[\sin\lambda(\dot\theta\cos\delta
    + \dot\psi\sin\theta\sin\delta) + \cos\lambda(\dot\phi + \dot\psi\cos\theta)]
    = 0$ (the model's residuals are $\cos\lambda$ times these); at $\mu = 0$ the
    first is the printed eq. 44 but for the sign of its $r$ term (perhaps another
    orientation convention).

    **Scenario** (the paper's values are lost; these are ours): start at
    $\lambda = 0.2$, $\mu = 0$, $(\phi, \theta, \psi) = (0, \pi/2, 0)$ with
    world angular velocity `omega0` = (1, -1, 6) rad/s and the rolling velocity
    of the centre that goes with it, a speed of 0.31 m/s; the gap
    $\rho - (R + r)$ at $t = 0$ is `gap` (default 0, in contact: the Fig. 3
    start; Fig. 2 starts out of contact, e.g. `gap=0.01`). Over 10 s the latitude
    stays within about $\pm 0.24$ rad and $\sin\theta$ above 0.9. At
    `t_displace` = 5 s the large sphere moves by `displacement`
    $\approx -0.0096\,n(5)$, away from the small sphere: a gap of about 1 cm.

    !!! warning

        The coordinates are singular at the poles $\cos\lambda = 0$ and the Euler
        angles at $\theta = 0, \pi$ (the mass matrix loses rank there; the
        formulation stops with an error). The scenario stays away from both.

    **Reference** (`reference(ts)`): the in-contact, *undisplaced* motion from
    `initial_state()` with the gap set to 0, i.e. valid for the simulation only
    before `t_displace` (or for `displacement = (0, 0, 0)`). It is the
    minimal-coordinate ODE of rolling derived from Newton-Euler, independent of
    `mass_matrix`, `forces` and the constraint rows: with $n$ on the unit sphere,
    $\dot n = (r/(R + r))\,\omega\times n$ and, eliminating the contact force
    from $m(R + r)\ddot n = F$, $I\dot\omega = -rn\times F$,
    $\dot\omega = -\frac{mr^2}{I + mr^2}\,n\times(\omega\times\dot n)$; state
    $(\lambda, \mu, \phi, \theta, \psi, \omega)$, solved with Dopri8 at
    rtol = atol = 1e-12. Its invariants (checked in the tests): the spin
    $n\cdot\omega$, the angular momentum about the contact point
    $I\omega + mr\,n\times\dot p$, and the energy; and a closed form:
    $w_0 = \omega - \tfrac57(n\cdot\omega)\,n$ is constant, and $n$ turns
    uniformly about $w_0$ at the rate $(r/(R + r))|w_0|$.
    """

    m: float | jax.Array = 1.0
    r: float | jax.Array = 0.05
    R: float | jax.Array = 0.55
    gap: float | jax.Array = 0.0
    t_displace: float | jax.Array = 5.0
    displacement: tuple = (0.008, -0.005, -0.002)
    omega0: tuple = (1.0, -1.0, 6.0)

    def __check_init__(self):
        for name in ("displacement", "omega0"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or len(value) != 3:
                raise ValueError(
                    f"RollingSphere: `{name}` must be a 3-vector (x, y, z) given as a "
                    f"tuple, got {value!r}"
                )
        check_positive(self, ("m", "r", "R"))
        if all(_is_number(x) for x in (self.R, self.r, self.gap)) and not (
            float(self.R) + float(self.r) + float(self.gap) > 0
        ):
            raise ValueError(
                "RollingSphere: the initial centre distance R + r + gap must be "
                f"positive, got gap={float(self.gap)}"
            )

    # The command line's run stops at the displacement, where the (undisplaced)
    # reference stops being valid; pass --t1 10 to see the displacement.
    default_t1: ClassVar[float] = 5.0
    default_dt: ClassVar[float] = 1e-2

    # Initial configuration (latitude, longitude, phi, theta, psi) of `initial_state`.
    _angles0: ClassVar[tuple[float, ...]] = (0.2, 0.0, 0.0, jnp.pi / 2, 0.0)

    # --- kinematics ---------------------------------------------------------------

    def inertia(self):
        """$I = \\tfrac25 mr^2$."""
        return 0.4 * self.m * self.r**2

    def centre(self, q):
        """The small sphere's centre $p = \\rho\\,u(\\lambda, \\mu)$."""
        return q[0] * _direction(q[1], q[2])

    def large_centre(self, t, dtype):
        """The large sphere's centre $c(t)$: a step just after `t_displace`."""
        d = jnp.stack([jnp.asarray(x, dtype) for x in self.displacement])
        t_d = jnp.asarray(self.t_displace, dtype)
        return jnp.where(jnp.asarray(t, dtype) > t_d, d, jnp.zeros_like(d))

    def angular_velocity(self, q, v):
        r"""World angular velocity of the z-x-z Euler angles,
        $\omega = \dot\phi e_z + \dot\theta R_z(\phi)e_x +
        \dot\psi R_z(\phi)R_x(\theta)e_z$ (the paper's body-frame $\omega$ of
        Sec. V-A rotated to the world; the tests check it against
        $[\omega]_\times = \dot RR^T$ by autodiff)."""
        phi, theta = q[3], q[4]
        dphi, dtheta, dpsi = v[3], v[4], v[5]
        sp, cp, st = jnp.sin(phi), jnp.cos(phi), jnp.sin(theta)
        return jnp.stack([dtheta * cp + dpsi * sp * st,
                          dtheta * sp - dpsi * cp * st,
                          dphi + dpsi * jnp.cos(theta)])

    def normal(self, t, q):
        """Unit vector $n$ from the large sphere's centre to the small one's."""
        d = self.centre(q) - self.large_centre(t, q.dtype)
        return d / jnp.linalg.norm(d)

    # --- the model ------------------------------------------------------------------

    def mass_matrix(self, t, q):
        rho, lat, theta = q[0], q[1], q[4]
        m, inertia = jnp.asarray(self.m, q.dtype), jnp.asarray(self.inertia(), q.dtype)
        z = jnp.zeros_like(rho)
        c = jnp.cos(theta)
        rows = [
            [m + z, z, z, z, z, z],
            [z, m * rho**2, z, z, z, z],
            [z, z, m * (rho * jnp.cos(lat)) ** 2, z, z, z],
            [z, z, z, inertia + z, z, inertia * c],
            [z, z, z, z, inertia + z, z],
            [z, z, z, inertia * c, z, inertia + z],
        ]
        return jnp.stack([jnp.stack(row) for row in rows])

    def forces(self, t, q, v):
        r"""$Q = -V(q, \dot q)$: centrifugal and Coriolis terms of Lagrange's
        equations for $T$ (derived by hand; the tests check them by autodiff)."""
        rho, lat, _, _, theta, _ = q
        drho, dlat, dlon, dphi, dtheta, dpsi = v
        m, inertia = jnp.asarray(self.m, q.dtype), jnp.asarray(self.inertia(), q.dtype)
        sl, cl, st = jnp.sin(lat), jnp.cos(lat), jnp.sin(theta)
        return jnp.stack([
            m * rho * (dlat**2 + cl**2 * dlon**2),
            -2 * m * rho * drho * dlat - m * rho**2 * sl * cl * dlon**2,
            -2 * m * rho * drho * cl**2 * dlon + 2 * m * rho**2 * sl * cl * dlat * dlon,
            inertia * dpsi * dtheta * st,
            -inertia * dphi * dpsi * st,
            inertia * dphi * dtheta * st,
        ])

    def holonomic(self, t, q):
        d = self.centre(q) - self.large_centre(t, q.dtype)
        R, r = jnp.asarray(self.R, q.dtype), jnp.asarray(self.r, q.dtype)
        return jnp.stack([jnp.linalg.norm(d) - (R + r)])

    def nonholonomic(self, t, q, v):
        r"""Tangential velocity of the small sphere's point nearest the large one,
        $e_\lambda\cdot w$ and $e_\mu\cdot w$ with $w = \dot p + \omega\times(-rn)$,
        $e_\mu = e_z\times n$, $e_\lambda = e_\mu\times n$ (both of length
        $\cos\lambda$ for the undisplaced sphere: unnormalised, which leaves the
        constraint unchanged and keeps the expression small to differentiate)."""
        n = self.normal(t, q)
        pdot = jax.jvp(self.centre, (q,), (v,))[1]
        r = jnp.asarray(self.r, q.dtype)
        w = pdot - r * jnp.cross(self.angular_velocity(q, v), n)
        e_lon = jnp.stack([-n[1], n[0], jnp.zeros_like(n[0])])  # e_z x n
        e_lat = jnp.cross(e_lon, n)
        return jnp.stack([e_lat @ w, e_lon @ w])

    def energy(self, t, q, v):
        """Kinetic energy $T$ (no gravity)."""
        return 0.5 * v @ self.mass_matrix(t, q) @ v

    # --- scenario -------------------------------------------------------------------

    def initial_state(self):
        """Rolling start at $\\rho = R + r +$ `gap` (see the class docstring): the
        Euler-angle rates give the world angular velocity `omega0`, and the centre
        moves with the rolling velocity $\\dot n = (r/(R + r))\\,\\omega\\times n$ of
        the in-contact state, so that for `gap = 0` the state satisfies every
        constraint, and for `gap > 0` it is the same motion lifted off the sphere."""
        dtype = jnp.result_type(float)
        lat, lon, phi, theta, psi = (jnp.asarray(a, dtype) for a in self._angles0)
        rho0 = jnp.asarray(self.R + self.r + self.gap, dtype)
        y0 = jnp.stack([lat, lon, phi, theta, psi,
                        *(jnp.asarray(w, dtype) for w in self.omega0)])
        rates = _minimal_rhs(0.0, y0, self._reference_args(dtype))[:5]
        q0 = jnp.stack([rho0, lat, lon, phi, theta, psi])
        return q0, jnp.concatenate([jnp.zeros((1,), dtype), rates])

    def observable(self, q):
        """Centre distance and position: $\\rho$, latitude, longitude."""
        return q[..., :3]

    observable_names: ClassVar[tuple[str, ...]] = (
        "rho [m]", "latitude [rad]", "longitude [rad]",
    )

    def _reference_args(self, dtype):
        k = self.m * self.r**2 / (self.inertia() + self.m * self.r**2)
        return jnp.stack([jnp.asarray(self.r / (self.R + self.r), dtype),
                          jnp.asarray(k, dtype)])

    def reference(self, ts):
        """The in-contact, undisplaced motion at `ts` (see the class docstring):
        the minimal ODE in $(\\lambda, \\mu, \\phi, \\theta, \\psi, \\omega)$ by
        Dopri8 at rtol = atol = 1e-12, mapped to $q$ and $\\dot q$."""
        lat, lon, phi, theta, psi = (jnp.asarray(a, jnp.float64) for a in self._angles0)
        y0 = jnp.stack([lat, lon, phi, theta, psi,
                        *(jnp.asarray(w, jnp.float64) for w in self.omega0)])
        args = self._reference_args(jnp.float64)
        ys = solve_minimal(_minimal_rhs, y0, ts, args)
        rates = jax.vmap(lambda y: _minimal_rhs(0.0, y, args)[:5])(ys)
        rho = jnp.full(ys.shape[:1] + (1,), self.R + self.r, jnp.float64)
        q = jnp.concatenate([rho, ys[:, :5]], axis=-1)
        v = jnp.concatenate([jnp.zeros_like(rho), rates], axis=-1)
        return Reference(jnp.asarray(ts), q, v)


def _is_number(x) -> bool:
    """A concrete real scalar (not a tracer inside jit/vmap/grad)."""
    if isinstance(x, jax.core.Tracer) or np.ndim(x) != 0:
        return False
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return True


def _minimal_rhs(t, y, args):
    r"""Rolling on a sphere in minimal form (module level: compiled once).

    `y = (lat, lon, phi, theta, psi, omega)`, `args = (r/(R + r), mr^2/(I + mr^2))`:
    $\dot n = \kappa\,\omega\times n$, $\dot\omega = -k\,n\times(\omega\times\dot n)$,
    the latitude and longitude rates from $\dot n = \dot\lambda\,e_\lambda +
    \cos\lambda\,\dot\mu\,e_\mu$, the Euler rates from inverting
    $\omega = \dot\phi e_z + \dot\theta R_z(\phi)e_x
    + \dot\psi R_z(\phi)R_x(\theta)e_z$.
    """
    lat, lon, phi, theta, psi = y[:5]
    omega = y[5:]
    kappa, k = args[0], args[1]
    n = _direction(lat, lon)
    e_lat = jnp.stack([-jnp.sin(lat) * jnp.cos(lon), -jnp.sin(lat) * jnp.sin(lon),
                       -jnp.cos(lat)])
    e_lon = jnp.stack([-jnp.sin(lon), jnp.cos(lon), jnp.zeros_like(lon)])
    ndot = kappa * jnp.cross(omega, n)
    domega = -k * jnp.cross(n, jnp.cross(omega, ndot))
    dlat = ndot @ e_lat
    dlon = (ndot @ e_lon) / jnp.cos(lat)
    wx, wy, wz = omega
    dtheta = wx * jnp.cos(phi) + wy * jnp.sin(phi)
    dpsi = (wx * jnp.sin(phi) - wy * jnp.cos(phi)) / jnp.sin(theta)
    dphi = wz - dpsi * jnp.cos(theta)
    return jnp.concatenate([jnp.stack([dlat, dlon, dphi, dtheta, dpsi]), domega])
