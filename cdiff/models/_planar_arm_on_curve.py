"""R8: a planar 2-DOF arm with its end effector on a curve (Costa-Castelló 1998,
Secs. 4.2 and 5.2)."""

from __future__ import annotations

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._model import AbstractModel, check_positive
from .._sketch import Sketch, circle, pivot, segment, stack_points
from ._reference import Reference, solve_minimal

#: The curves of Sec. 5.2 as coefficients $(c_2, c_x, c_y, c_0)$ of
#: $\phi(x, y) = c_2(x^2 + y^2) + c_xx + c_yy + c_0$.
CURVES: dict[str, tuple[float, float, float, float]] = {
    "line_x1": (0.0, 1.0, 0.0, -1.0),  # x = 1
    "line_x0": (0.0, 1.0, 0.0, 0.0),  # x = 0
    "circle": (1.0, 0.0, 0.0, -1.0),  # x^2 + y^2 = 1
}

# The joint angle held fixed by `initial_state` on each curve (the other one is
# solved from the constraint; see `PlanarArmOnCurve._default_hold`).
_THETA1 = {"line_x1": 1.0, "line_x0": np.pi / 2 - 0.5, "circle": 0.3}


# ---------------------------------------------------------------------------
# Exact reference: one degree of freedom, minimal-coordinate ODEs.
# ---------------------------------------------------------------------------


def _kinetic_potential(q, qdot, params):
    r"""$(T, V)$ of the two links from their centres of mass and angular
    velocities (independent of `mass_matrix` and `forces`)."""
    l1, lc1, lc2, m1, m2, i1, i2, g = params

    def centres(q):
        e1 = jnp.stack([jnp.cos(q[0]), jnp.sin(q[0])])
        e12 = jnp.stack([jnp.cos(q[0] + q[1]), jnp.sin(q[0] + q[1])])
        return jnp.stack([lc1 * e1, l1 * e1 + lc2 * e12])

    r, dr = jax.jvp(centres, (q,), (qdot,))
    w1, w2 = qdot[0], qdot[0] + qdot[1]
    kinetic = 0.5 * (m1 * dr[0] @ dr[0] + i1 * w1**2 + m2 * dr[1] @ dr[1] + i2 * w2**2)
    return kinetic, g * (m1 * r[0, 1] + m2 * r[1, 1])


def _euler_lagrange(chart, s, sdot, params):
    r"""$\ddot s$ of the one-DOF Lagrangian $L = \tfrac12m(s)\dot s^2 - V(s)$ of
    the chart $q = q(s)$: $m\ddot s = -\tfrac12m'(s)\dot s^2 - V'(s)$, with
    $m(s) = 2T(q(s), q'(s))$."""

    def mass_potential(s):
        q, dq = jax.jvp(chart, (s,), (jnp.ones_like(s),))
        kinetic, potential = _kinetic_potential(q, dq, params)
        return jnp.stack([2 * kinetic, potential])

    (mass, _), (dmass, dpotential) = jax.jvp(mass_potential, (s,), (jnp.ones_like(s),))
    return -(0.5 * dmass * sdot**2 + dpotential) / mass


def _linear_chart(s, chart_args):
    r"""The chart $q = (s, \theta_2^0 + k(s - \theta_1^0))$ about `s`, as a function
    of $\epsilon$ = angle $- s$."""
    theta0, k = chart_args

    def chart(eps):
        return jnp.stack([s + eps, theta0[1] + k * (s + eps - theta0[0])])

    return chart


def _chart_rhs(local, y, args):
    chart_args, params = args
    s, sdot = y
    acc = _euler_lagrange(local(s, chart_args), jnp.zeros_like(s), sdot, params)
    return jnp.stack([sdot, acc])


def _linear_rhs(t, y, args):
    return _chart_rhs(_linear_chart, y, args)


def _polar_residual(rho, s, curve_args):
    r"""$\phi(\mathrm{kin}(q))$ at $\theta_1 = \rho\cos s$, $\theta_1 + \theta_2 =
    \rho\sin s$."""
    coefficients, l1, l2 = curve_args
    a, b = rho * jnp.cos(s), rho * jnp.sin(s)
    x = l1 * jnp.cos(a) + l2 * jnp.cos(b)
    y = l1 * jnp.sin(a) + l2 * jnp.sin(b)
    c2, cx, cy, c0 = coefficients
    return c2 * (x**2 + y**2) + cx * x + cy * y + c0


def _polar_bisect(s, curve_args):
    r"""The root $\rho \in (0, \rho_{max}]$ of `_polar_residual` on the ray of
    angle `s` in the $(\theta_1, \theta_1 + \theta_2)$ plane, $\rho_{max} =
    \pi/\max(|\cos s|, |\sin s|)$ (the edge of the box $|\theta_1|, |\theta_1 +
    \theta_2| \le \pi$), by bisection to the last bit (not differentiated)."""
    s = jax.lax.stop_gradient(s)
    hi = jnp.pi / jnp.maximum(jnp.abs(jnp.cos(s)), jnp.abs(jnp.sin(s)))
    lo = jnp.zeros_like(hi)
    sign0 = jnp.sign(_polar_residual(lo, s, curve_args))

    def bisect(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        same = jnp.sign(_polar_residual(mid, s, curve_args)) == sign0
        return jnp.where(same, mid, lo), jnp.where(same, hi, mid)

    lo, hi = jax.lax.fori_loop(0, 64, bisect, (lo, hi))
    return jax.lax.stop_gradient(0.5 * (lo + hi))


def _polar_chart(s, chart_args):
    r"""The chart about the angle `s`, as a function of $\epsilon$:
    $(\theta_1, \theta_1 + \theta_2) = \rho(s + \epsilon)(\cos(s + \epsilon),
    \sin(s + \epsilon))$ plus a constant offset (multiples of $2\pi$, from the
    start), with $\rho$ replaced by its second-order Taylor polynomial: exact in
    value, first and second derivative at $\epsilon = 0$ (all the Lagrangian
    needs). $\rho(s)$ is bisected; $\rho'$, $\rho''$ follow from the implicit
    function theorem on $F(\rho, s) = \phi(\mathrm{kin}(q)) = 0$."""
    curve_args, offset = chart_args
    rho = _polar_bisect(s, curve_args)

    def residual(x):
        return _polar_residual(x[0], x[1], curve_args)

    x = jnp.stack([rho, s])
    grad, hess = jax.grad(residual)(x), jax.hessian(residual)(x)
    d1 = -grad[1] / grad[0]
    d2 = -(hess[1, 1] + 2 * hess[0, 1] * d1 + hess[0, 0] * d1**2) / grad[0]

    def chart(eps):
        r = rho + d1 * eps + 0.5 * d2 * eps**2
        a, b = r * jnp.cos(s + eps), r * jnp.sin(s + eps)
        return jnp.stack([a, b - a]) + offset

    return chart


def _polar_rhs(t, y, args):
    return _chart_rhs(_polar_chart, y, args)


@functools.partial(jax.jit, static_argnums=0)
def _states(local, s, sdot, chart_args):
    r"""$(q, \dot q) = (q(s), q'(s)\dot s)$ along a solution of the chart `local`."""
    return jax.vmap(
        lambda s, sdot: jax.jvp(local(s, chart_args), (jnp.zeros_like(s),), (sdot,))
    )(s, sdot)


def _wrap(x):
    """Angle(s) in $(-\\pi, \\pi]$."""
    return x - 2 * jnp.pi * jnp.ceil((x - jnp.pi) / (2 * jnp.pi))


# ---------------------------------------------------------------------------
# The model.
# ---------------------------------------------------------------------------


class PlanarArmOnCurve(AbstractModel):
    r"""Planar two-link arm (two revolute joints, base at the origin) whose end
    effector is constrained to a curve $\phi(x, y) = 0$ (Costa-Castelló, Griñó & Basañez,
    Secs. 4.2 and 5.2, eqs. 36-46, Table 1, Figs. 3-5).

    Coordinates $q = [\theta_1, \theta_2]$: the absolute angle of link 1 from the
    $x$ axis and the angle of link 2 relative to link 1. Gravity $g$ acts along
    $-y$. The equations of motion are eq. 38,
    $M(\theta)\ddot\theta + c(\theta, \dot\theta) + G(\theta) = \tau -
    J^T(\theta)f$, with the standard two-link manipulator terms (Craig; Spong):

    - $M_{11} = I_1 + I_2 + m_1l_{c1}^2 + m_2(l_1^2 + l_{c2}^2 + 2l_1l_{c2}
      \cos\theta_2)$, $M_{12} = M_{21} = I_2 + m_2(l_{c2}^2 + l_1l_{c2}\cos\theta_2)$,
      $M_{22} = I_2 + m_2l_{c2}^2$ ($I_i$ about each link's centre of mass, at
      $l_{ci}$ from its joint);
    - $c = [-h(2\dot\theta_1\dot\theta_2 + \dot\theta_2^2),\ h\dot\theta_1^2]$,
      $h = m_2l_1l_{c2}\sin\theta_2$;
    - $G = [(m_1l_{c1} + m_2l_1)g\cos\theta_1 + m_2l_{c2}g\cos(\theta_1 + \theta_2),\
      m_2l_{c2}g\cos(\theta_1 + \theta_2)]$.

    `forces` returns $-c - G + \tau_{hold}(t)$.

    **The experiment of Sec. 5.2.** Torques hold the arm in its initial position
    until $t = 0.5$ s, then the arm moves freely: $\tau_{hold}(t) = G(q_{hold})$ for
    $t <$ `t_release` and 0 afterwards. Started at rest at $q_0 = q_{hold}$ (on the
    curve), the constraint force vanishes and the arm stays exactly at rest until
    `t_release`.

    *Time-stepping across the release.* The force jumps at `t_release`. A
    fixed-step Runge-Kutta step that straddles (or ends exactly at) the jump sees
    the wrong torque in one of its stages and makes an $O(dt)$ error: with RK4 on
    the grid $0, dt, \dots$ the last stage of the step ending at `t_release`
    already sees the released arm, so $\dot\theta(t_{release}) = (dt/6)\ddot
    \theta_{free}$ instead of 0 (1.5e-3 rad/s at $dt = 10^{-3}$), and a run from
    $t = 0$ then differs from `reference` by about 3e-3 rad (what `cdiff run`
    reports). For accurate runs simulate the free motion from `t0 = t_release`
    (before it the arm is at rest at $q_{hold}$), or use an adaptive controller
    with `diffrax.ClipStepSizeController(..., jump_ts=[t_release])`.

    **Constraint** (eq. 39): one holonomic residual $\phi(\mathrm{kin}(\theta))$ with
    the end effector $\mathrm{kin}(\theta) = (l_1\cos\theta_1 + l_2\cos(\theta_1 +
    \theta_2),\ l_1\sin\theta_1 + l_2\sin(\theta_1 + \theta_2))$ (eq. 37) and
    $\phi(x, y) = c_2(x^2 + y^2) + c_xx + c_yy + c_0$, `coefficients` $= (c_2, c_x,
    c_y, c_0)$. The curves of Sec. 5.2 share this parametrisation, so a batch of them
    is a `jax.vmap` over `coefficients` (and `hold`):

    - `"line_x1"`: $x = 1$, $(0, 1, 0, -1)$;
    - `"line_x0"`: $x = 0$, $(0, 1, 0, 0)$;
    - `"circle"`: $x^2 + y^2 = 1$, $(1, 0, 0, -1)$.

    cdiff's constraint force is $A^T\lambda$ with $A = \phi_xJ$, i.e.
    $J^T\phi_x^T\lambda$: eq. 40's force $-J^T\phi_x^Tf/\|\phi_x\|$ with the multiplier
    scaled, $\lambda = -f/\|\phi_x\|$ (the same force; $\|\phi_x\| = 1$ on the lines
    and 2 on the unit circle).

    **Singular configurations** (Proposition 1, eqs. 44-46, Table 1). The reduction
    index matrix $\varphi = \phi_xJM^{-1}J^T\phi_x^T$ (a scalar) vanishes iff
    $J^T\phi_x^T = 0$.

    - Lines $x = \text{const}$ ($\phi_x = (1, 0)$): $J^T\phi_x^T = -[l_1\sin\theta_1 +
      l_2\sin(\theta_1 + \theta_2),\ l_2\sin(\theta_1 + \theta_2)]$ vanishes iff
      $\sin\theta_1 = \sin(\theta_1 + \theta_2) = 0$: $(0, 0), (\pi, 0), (0, \pi),
      (\pi, \pi)$, at $x = 2, -2, 0, 0$. None lies on $x = 1$; on $x = 0$ the folded
      $(0, \pi)$ and $(\pi, \pi)$ do (the end effector at the base), "the
      simulation cannot go on near these points" (Sec. 5.2, with DASSL). With RK4
      at a fixed step, `UdwadiaKalaba`, `Lagrange`, `NullSpace` and `Projection`
      are not stopped there (no stage lands exactly on one; `UdwadiaKalaba`'s
      pseudoinverse drops the vanishing row): from the default start they pass
      both and go on along the smooth continuation that
      `reference` follows. On $x = 1$ the arm passes the stretched configurations
      at $p = (1, \pm\sqrt3)$, which are regular.
    - Circle $|p| = 1$ ($\phi_x = 2p^T$): $J^Tp = [0,\ -l_1l_2\sin\theta_2]$ vanishes
      iff $\sin\theta_2 = 0$, i.e. $|p| \in \{|l_1 - l_2|, l_1 + l_2\} = \{0, 2\}$
      (and $\phi_x = 0$ only at $p = 0$): off the circle, so no singularity.

    `singular_configurations()` lists those on the curve.

    **Initial states** (`initial_state()`, at rest at $q_{hold}$; the paper's values
    are lost, these are chosen here, each a generic regular configuration): link 1
    at a chosen angle, link 2 solved from the constraint:

    - `"line_x1"`: $\theta_1 = 1$, $\theta_1 + \theta_2 = -\arccos((1 - l_1\cos
      \theta_1)/l_2)$ ("elbow down"): $q_0 = (1, -2.0931)$, $p = (1, -0.0466)$.
    - `"line_x0"`: $\theta_1 = \pi/2 - 0.5$, $\theta_1 + \theta_2 = \arccos(-l_1
      \cos\theta_1/l_2)$ $= \pi - \theta_1$: $q_0 = (1.0708, 1)$, the end effector
      above the base at $p = (0, 1.7552)$. Released, the arm folds under gravity
      and the end effector slides down the $y$ axis into the base, reaching the
      singular configuration $(0, \pi)$ at $t = 1.0905$ s (0.5905 s after the
      release, with $\dot q = (-3.446, 6.892)$), and, swinging on, $(\pi, \pi)$
      (as $\theta_1 = -\pi$) at $t = 1.6633$ s (from `reference`).
    - `"circle"`: $\theta_1 = 0.3$, $\theta_2 = -\arccos((1 - l_1^2 - l_2^2)/(2l_1l_2))
      = -2\pi/3$.

    **Exact reference** (`reference(ts)`, derived here): on every curve the
    constrained arm has one degree of freedom. With a chart $q = q(s)$ of the
    constraint manifold, the Lagrangian $L(s, \dot s) = T - V$ (built from the
    links' centres of mass, independently of `mass_matrix` and `forces`) gives
    $m(s)\ddot s = -\tfrac12m'(s)\dot s^2 - V'(s)$, solved from `t_release`
    with `solve_minimal` (Dopri8, rtol = atol = 1e-13); before `t_release` the arm
    is at rest at $q_{hold}$.

    - `"circle"`: $|p|$ fixed fixes $\theta_2 = \theta_2^0$, and the arm is a rigid
      compound pendulum about the base: $q = (s, \theta_2^0)$,
      $M_{11}(\theta_2^0)\ddot\theta_1 = -G_1(\theta_1, \theta_2^0)$.
    - `"line_x0"` (for $l_1 = l_2$): the configurations on $x = 0$ are the folded
      family $\theta_2 = \pi$ and the symmetric family $\theta_1 + (\theta_1 +
      \theta_2) = \pi$ (the end effector on the $y$ axis at $2l_1\sin\theta_1$),
      which cross at the singular configurations. From the default start the arm
      moves on the symmetric family, $q = (s, \theta_2^0 - 2(s - \theta_1^0))$. At
      the singular configuration the DAE does not determine the motion; the
      reference continues on the same family, which is only one of the possible
      continuations.
    - `"line_x1"`: the configurations on $x = 1$ form one closed regular curve
      about $\theta_1 = \theta_1 + \theta_2 = 0$, star-shaped in the plane of
      $(\theta_1, \theta_1 + \theta_2)$ (for $|l_1 - l_2| < 1 < l_1 + l_2$); the
      chart is the polar angle $s$ in that plane, the radius solved by bisection
      and differentiated implicitly.

    **Parameters** (Sec. 5.2): links of $l_1 = l_2 = 1$ m, $m_1 = m_2 = 5$ kg,
    $I_1 = I_2 = 1$ kg m² (about the centres of mass, taken at mid-link,
    $l_{c1} = l_{c2} = 0.5$ m), $g = 9.81$, release at 0.5 s.

    **Observable:** the joint angles $\theta_1, \theta_2$ (Figs. 3-5 (d), (e)).

    **Energy:** $\tfrac12\dot\theta^TM\dot\theta + g(m_1y_{c1} + m_2y_{c2})$, the
    mechanical energy. It is conserved for $t \ge$ `t_release`; before it the
    holding torque would do work if the arm moved, but it does not (it is at rest).
    """

    curve: str = eqx.field(static=True)
    coefficients: jnp.ndarray
    hold: jnp.ndarray
    l1: float | jnp.ndarray
    l2: float | jnp.ndarray
    lc1: float | jnp.ndarray
    lc2: float | jnp.ndarray
    m1: float | jnp.ndarray
    m2: float | jnp.ndarray
    I1: float | jnp.ndarray
    I2: float | jnp.ndarray
    g: float | jnp.ndarray
    t_release: float | jnp.ndarray

    default_t1: ClassVar[float] = 3.0
    default_dt: ClassVar[float] = 1e-3

    def __init__(
        self,
        curve: str = "line_x1",
        *,
        coefficients=None,
        hold=None,
        l1=1.0,
        l2=1.0,
        lc1=0.5,
        lc2=0.5,
        m1=5.0,
        m2=5.0,
        I1=1.0,
        I2=1.0,
        g=9.81,
        t_release=0.5,
    ):
        """**Arguments:** `curve`, one of `"line_x1"` (default), `"line_x0"`,
        `"circle"`; `coefficients` (default: the curve's) and `hold` (default: the
        curve's start, see the class docstring) override them; the other keywords
        are the physical parameters."""
        if curve not in CURVES:
            raise ValueError(
                f"PlanarArmOnCurve: unknown curve {curve!r}; choose one of "
                + ", ".join(repr(c) for c in CURVES)
            )
        self.curve = curve
        self.l1, self.l2, self.lc1, self.lc2 = l1, l2, lc1, lc2
        self.m1, self.m2, self.I1, self.I2 = m1, m2, I1, I2
        self.g, self.t_release = g, t_release
        self.coefficients = jnp.asarray(
            CURVES[curve] if coefficients is None else coefficients, dtype=float)
        self.hold = (
            self._default_hold(curve, l1, l2) if hold is None
            else jnp.asarray(hold, dtype=float)
        )

    def __check_init__(self):
        check_positive(self, ("l1", "l2", "lc1", "lc2", "m1", "m2", "I1", "I2"))
        if jnp.shape(self.coefficients) != (4,):
            raise ValueError(
                "PlanarArmOnCurve: `coefficients` must have shape (4,) (c2, cx, cy, "
                f"c0), got {jnp.shape(self.coefficients)}"
            )
        if jnp.shape(self.hold) != (2,):
            raise ValueError(
                "PlanarArmOnCurve: `hold` must have shape (2,) (theta1, theta2), got "
                f"{jnp.shape(self.hold)}"
            )

    @staticmethod
    def _default_hold(curve, l1, l2):
        """The start on `curve` (class docstring): theta1 chosen, theta2 solved."""
        th1 = jnp.asarray(_THETA1[curve], dtype=float)
        if curve == "circle":
            th2 = -jnp.arccos((1.0 - l1**2 - l2**2) / (2 * l1 * l2))
        else:
            x = 1.0 if curve == "line_x1" else 0.0
            beta = jnp.arccos((x - l1 * jnp.cos(th1)) / l2)
            th2 = (-beta if curve == "line_x1" else beta) - th1
        return jnp.stack([th1, jnp.asarray(th2, dtype=float)])

    # -- kinematics ---------------------------------------------------------

    def end_effector(self, q):
        """$\\mathrm{kin}(\\theta)$ (eq. 37), on `q[..., :2]`, shape `(..., 2)`."""
        th1, th12 = q[..., 0], q[..., 0] + q[..., 1]
        return jnp.stack([self.l1 * jnp.cos(th1) + self.l2 * jnp.cos(th12),
                          self.l1 * jnp.sin(th1) + self.l2 * jnp.sin(th12)], axis=-1)

    def curve_residual(self, p):
        r"""$\phi(p)$ at end-effector positions `p[..., :2]`."""
        c2, cx, cy, c0 = jnp.moveaxis(self.coefficients.astype(p.dtype), -1, 0)
        x, y = p[..., 0], p[..., 1]
        return c2 * (x**2 + y**2) + cx * x + cy * y + c0

    # -- dynamics -----------------------------------------------------------

    def mass_matrix(self, t, q):
        c2 = jnp.cos(q[1])
        m12 = self.I2 + self.m2 * (self.lc2**2 + self.l1 * self.lc2 * c2)
        m11 = (self.I1 + self.I2 + self.m1 * self.lc1**2
               + self.m2 * (self.l1**2 + self.lc2**2 + 2 * self.l1 * self.lc2 * c2))
        m22 = (self.I2 + self.m2 * self.lc2**2) * jnp.ones_like(c2)
        return jnp.stack([jnp.stack([m11, m12]), jnp.stack([m12, m22])]).astype(q.dtype)

    def gravity_torques(self, q):
        """$G(\\theta)$, the joint torques of gravity, shape `(2,)`."""
        c12 = self.m2 * self.lc2 * self.g * jnp.cos(q[0] + q[1])
        c1 = (self.m1 * self.lc1 + self.m2 * self.l1) * self.g * jnp.cos(q[0])
        return jnp.stack([c1 + c12, c12]).astype(q.dtype)

    def holding_torques(self, t, q):
        """$\\tau_{hold}(t) = G(q_{hold})$ before `t_release`, zero after."""
        held = self.gravity_torques(self.hold.astype(q.dtype))
        return jnp.where(t < self.t_release, held, jnp.zeros_like(held))

    def forces(self, t, q, v):
        """$-c(\\theta, \\dot\\theta) - G(\\theta) + \\tau_{hold}(t)$."""
        h = self.m2 * self.l1 * self.lc2 * jnp.sin(q[1])
        coriolis = jnp.stack([-h * (2 * v[0] * v[1] + v[1] ** 2), h * v[0] ** 2])
        return (-coriolis.astype(q.dtype) - self.gravity_torques(q)
                + self.holding_torques(t, q))

    def holonomic(self, t, q):
        r"""Eq. 39: $[\phi(\mathrm{kin}(\theta))]$, shape `(1,)`."""
        return self.curve_residual(self.end_effector(q))[None].astype(q.dtype)

    def energy(self, t, q, v):
        th1, th12 = q[0], q[0] + q[1]
        y1 = self.lc1 * jnp.sin(th1)
        y2 = self.l1 * jnp.sin(th1) + self.lc2 * jnp.sin(th12)
        potential = self.g * (self.m1 * y1 + self.m2 * y2)
        return (0.5 * v @ self.mass_matrix(t, q) @ v + potential).astype(q.dtype)

    # -- experiment ---------------------------------------------------------

    def initial_state(self):
        """At rest at `hold` (on the curve for the default `hold`)."""
        q0 = jnp.asarray(self.hold, dtype=float)
        return q0, jnp.zeros_like(q0)

    def singular_configurations(self, atol=1e-9):
        r"""The singular configurations on the curve (Proposition 1, Table 1), as
        rows $(\theta_1, \theta_2)$ with angles in $(-\pi, \pi]$, shape `(k, 2)`;
        concrete values only.

        - Lines ($c_2 = 0$, normal $n = (c_x, c_y)$ at angle $\psi$):
          $J^Tn = [n\cdot(l_1e_1^\perp + l_2e_{12}^\perp),\ l_2n\cdot e_{12}^\perp]$
          vanishes iff both links lie along the normal, $\theta_1, \theta_1 +
          \theta_2 \in \{\psi, \psi + \pi\}$ (Table 1: $\theta_1 =
          \arctan(a/b)$, $\theta_2 \in \{0, \pi\}$); the four candidates are kept
          where $|\phi| <$ `atol`.
        - Circles about the base ($c_x = c_y = 0$, $\phi_x = 2c_2p^T$): $J^Tp =
          [0, -l_1l_2\sin\theta_2]$ vanishes iff $\sin\theta_2 = 0$ (stretched or
          folded, $|p| = l_1 + l_2$ or $|l_1 - l_2|$, any $\theta_1$): on the curve
          only for those radii, and then returned at $\theta_1 = 0$.
        """
        c2, cx, cy, _ = (float(c) for c in np.asarray(self.coefficients))
        if c2 == 0.0:
            psi = np.arctan2(cy, cx)
            first = (psi, psi + np.pi)
            candidates = np.array([[a, b - a] for a in first for b in first])
        elif cx == 0.0 and cy == 0.0:
            candidates = np.array([[0.0, 0.0], [0.0, np.pi]])
        else:
            raise NotImplementedError(
                "singular_configurations: lines and circles about the base only "
                "(cdiff.analysis.singular_configurations searches numerically)"
            )
        candidates = np.asarray(_wrap(jnp.asarray(candidates)))
        phi = np.asarray(self.curve_residual(self.end_effector(jnp.asarray(candidates))))
        return candidates[np.abs(phi) < atol]

    def observable(self, q):
        """The joint angles $\\theta_1, \\theta_2$ (Figs. 3-5 (d), (e))."""
        return q[..., :2]

    observable_names: ClassVar[tuple[str, ...]] = ("theta1 [rad]", "theta2 [rad]")

    def sketch(self, q) -> Sketch:
        """The drawing of `q` for [`cdiff.animate`][]: points `[base, elbow, end
        effector]`, links `(0, 1)` of length `l1` and `(1, 2)` of length `l2`. On
        the constraint the end effector is on the curve."""
        th1, th12 = q[0], q[0] + q[1]
        z = jnp.zeros_like(th1)
        xe, ye = self.l1 * jnp.cos(th1), self.l1 * jnp.sin(th1)
        points = stack_points((z, z), (xe, ye), (xe + self.l2 * jnp.cos(th12),
                                                 ye + self.l2 * jnp.sin(th12)))
        return Sketch(points, ((0, 1), (1, 2)))

    def scenery(self) -> list[np.ndarray]:
        r"""The base pivot and the curve $\phi(x, y) = 0$ of `coefficients`: a
        circle, or the part of a line within 1.1 times the arm's reach
        $l_1 + l_2$ (nothing for an empty curve)."""
        c2, cx, cy, c0 = (float(c) for c in np.asarray(self.coefficients))
        reach = float(self.l1) + float(self.l2)
        curve = []
        if c2 != 0.0:
            centre = (-cx / (2 * c2), -cy / (2 * c2))
            radius2 = (cx**2 + cy**2) / (4 * c2**2) - c0 / c2
            if radius2 > 0.0:
                curve = [circle(centre, np.sqrt(radius2))]
        elif cx != 0.0 or cy != 0.0:
            norm = np.hypot(cx, cy)
            foot = np.array([cx, cy]) * (-c0 / norm**2)  # the point nearest the base
            along = np.array([-cy, cx]) / norm
            distance = abs(c0) / norm
            chord = np.sqrt(max(reach**2 - distance**2, 0.0))  # the reachable part
            half = 1.1 * (chord if distance < reach else reach)
            curve = [segment(foot - half * along, foot + half * along)]
        return [*curve, pivot(0.0, 0.0)]

    def reference(self, ts):
        """Exact solution at `ts` from `initial_state()` (class docstring): at rest
        before `t_release`, then the minimal-coordinate ODE of the curve's chart."""
        ts = jnp.asarray(ts, dtype=jnp.float64)
        hold = jnp.asarray(self.hold, dtype=jnp.float64)
        params = (self.l1, self.lc1, self.lc2, self.m1, self.m2, self.I1, self.I2,
                  self.g)
        coefficients = np.asarray(self.coefficients, dtype=float)
        off = float(jnp.abs(self.curve_residual(self.end_effector(hold))))
        if not off < 1e-9:
            raise ValueError(
                f"reference: the start `hold` = {np.asarray(hold)} is off the curve "
                f"(|phi| = {off:.3g}); the reference starts on it"
            )
        if self.curve == "circle":
            if np.any(coefficients[1:3] != 0.0):
                raise NotImplementedError(
                    "reference: circles centred at the base only")
            local, rhs = _linear_chart, _linear_rhs
            chart_args, s0 = (hold, jnp.asarray(0.0)), hold[0]
        elif self.curve == "line_x0":
            symmetric = _wrap(2 * hold[0] + hold[1] - jnp.pi)
            if not (float(jnp.abs(jnp.asarray(self.l1) - self.l2)) == 0.0
                    and float(jnp.abs(symmetric)) < 1e-9):
                raise NotImplementedError(
                    "reference: on x = 0 only for l1 == l2 and a start on the "
                    "symmetric family 2 theta1 + theta2 = pi; compare with a "
                    "tight-tolerance simulation instead"
                )
            local, rhs = _linear_chart, _linear_rhs
            chart_args, s0 = (hold, jnp.asarray(-2.0)), hold[0]
        else:
            curve_args = (jnp.asarray(coefficients), self.l1, self.l2)
            s0 = jnp.arctan2(_wrap(hold[0] + hold[1]), _wrap(hold[0]))
            q_s0, _ = _states(_polar_chart, s0[None], jnp.zeros(1),
                              (curve_args, jnp.zeros(2)))
            offset = hold - q_s0[0]
            local, rhs = _polar_chart, _polar_rhs
            chart_args = (curve_args, offset)
        t0 = float(self.t_release)
        before = (ts < t0)[:, None]
        if bool(jnp.all(before)):
            return Reference(ts, jnp.broadcast_to(hold, (ts.size, 2)),
                             jnp.zeros((ts.size, 2)))
        y0 = jnp.stack([s0, jnp.zeros_like(s0)])
        s, sdot = solve_minimal(rhs, y0, jnp.maximum(ts, t0), (chart_args, params),
                                rtol=1e-13, atol=1e-13, t0=t0).T
        chart_args = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), chart_args)
        q, v = _states(local, s, sdot, chart_args)
        q = jnp.where(before, hold, q)
        v = jnp.where(before, 0.0, v)
        return Reference(ts, q, v)
