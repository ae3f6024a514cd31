"""cdiff.BDF, the DAE formulations (GGL, IndexOne) and Regularized, on problems with
exact solutions. The planar arm on curves (R8) is in test_planar_arm_dae.py."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Skate
from scipy.integrate import solve_ivp

import cdiff

# private on purpose: the BDF kernel on bare DAE residuals (simulate takes a model)
from cdiff._solver.bdf import bdf_solve


def _solve(residual, initial, x0, t1, tol, *, algebraic, ts=None, jump_ts=None,
           max_steps=20_000):
    return bdf_solve(
        residual, initial, 0.0, t1, x0, 1e-4, algebraic=np.asarray(algebraic),
        solver=cdiff.BDF(tol, tol, jump_ts=jump_ts), save_t0=False, save_t1=True,
        save_steps=False, save_ts=ts, max_steps=max_steps,
    )


# y' = -y + z, 0 = z - sin t, y(0) = 1: y = 1.5 e^-t + (sin t - cos t) / 2.
def _index1(t, x, xdot):
    return jnp.stack([xdot[0] + x[0] - x[1], x[1] - jnp.sin(t)])


def _index1_initial(t, x):
    z = jnp.sin(t)
    return jnp.stack([x[0], z]), jnp.stack([z - x[0], 0.0])


@jax.jit
def _index1_run(tols):
    ts = jnp.linspace(0.0, 10.0, 21)

    def one(tol):
        return _solve(_index1, _index1_initial, jnp.array([1.0, 0.0]), 10.0, tol,
                      algebraic=[False, True], ts=ts)

    return jax.vmap(one)(tols)  # vmap over the tolerance


def test_bdf_index1_dae_error_proportional_to_tolerance():
    tols = jnp.array([1e-6, 1e-9])
    ts, xs, result, stats = _index1_run(tols)
    exact = 1.5 * np.exp(-ts[:, :-1]) + (np.sin(ts[:, :-1]) - np.cos(ts[:, :-1])) / 2
    err = np.abs(np.asarray(xs[:, :-1, 0]) - exact).max(axis=1)
    assert np.all(np.asarray(result._value) == 0)
    # Local error control: the global error follows the tolerance (here 8.5e-6 and
    # 1.3e-8: ~10x the tolerance), and the algebraic component is exact at the
    # steps (here the last one; between steps it is interpolated).
    assert err[0] < 30 * 1e-6 and err[1] < 30 * 1e-9, err
    assert err[1] < err[0] / 100
    # (Measured: 1.1e-16 at the last step; 2.6e-9 interpolated, at tol = 1e-9.)
    np.testing.assert_allclose(xs[:, -1, 1], np.sin(10.0), rtol=0, atol=5e-16)
    np.testing.assert_allclose(xs[1, :-1, 1], np.sin(ts[1, :-1]), rtol=0, atol=1e-8)
    # Fewer steps at the loose tolerance; orders above 1 were used.
    n = np.asarray(stats["num_accepted_steps"])
    assert n[0] < n[1] < 1000


def test_bdf_stiff_robertson_against_radau():
    def F(t, x, xdot):
        y1, y2, y3 = x
        f = jnp.stack([-0.04 * y1 + 1e4 * y2 * y3,
                       0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2**2,
                       3e7 * y2**2])
        return xdot - f

    def initial(t, x):
        return x, -F(t, x, jnp.zeros(3))

    run = jax.jit(lambda: _solve(F, initial, jnp.array([1.0, 0.0, 0.0]), 40.0, 1e-9,
                                 algebraic=[False] * 3))
    _, xs, result, stats = run()
    ref = solve_ivp(lambda t, y: -np.asarray(F(t, jnp.asarray(y), jnp.zeros(3))),
                    (0, 40), [1, 0, 0], method="Radau", rtol=1e-12, atol=1e-16).y[:, -1]
    assert int(result._value) == 0
    np.testing.assert_allclose(xs[-1], ref, rtol=4e-7)  # measured 9.5e-8
    # Stiff: an explicit method would need ~1e4 steps or more here.
    assert int(stats["num_accepted_steps"]) < 600


def test_bdf_jump_ts_lands_on_the_jump():
    # y' = 1 before t = 1 and -1 after: y(2) = 0; BDF is exact on each linear piece.
    def F(t, x, xdot):
        return xdot - jnp.where(t < 1.0, 1.0, -1.0)

    def initial(t, x):
        return x, -F(t, x, jnp.zeros(1))

    with_jump = jax.jit(lambda: _solve(F, initial, jnp.zeros(1), 2.0, 1e-8,
                                       algebraic=[False], jump_ts=1.0))
    without = jax.jit(lambda: _solve(F, initial, jnp.zeros(1), 2.0, 1e-8,
                                     algebraic=[False]))
    _, xs, _, stats = with_jump()
    _, xs_no, _, stats_no = without()
    assert abs(float(xs[-1, 0])) < 1e-16  # measured 2.8e-17
    assert int(stats["num_rejected_steps"]) == 0
    # Without it the error test has to find the kink: rejected steps.
    assert int(stats_no["num_rejected_steps"]) > 0
    assert abs(float(xs_no[-1, 0])) < 5e-8  # measured 1.3e-8


# -- the DAE formulations on a pendulum (R1 with gravity) ------------------------


@pytest.fixture(scope="module")
def pendulum():
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 2.0, 21)
    return model, q0, v0, ts, model.reference(ts)


@pytest.mark.parametrize(
    "formulation", [cdiff.GGL(), cdiff.GGL("no_inverse"), cdiff.IndexOne()],
    ids=["ggl-mass", "ggl-no-inverse", "index-one"],
)
def test_dae_formulations_on_the_pendulum(pendulum, formulation):
    model, q0, v0, ts, ref = pendulum
    sol = cdiff.simulate(model, formulation, q0, v0, t1=2.0, dt=1e-4,
                         solver=cdiff.BDF(1e-9, 1e-9), saveat=cdiff.SaveAt(ts=ts))
    err = float(np.abs(np.asarray(sol.q) - np.asarray(ref.q)).max())
    assert err < 1e-7, err
    phi = float(sol.max_constraint_error)
    vel = float(np.abs(sol.velocity_residual).max())
    if isinstance(formulation, cdiff.GGL):
        # GGL keeps the position and velocity constraints (eqs. 17-18): at the
        # steps to the Newton tolerance, here at interpolated times (measured
        # 3.7e-11, 2.3e-10).
        assert phi < 2e-10, (phi, vel)
        assert vel < 1e-9, (phi, vel)
        # mu = 0 on the exact solution; numerically it absorbs the position
        # defect of each step, O(tol / h) (measured 5.5e-8, against |lambda| ~ 20).
        mu = np.asarray(sol.state)[:, -1]
        assert np.abs(mu).max() < 2e-7
    else:
        # The index-1 form only keeps them through its initial condition.
        assert phi < 1e-7
    # The constraint force is the string tension of the pendulum, radial with
    # T = m |v|^2 / rho - m g q_y / rho (m = rho = 1).
    q, v = np.asarray(sol.q), np.asarray(sol.v)
    tension = (v**2).sum(1) - 9.81 * q[:, 1]
    np.testing.assert_allclose(sol.constraint_force, -tension[:, None] * q, atol=1e-6)


class RedundantPendulum(cdiff.models.ParticleOnCircle):
    """R1 with its circle written twice (a redundant row everywhere) and a row
    that is identically zero, as the out-of-plane row of a planar MJCF loop."""

    def holonomic(self, t, q):
        (phi,) = super().holonomic(t, q)
        return jnp.stack([phi, 0.0 * q[0], 2.0 * phi])


@pytest.mark.parametrize("formulation", [cdiff.GGL(), cdiff.IndexOne()],
                         ids=["ggl", "index-one"])
def test_dae_keeps_independent_rows_of_redundant_constraints(pendulum, formulation):
    # Before, BDF stopped at t = 0 with "singular configuration".
    _, q0, v0, ts, ref = pendulum
    model = RedundantPendulum(g=9.81)
    with pytest.warns(UserWarning, match=r"rows \[0, 1\] .*rows \[1\] with a zero"):
        sol = cdiff.simulate(model, formulation, q0, v0, t1=2.0, dt=1e-4,
                             solver=cdiff.BDF(1e-9, 1e-9), saveat=cdiff.SaveAt(ts=ts))
    assert sol.succeeded, sol.message
    err = float(np.abs(np.asarray(sol.q) - np.asarray(ref.q)).max())
    assert err < 1e-7, err  # as the non-redundant pendulum above
    assert sol.holonomic_residual.shape == (ts.shape[0], 3)  # every row reported
    assert sol.multipliers.shape == (ts.shape[0], 3)
    q, v = np.asarray(sol.q), np.asarray(sol.v)
    tension = (v**2).sum(1) - 9.81 * q[:, 1]
    np.testing.assert_allclose(sol.constraint_force, -tension[:, None] * q, atol=1e-6)


def test_ggl_with_nonholonomic_constraint():
    model = Skate()
    q0 = jnp.zeros(3)
    v0 = jnp.array([1.0, 0.0, 2.0])
    ts = jnp.linspace(0.0, 2.0, 11)
    sol = cdiff.simulate(model, cdiff.GGL(), q0, v0, t1=2.0, dt=1e-4,
                         solver=cdiff.BDF(1e-10, 1e-10), saveat=cdiff.SaveAt(ts=ts))
    q_exact, _ = Skate.exact(np.asarray(ts))
    np.testing.assert_allclose(sol.q, q_exact, rtol=0, atol=3e-8)  # measured 9.2e-9
    assert float(np.abs(sol.velocity_residual).max()) < 1e-11  # measured 1.9e-12


def test_bdf_runs_ode_formulations():
    # Lagrange posed as xdot - f(t, x) = 0.
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()
    ts = jnp.linspace(0.0, 2.0, 11)
    sol = cdiff.simulate(model, cdiff.Lagrange(5.0, 5.0), q0, v0, t1=2.0, dt=1e-4,
                         solver=cdiff.BDF(1e-9, 1e-9), saveat=cdiff.SaveAt(ts=ts))
    np.testing.assert_allclose(sol.q, model.reference(ts).q, rtol=0,
                               atol=1e-7)  # measured 3.1e-8


def test_regularized_is_baumgarte_with_gains_from_h():
    # With eps -> 0 and phi regular, eq. 35 is Baumgarte's eq. 25 with
    # alpha = 1/h and beta^2 = 2/h^2 (Lagrange's 2 alpha dPhi + beta^2 Phi).
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()
    q0 = q0 * 1.01  # off the constraint: the feedback acts
    h = 0.05
    kw = dict(t1=1.0, dt=1e-3, saveat=cdiff.SaveAt(t1=True))
    reg = cdiff.simulate(model, cdiff.Regularized(eps=1e-14, h=h), q0, v0, **kw)
    lag = cdiff.simulate(model, cdiff.Lagrange(1 / h, np.sqrt(2) / h), q0, v0, **kw)
    np.testing.assert_allclose(reg.q, lag.q, rtol=0, atol=1.5e-15)  # measured 3.3e-16
    # ... and the constraint error decays: |q| - rho from 0.01 to 8e-11 in 1 s
    # (measured; Baumgarte's roots -20 +- 20i decay as e^-20 = 2e-9).
    assert abs(float(jnp.linalg.norm(reg.q[-1])) - 1.0) < 3e-10


def test_bdf_failures_are_result_codes():
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()
    kw = dict(t1=2.0, dt=1e-4, solver=cdiff.BDF(1e-9, 1e-9), max_steps=20)
    sol = cdiff.simulate(model, cdiff.GGL(), q0, v0, throw=False, **kw)
    assert sol.result == cdiff.RESULTS.max_steps_reached
    assert "maximum number of solver steps" in sol.message
    assert "Stopped at t = " in sol.message
    ok = np.isfinite(np.asarray(sol.ts))
    # t0 and the accepted steps (rejected ones count towards max_steps too).
    assert 2 < ok.sum() <= 21 and np.all(np.isfinite(np.asarray(sol.q)[ok]))
    t_stop = float(sol.stats["t_stop"])
    assert t_stop == float(np.asarray(sol.ts)[ok][-1])  # the last saved row
    assert t_stop < 2.0  # not a tolerance: it stopped before t1
    with pytest.raises(RuntimeError, match="maximum number of solver steps"):
        cdiff.simulate(model, cdiff.GGL(), q0, v0, **kw)


def test_bad_configurations_raise():
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()
    with pytest.raises(ValueError, match="DAE formulation"):
        cdiff.simulate(model, cdiff.GGL(), q0, v0, t1=1.0, dt=1e-2)
    with pytest.raises(ValueError, match="per-step data"):
        cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=1.0, dt=1e-2,
                       solver=cdiff.BDF())
    with pytest.raises(ValueError, match="stepsize_controller"):
        cdiff.simulate(model, cdiff.GGL(), q0, v0, t1=1.0, dt=1e-2,
                       solver=cdiff.BDF(), stepsize_controller=diffrax.ConstantStepSize())
    with pytest.raises(ValueError, match="max_order"):
        cdiff.BDF(max_order=6)
    with pytest.raises(ValueError, match="rtol"):
        cdiff.BDF(rtol=0.0)
    with pytest.raises(ValueError, match="variant"):
        cdiff.GGL("inverse")
    with pytest.raises(ValueError, match="h must be positive"):
        cdiff.Regularized(h=0.0)


def test_consistent_initialisation_projects_an_inconsistent_start(pendulum):
    # q0 off the circle and v0 with a radial part: GGL starts from the mass-weighted
    # projection onto Phi = 0 and its velocity constraint (and then keeps them).
    model, q0, v0, ts, _ = pendulum
    sol = cdiff.simulate(model, cdiff.GGL(), 1.01 * q0, v0 + 0.1 * q0, t1=2.0,
                         dt=1e-4, solver=cdiff.BDF(1e-9, 1e-9),
                         saveat=cdiff.SaveAt(ts=ts))
    # Exactly: q0 = (1, 0) and v0 = (0, 1) lie on the axes, where the projection's
    # zero components stay zero and |q| = 1 is reached exactly (measured equal).
    np.testing.assert_array_equal(sol.q[0], q0)
    np.testing.assert_array_equal(sol.v[0], v0)
    assert float(sol.max_constraint_error) < 2e-10  # measured 3.7e-11
