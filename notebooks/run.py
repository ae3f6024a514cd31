"""Execute notebooks with a Jupyter kernel, at their full settings.

    pip install -e ".[notebooks]"
    python notebooks/run.py                   # all, executed copies in out/notebooks/
    python notebooks/run.py braun_goldfarb    # one (name without .ipynb)
    python notebooks/run.py --update          # rewrite the tracked notebooks' outputs
    CDIFF_NOTEBOOK_SHORT=1 python notebooks/run.py ...   # the test suite's horizons

By default the tracked notebooks are left as they are and the executed copies are
written to `--out` (default `out/notebooks/`, beside the command line's results):
a run at other settings, or one that fails half-way, never overwrites the stored
full-length outputs. `--update` writes them back in place, for a commit.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (default: all)")
    parser.add_argument("--update", action="store_true",
                        help="write the executed notebooks back in place")
    parser.add_argument("--out", type=Path, default=HERE.parent / "out" / "notebooks",
                        help="folder for the executed copies (default: out/notebooks)")
    args = parser.parse_args(argv)
    paths = ([HERE / f"{n.removesuffix('.ipynb')}.ipynb" for n in args.names]
             if args.names else sorted(HERE.glob("*.ipynb")))
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)} (in {HERE})")
    if not args.update:
        args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=None, kernel_name="python3",
                       resources={"metadata": {"path": str(HERE)}}).execute()
        target = path if args.update else args.out / path.name
        nbformat.write(nb, target)
        print(f"{path.name}: {time.perf_counter() - start:.0f} s -> {target}")


if __name__ == "__main__":
    main()
