"""The Udwadia-Kalaba equation with Braun-Goldfarb constraint and energy correction."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import PseudoInverse, default_rtol, matvec
from .base import (
    AbstractFormulation,
    Context,
    Dynamics,
    check_gains,
    constrained_acceleration,
    first_stage_freeze,
    free_motion,
)


class _Deltas(eqx.Module):
    delta_q: jnp.ndarray  # Phi_q / dt               (eq. 4)
    delta_v: jnp.ndarray  # [dPhi_q; Phi_v] / dt     (eq. 5)
    delta_e: jnp.ndarray  # Phi_e / dt               (eq. 19)
    damping_e: jnp.ndarray  # threshold (J) of the energy row's pseudoinverse


class UdwadiaKalaba(AbstractFormulation):
    r"""Braun & Goldfarb's pseudoinverse equation of motion (Udwadia-Kalaba type).

    $$\dot q = v + R^{-1}C_q^+(b_q - A_q v - \Delta_q) \qquad (16)$$

    $$\dot v = a + R^{-1}C_v^+(b_v - A_v a - \Delta_v)
             + R^{-1}N_v R^{-T}Q_0 \qquad (17)$$

    $$Q_0 = R^T[C_e N_v]^+(b_{ev} - A_{ev}a - \Delta_{ev}) \qquad (20)$$

    with $M = R^TR$ (Cholesky), $C_* = A_* R^{-1}$, $N_v = I - C_v^+C_v$,
    $a = M^{-1}(Q + Eu)$, $A_v = [A_q; \partial\Phi_v/\partial v]$ (eqs. 4-5),
    and the energy law $\Phi_e = E - E_0$ treated as a nonideal constraint
    (eqs. 18-20; $(\cdot)_{ev} = (\cdot)_e - C_eC_v^+(\cdot)_v$). The
    pseudoinverses make it valid for redundant constraints and through kinematic
    singularities.

    **Where the $\Delta = \Phi/dt$ terms get their $dt$.** $\Delta_q = \Phi_q/dt$,
    $\Delta_v = (\dot\Phi_q, \Phi_v)/dt$ and $\Delta_e = \Phi_e/dt$ are evaluated
    once at the start $(t_n, q_n, v_n)$ of every step, with $dt = t_{n+1} - t_n$
    the step being taken, and passed unchanged to every Runge-Kutta stage (cdiff's
    solver wrapper does this; see [`cdiff.simulate`][]). The stage weights then sum
    the correction to $-\Phi_n$ over the step: this is the discretisation in which
    the paper's "$1/dt$ terms cancel". Re-evaluating $\Phi/dt$ at every stage
    instead turns it into a stiff Baumgarte term of gain $1/dt$, which holds the
    constraints far less accurately. With a
    fixed-step solver $dt$ is the step size (`simulate`'s `dt`, or the
    uniform step $T/\lceil T/dt\rceil$ that diffrax takes). With an adaptive
    step-size controller $dt$ is the step currently attempted, so each accepted
    step removes the error present at its start; rejected steps are recomputed from
    the same start with the new $dt$. The correction does not depend on the
    solver's error estimate, so it works with any explicit diffrax solver.

    **Energy row threshold.** The row $C_eN_v$ vanishes at rest and at turning
    points, where no tangential force can change the energy. Its pseudoinverse is
    damped by $|\Phi_e| + \text{rtol}\,|E|$ + `energy_damping` (J; $\Phi_e$ and
    $E$ taken at the step start): the correction then never changes the speed by
    more than the speed scale $\sqrt{|\Phi_e|}$ of the error itself, it is off
    while the tangential kinetic energy is below the energy's round-off level, and
    it fades out smoothly near rest instead of exploding (in value and in
    gradient).

    **Arguments:**

    - `constraint_correction`: use the $\Delta$ terms and the velocity correction of
      eq. 16 (otherwise $\dot q = v$ and eq. 13 with $\Delta = 0$: the plain
      Udwadia-Kalaba equation, which drifts, and, like [`cdiff.Lagrange`][] without
      stabilisation, can be thrown off at a kinematic singularity once the drift
      has grown).
    - `energy_correction`: add the nonideal energy-correction force of eq. 20
      (needs `model.energy`). The model is assumed conservative under the applied
      forces: $E_0$ is the energy of the initial state, and the energy input rate
      $\dot E$ of eq. 18 is taken as zero. Do not combine it with a controller or
      with dissipative forces: it would remove the energy they change.
    - `energy_damping`: extra absolute damping of the energy row (J), default 0.
    - `rtol`: relative singular-value threshold of the pseudoinverse.

    ??? cite "References"

        J. Braun, M. Goldfarb, *Simulation of constrained mechanical systems -
        Part I: an equation of motion*, J. Appl. Mech. 79 (2012), eqs. 4-20.
        F. E. Udwadia, R. E. Kalaba, *A new perspective on constrained motion*,
        Proc. R. Soc. A 439 (1992).
    """

    supports_unilateral: ClassVar[bool] = True

    constraint_correction: bool = eqx.field(static=True, default=True)
    energy_correction: bool = eqx.field(static=True, default=False)
    energy_damping: float = 0.0
    rtol: float | None = eqx.field(static=True, default=None)

    stepwise: ClassVar[bool] = True  # the Delta terms are frozen at step starts

    @property
    def corrects_energy(self) -> bool:
        return self.energy_correction

    def __check_init__(self):
        check_gains("UdwadiaKalaba", energy_damping=self.energy_damping,
                    rtol=self.rtol)

    freezes_from_terms: ClassVar[bool] = True  # the residuals and energy at t0

    def freeze(self, t0, t1, y0, context: Context):
        q, v = y0
        return self._deltas(t1 - t0, context, context.model.terms(t0, q, v))

    def _deltas(self, dt, context: Context, terms) -> _Deltas:
        phi_q, phi_v = terms.residuals
        q = terms.q
        scale = 1.0 if self.constraint_correction else 0.0
        if self.energy_correction:
            energy = terms.energy
            phi_e = energy - context.e0
            rtol = default_rtol(q.dtype) if self.rtol is None else self.rtol
            damping_e = jnp.abs(phi_e) + rtol * jnp.abs(energy) + self.energy_damping
        else:
            phi_e = damping_e = jnp.zeros((), q.dtype)
        return _Deltas(
            delta_q=scale * phi_q / dt,
            delta_v=scale * phi_v / dt,
            delta_e=phi_e / dt,
            damping_e=jax.lax.stop_gradient(damping_e),
        )

    def vector_field_and_freeze(self, t, y, context: Context, frozen: _Deltas, dt,
                                first):
        dyn, frozen = self.dynamics_and_freeze(t, y, context, frozen, dt, first)
        return dyn.rate, frozen

    def dynamics_and_freeze(self, t, y, context: Context, frozen: _Deltas | None,
                            dt, first, terms=None) -> tuple[Dynamics, _Deltas]:
        q, v = y
        if terms is None:
            terms = context.model.terms(t, q, v)
        frozen = first_stage_freeze(first, self._deltas(dt, context, terms), frozen)
        return self.dynamics(t, y, context, frozen, terms), frozen

    def dynamics(self, t, y, context: Context, frozen: _Deltas,
                 terms=None) -> Dynamics:
        q, v = y
        model = context.model
        if terms is None:
            terms = model.terms(t, q, v)
        mf, a, kin = free_motion(context, t, q, v, terms)
        pinv_v = PseudoInverse(mf.weight(kin.A_v), self.rtol)
        # Eq. 16: velocity-level correction by an ideal impulse.
        if self.constraint_correction:
            if kin.A_v.shape[0] == kin.A_q.shape[0]:  # no nonholonomic rows: C_q = C_v
                pinv_q = pinv_v
            else:
                pinv_q = PseudoInverse(mf.weight(kin.A_q), self.rtol)
            r_q = -kin.dphi_q - frozen.delta_q  # b_q - A_q v = -dPhi_q/dt
            dq = v + mf.unweight(pinv_q.solve(r_q))
        else:
            dq = v
        # Eq. 17: ideal constraint force.
        r_v = kin.b_v - matvec(kin.A_v, a) - frozen.delta_v
        y_v, multipliers, _ = constrained_acceleration(mf, kin.A_v, r_v, pinv=pinv_v)
        # The ideal constraint force R^T C_v^+ (...) of eq. 11.
        force = mf.times_R_transpose(y_v)
        # Eq. 20: nonideal energy-correction force, tangent to the constraints.
        if self.energy_correction:
            law = terms.energy_law(dq)
            c_e = mf.weight(law.A_e[None])[0]
            w = pinv_v.null_project(c_e)  # (C_e N_v)^T = N_v C_e^T
            r_ev = law.b_e - jnp.sum(law.A_e * a) - frozen.delta_e - jnp.sum(c_e * y_v)
            y_e = PseudoInverse(w[None], damping=frozen.damping_e).solve(r_ev[None])
            y_v = y_v + y_e
        qdot = model.position_rate(t, q, dq)  # eq. 16's velocity, as a coordinate rate
        return Dynamics((qdot, a + mf.unweight(y_v)), force, multipliers)
