"""The Braun-Goldfarb notebook runs (short horizon) and its results hold."""
import numpy as np
import pytest
from notebook_runner import run_notebook

# A notebook is a long run: not in the default run (`pytest -m slow`).
pytestmark = pytest.mark.slow


def test_braun_goldfarb_notebook(tmp_path, monkeypatch):
    ns = run_notebook("braun_goldfarb", tmp_path, monkeypatch)
    uke, uk, bg = ns["NAMES"]

    # Every run finished (no solver failure) and the mechanism stays assembled.
    for name in ns["NAMES"]:
        for run in ns["runs"][name].values():
            assert run["message"] == ""
            assert np.all(np.isfinite(run["q"]))

    # Fig. 3 (dt = 1e-2): constraint correction keeps |Phi_q| small (measured
    # 1.2e-8), and energy correction does not disturb it (ratio 1.02, 0.95) ...
    fig3 = ns["fig3"]
    assert fig3[uke]["phi"] < 1e-7
    assert 0.8 < fig3[uke]["phi"] / fig3[uk]["phi"] < 1.25
    assert 0.8 < fig3[uke]["dphi"] / fig3[uk]["dphi"] < 1.25
    # ... while it lowers the energy error (measured 7x in 2 s).
    assert fig3[uke]["energy"] < fig3[uk]["energy"] / 3

    # Fig. 2 (dt = 5e-2): the energy-corrected slider is the most accurate
    # (measured 7.9e-5 m against 7.4e-4 without energy correction).
    err = ns["fig2_error"]
    assert err[uke] < 7e-4
    assert err[uke] < err[uk] / 3

    # Fig. 4(d): at large steps, more accurate than RK4 on the minimal ODE at the
    # same step (measured 28x at dt = 5e-2, 50x at dt = 1e-1).
    dts = np.asarray(ns["STUDY_DTS"])
    ratio = ns["err_min"] / ns["err_uke"]
    assert np.all(ratio[dts >= 5e-2] > 5)
    # The best Baumgarte gains run, and are less accurate at every step size
    # (measured 3.8x to 8.1x).
    assert np.all(ns["err_uke"] < ns["err_bg"])

    # Figs. 6-7 (double four-bar): through the singular configurations, constraint
    # and energy errors stay small and the energy-corrected run is the most accurate
    # (eps3 1.3e-6 m against 2.2e-5 m without energy correction; max |Phi_q|
    # 3.0e-9). The exact motion passes the singular configuration 5 times in the
    # short run's 5 s.
    fig7 = ns["fig7"]
    assert len(ns["singular"]) == 5
    assert fig7[uke]["phi"] < 1.2e-8
    assert fig7[uke]["eps"] < 1e-5
    assert fig7[uke]["eps"] < fig7[uk]["eps"] / 5
    assert fig7[uke]["energy"] < fig7[uk]["energy"] / 10
    assert fig7[bg]["phi"] > 10 * fig7[uke]["phi"]  # Baumgarte's constraints drift

    # The closing table is computed, one verdict per claim.
    claims = ns["claims"]
    assert len(claims) >= 10
    assert claims["Fig. 4d: large dt (>= 2e-2): UK + energy more accurate than RK4 ODE"]
