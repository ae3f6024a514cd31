"""The documentation's Python examples run as written, and print what the pages say
they print.

docs/getting-started.md, the tour (the README's tour is a part of it, which
tests/docs/test_docs.py checks), runs in order in one namespace; every other page of docs/
with ```python blocks runs the same way, each page in its own namespace. Blocks that
read files written by the command line (`np.load`) are skipped; ```py blocks are
shown, not run (each says why).

Every `print` call on a page carries its output in a `# prints: ...` comment, at the
end of the call's last line or on the comment line right after it, and the test
compares what the call prints with it: every number to the digits shown (a figure
shown as 2.4e-03 must round to 2.4e-03, an integer must be equal), the text between
the numbers as written (spacing aside), `...` standing for any text.
"""

import ast
import builtins
import io
import re
import sys
import tokenize
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TOUR = DOCS / "getting-started.md"

_FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_PRINTS = re.compile(r"#\s*prints:\s?(.*)$")
_NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
_TOKEN = re.compile(rf"(\.\.\.)|({_NUMBER})|(\s+)|(.)", re.DOTALL)


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The page's ```python blocks that run here, each with the page line its code
    starts on."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        if "np.load" in match.group(1):  # reads a file the command line writes
            continue
        blocks.append((text.count("\n", 0, match.start(1)) + 1, match.group(1)))
    return blocks


def _pages() -> list[Path]:
    pages = [page for page in sorted(DOCS.glob("*.md")) if python_blocks(page)]
    return sorted(pages, key=lambda page: page != TOUR)  # the tour first


def _expected_prints(start: int, block: str, where: str) -> dict[tuple[int, int], str]:
    """`{(first line, last line) of a print call: the output its comment shows}`, in
    page lines."""
    comments = {}  # line -> (text, whether the line holds nothing else)
    for token in tokenize.generate_tokens(io.StringIO(block).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string,
                                        not token.line[:token.start[1]].strip())
    calls = [node for node in ast.walk(ast.parse(block))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "print"]
    expected, used = {}, set()
    for call in calls:
        last = call.end_lineno
        found = None
        for line, must_be_alone in ((last, False), (last + 1, True)):
            text, alone = comments.get(line, ("", False))
            if (match := _PRINTS.search(text)) and (alone or not must_be_alone):
                found = line, match.group(1).strip()
                break
        span = f"{where}:{start + call.lineno - 1}"
        assert found is not None, (
            f"{span}: a print without a `# prints: ...` comment saying what it prints")
        used.add(found[0])
        expected[(start + call.lineno - 1, start + last - 1)] = found[1]
    stray = [start + line - 1 for line, (text, _) in comments.items()
             if _PRINTS.search(text) and line not in used]
    assert not stray, f"{where}: `# prints:` comments without a print call on lines {stray}"
    return expected


def _rounds_to(printed: str, shown: str) -> bool:
    """Whether the printed number, rounded to the digits of the shown one, is it."""
    mantissa, _, exponent = shown.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    half_unit = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
    return abs(float(printed) - float(shown)) <= half_unit * (1 + 1e-9)


def check_printed(printed: str, shown: str) -> str | None:
    """None if `printed` is what `shown` shows, else why not."""
    pattern, numbers = [r"\s*"], []
    for wildcard, number, space, char in _TOKEN.findall(shown):
        if wildcard:
            pattern.append(r".*?")
        elif number:
            pattern.append(rf"({_NUMBER})")
            numbers.append(number)
        elif space:
            pattern.append(r"\s+")
            continue
        else:
            pattern.append(re.escape(char))
        pattern.append(r"\s*")
    match = re.fullmatch("".join(pattern), printed, re.DOTALL)
    if match is None:
        return "the text differs"
    wrong = [f"{got} is not {want} to the digits shown"
             for got, want in zip(match.groups(), numbers) if not _rounds_to(got, want)]
    return "; ".join(wrong) or None


def run_page(page: Path) -> dict:
    """Run the page's blocks in order in one namespace; check every print."""
    where = str(page.relative_to(ROOT))
    filename = str(page)
    expected, printed = {}, []

    def recording_print(*args, sep=" ", end="\n", file=None, flush=False):
        frame = sys._getframe(1)
        if file is None and frame.f_code.co_filename == filename:
            printed.append((frame.f_lineno, (" " if sep is None else sep).join(map(str, args))))
        builtins.print(*args, sep=sep, end=end, file=file, flush=flush)

    namespace = {"__name__": "docs", "print": recording_print}
    with jax.numpy_dtype_promotion("standard"):  # as a user's session has it
        for start, block in python_blocks(page):
            expected.update(_expected_prints(start, block, where))
            # Padded, so that line numbers (tracebacks, prints) are the page's.
            exec(compile("\n" * (start - 1) + block, filename, "exec"), namespace)

    outputs = {span: [] for span in expected}
    for line, text in printed:
        span = next(s for s in expected if s[0] <= line <= s[1])
        outputs[span].append(text)
    failures = []
    for span, shown in expected.items():
        if len(outputs[span]) != 1:
            failures.append(f"{where}:{span[0]}: printed {len(outputs[span])} times")
            continue
        if (why := check_printed(outputs[span][0], shown)) is not None:
            failures.append(f"{where}:{span[0]}: printed {outputs[span][0]!r}, "
                            f"the page shows {shown!r}: {why}")
    assert not failures, "\n".join(failures)
    namespace["_checked_prints"] = len(expected)
    return namespace


# The tour runs by default; the other guides' examples are long runs (`pytest -m slow`).
@pytest.mark.parametrize("page", [
    pytest.param(page, marks=() if page == TOUR else pytest.mark.slow)
    for page in _pages()], ids=lambda page: page.name)
def test_page_examples_run_and_print_what_the_page_shows(page):
    namespace = run_page(page)
    assert namespace["_checked_prints"] >= 1
    if page == TOUR:  # the tour defines a model of its own and simulates it
        assert "Pendulum" in namespace and "sol" in namespace


def test_the_tour_is_run():
    pages = _pages()
    assert pages[0] == TOUR and len(python_blocks(TOUR)) >= 6


@pytest.mark.parametrize("printed, shown, ok", [
    ("[7.53097549e-02 2.40633760e-03]", "[7.5e-02 2.4e-03]", True),
    ("[0.07530975 0.00240634]", "[7.5e-02 2.4e-03]", True),
    ("[7.53097549e-02 2.46e-03]", "[7.5e-02 2.4e-03]", False),
    ("(1001, 2)", "(1001, 2)", True),
    ("(1001, 3)", "(1001, 2)", False),
    ("2.549279145941027", "2.549", True),
    ("2.5496", "2.549", False),
    ("8.628313619141181e-10", "8.6e-10", True),
    ("9.96e-10", "1.0e-09", True),
    ("(48,) 6.485040842307837e-07", "(48,) 6.5e-07", True),
    ("(48,) 6.485040842307837e-07", "(49,) 6.5e-07", False),
    ("True", "True", True),
    ("True", "False", False),
    ("failed: singular configuration at t = 1.09051 s, q = [-1.2e-10  3.14159265e+00].",
     "... singular configuration ... t = 1.0905 s, q = [0 3.14]...", True),
])
def test_check_printed(printed, shown, ok):
    assert (check_printed(printed, shown) is None) == ok
