"""The package's structure: each folder (or module) a layer, imports only downward.

Parses every import in `cdiff/` (those inside functions and those under
`if TYPE_CHECKING:` too: an import for annotations is still a dependency) and
fails on an import of a higher layer and on a cycle among modules. `benchmarks/` has no cycle and no
script named like a package it imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The layers, lowest first: a module may import its own layer and those below.
#: A name is a module or a package (all the modules under it).
LAYERS = [
    # Kernels: flags, result codes, linear algebra, drawings, the caches.
    ["cdiff._compiler", "cdiff._reschedule", "cdiff._results", "cdiff._linalg",
     "cdiff._sketch", "cdiff._cache", "cdiff._export"],
    # The model interface: what a model is, its kinematics and mass matrix.
    ["cdiff._kinematics", "cdiff._model", "cdiff._mass"],
    # Drawing a model's motion; projections onto the constraints.
    ["cdiff._animate", "cdiff._projection", "cdiff._consistent", "cdiff._coulomb",
     "cdiff._impact"],
    ["cdiff._formulation"],
    # The driver: solution, problem, solvers, simulate.
    ["cdiff._solution"],
    ["cdiff._problem"],
    ["cdiff._solver"],
    ["cdiff._routes"],
    ["cdiff._checks"],
    ["cdiff._simulate"],
    # Built on the driver.
    ["cdiff.models", "cdiff.analysis", "cdiff.control"],
    ["cdiff.studies"],
    ["cdiff"],  # the package root: re-exports
    ["cdiff.cli"],  # the command line, on the public API
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            for child in node.body:
                lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def _imports(folder: str) -> dict[str, set[tuple[str, int]]]:
    """Each module of `folder` -> the modules of `folder` it imports (and where)."""
    paths = {_module_name(p): p for p in (ROOT / folder).rglob("*.py")}
    if folder != "cdiff":  # scripts: imported by their bare names
        paths = {p.stem: p for p in paths.values()}
    edges: dict[str, set[tuple[str, int]]] = {m: set() for m in paths}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = set() if folder == "cdiff" else _type_checking_lines(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target in paths and target != module:
                    edges[module].add((target, node.lineno))
    return edges


def _layer(module: str) -> int:
    best, index = -1, None
    for i, layer in enumerate(LAYERS):
        for name in layer:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, index = len(name), i
    assert index is not None, f"{module} is in no layer: add it to LAYERS"
    return index


def _cycles(edges) -> list[list[str]]:
    """The cycles among modules (one per strongly connected component)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(1000, 10 * len(edges)))
    for v in edges:
        if v not in index:
            visit(v)
    return out


#: Deprecation aliases, the only imports allowed upward (remove with the alias).
DEPRECATED: set[tuple[str, str]] = set()


def test_cdiff_imports_only_downward():
    edges = _imports("cdiff")
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)}), line {line}"
              for m, targets in sorted(edges.items())
              for t, line in sorted(targets)
              if _layer(t) > _layer(m) and (m, t) not in DEPRECATED]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_cdiff_has_no_import_cycle():
    edges = _imports("cdiff")
    for m, t in DEPRECATED:
        edges[m] = {(target, line) for target, line in edges[m] if target != t}
    assert not _cycles(edges)


#: Where `simulate` decides what a formulation or solver can do: by what its class
#: declares, not by a list of cdiff's concrete classes.
DECIDERS = ["cdiff/_checks.py", "cdiff/_routes.py", "cdiff/_problem.py"]


def _own_classes(tree: ast.AST) -> set[str]:
    """The names a module imports from cdiff's own modules (relative imports)."""
    return {alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level
            for alias in node.names}


def _whitelists(source: str, path: str = "<test>") -> list[str]:
    """`type(x) is C`, `type(x) in (C, D)` and `isinstance(x, C)` where `C` is one
    of cdiff's concrete classes (imported from its own modules, not `Abstract...`)."""
    tree = ast.parse(source, path)
    own = _own_classes(tree)

    def concrete(node) -> list[str]:
        names = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [n.id for n in names if isinstance(n, ast.Name) and n.id in own
                and not n.id.startswith("Abstract")]

    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                and isinstance(node.left.func, ast.Name)
                and node.left.func.id == "type"):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn, ast.Eq,
                                   ast.NotEq)):
                    found += [f"{path}:{node.lineno} type(...) against {c}"
                              for c in concrete(right)]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2):
            found += [f"{path}:{node.lineno} {node.func.id}(..., {c})"
                      for c in concrete(node.args[1])]
    return found


def test_capabilities_are_declared_not_whitelisted():
    found = [hit for path in DECIDERS
             for hit in _whitelists((ROOT / path).read_text(), path)]
    assert not found, ("decisions by concrete class (declare a capability on the "
                       "class instead, e.g. `supports_unilateral`, `own_loop`):\n"
                       + "\n".join(found))


def test_benchmarks_have_no_cycle_and_shadow_no_package():
    edges = _imports("benchmarks")
    assert not _cycles(edges)
    shadowing = [name for name in edges
                 if name in sys.stdlib_module_names
                 or name in {"mujoco", "jax", "diffrax", "equinox", "scipy", "numpy",
                             "matplotlib", "optax", "lineax", "optimistix", "cdiff"}]
    assert not shadowing, f"benchmark scripts named like packages: {shadowing}"


def test_the_checker_finds_what_it_should():
    # Control: the layering above sees an upward import and a cycle when given one.
    edges = {"a": {("b", 1)}, "b": {("c", 2)}, "c": {("a", 3)}, "d": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _layer("cdiff._formulation.dae") > _layer("cdiff._projection")
    assert _layer("cdiff.cli") > _layer("cdiff") > _layer("cdiff.studies")
    # ... and a whitelist of concrete classes when given one.
    source = ("from ._solver.bdf import BDF\nfrom ._x import AbstractThing, GGL, IndexOne\n"
              "a = type(f) in (GGL, IndexOne)\nb = isinstance(s, BDF)\n"
              "c = isinstance(s, AbstractThing)\nd = type(t) is not GGL\n"
              "e = isinstance(a, diffrax.ForwardMode)\n")
    assert [hit.split(" ", 1)[1] for hit in _whitelists(source)] == [
        "type(...) against GGL", "type(...) against IndexOne", "isinstance(..., BDF)",
        "type(...) against GGL"]
