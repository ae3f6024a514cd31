"""The documentation site (mkdocs.yml, docs/): it builds with `--strict` (a broken
cross-reference, link or anchor fails), every public name has an API entry, and no
docstring or page names a file that is not in the repository."""

import ast
import builtins
import html.parser
import json
import os
import re
import subprocess
import symtable
import sys
import types
from pathlib import Path

import pytest

import cdiff  # imports cdiff.models, .studies, .control and .analysis

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "cdiff"

# The namespaces whose public names must each have a `::: name` entry on an API page.
NAMESPACES = (cdiff, cdiff.models, cdiff.studies, cdiff.control, cdiff.analysis)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """`mkdocs build --strict`, run once for the tests that read the built site:
    `(the finished process, the site's directory)`."""
    site = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict",
               "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    return run, site


def test_mkdocs_build_strict(built_site):
    """`mkdocs build --strict` succeeds; on failure, mkdocs's output says why."""
    run, site = built_site
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{output[-20000:]}"
    for page in ("index.html", "choosing-a-formulation/index.html",
                 "reference-mechanisms/index.html", "api/formulations/index.html",
                 "notebooks/braun_goldfarb/index.html"):
        assert (site / page).is_file(), page
    # The site renders its maths with no network: MathJax is served from it, and no
    # page loads a script from elsewhere (MathJax came from a CDN, so offline every
    # page showed raw \( ... \)).
    # The files MathJax loads with docs/javascripts/mathjax.js's configuration
    # (checked in jsdom too: a page's maths then typesets to HTML-CSS spans).
    mathjax = site / "javascripts" / "mathjax"
    config = (ROOT / "docs" / "javascripts" / "mathjax.js").read_text()
    needed = ["MathJax.js", "extensions/tex2jax.js",
              "jax/output/HTML-CSS/fonts/STIX-Web/fontdata.js",
              "fonts/HTML-CSS/STIX-Web/woff/STIXMathJax_Main-Regular.woff"]
    needed += [f"config/{name}" for name in
               re.findall(r'config: \["([^"]+)"\]', config)]
    needed += [f"extensions/TeX/{name}" for name in re.findall(
        r'"(\w+\.js)"', config.split("TeX: {", 1)[1].split("}", 1)[0])]
    assert len(needed) == 9, needed
    missing = [name for name in needed if not (mathjax / name).is_file()]
    assert not missing, f"MathJax files missing from the site: {missing}"
    external = {}
    for page in site.rglob("*.html"):
        found = re.findall(r"<script[^>]*\bsrc=[\"']?((?:https?:)?//[^\"' >]+)",
                           page.read_text(encoding="utf-8"))
        if found:
            external[str(page.relative_to(site))] = sorted(set(found))
    assert not external, f"pages loading scripts from the network: {external}"
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "javascripts/mathjax/MathJax.js" in index


# What Markdown left unconverted in a built page, in the text a reader sees as prose
# (code, maths and the notebooks' code cells and outputs aside): a list glued to the
# paragraph above it (no blank line before it, or its block indented by 2 spaces
# instead of 4, so that it closes the list), TeX that is not inside maths, and `_`
# or `*` taken as emphasis inside a formula (Φ̇<em>q; ...</em>), which italicises
# the rest of the paragraph.
_PROSE_BLOCKS = {"p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "h5",
                 "h6", "figcaption", "summary", "blockquote"}
_NOT_PROSE_TAGS = {"code", "pre", "kbd", "script", "style", "svg", "textarea",
                   "mjx-container", "math"}
# (`arithmatex`: pymdownx.arithmatex's maths; `MathJax`: maths as typeset; in a
# notebook, `jp-InputArea` and `jp-OutputArea` hold its code and what it printed.)
_NOT_PROSE_CLASSES = {"arithmatex", "MathJax", "MathJax_Display", "MathJax_Preview",
                      "jp-InputArea", "jp-OutputArea", "clipboard-copy-txt",
                      "highlight", "doc-signature", "headerlink"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link",
              "meta", "param", "source", "track", "wbr"}
# A notebook's Markdown keeps its $ ... $ and $$ ... $$ for MathJax.
_NOTEBOOK_MATHS = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.DOTALL)
_RAW_MARKUP = [
    (re.compile(r"\\[()\[\]]|\$\$"), "a TeX delimiter outside maths"),
    (re.compile(r"\$"), "a $ outside maths"),
    (re.compile(r"(?<![\w\\])\\[A-Za-z]{2,}"), "a TeX command outside maths"),
    (re.compile(r"\*\*|__"), "a ** or __ left as text"),
    (re.compile(r"\n[ \t]*(?:[-*+]|\d+\.)[ \t]"), "a list glued to a paragraph"),
]


class _ProseScanner(html.parser.HTMLParser):
    """Scans a built page's main content (Material's `article`) for raw Markdown."""

    def __init__(self, notebook: bool):
        super().__init__(convert_charrefs=True)
        self.notebook = notebook
        self.stack = []  # (tag, inside the article, not prose)
        self.blocks = []  # (tag, text) of the open prose blocks
        self.before = ""  # the prose text just before the current position
        self.found = []

    def _in_article(self):
        return bool(self.stack) and self.stack[-1][1]

    def _not_prose(self):
        return bool(self.stack) and self.stack[-1][2]

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = set((attributes.get("class") or "").split())
        in_article = self._in_article() or (tag == "article")
        not_prose = self._not_prose() or tag in _NOT_PROSE_TAGS or bool(
            classes & _NOT_PROSE_CLASSES)
        if in_article and not not_prose:
            if tag in ("em", "strong"):
                # Emphasis opened inside a word: a `_` or `*` of a formula in prose.
                if re.search(r"[\w\u0300-\u036f]\Z", self.before):
                    self.found.append((f"<{tag}> opened inside a word, after",
                                       self.before[-40:]))
                # attr_list read a {...} after the emphasis (t_{n+1}) as attributes.
                extra = sorted(set(attributes) - {"class", "id", "title"})
                if extra:
                    self.found.append((f"<{tag}> with attributes (a {{...}} of a "
                                       "formula read as attributes)", str(extra)))
            if tag in _PROSE_BLOCKS:
                self.blocks.append([tag, ""])
                self.before = ""
        if tag in _VOID_TAGS:
            return
        self.stack.append((tag, in_article, not_prose))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in _VOID_TAGS and self.stack and self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in _VOID_TAGS:
            return
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                closed = self.stack[i:]
                del self.stack[i:]
                break
        else:
            return
        for name, in_article, not_prose in reversed(closed):
            if (in_article and not not_prose and name in _PROSE_BLOCKS and self.blocks
                    and self.blocks[-1][0] == name):
                self._check(*self.blocks.pop())
            elif in_article and not_prose and not self._not_prose():
                # Code or maths ends: it stands for a word in the prose around it.
                for block in self.blocks:
                    block[1] += "\u2022"
                self.before = "\u2022"

    def handle_data(self, data):
        if not self._in_article() or self._not_prose():
            return
        for block in self.blocks:
            block[1] += data
        self.before = (self.before + data)[-80:]

    def _check(self, tag, text):
        if self.notebook:
            text = _NOTEBOOK_MATHS.sub("\u2022", text)
        for pattern, what in _RAW_MARKUP:
            if pattern.pattern.startswith(r"\n") and tag not in ("p", "li", "dd"):
                continue  # (a list glued to the text above it shows inside its block)
            for match in pattern.finditer(text):
                start, end = max(match.start() - 50, 0), match.end() + 30
                self.found.append((what, text[start:end]))


def raw_markup(site: Path) -> dict[str, list[tuple[str, str]]]:
    """`{page: [(what it shows of raw Markdown, the text there), ...]}` for the
    pages of a built site (code and maths in the text stand as •)."""
    found = {}
    for page in sorted(site.rglob("*.html")):
        name = str(page.relative_to(site))
        if name.startswith(("javascripts/", "assets/")) or name == "404.html":
            continue
        scanner = _ProseScanner(notebook=name.startswith("notebooks/")
                                and name != "notebooks/index.html")
        scanner.feed(page.read_text(encoding="utf-8"))
        scanner.close()
        if scanner.found:
            found[name] = scanner.found
    return found


def test_built_pages_show_no_raw_markdown(built_site):
    """No built page shows Markdown or TeX that was not converted: a list glued to
    the paragraph above it (rendered as "... text - item - item"), maths left as
    text ($, \\( \\), $$, TeX commands), `**`, or emphasis opened inside a formula
    (formulations.md's Δ_q = Φ_q/dt ... t_{n+1} turned half a paragraph italic).
    Reads the site that test_mkdocs_build_strict built."""
    run, site = built_site
    if run.returncode != 0:
        pytest.fail("mkdocs build --strict failed (see test_mkdocs_build_strict)")
    found = raw_markup(site)
    problems = [f"{page}: {what}: {text!r}"
                for page, findings in sorted(found.items()) for what, text in findings]
    assert not problems, "raw Markdown in the built pages:\n" + "\n".join(problems)


def _public_names(module: types.ModuleType) -> set[str]:
    """`__all__` where the module has one, else every name without a leading
    underscore that is not a module (the re-exports of its `__init__.py`)."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return {f"{module.__name__}.{n}" for n in names
            if not isinstance(getattr(module, n), types.ModuleType)}


def test_the_package_lists_its_public_names():
    """`cdiff.__all__` is what `from cdiff import *` and the API pages take: every
    name in it exists, and every public attribute is in it (the standard library
    `importlib` once showed up as `cdiff.importlib`)."""
    import cdiff

    assert all(hasattr(cdiff, name) for name in cdiff.__all__)
    assert "importlib" not in vars(cdiff)
    # (Submodules such as `cdiff.cli` become attributes once imported.)
    public = {n for n, value in vars(cdiff).items()
              if not n.startswith("_") and not isinstance(value, types.ModuleType)}
    listed = {n for n in cdiff.__all__
              if not isinstance(getattr(cdiff, n), types.ModuleType)}
    assert public == listed, public ^ listed
    assert {"analysis", "control", "models", "studies"} <= set(cdiff.__all__)


def test_former_names_warn_and_point_to_the_new_ones():
    import cdiff

    for old, new in [("DAEResults", cdiff.RESULTS),
                     ("AbstractStateFeedback", cdiff.control.AbstractStateFeedback),
                     ("ControlAffine", cdiff.control.ControlAffine)]:
        with pytest.warns(DeprecationWarning, match=f"cdiff.{old} is deprecated"):
            assert getattr(cdiff, old) is new
        assert old not in cdiff.__all__
    with pytest.raises(AttributeError):  # the alias is gone: cdiff.studies has it
        cdiff.models.acceptance  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        cdiff.nothing  # noqa: B018


def _api_entries() -> dict[str, str]:
    entries = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            if match := re.match(r"^:::\s+(\S+)\s*$", line):
                entries[match.group(1)] = page.name
    return entries


def test_every_public_name_has_an_api_entry():
    entries = _api_entries()
    public = set()
    for module in NAMESPACES:
        public |= _public_names(module)
    missing = sorted(public - set(entries))
    assert not missing, f"public names without a `::: name` entry in docs/api/*.md: {missing}"
    # And no entry names something that is not there (a renamed or removed object).
    stale = sorted(e for e in entries if e not in public
                   and e not in {m.__name__ for m in NAMESPACES})
    assert not stale, f"API entries that are not public names: {stale}"


# Files that are not in the repository (the project's specification lives outside
# it): a page or a docstring must not send a reader to them.
_OUTSIDE = re.compile(r"REFERENCE\.md|\bpapers/|\.\./shared|/work/|\bshared/[\w.-]+\.md")
# A repository path named in a page or docstring must exist (generated outputs, such
# as benchmarks/out/*.png or out/MODEL.npz, are not checked).
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:benchmarks|tests|notebooks|cdiff|docs)/[\w./-]*\.(?:py|md|ipynb|xml|urdf))\b")


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            is_string = (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                         and isinstance(stmt.value.value, str))
            # The docstring of a module, class or function, and attribute docstrings
            # (a string right after an assignment).
            if is_string and (i == 0 or isinstance(body[i - 1], (ast.Assign, ast.AnnAssign))):
                yield stmt.lineno, stmt.value.value


def _texts():
    for path in sorted(PACKAGE.rglob("*.py")):
        for lineno, text in _docstrings(path):
            yield f"{path.relative_to(ROOT)}:{lineno}", text
    for path in sorted(DOCS.rglob("*.md")):
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
    for path in sorted(DOCS.rglob("*.ipynb")):  # the notebooks, rendered as pages
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                yield f"{path.relative_to(ROOT)} cell {i}", "".join(cell["source"])
    yield "mkdocs.yml", (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_no_page_or_docstring_names_a_file_outside_the_repository():
    outside, absent = [], []
    for where, text in _texts():
        outside += [f"{where}: {m.group(0)!r}" for m in _OUTSIDE.finditer(text)]
        # (Link targets and nav entries are relative to docs/.)
        absent += [f"{where}: {m.group(1)!r}" for m in _REPO_PATH.finditer(text)
                   if not (ROOT / m.group(1)).exists() and not (DOCS / m.group(1)).exists()]
    assert not outside, "names a file outside the repository:\n" + "\n".join(outside)
    assert not absent, "names a repository file that does not exist:\n" + "\n".join(absent)



_HELP_BLOCK = re.compile(r"### `(cdiff[^`]*) --help`\n\n```text\n(.*?)```", re.DOTALL)


def _help_text(command: str, capsys, monkeypatch) -> str:
    from cdiff import cli

    monkeypatch.setenv("COLUMNS", "88")
    with pytest.raises(SystemExit):
        cli.main([*command.split()[1:], "--help"])
    return capsys.readouterr().out


def test_command_line_page_shows_the_current_help(capsys, monkeypatch):
    """docs/cli.md's copies of `cdiff ... --help` are the parser's output (at 88
    columns), so an option added to the command line fails here until the page
    has it."""
    page = (ROOT / "docs" / "cli.md").read_text()
    blocks = _HELP_BLOCK.findall(page)
    assert {command for command, _ in blocks} >= {"cdiff", "cdiff list", "cdiff run",
                                                 "cdiff study"}
    for command, text in blocks:
        assert text == _help_text(command, capsys, monkeypatch), command


_FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _global_names_used(table: symtable.SymbolTable, top: bool = True) -> set[str]:
    """Names a block reads from the module namespace without binding them itself."""
    names = set()
    for symbol in table.get_symbols():
        if symbol.is_referenced() and (
                (top and not symbol.is_assigned() and not symbol.is_imported())
                or (not top and symbol.is_global())):
            names.add(symbol.get_name())
    for child in table.get_children():
        names |= _global_names_used(child, top=False)
    return names


def test_the_readme_code_is_the_sites():
    """Every Python block of the README is one of the site's (docs/getting-started.md,
    or a guide page), which tests/docs/test_readme.py executes, checking every value it
    prints against its `# prints:` comment: the README's tour is run, not only shown.
    The blocks come in the page's order, and each reads only names that the README's
    earlier blocks (or the block itself) define, so the README runs as written too."""
    readme = _FENCE.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(readme) >= 4, "the README's tour has no Python blocks"
    tour = _FENCE.findall((DOCS / "getting-started.md").read_text(encoding="utf-8"))
    site = [block for page in sorted(DOCS.glob("*.md"))
            for block in _FENCE.findall(page.read_text(encoding="utf-8"))]
    missing = [block.splitlines()[0] for block in readme if block not in site]
    assert not missing, f"README blocks that no site page has (not executed): {missing}"
    in_tour = [tour.index(block) for block in readme if block in tour]
    assert in_tour == sorted(in_tour), "the README's blocks are not in the tour's order"
    defined, undefined = set(dir(builtins)), []
    for block in readme:
        table = symtable.symtable(block, "README.md", "exec")
        own = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
        undefined += [f"{block.splitlines()[0]!r}: {name}"
                      for name in sorted(_global_names_used(table) - defined - own)]
        defined |= own
    assert not undefined, f"README blocks read names no earlier block defines: {undefined}"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository (the site's
    pages are linked as docs/*.md, so that they work on GitHub too)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [target for target in _LINK.findall(readme) if "://" not in target]
    assert links, "the README links no page of the site"
    broken = [target for target in links
              if not (ROOT / target.split("#")[0]).is_file()]
    assert not broken, f"README links to files that do not exist: {broken}"


def test_the_front_pages_name_every_guide():
    """The README and the site's home page link every guide of docs/ that a user
    needs to find (unilateral constraints were on neither)."""
    for page, prefix in ((ROOT / "README.md", "docs/"), (DOCS / "index.md", "")):
        text = page.read_text(encoding="utf-8")
        for guide in ("unilateral.md", "mujoco.md", "formulations.md", "errors.md",
                      "limitations.md"):
            assert f"]({prefix}{guide}" in text, f"{page.name} does not link {guide}"


def test_the_repository_root_holds_no_stray_archives():
    """No build output or download is committed at the top level (an unrelated
    sdist was, for a week)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    stray = [f for f in tracked if "/" not in f
             and f.endswith((".tar.gz", ".whl", ".zip", ".tgz"))]
    assert not stray, stray
