"""`Solution.qdot`, `vdot`, `constraint_force` and `multipliers` are computed when
read: against R2's KKT system in NumPy, for one solution and a vmapped batch, and
a solve whose caller does not read them traces the formulation's dynamics only where
the solver needs them."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import kkt_numpy, slider_crank_numpy

import cdiff

LAGRANGE = cdiff.Lagrange(10.0, 10.0)
LENGTHS = (1.0, 1.1)


def _solve(length, formulation=LAGRANGE):
    model = cdiff.models.SliderCrank(l=length)
    q0, v0 = model.initial_state()
    return cdiff.simulate(model, formulation, q0, v0, t1=0.5, dt=1e-2)


def _kkt_reference(sol, length):
    """vdot, the multipliers and the constraint force A^T lam at every saved row:
    M vdot = Q + A^T lam with A vdot = -(dA/dt) v - 2 alpha dPhi - beta^2 Phi
    (Lagrange(10, 10)), in NumPy."""
    rows = []
    for q, v, phi, dphi in zip(*(np.asarray(x) for x in (
            sol.q, sol.v, sol.holonomic_residual, sol.velocity_residual))):
        M, Q, A, Adot_v = slider_crank_numpy(q, v, l=length)
        a, lam = kkt_numpy(M, Q, A, -Adot_v - 20.0 * dphi - 100.0 * phi)
        rows.append((a, lam, A.T @ lam))
    return tuple(np.array(x) for x in zip(*rows))


def _check_against_numpy(sol, length):
    vdot, lam, force = _kkt_reference(sol, length)
    # Measured (the KKT solves' round-off, |lam| up to 42): l = 1 vdot 4.3e-14,
    # multipliers 5.7e-14, force 3.8e-14; l = 1.1 1.4e-13, 1.4e-13, 1.0e-13; the
    # same in the batch. The rates: qdot = v exactly.
    atol = {1.0: 2e-13, 1.1: 5e-13}[length]
    np.testing.assert_allclose(sol.vdot, vdot, rtol=0, atol=atol)
    np.testing.assert_allclose(sol.multipliers, lam, rtol=0, atol=atol)
    np.testing.assert_allclose(sol.constraint_force, force, rtol=0, atol=atol)
    np.testing.assert_array_equal(sol.qdot, sol.v)


def test_read_after_the_solve_match_the_kkt_system():
    sol = _solve(LENGTHS[0])
    _check_against_numpy(sol, LENGTHS[0])


def test_batched_solution():
    sols = jax.vmap(_solve)(jnp.array(LENGTHS))
    assert sols.multipliers.shape == (2, 51, 5)
    for i, length in enumerate(LENGTHS):
        _check_against_numpy(jax.tree.map(lambda x: x[i], sols), length)
    # A solution whose arrays lost the batch axes of `ts` says so.
    broken = eqx.tree_at(lambda s: s.ts, sols, sols.ts[0])
    with pytest.raises(ValueError, match="batch axes"):
        broken.multipliers


class _Counting(cdiff.Lagrange):
    """Lagrange, counting how often its dynamics are traced."""

    def dynamics(self, t, y, context, frozen):
        TRACES.append(1)
        return super().dynamics(t, y, context, frozen)


TRACES = []


def test_dynamics_traced_only_when_read():
    formulation = _Counting(10.0, 10.0)

    def traces(read):
        jax.clear_caches()  # trace the solve again
        TRACES.clear()
        jax.make_jaxpr(lambda length: read(_solve(length, formulation)))(1.0)
        return len(TRACES)

    solve_only = traces(lambda sol: (sol.q, sol.v, sol.holonomic_residual,
                                     sol.velocity_residual, sol.energy))
    # RK4's stages share one trace of the vector field.
    assert solve_only == 1
    assert traces(lambda sol: sol.multipliers) == solve_only + 1
    # `evaluate` reads both rates from one evaluation.
    assert traces(lambda sol: sol.evaluate(0.25)) == solve_only + 1
