"""Running a notebook of `notebooks/` as the test suite does: every code cell, in
order, in one namespace, with `CDIFF_NOTEBOOK_SHORT=1` (the notebook's own short
horizon, a parameter in its first code cell), in a temporary directory, on the Agg
backend. No Jupyter kernel is needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(name: str, tmp_path: Path, monkeypatch) -> dict:
    """Execute `notebooks/<name>.ipynb`; returns its namespace."""
    import matplotlib

    matplotlib.use("Agg")
    path = NOTEBOOKS / f"{name}.ipynb"
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    # Each notebook begins with what the paper claims and ends with what cdiff
    # measured (markdown), with a parameter cell first among the code cells.
    assert cells[0]["cell_type"] == "markdown", "begin with the paper's claims"
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert "CDIFF_NOTEBOOK_SHORT" in code[0], "first code cell: the parameters"
    monkeypatch.setenv("CDIFF_NOTEBOOK_SHORT", "1")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    with jax.numpy_dtype_promotion("standard"):  # as a user's session has it
        for i, source in enumerate(code):
            if source.lstrip().startswith(("%", "!")):
                raise AssertionError(f"{path.name}: cell {i} uses IPython syntax")
            exec(compile(source, f"{path.name}:cell{i}", "exec"), namespace)
    assert namespace.get("SHORT") is True
    assert os.environ["CDIFF_NOTEBOOK_SHORT"] == "1"
    return namespace
