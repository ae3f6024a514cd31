"""The controller-mismatch notebook runs (short horizon) and its results hold."""
import numpy as np
import pytest
from notebook_runner import run_notebook

# A notebook is a long run: not in the default run (`pytest -m slow`).
pytestmark = pytest.mark.slow


def test_controller_mismatch_notebook(tmp_path, monkeypatch):
    ns = run_notebook("controller_mismatch", tmp_path, monkeypatch)
    # The algebraic loop (1 + G_F) e + G_I z + delta = 0 holds at every instant
    # (measured 2.9e-14 N in the short run, 3.1e-14 N in the full one).
    assert ns["loop_residual"] < 1.2e-13
    # Without integral action the force error settles at -delta / (1 + G_F)
    # (measured -0.13837 N, equal to the prediction to 3.4e-15).
    assert abs(ns["settled"]) > 0.1
    assert abs(ns["settled"] - ns["predicted"]) < 1.5e-14
    # With G_I > 0 it decays at eq. 50's rate K = G_I / (1 + G_F)
    # (measured 1.0000155 /s for G_I = 2 and 5.006 /s for G_I = 10 in the short run).
    np.testing.assert_allclose(ns["rates"][2.0], 1.0, rtol=6e-5)
    np.testing.assert_allclose(ns["rates"][10.0], 5.0, rtol=5e-3)
