"""The README's Python examples run as written (in order, in one namespace), so the
tour cannot drift from the library. Blocks that read files written by the command
line are skipped."""

import re
from pathlib import Path

import jax

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    text = README.read_text()
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL)
            if "np.load" not in b]


def test_readme_examples_run(capsys):
    blocks = _python_blocks()
    assert len(blocks) >= 6
    namespace = {"__name__": "readme"}
    with jax.numpy_dtype_promotion("standard"):  # as a user's session has it
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "(1001, 2)" in out  # the first printed result of the tour
    # The projection example's constraint error is at round-off.
    assert float(namespace["sol"].max_constraint_error) < 1e-14
