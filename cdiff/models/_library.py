"""The mechanisms shipped as MJCF files (`cdiff/models/mjcf/`), each with an
independent reference: a minimal-coordinate ODE solved tightly, published reference
values, or the conservation laws the benchmark checks."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ._double_four_bar import DoubleFourBar
from ._reference import Reference, _require_x64, solve_minimal
from ._slider_crank import SliderCrank

MJCF_DIR = Path(__file__).parent / "mjcf"
"""The folder of the shipped MJCF files (`cdiff/models/mjcf/`)."""

_G = 9.81


def _crank_rhs(t, y, c):
    r"""$\ddot\theta = -c\cos\theta$ for $y = (\theta, \dot\theta)$ (module level, so
    that compiled solves are reused)."""
    th, om = y
    return jnp.stack([om, -c * jnp.cos(th)])


def _solve_crank(c, theta0, omega0, ts):
    y0 = jnp.array([theta0, omega0], dtype=jnp.float64)
    y = solve_minimal(_crank_rhs, y0, ts, args=c)
    return y[:, 0], y[:, 1]


# --------------------------------------------------------------------------- R2


def slider_crank_reference(ts) -> Reference:
    r"""R2, `slider_crank.xml`: Braun & Goldfarb's exact reference (eq. 24) in the
    file's coordinates.

    A reduction of the paper's model, not published data: on the branch
    $\theta_2 = -\theta_1$ the crank obeys eq. 24 (solved by
    [`cdiff.models.SliderCrank`][]'s `minimal_ode()` to `rtol = atol = 1e-12`), and
    `qpos` $= [\theta_1,\ 2l\cos\theta_1,\ -\theta_1]$ (crank, slider, rod).

    **Arguments:**

    - `ts`: the times, from 0 (the keyframe "paper": 45 degrees, at rest).

    **Returns:** a `cdiff.models.Reference` of `qpos` and `qvel`, shape `(T, 3)`.
    """
    crank = SliderCrank()
    ode = crank.minimal_ode()
    y = solve_minimal(ode.rhs, ode.y0.astype(jnp.float64), ts,
                      args=jnp.asarray(ode.args, jnp.float64))
    th, om = y[:, 0], y[:, 1]
    l = crank.l
    q = jnp.stack([th, 2 * l * jnp.cos(th), -th], axis=-1)
    v = jnp.stack([om, -2 * l * jnp.sin(th) * om, -om], axis=-1)
    return Reference(jnp.asarray(ts), q, v)


# --------------------------------------------------------------------------- R4


def double_four_bar_reference(ts) -> Reference:
    r"""R4, `double_four_bar.xml`: Braun & Goldfarb's exact reference (Fig. 6
    caption) in the file's coordinates.

    A reduction, not published data: the linkage stays a parallelogram, every crank
    at $\theta$ with $\ddot\theta = -\tfrac{7g}{6l}\cos\theta$ (solved by
    [`cdiff.models.DoubleFourBar`][]'s `minimal_ode()` to `rtol = atol = 1e-12`),
    every coupler horizontal: `qpos` $= [\theta, -\theta, \theta, -\theta, \theta]$
    (cranks' absolute angles, couplers' angles relative to their cranks).

    **Arguments:**

    - `ts`: the times, from 0 (the keyframe "paper": $\theta = \pi/2$,
      $\dot\theta = -1$ rad/s).

    **Returns:** a `cdiff.models.Reference` of `qpos` and `qvel`, shape `(T, 5)`.
    """
    ode = DoubleFourBar().minimal_ode()
    y = solve_minimal(ode.rhs, ode.y0.astype(jnp.float64), ts,
                      args=jnp.asarray(ode.args, jnp.float64))
    th, om = y[:, :1], y[:, 1:]
    sign = jnp.array([1.0, -1.0, 1.0, -1.0, 1.0])
    return Reference(jnp.asarray(ts), th * sign, om * sign)


# --------------------------------------------------------------------------- A01

# The lumped mass's own rotational inertia in simple_pendulum.xml (MuJoCo needs a
# positive one); the reduction below includes it.
_A01_INERTIA = 1e-12


def simple_pendulum_reference(ts) -> Reference:
    r"""IFToMM A01, `simple_pendulum.xml`: the pendulum's angle from its minimal ODE.

    A reduction, not the benchmark's published data (A01_solution_data.txt is not in
    the stored sources): $(ml^2 + I)\ddot\theta = -mgl\cos\theta$ with
    $m = 1$ kg, $l = 1$ m, $g = 9.81$ m/s$^2$ and the file's $I = 10^{-12}$ kg m$^2$,
    from $\theta = 0$ at rest; point P1 is at $l(\cos\theta, \sin\theta)$.

    **Arguments:**

    - `ts`: the times, from 0.

    **Returns:** a `cdiff.models.Reference` of `qpos` and `qvel`, shape `(T, 1)`.
    """
    c = _G / (1.0 + _A01_INERTIA)
    th, om = _solve_crank(c, 0.0, 0.0, ts)
    return Reference(jnp.asarray(ts), th[:, None], om[:, None])


# --------------------------------------------------------------------------- A02

A02_N = 40


def n_four_bar_ode_coefficient(n: int) -> float:
    r"""$c$ in the N four-bar mechanism's parallelogram motion
    $\ddot\theta = -c\,\tfrac{g}{l}\cos\theta$: $c = \frac{3(3N+1)}{2(4N+1)}$.

    Derivation (every crank at angle $\theta$, every coupler translating at
    $l\dot\theta$): the $N+1$ cranks, each $ml^2/3$ about its pivot, and the $N$
    couplers give $T = \tfrac12 ml^2\dot\theta^2\,(\tfrac{N+1}{3} + N)$, and
    $V = mgl\sin\theta\,(\tfrac{N+1}{2} + N)$; Lagrange's equation gives $c$.
    $N = 2$ is Braun & Goldfarb's R4 ($c = 7/6$).
    """
    return 3 * (3 * n + 1) / (2 * (4 * n + 1))


def n_four_bar_reference(ts, n: int = A02_N) -> Reference:
    r"""IFToMM A02, `n_four_bar.xml` (N = 40): the exact parallelogram motion.

    A reduction derived here, not the benchmark's published data
    (A02_solution_data.txt is not in the stored sources): all cranks turn together,
    $\ddot\theta = -c\,(g/l)\cos\theta$ with $c$ from
    `n_four_bar_ode_coefficient` (363/322 for N = 40), from
    $\theta = \pi/2$, $\dot\theta = -1$ rad/s (B0 moving at 1 m/s along +x), solved
    to `rtol = atol = 1e-12`. Point B0 is at $l(\cos\theta, \sin\theta)$ with
    velocity $l\dot\theta(-\sin\theta, \cos\theta)$; `qpos` is $\theta$ for every
    crank and $-\theta$ for every coupler (relative to its crank).

    **Arguments:**

    - `ts`: the times, from 0.
    - `n`: the number of four-bar windows (the file has 40).

    **Returns:** a `cdiff.models.Reference` of `qpos` and `qvel`, shape
    `(T, 2n + 1)`.
    """
    th, om = _solve_crank(_G * n_four_bar_ode_coefficient(n), np.pi / 2, -1.0, ts)
    sign = jnp.asarray(np.r_[np.tile([1.0, -1.0], n), 1.0])
    return Reference(jnp.asarray(ts), th[:, None] * sign, om[:, None] * sign)


def n_four_bar_b0(reference: Reference):
    """Position and velocity of point B0 (x, y) from an A02 reference, shape
    `(T, 4)`: the benchmark's output, `[x, y, xdot, ydot]`."""
    th, om = reference.q[:, 0], reference.v[:, 0]
    c, s = jnp.cos(th), jnp.sin(th)
    return jnp.stack([c, s, -s * om, c * om], axis=-1)


# --------------------------------------------------------------------------- A03

#: Andrews' squeezer at t = 0.03 s, Hairer & Wanner's order
#: [beta, Theta, gamma, Phi, delta, Omega, epsilon] and their rates: the IVP test set's
#: reference solution (Mazzia & Magherini, "Test Set for IVP Solvers", problem
#: "andrews", subroutine `andsoln`: PSIDE at rtol = atol = 1e-14).
A03_T = 0.03
A03_REFERENCE_Q = (
    0.1581077119629904e2, -0.1575637105984298e2, 0.4082224013073101e-1,
    -0.5347301163226948, 0.5244099658805304, 0.5347301163226948,
    0.1048080741042263e1,
)
A03_REFERENCE_V = (
    0.1139920302151208e4, -0.1424379294994111e4, 0.1103291221937134e2,
    0.1929337464421385e2, 0.5735699284790808, -0.1929337464421385e2,
    0.3231791658026955,
)
# qpos of andrews_squeezer.xml is [beta, Theta, gamma, delta, Phi, epsilon, Omega].
_A03_ORDER = np.array([0, 1, 2, 4, 3, 6, 5])


def andrews_squeezer_reference(ts=(A03_T,)) -> Reference:
    r"""IFToMM A03, `andrews_squeezer.xml`: the published state at $t = 0.03$ s.

    Published data, not a reduction: the IVP test set's reference solution of
    Andrews' squeezing mechanism (Hairer & Wanner, "Solving ODEs II", Sec. VII.7;
    Mazzia & Magherini's Test Set for IVP Solvers, problem "andrews", computed with
    PSIDE at `rtol = atol = 1e-14`), reordered to the file's `qpos`. The
    mechanism has no independent reduction (one degree of freedom through six loop
    constraints), and the published values exist only at 0.03 s.

    **Arguments:**

    - `ts`: must be `(0.03,)`.

    **Returns:** a `cdiff.models.Reference` of `qpos` and `qvel`, shape `(1, 7)`.

    **Raises:** `ValueError` for any other `ts`.
    """
    ts = np.asarray(ts, dtype=float).reshape(-1)
    if ts.shape != (1,) or ts[0] != A03_T:
        raise ValueError(
            f"andrews_squeezer_reference: published values exist only at t = {A03_T} "
            f"s; got ts = {ts}"
        )
    q = np.asarray(A03_REFERENCE_Q)[_A03_ORDER]
    v = np.asarray(A03_REFERENCE_V)[_A03_ORDER]
    return Reference(jnp.asarray(ts), jnp.asarray(q)[None], jnp.asarray(v)[None])


# --------------------------------------------------------------------------- A05

# The stiff flyball governor, flyball_governor.xml, in SI units: the benchmark's
# prismatic bodies of density 3000 kg/m^3 (shaft and rods 1 x 0.01 x 0.01 m, 0.3 kg;
# slider a 0.1 m cube, 3 kg), 5 kg point masses, spring-dampers K, C, rest length.
A05_K, A05_C, A05_REST = 8e5, 4e4, 0.5
_A05_M_SHAFT, _A05_M_SLIDER, _A05_M_ROD, _A05_M_BALL = 0.3, 3.0, 0.3, 5.0
_A05_I_SHAFT = _A05_M_SHAFT * (0.01**2 + 0.01**2) / 12  # about its axis
_A05_I_AXIAL = _A05_M_ROD * (0.01**2 + 0.01**2) / 12  # a rod about its axis
_A05_I_TRANSVERSE = _A05_M_ROD * (1.0 + 0.01**2) / 12  # a rod across it
_A05_I_SLIDER = _A05_M_SLIDER * (0.1**2 + 0.1**2) / 12
_A05_I_BALL = 1e-12  # the point masses' own inertia in the file (MuJoCo needs one)
_A05_HINGE = 0.05  # hinges and spring anchors at +-0.05 m from the axis
#: The benchmark's start, `qpos` and `qvel` of the file's keyframe: s = 0.5 m,
#: alpha = 30 degrees, the shaft at 2 pi rad/s.
A05_Q0 = (0.0, 0.5, np.pi / 6, np.pi / 6)
A05_V0 = (2 * np.pi, 0.0, 0.0, 0.0)


def _a05_terms(q, v):
    """The diagonal of the mass matrix and the forces of the reduction (see
    `flyball_governor_equations`), as tuples of floats."""
    _, s, *alphas = (float(x) for x in q)
    phid, sd, *alphads = (float(x) for x in v)
    m_phi = _A05_I_SHAFT + _A05_I_SLIDER  # the shaft and the slider about the axis
    f_phi = 0.0
    f_s = -_A05_M_SLIDER * _G
    f_alpha = []
    for a, ad in zip(alphas, alphads):
        c, sn = math.cos(a), math.sin(a)
        r_rod, r_ball = _A05_HINGE + 0.5 * c, _A05_HINGE + c  # distances to the axis
        m_phi += (_A05_I_AXIAL * sn**2 + _A05_I_TRANSVERSE * c**2
                  + _A05_M_ROD * r_rod**2 + _A05_M_BALL * r_ball**2 + _A05_I_BALL)
        dm_phi = (2 * (_A05_I_AXIAL - _A05_I_TRANSVERSE) * sn * c
                  - _A05_M_ROD * r_rod * sn - 2 * _A05_M_BALL * r_ball * sn)
        # The spring from the slider's anchor (radius 0.05, height s) to the rod's
        # midpoint (radius 0.05 + cos(alpha)/2, height 1 - sin(alpha)/2).
        dx, dz = 0.5 * c, 1.0 - s - 0.5 * sn
        length = math.hypot(dx, dz)
        dl_ds = -dz / length
        dl_da = -0.5 * (dx * sn + dz * c) / length
        tension = A05_K * (length - A05_REST) + A05_C * (dl_ds * sd + dl_da * ad)
        f_phi -= dm_phi * ad * phid
        f_s -= tension * dl_ds
        f_alpha.append(0.5 * dm_phi * phid**2
                       + _G * c * (0.5 * _A05_M_ROD + _A05_M_BALL) - tension * dl_da)
    m_alpha = _A05_I_TRANSVERSE + 0.25 * _A05_M_ROD + _A05_M_BALL + _A05_I_BALL
    return (m_phi, _A05_M_SLIDER, m_alpha, m_alpha), (f_phi, f_s, *f_alpha)


def flyball_governor_equations(q, v):
    r"""IFToMM A05's equations of motion $M(q)\ddot q = f(q, \dot q)$ in the
    coordinates of `flyball_governor.xml`, derived by hand (NumPy, not MJX).

    With $q = (\varphi, s, \alpha_1, \alpha_2)$ (shaft angle, slider height, rods'
    angles below the horizontal), hinges at radius $h = 0.05$ m and height 1 m,
    rods of mass $m_r$ (inertias $I_a$ about their axis, $I_t$ across it) with the
    balls $m_b$ (own inertia $I_b$) at their ends:

    $$T = \tfrac12 M_\varphi(\alpha)\dot\varphi^2 + \tfrac12 m_s\dot s^2
    + \tfrac12 M_\alpha(\dot\alpha_1^2 + \dot\alpha_2^2),$$
    $M_\varphi = I_\text{shaft} + I_\text{slider} + \sum_i [I_a\sin^2\alpha_i
    + I_t\cos^2\alpha_i + m_r(h + \tfrac12\cos\alpha_i)^2 + m_b(h + \cos\alpha_i)^2
    + I_b]$, $M_\alpha = I_t + m_r/4 + m_b + I_b$ (no cross terms: each rod's angular
    velocity is $\dot\varphi e_z \pm \dot\alpha_i e_t$ along principal axes);
    $V = g[m_\text{shaft}/2 + m_s s + \sum_i (m_r(1 - \tfrac12\sin\alpha_i)
    + m_b(1 - \sin\alpha_i))] + \sum_i \tfrac12 K(L_i - L_0)^2$ with the spring
    length $L_i = \sqrt{(\tfrac12\cos\alpha_i)^2 + (1 - s - \tfrac12\sin\alpha_i)^2}$
    (from the slider's anchor, radius $h$ and height $s$, to the rod's midpoint).
    Lagrange's equations give $f = -\partial V/\partial q
    - C\sum_i\dot L_i\,\partial L_i/\partial q$ (the dampers) plus the velocity
    terms $-\sum_i M_{\varphi,i}'\dot\alpha_i\dot\varphi$ in the $\varphi$ row and
    $\tfrac12 M_{\varphi,i}'\dot\varphi^2$ in the $\alpha_i$ row, where
    $M_{\varphi,i}'$ is the derivative of rod $i$'s term of $M_\varphi$.

    **Arguments:**

    - `q`, `v`: `qpos` and `qvel`, shape `(4,)`.

    **Returns:** `(M, f)`: NumPy arrays of shapes `(4, 4)` (diagonal) and `(4,)`;
    `f` is MuJoCo's `qfrc_passive - qfrc_bias`.
    """
    m, f = _a05_terms(q, v)
    return np.diag(m), np.asarray(f)


def flyball_governor_energy(q, v) -> float:
    """IFToMM A05's kinetic plus potential energy (gravity, springs) of the
    reduction, as MuJoCo's `mj_energyPos + mj_energyVel` for the file (J).
    Dissipated by the dampers."""
    m, _ = _a05_terms(q, np.zeros(4))
    _, s, *alphas = (float(x) for x in q)
    energy = 0.5 * sum(mi * float(vi) ** 2 for mi, vi in zip(m, v))
    energy += _G * (0.5 * _A05_M_SHAFT + _A05_M_SLIDER * s)
    for a in alphas:
        sn = math.sin(a)
        energy += _G * (_A05_M_ROD * (1 - 0.5 * sn) + _A05_M_BALL * (1 - sn))
        length = math.hypot(0.5 * math.cos(a), 1.0 - s - 0.5 * sn)
        energy += 0.5 * A05_K * (length - A05_REST) ** 2
    return energy


def _a05_rhs(t, y):
    m, f = _a05_terms(y[:4], y[4:])
    return np.concatenate([y[4:], np.divide(f, m)])


def _a05_jacobian(t, y):
    """Central differences of `_a05_rhs`: the Newton matrix of the Radau solve
    (its accuracy does not enter the solution's)."""
    jac = np.empty((8, 8))
    for k in range(8):
        h = 1e-7 * max(1.0, abs(y[k]))
        e = np.zeros(8)
        e[k] = h
        jac[:, k] = (_a05_rhs(t, y + e) - _a05_rhs(t, y - e)) / (2 * h)
    return jac


@functools.lru_cache(maxsize=8)
def _a05_solve(ts: tuple[float, ...]):
    from scipy.integrate import solve_ivp

    sol = solve_ivp(_a05_rhs, (0.0, ts[-1]), np.r_[A05_Q0, A05_V0], method="Radau",
                    t_eval=ts, rtol=1e-12, atol=1e-12, jac=_a05_jacobian)
    if not sol.success:
        raise RuntimeError(f"flyball_governor_reference: Radau failed: {sol.message}")
    return sol.y.T


def flyball_governor_reference(ts) -> Reference:
    r"""IFToMM A05, `flyball_governor.xml`: the motion from the benchmark's start.

    A reduction derived here, not the benchmark's published data (its solution data
    and accuracy bar are not in the stored sources): the Lagrangian in the file's
    tree coordinates (`flyball_governor_equations`), integrated with SciPy's
    `solve_ivp(method="Radau", rtol=1e-12, atol=1e-12)` (the system is stiff:
    eigenvalues down to $-8.1\cdot10^3$ s$^{-1}$) from $s = 0.5$ m,
    $\alpha_1 = \alpha_2 = 30°$, $\dot\varphi = 2\pi$ rad/s. Its slider height $s$,
    the benchmark's output, matches the benchmark's reference curve as plotted by
    the MBSbenchmarksInOpenSim project (0.1 s samples over 3 s) within the
    2e-3 m to which that plot can be read. Needs SciPy; solves are cached.

    **Arguments:**

    - `ts`: the times, from 0, nondecreasing.

    **Returns:** a `cdiff.models.Reference` of `qpos` and `qvel`, shape `(T, 4)`.

    **Raises:** `ValueError` for times that are not finite, negative or decreasing.
    """
    _require_x64("flyball_governor_reference")
    ts = np.asarray(ts, dtype=float).reshape(-1)
    if ts.size == 0 or not np.all(np.isfinite(ts)) or np.any(ts < 0) or np.any(
            np.diff(ts) < 0):
        raise ValueError(
            "flyball_governor_reference: ts must be a non-empty, finite, nondecreasing "
            f"sequence of times >= 0; got {ts}"
        )
    if ts[-1] == 0.0:
        y = np.tile(np.r_[A05_Q0, A05_V0], (ts.size, 1))
    else:
        y = _a05_solve(tuple(ts.tolist()))
    return Reference(jnp.asarray(ts), jnp.asarray(y[:, :4]), jnp.asarray(y[:, 4:]))


# --------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class MJCFMechanism:
    """One shipped MJCF mechanism with its source, suggested run and reference.

    **Attributes:**

    - `name`: registry key.
    - `file`: the MJCF file in `MJCF_DIR`; `path` is its full path.
    - `source`: the paper or benchmark it comes from.
    - `t1`, `dt`: the suggested horizon (the benchmark's where it gives one) and a
      fixed step for the default RK4.
    - `reference`: `reference(ts) -> cdiff.models.Reference` in the file's `qpos` and
      `qvel`, or `None` where only conservation laws are checked.
    - `reference_kind`: `"reduction"` (a minimal-coordinate ODE derived from the
      model, solved at `rtol = atol = 1e-12`), `"published"` (published numbers) or
      `"conservation"` (energy and the constraint manifold).
    - `accuracy`: the published accuracy bar, in words.
    - `pinv_rtol`: the relative singular-value threshold of the formulations'
      pseudoinverse (`rtol` of `cdiff.UdwadiaKalaba`) the mechanism needs, where
      the default does not do: for Bricard's mechanism, whose six weld rows are
      dependent only on the constraint manifold. At a Runge-Kutta stage, off the
      manifold by $O(dt^2)$, their sixth singular value is no longer zero; below the
      threshold it is treated as the redundancy it is, above it as a constraint,
      whose force then has a tangential part. `None`: the default.
    """

    name: str
    file: str
    source: str
    t1: float
    dt: float
    reference: Callable[..., Reference] | None
    reference_kind: str
    accuracy: str
    pinv_rtol: float | None = None

    @property
    def path(self) -> Path:
        """The MJCF file's full path."""
        return MJCF_DIR / self.file


_IFTOMM = (
    "IFToMM library of computational benchmark problems (Gonzalez, Dopico, Lugris & "
    "Cuadrado, Multibody Syst. Dyn. 16:179-190, 2006)"
)

MJCF_LIBRARY: dict[str, MJCFMechanism] = {
    m.name: m
    for m in (
        MJCFMechanism(
            "slider-crank-mjcf", "slider_crank.xml",
            "Braun & Goldfarb 2012, Sec. 4.1 (R2)", 10.0, 1e-2,
            slider_crank_reference, "reduction",
            "none published; the paper compares with the exact eq. 24 (Figs. 3-4)",
        ),
        MJCFMechanism(
            "double-four-bar-mjcf", "double_four_bar.xml",
            "Braun & Goldfarb 2012, Sec. 4.2 (R4)", 10.0, 1e-2,
            double_four_bar_reference, "reduction",
            "none published; the paper compares with the exact solution (Figs. 6-7)",
        ),
        MJCFMechanism(
            "iftomm-a01-simple-pendulum", "simple_pendulum.xml",
            _IFTOMM + ", A01", 10.0, 1e-3,
            simple_pendulum_reference, "reduction",
            "position of P1 within 1e-3 (high precision; 1e-1 low) at 4000 outputs "
            "over the benchmark's 2000 s",
        ),
        MJCFMechanism(
            "iftomm-a02-n-four-bar", "n_four_bar.xml",
            _IFTOMM + ", A02 (N = 40)", 20.0, 1e-2,
            n_four_bar_reference, "reduction",
            "position and velocity of B0 within 1e-3 (high precision; 1e-1 low) at "
            "400 outputs over 20 s",
        ),
        MJCFMechanism(
            "iftomm-a03-andrews-squeezer", "andrews_squeezer.xml",
            _IFTOMM + ", A03; Hairer & Wanner, Solving ODEs II, Sec. VII.7",
            A03_T, 1e-5,
            andrews_squeezer_reference, "published",
            "IVP test set: the seven angles at t = 0.03 s, given to about 13 digits "
            "(the IFToMM bar is not in the stored sources)",
        ),
        MJCFMechanism(
            "iftomm-a04-bricard", "bricard.xml",
            _IFTOMM + ", A04", 10.0, 1e-3,
            None, "conservation",
            "stay on the constraint manifold and conserve energy over 10 s (the "
            "benchmark's P3 data are not in the stored sources)",
            pinv_rtol=1e-5,
        ),
        MJCFMechanism(
            "iftomm-a05-flyball-governor", "flyball_governor.xml",
            _IFTOMM + ", A05", 10.0, 2.5e-4,
            flyball_governor_reference, "reduction",
            "not in the stored sources (nor the solution data); the benchmark's output "
            "is the slider height s, whose reference curve (as plotted by the "
            "MBSbenchmarksInOpenSim project, 0.1 s samples over 3 s) the reduction "
            "matches to the 2e-3 m the plot can be read to. Stiff: RK4 needs dt below "
            "3.4e-4 s",
        ),
    )
}
"""The shipped mechanisms, by name: [`cdiff.models.MJCFMechanism`][] entries whose
file [`cdiff.models.mjcf_path`][] gives, run by `cdiff run NAME` and measured by
[`cdiff.studies.acceptance`][]."""


def mjcf_path(name: str) -> Path:
    """The path of a shipped MJCF file by its registry name (see
    `MJCF_LIBRARY`).

    **Raises:** `KeyError` listing the names.
    """
    try:
        return MJCF_LIBRARY[name].path
    except KeyError:
        raise KeyError(
            f"no shipped MJCF mechanism {name!r}; choose one of {sorted(MJCF_LIBRARY)}"
        ) from None
