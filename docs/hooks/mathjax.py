"""mkdocs hook: serve MathJax from the site itself, so that its maths renders with
no network. MathJax 2.7 comes from the `jupyter-server-mathjax` package (the
Jupyter project's distribution of it on PyPI, a `docs` dependency) and is copied
into `site/javascripts/mathjax/` after the build; `docs/javascripts/mathjax.js`
configures it."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

# The package is MathJax as Jupyter uses it: the combined configuration
# `TeX-AMS-MML_HTMLorMML-full` (TeX input and the HTML-CSS output in one file) with
# the STIX-Web fonts. Its SVG output holds only fonts, without the output itself:
# left out, with the translations (English only).
_SKIP = ("SVG", "localization")


def _static() -> Path:
    # The package's location without importing it (its import needs jupyter_server's
    # application classes, which the docs do not use).
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the docs need MathJax from the jupyter-server-mathjax package: "
            "pip install -e '.[docs]'")
    return Path(spec.origin).parent / "static"


def on_post_build(config, **kwargs) -> None:
    target = Path(config["site_dir"]) / "javascripts" / "mathjax"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(_static(), target, ignore=shutil.ignore_patterns(*_SKIP))
