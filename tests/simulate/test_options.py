"""Options that no other test exercises, each against an independent reference or a
property that would fail if the option were ignored: Udwadia-Kalaba without constraint
correction, float32 against float64, the mass-weighted Newton projection, BDF's
`max_order` and `simulate(progress=True)`."""

import jax
import jax.numpy as jnp
import numpy as np

import cdiff

jax.config.update("jax_enable_x64", True)

CRANK = cdiff.models.SliderCrank()  # R2
Q0, V0 = CRANK.initial_state()
T1 = 2.0
TS = jnp.linspace(0.0, T1, 201)
REF = CRANK.reference(TS[1:])  # Dopri8 at 1e-12 on the minimal ODE (eq. 24)
REF_Q = np.vstack([np.asarray(Q0)[None], np.asarray(REF.q)])


def test_udwadia_kalaba_without_constraint_correction():
    """The ideal-constraint equation (eq. 11 without the Delta terms): RK4's error
    only, and the constraints drift (with the correction they hold at 1.2e-13)."""
    sol = cdiff.simulate(CRANK, cdiff.UdwadiaKalaba(constraint_correction=False),
                         Q0, V0, t1=T1, dt=1e-3, saveat=cdiff.SaveAt(ts=TS))
    assert np.abs(np.asarray(sol.q) - REF_Q).max() < 1e-9  # measured 2.7e-10
    phi = np.abs(np.asarray(sol.holonomic_residual)).max(axis=1)
    assert 1e-11 < phi.max() < 1e-9  # measured 1.5e-10: drift, not round-off
    assert phi[100:].max() > phi[:100].max()  # measured 1.5e-10 against 9.8e-11


def test_float32_against_float64():
    """The same solve in float32 and float64 (R2, UK with constraint correction, 1 s
    at dt = 1e-2): float64's error is RK4's, float32 adds its round-off."""
    ts = jnp.linspace(0.0, 1.0, 101)
    exact = np.asarray(CRANK.reference(ts[1:]).q)
    kwargs = dict(t1=1.0, dt=1e-2)
    s64 = cdiff.simulate(CRANK, cdiff.UdwadiaKalaba(), Q0, V0,
                         saveat=cdiff.SaveAt(ts=ts), **kwargs)
    s32 = cdiff.simulate(CRANK, cdiff.UdwadiaKalaba(), Q0.astype(jnp.float32),
                         V0.astype(jnp.float32),
                         saveat=cdiff.SaveAt(ts=ts.astype(jnp.float32)), **kwargs)
    assert s32.q.dtype == jnp.float32 and s64.q.dtype == jnp.float64
    err64 = np.abs(np.asarray(s64.q[1:]) - exact).max()
    err32 = np.abs(np.asarray(s32.q[1:], np.float64) - exact).max()
    assert err64 < 1e-6  # measured 1.6e-7 (RK4 at dt = 1e-2)
    assert err32 < 8e-6  # measured 1.9e-6
    assert float(s32.max_constraint_error) < 3e-6  # measured 3.6e-7 (3 float32 ulps of 1)
    assert float(s64.max_constraint_error) < 1e-7  # measured 1.1e-8
    # (measured 1.9e-6)
    assert np.abs(np.asarray(s32.q, np.float64) - np.asarray(s64.q)).max() < 8e-6


def test_mass_weighted_newton_projection_is_more_accurate_on_r2():
    """docs: `NewtonProjection(mass_weighted=True)` is more accurate on R2: the error at
    the end of the run, Projection, RK4 at dt = 1e-3, is 3.0e-11 against 9.5e-9
    unweighted at 10 s (measured); here at 2 s. Over the whole run the largest errors
    are closer (4.4e-11 against 2.3e-10): the weighted error oscillates, the
    unweighted one grows."""
    errors = {}
    for weighted in (False, True):
        solver = cdiff.Projected(cdiff.RK4(),
                                 cdiff.NewtonProjection(mass_weighted=weighted))
        sol = cdiff.simulate(CRANK, cdiff.Projection(), Q0, V0, t1=T1, dt=1e-3,
                             solver=solver, saveat=cdiff.SaveAt(ts=TS))
        errors[weighted] = np.abs(np.asarray(sol.q[-1]) - REF_Q[-1]).max()
        assert float(sol.max_constraint_error) < 4e-15  # measured 8.9e-16 and 1.1e-15
    assert errors[True] < 2e-11  # measured 5.0e-12
    assert errors[False] < 2e-9  # measured 2.3e-10
    assert errors[False] > 10 * errors[True]  # measured 45 times


def test_bdf_max_order_is_honoured():
    """Steps of an adaptive BDF grow like tol^(-1/(p+1)) for order p: from rtol 1e-4
    to 1e-6, BDF1 needs about sqrt(100) = 10 times more steps (measured 7.1), the
    variable order up to 5 far fewer (measured 1.4; 100^(1/6) = 2.2)."""
    arm = cdiff.models.PlanarArmOnCurve("circle")
    q0, v0 = arm.initial_state()
    steps = {}
    for order in (1, 5):
        for tol in (1e-4, 1e-6):
            sol = cdiff.simulate(arm, cdiff.GGL(), q0, v0, t1=1.0, dt=1e-4,
                                 solver=cdiff.BDF(rtol=tol, atol=tol, max_order=order))
            assert sol.succeeded
            steps[order, tol] = int(sol.stats["num_steps"])
    growth = {p: steps[p, 1e-6] / steps[p, 1e-4] for p in (1, 5)}
    assert 5 < growth[1] < 14  # measured 808 / 114 = 7.1
    assert growth[5] < 2.5  # measured 72 / 52 = 1.4
    assert steps[1, 1e-6] > 5 * steps[5, 1e-6]  # measured 808 against 72


def test_progress_bar(capfd):
    """`progress=True` draws a bar on stderr and changes nothing in the result."""
    model = cdiff.models.ParticleOnCircle(g=9.81)
    q0, v0 = model.initial_state()
    runs = {p: cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=1.0, dt=1e-2,
                              progress=p) for p in (False, True)}
    err = capfd.readouterr().err
    assert "100.00%" in err, err[-500:]
    np.testing.assert_array_equal(np.asarray(runs[True].q), np.asarray(runs[False].q))
