"""The unilateral-constraints notebook runs (short horizon) and its claims hold."""
import pytest
from notebook_runner import run_notebook

# A notebook is a long run: not in the default run (`pytest -m slow`).
pytestmark = pytest.mark.slow


def test_unilateral_notebook(tmp_path, monkeypatch):
    ns = run_notebook("unilateral", tmp_path, monkeypatch)
    failed = [claim for claim, _, ok in ns["claims"] if not ok]
    assert not failed, failed
    # MuJoCo's soft limit approaches cdiff's exact one as its time constant shrinks.
    assert ns["measured"]["mjcf converges"]
