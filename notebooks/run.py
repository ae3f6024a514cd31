"""Execute notebooks in place with a Jupyter kernel, at their full settings, so that
their stored outputs (tables, figures) are the full-length results.

    pip install -e ".[notebooks]"
    python notebooks/run.py                 # all notebooks
    python notebooks/run.py braun_goldfarb  # one (name without .ipynb)
    CDIFF_NOTEBOOK_SHORT=1 python notebooks/run.py ...   # the test suite's horizons
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> None:
    paths = [HERE / f"{n}.ipynb" for n in names] if names else sorted(
        HERE.glob("*.ipynb"))
    for path in paths:
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=None, kernel_name="python3",
                       resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
