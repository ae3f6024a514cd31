"""The Yun-Sarkar notebook runs (short horizon) and its results hold."""
import numpy as np
import pytest
from notebook_runner import run_notebook

# A notebook is a long run: not in the default run (`pytest -m slow`).
pytestmark = pytest.mark.slow


def test_yun_sarkar_notebook(tmp_path, monkeypatch):
    ns = run_notebook("yun_sarkar", tmp_path, monkeypatch)
    # Fig. 2 (alpha = 10, 1 cm gap): contact by 0.5 s, lost at t_displace by about
    # the displacement (0.96 cm), regained within 0.5 s; eq. 18 to RK4's accuracy.
    assert 0.4 <= ns["engaged"] <= 0.5
    assert 0.4 <= ns["regained"] <= 0.5
    assert ns["held2"] < ns["CONTACT"]
    assert ns["gap2"][ns["n_disp"] + 1] > 0.8 * np.linalg.norm(ns["DISPLACEMENT"])
    assert ns["eq18_sphere"] < 1.5e-8  # measured 3.3e-9
    # Fig. 3 (alpha = 0): in contact to round-off, then the gap stays.
    assert ns["held3"] < 5e-16  # measured 1.1e-16
    assert ns["lost3"].min() > 0.9 * np.linalg.norm(ns["DISPLACEMENT"])
    assert np.ptp(ns["lost3"]) < 5e-13  # measured 1.1e-13
    # The rolling residual at round-off, far below the 1e-8 (measured 2.2e-16).
    assert max(ns["rolling2"], ns["rolling3"]) < 1e-15
    assert ns["ref_error"][0] < 1e-6
    assert ns["ref_error"][1] < 5e-6
    # Fig. 5 (alpha = 5): converged by about 1 s, as c0 exp(-alpha t).
    k5 = ns["k5"]
    assert 0.9 <= ns["t_1e3"][k5] <= 1.2
    assert ns["eq18_arm"] < 3e-7  # measured 6.3e-8
    alpha_t = np.asarray(ns["ALPHAS"]) * ns["t_1pct"]
    assert np.all((4.5 <= alpha_t) & (alpha_t <= 5.0)), alpha_t
    assert ns["rigid"] < 1e-4
    # Sec. IV-A: the output errors follow the PD law; contact and rolling hold.
    assert ns["pd_deviation"] < 1.5e-7  # measured 3.0e-8
    assert np.max(np.abs(ns["e"])) > 0.1  # the errors are not trivially small
    # Round-off (measured 1.1e-16).
    assert max(ns["contact_ctrl"], ns["rolling_ctrl"]) < 5e-16
    # The claims table: everything reproduces but the "double pendulum" remark.
    verdicts = [row[3] for row in ns["claims"]]
    assert verdicts.count("yes") == len(verdicts) - 1, ns["claims"]
