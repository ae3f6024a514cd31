"""cdiff.studies.step_size_study and gain_sweep (one compiled program per formulation),
checked against separate simulations measured independently (numpy on the
Solution's own residuals and the exact reference)."""

from __future__ import annotations

import functools

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EPS, slider_crank_exact_scipy, slider_crank_theta_ddot

import cdiff

MODEL = cdiff.models.SliderCrank()
T1 = 1.0
DTS = np.array([2e-2, 5e-2, 1e-1])
N_SAVE = 10  # every 0.1 s: on the step grid of every dt
TS = np.linspace(0.0, T1, N_SAVE + 1)[1:]
ALPHAS, BETAS = [1.0, 10.0, 3e3], [2.0, 20.0]  # alpha = 3e3 diverges at 0.1


@functools.cache
def _sweep():
    return cdiff.studies.gain_sweep(MODEL, cdiff.Lagrange(),
                                    {"alpha": ALPHAS, "beta": BETAS}, DTS, T1,
                                    n_save=N_SAVE)


@functools.cache
def _study():
    formulations = {"UK": cdiff.UdwadiaKalaba(), "minimal": cdiff.studies.Minimal(),
                    "best Baumgarte": _sweep().best_formulation()}
    return cdiff.studies.step_size_study(MODEL, formulations, DTS, T1,
                                         n_save=N_SAVE, time_each=False,
                                         progress=False)


@eqx.filter_jit
def _separate(formulation, dt):
    """One simulation (dt traced: one compilation for all step sizes)."""
    q0, v0 = MODEL.initial_state()
    return cdiff.simulate(MODEL, formulation, q0, v0, t1=T1, dt=dt,
                          saveat=cdiff.SaveAt(ts=jnp.asarray(TS)), max_steps=50)


def _independent(sol):
    """The four measures from a Solution, in numpy."""
    ref = MODEL.reference(jnp.asarray(TS))
    q0, v0 = MODEL.initial_state()
    e0 = float(MODEL.energy(0.0, q0, v0))
    obs = np.asarray(MODEL.observable(sol.q)) - np.asarray(MODEL.observable(ref.q))
    return np.array([
        np.max(np.abs(np.asarray(sol.holonomic_residual))),
        np.max(np.abs(np.asarray(sol.velocity_residual))),
        np.max(np.abs(np.asarray(sol.energy) - e0)),
        np.max(np.linalg.norm(obs, axis=-1)),
    ])


COLUMNS = ["max_constraint_error", "max_velocity_error", "max_energy_error",
           "max_error"]


def test_study_rows_equal_separate_simulations():
    study = _study()
    assert len(study) == 3 * len(DTS)
    rows = study.where(formulation="UK")
    np.testing.assert_array_equal(rows["dt"], DTS)
    np.testing.assert_array_equal(rows["steps"], [50, 20, 10])
    for i, dt in enumerate(DTS):
        expected = _independent(_separate(cdiff.UdwadiaKalaba(), jnp.asarray(dt)))
        got = np.array([rows[c][i] for c in COLUMNS])
        # Round-off (batched against separate): measured absolute differences up
        # to 2.7e-15 (the energy error: a difference of energies of ~10 J).
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=2e-14)
    # RK4's error grows with the step: four orders over a factor of five in dt
    # (measured 1.2e-6, 1.4e-4, 1.2e-2).
    assert np.all(np.diff(rows["max_error"]) > 0)
    assert np.all(study["batch_time"] > 0) and np.all(study["compile_time"] > 0)
    assert np.all(np.isnan(study["time"]))  # time_each=False


def test_one_vmapped_call_equals_one_after_another():
    # vmap=True is the default on GPUs; both compute every step size alike.
    formulations = {"UK": cdiff.UdwadiaKalaba()}
    vmapped = cdiff.studies.step_size_study(MODEL, formulations, DTS, T1, n_save=N_SAVE,
                                            time_each=False, progress=False, vmap=True)
    rows = _study().where(formulation="UK")
    for c in COLUMNS:
        np.testing.assert_allclose(vmapped[c], rows[c], rtol=1e-12, atol=2e-14)
    assert np.all(np.isfinite(vmapped["max_error"]))


def _rk4_minimal_numpy(dt):
    """Classical RK4 at step dt on R2's minimal ODE, in NumPy on the hand-derived
    `slider_crank_theta_ddot` (not cdiff's eq. 24 code): theta1 at TS."""
    def rate(y):
        return np.array([y[1], slider_crank_theta_ddot(y[0], y[1], MODEL.g / MODEL.l)])

    y, out = np.array([np.pi / 4, 0.0]), []
    every = round(T1 / N_SAVE / dt)  # steps between saves (on the grid)
    for k in range(1, round(T1 / dt) + 1):
        k1 = rate(y)
        k2 = rate(y + dt / 2 * k1)
        k3 = rate(y + dt / 2 * k2)
        k4 = rate(y + dt * k3)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if k % every == 0:
            out.append(y[0])
    return np.array(out)


def test_minimal_row_is_rk4_on_eq_24():
    """The minimal row against an independent computation: RK4 in NumPy on the
    hand-derived equation of motion, and the exact solution by SciPy's DOP853 at
    1e-13 (x_s = 2 l cos(theta1))."""
    rows = _study().where(formulation="minimal")
    exact = 2 * MODEL.l * np.cos(slider_crank_exact_scipy(TS)[0])
    expected = [np.max(np.abs(2 * MODEL.l * np.cos(_rk4_minimal_numpy(dt)) - exact))
                for dt in DTS]
    # The study's reference (Dopri8 at 1e-12) and SciPy's differ by 3.2e-13
    # (measured, at errors of 8.9e-6, 5.4e-4 and 2.2e-2).
    np.testing.assert_allclose(rows["max_error"], expected, rtol=0, atol=3e-12)
    # Minimal coordinates satisfy the constraints by construction: exactly 0.
    np.testing.assert_array_equal(rows["max_constraint_error"], 0.0)


def test_gain_sweep_best_gains_and_their_formulation():
    sweep = _sweep()
    assert len(sweep) == len(DTS) * len(ALPHAS) * len(BETAS)
    best = sweep.best
    np.testing.assert_array_equal(best["dt"], DTS)
    for i, dt in enumerate(DTS):
        rows = sweep.where(dt=dt)
        k = int(np.argmin(rows["max_error"]))
        assert (best["alpha"][i], best["beta"][i]) == (rows["alpha"][k], rows["beta"][k])
    form = sweep.best_formulation()
    np.testing.assert_array_equal(np.asarray(form.alpha), best["alpha"])
    # The per-step-size formulation reproduces the sweep's best rows.
    study = _study().where(formulation="best Baumgarte")
    # Measured equal in both builds (not by construction: two programs): 4 ulp.
    for c in COLUMNS:
        np.testing.assert_allclose(study[c], best[c], rtol=4 * EPS, atol=0)
    # One sweep row against its own simulation.
    i = int(np.flatnonzero((sweep["dt"] == 5e-2) & (sweep["alpha"] == 10.0))[0])
    lagrange = cdiff.Lagrange(alpha=jnp.asarray(sweep["alpha"][i]),
                              beta=jnp.asarray(sweep["beta"][i]))
    expected = _independent(_separate(lagrange, jnp.asarray(sweep["dt"][i])))
    # Round-off (measured relative difference 1.4e-12).
    np.testing.assert_allclose([sweep[c][i] for c in COLUMNS], expected, rtol=5e-12)


def test_a_diverging_run_is_inf_not_an_error():
    rows = _sweep().where(alpha=3e3, dt=1e-1)  # alpha dt = 300: RK4 unstable
    assert len(rows) == 2
    for c in COLUMNS:
        assert np.all(np.isinf(rows[c])), c
    assert np.all(np.isfinite(_sweep().best["max_error"]))


def test_table_prints_saves_and_plots(tmp_path):
    study = _study()
    text = str(study)
    assert "max_error" in text and "minimal" in text
    csv_path, npz_path = study.save(tmp_path / "study")
    header = csv_path.read_text().splitlines()[0].split(",")
    assert header[:3] == ["formulation", "dt", "steps"]
    data = np.load(npz_path)
    np.testing.assert_array_equal(data["max_error"], study["max_error"])
    assert str(data["meta_solver"]) == "RK4"
    fig = study.plot(tmp_path / "study.png")
    assert len(fig.axes) == 5 and (tmp_path / "study.png").stat().st_size > 0
    _sweep().plot(tmp_path / "gains.png")
    assert (tmp_path / "gains.png").stat().st_size > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="minimal_ode"):
        cdiff.studies.step_size_study(cdiff.models.TwoLinkOnCircle(),
                                      [cdiff.studies.Minimal()], [0.1], 1.0)
    with pytest.raises(ValueError, match="positive step sizes"):
        cdiff.studies.step_size_study(MODEL, [cdiff.UdwadiaKalaba()], [0.0], 1.0)
    with pytest.raises(ValueError, match="no field 'gamma'"):
        cdiff.studies.gain_sweep(MODEL, cdiff.Lagrange(), {"gamma": [1.0]}, [0.1], 1.0)
    with pytest.raises(ValueError, match="metric"):
        cdiff.studies.gain_sweep(MODEL, cdiff.Lagrange(), {"alpha": [1.0]}, [0.1],
                                 1.0, metric="error")
    with pytest.raises(TypeError, match="formulation"):
        cdiff.studies.step_size_study(MODEL, {"x": "UK"}, [0.1], 1.0)


def test_command_line_writes_tables_and_figures(tmp_path, capsys):
    from cdiff.cli import main

    common = ["slider-crank", "--t1", "1", "--dts", "0.02", "0.05", "0.1", "--out",
              str(tmp_path)]
    assert main(["study", "gains", *common, "--alphas", "1", "10", "3000",
                 "--betas", "2", "20"]) == 0
    best = np.loadtxt(tmp_path / "slider-crank-gains-best.csv", delimiter=",",
                      skiprows=1)
    np.testing.assert_array_equal(best[:, 1:3], np.stack(
        [_sweep().best["alpha"], _sweep().best["beta"]], axis=1))
    assert main(["study", "step-size", *common, "--no-time-each"]) == 0
    out = capsys.readouterr().out
    assert "RK4 on the minimal ODE" in out and "UK, constraint + energy" in out
    for suffix in ("csv", "npz", "png"):
        assert (tmp_path / f"slider-crank-step-size.{suffix}").stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["study", "step-size", "slider-crank", "--t1", "1", "--dts", "2"])


def test_off_grid_step_sizes_interpolate_like_simulate():
    # 0.03 and 0.07 do not divide the 0.1 s measurement spacing: the study falls
    # back from its own loop on the step grid to diffeqsolve with SaveAt(ts),
    # and must still equal separate simulations (interpolated alike).
    # private on purpose: which of the study's two loops runs is internal to it
    from cdiff.studies._runner import _steps_per_save

    dts = np.array([3e-2, 7e-2])
    assert _steps_per_save(dts, T1, N_SAVE) is None
    assert list(_steps_per_save(DTS, T1, N_SAVE)) == [5, 2, 1]
    study = cdiff.studies.step_size_study(MODEL, {"UK": cdiff.UdwadiaKalaba()}, dts,
                                          T1, n_save=N_SAVE, time_each=False,
                                          progress=False)
    for i, dt in enumerate(dts):
        expected = _independent(_separate(cdiff.UdwadiaKalaba(), jnp.asarray(dt)))
        got = np.array([study[c][i] for c in COLUMNS])
        # The same route (diffeqsolve with SaveAt(ts)) both ways: measured equal in
        # both builds; 4 ulp.
        np.testing.assert_allclose(got, expected, rtol=4 * EPS, atol=0)


def test_log_plot_shows_zeros_and_failures_on_the_edges():
    # A log axis leaves 0 and inf out; the plot puts them on the bottom and top
    # edges, named in the legend, instead of a legend entry with nothing drawn.
    # (A StepSizeStudy built from its columns, as a user could from a saved table.)
    dts = [1e-3, 1e-2, 1e-1, 1.0]
    ones = np.ones(4)
    study = cdiff.studies.StepSizeStudy({
        "formulation": np.array(["minimal"] * 4 + ["fine"] * 4),
        "dt": np.array(dts * 2), "steps": np.array([1000, 100, 10, 1] * 2),
        "max_constraint_error": np.concatenate([ones, ones]),
        "max_velocity_error": np.array([0.0, 1e-4, np.inf, 0.0, 1e-3, 1e-4, 1e-5,
                                        1e-6]),
        "max_energy_error": np.concatenate([ones, ones]),
        "max_error": np.concatenate([ones, ones]),
        "time": np.full(8, np.nan)})
    fig = study.plot()
    ax = fig.axes[1]  # (b): the velocity constraint error
    marked = ax.get_legend().legend_handles
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "minimal: exactly 0", "minimal: failed (inf)"]
    zeros, failed = (next(line for line in ax.lines if line.get_label() == label)
                     for label in ("minimal: exactly 0", "minimal: failed (inf)"))
    assert len(marked) == 2
    np.testing.assert_array_equal(zeros.get_xdata(), [1e-3, 1.0])
    np.testing.assert_array_equal(failed.get_xdata(), [1e-1])
    assert np.all(zeros.get_ydata() < 0.1) and np.all(failed.get_ydata() > 0.9)
    assert zeros.get_transform().contains_branch_seperately(ax.transData) == (
        True, False)  # x in data, y on the axes
    # Panels where every value is positive and finite have no edge markers.
    assert fig.axes[2].get_legend() is None


def test_null_space_without_dof_is_bound_as_simulate_binds_it():
    """`NullSpace()` reads its number of degrees of freedom from the initial state
    (`bind`, which `simulate` calls before tracing); the studies trace the step
    size, so they bind it first too: the rows of `NullSpace()` equal those of
    `NullSpace(dof=1)` (R2 has one), and a separate simulation's measures."""
    dts = DTS[:2]
    bound = cdiff.studies.step_size_study(
        MODEL, {"free": cdiff.NullSpace(), "given": cdiff.NullSpace(dof=1)}, dts, T1,
        n_save=N_SAVE, time_each=False, progress=False)
    free, given = bound.where(formulation="free"), bound.where(formulation="given")
    for c in COLUMNS:
        np.testing.assert_array_equal(free[c], given[c])
    expected = _independent(_separate(cdiff.NullSpace(dof=1), jnp.asarray(dts[0])))
    np.testing.assert_allclose([free[c][0] for c in COLUMNS], expected, rtol=1e-12,
                               atol=2e-14)
    sweep = cdiff.studies.gain_sweep(MODEL, cdiff.NullSpace(), {"alpha": [0.0, 5.0]},
                                     dts, T1, n_save=N_SAVE, progress=False)
    assert np.all(np.isfinite(sweep["max_error"]))
    assert sweep.best_formulation().dof == 1
