"""Compiled programs kept across processes as `jax.export` programs.

JAX's persistent compilation cache (`cdiff.use_compilation_cache`) keeps what XLA
makes of a program, looked up by the lowered program itself: a second process
still traces and lowers its function (seconds to a minute for a loaded MuJoCo
model) before it can look. This module keeps the lowered program (StableHLO,
serialized by `jax.export`) under a key computed *without tracing*, from what the
program is made of:

- the process: cdiff's version and a hash of its source files, the versions of
  Python, jax, jaxlib and cdiff's dependencies, JAX's tracing settings
  (`jax_enable_x64`, the dtype promotion, ...), Equinox's `EQX_ON_ERROR`, the
  backend and the device kind;
- the function: its code (where it lives, and for code outside installed packages
  the hash of its source files), the values of the globals and closure variables
  it reads, and every setting bound to it (`functools.partial` arguments);
- the arguments: their tree structure and static values (as `eqx.filter_jit`
  splits them: arrays are inputs, everything else is part of the program), and
  each array's shape, dtype and weak type.

A second process computes the same key, reads the program, and has XLA compile
it, which is a persistent-cache hit (these programs are kept there whatever
their compile time): nothing is traced and nothing is compiled.

What cannot be described deterministically is not cached: the call goes to a
plain `eqx.filter_jit` (logged at debug level on the `cdiff` logger). That is
code without a source file (a notebook cell, `python -c`), an object whose state
lives in C (a lock, an open file), a source file modified after the process
started (the code in memory may not be what the file now says), calls under an
outer `jax.jit`, `jax.vmap` or `jax.grad` (the arguments are tracers), and
programs `jax.export` refuses (host callbacks: `eqx.error_if` with the default
`EQX_ON_ERROR=raise`, progress bars, `jax.debug.print`; custom calls without
compatibility guarantees). The last are remembered on disk (a `.jit` marker), so
that later processes go to `jax.jit` at once.

The key cannot see what a function reads at trace time from outside its
arguments, globals and closure: files, environment variables, mutable state of
other modules. Such functions must take those values as arguments (or not be
cached): that is `jax.jit`'s own contract within one process.

The folder is `<jax_compilation_cache_dir>/exported`, off when JAX's cache is
off. Files are written atomically (a temporary file, then `os.replace`), so that
several processes may share the folder, and carry a checksum: a damaged file is
ignored and written again. So is an entry of JAX's own cache that JAX cannot read
(JAX warns, compiles, and would never write over it; see `_compile_exported`).
Loading a file unpickles it: keep the folder as private as JAX's own cache, which
holds executable code.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import pickle
import site
import sys
import sysconfig
import tempfile
import time
import types
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jaxlib
import numpy as np

logger = logging.getLogger("cdiff")

#: The layout of the files and the recipe of the key; a change of either must
#: change this number, so that old files are never read as new ones.
FORMAT = 1
_MAGIC = b"cdiff-exported-program\n"
_SUFFIX = ".exported"
_NO_EXPORT_SUFFIX = ".jit"  # a marker: this key's program cannot be exported
_RECENT = 256  # calls a `CachedJit` remembers by the identity of their statics


class Unkeyable(Exception):
    """Something the key cannot describe deterministically: the call is not
    cached."""


# --------------------------------------------------------------------------
# Where code comes from


def _process_start() -> float:
    """The wall-clock time this process started (Linux's /proc), else the time
    this module was imported."""
    now = time.time()
    try:
        with open("/proc/self/stat") as f:
            ticks = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return min(now, now - (uptime - ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError, AttributeError):
        return now


_PROCESS_START = _process_start()
_CDIFF_DIR = Path(__file__).resolve().parent


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@functools.cache
def _roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The folders of installed packages (site-packages) and of the standard
    library, resolved."""
    paths = sysconfig.get_paths()
    sites = {paths.get("purelib"), paths.get("platlib")}
    try:
        sites.update(site.getsitepackages())
        sites.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old `site` module
        pass
    sites.update(p for p in sys.path
                 if os.path.basename(p) in ("site-packages", "dist-packages"))
    stdlib = {paths.get("stdlib"), paths.get("platstdlib")}
    return _resolved(sites), _resolved(stdlib)


def _resolved(paths) -> tuple[str, ...]:
    return tuple(sorted({os.path.realpath(p) for p in paths if p}))


@functools.cache
def _versions(top: str) -> tuple[tuple[str, str], ...]:
    """The distributions installing the top-level package `top`, and their
    versions: the one of the same name (jax, equinox, mujoco, ...; found at
    once), else those that `importlib.metadata` finds in a scan of every
    installed distribution (half a second, once per process)."""
    try:
        return ((top, importlib.metadata.version(top)),)
    except importlib.metadata.PackageNotFoundError:
        pass
    names = sorted(set(_distributions().get(top, ())))
    return tuple((n, importlib.metadata.version(n)) for n in names)


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _origin(filename: str) -> tuple:
    """Where the code in `filename` comes from, as the key writes it: `("cdiff",
    relative path)` (cdiff's source hash is in the key), `("python", path)` (the
    standard library: Python's version is in the key), `("dist", relative path,
    ((name, version), ...))` (an installed distribution), or `("file", absolute
    path)`: code of yours, whose file's contents go in the key."""
    if filename.startswith("<frozen "):
        return ("python", filename)
    if not filename or filename.startswith("<") or not os.path.isfile(filename):
        raise Unkeyable(f"code without a source file ({filename or 'unknown'})")
    path = os.path.realpath(filename)
    if _under(path, str(_CDIFF_DIR)):
        return ("cdiff", os.path.relpath(path, _CDIFF_DIR))
    sites, stdlib = _roots()
    for root in sites:
        if _under(path, root):
            relative = os.path.relpath(path, root)
            versions = _versions(relative.split(os.sep)[0].split(".")[0])
            if versions:
                return ("dist", relative, versions)
            return ("file", path)  # in site-packages, but from no distribution
    for root in stdlib:
        if _under(path, root):
            return ("python", os.path.relpath(path, root))
    return ("file", path)


_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def _file_digest(path: str) -> str:
    """sha256 of a source file; `Unkeyable` if it was modified (or its status
    changed) after this process started: the code in memory may then not be the
    code in the file."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise Unkeyable(f"cannot read {path}: {e.strerror}") from None
    if max(stat.st_mtime, stat.st_ctime) > _PROCESS_START:
        raise Unkeyable(f"{path} was modified after this process started")
    token = (path, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)
    if token not in _DIGESTS:
        with open(path, "rb") as f:
            _DIGESTS[token] = hashlib.sha256(f.read()).hexdigest()
    return _DIGESTS[token]


def tree_digest(root: Path) -> str:
    """sha256 of the `.py` files under `root` (their paths and contents);
    `Unkeyable` if one was modified after this process started."""
    h = hashlib.sha256()
    files = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    for path in files:
        h.update(os.path.relpath(path, root).encode() + b"\0")
        h.update(_file_digest(path).encode())
    return h.hexdigest()


def cdiff_source_hash() -> str:
    """sha256 of cdiff's source files: a program made by other cdiff code never
    matches, whatever the version number says."""
    return tree_digest(_CDIFF_DIR)


#: cdiff's optional dependencies that run while tracing (MuJoCo models).
_TRACED_EXTRAS = ("mujoco",)


@functools.cache
def _dependency_versions() -> tuple[tuple[str, str], ...]:
    """The installed versions of cdiff's dependencies and theirs (diffrax,
    equinox, lineax, optax, ..., and MJX where installed): the code they run
    while cdiff traces. (Not the test and documentation tools.)"""
    import re

    found: dict[str, str] = {}
    todo = ["cdiff"]
    while todo:
        package = todo.pop()
        try:
            requires = importlib.metadata.requires(package) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            extra = re.search(r"extra\s*==\s*['\"]([\w.-]+)['\"]", requirement)
            if extra and not (package == "cdiff"
                              and extra.group(1) in _TRACED_EXTRAS):
                continue
            name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower()
            if not name or name in found:
                continue
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:  # not installed
                continue
            todo.append(name)
    return tuple(sorted(found.items()))


@functools.cache
def _cdiff_version() -> str:
    try:
        return importlib.metadata.version("cdiff")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return "0.0.0"


def _device() -> tuple[str, str, str]:
    """The default backend's platform, device kind and platform version."""
    device = jax.devices()[0]
    return (device.platform, device.device_kind,
            str(getattr(device.client, "platform_version", "")))


def _trace_context() -> tuple:
    """JAX's settings that change what a function traces to, the ones `jax.jit`
    keys its own cache on (x64, dtype promotion, default matmul precision, the
    mesh and axis contexts, ...), as names and plain values."""
    from jax._src import config as jax_config

    values = jax_config.trace_context()
    try:
        names = jax_config.trace_context_names()
    except NotImplementedError:  # an older jaxlib: the values, in order
        names = range(len(values))
    return tuple((str(name), _describe(value)) for name, value in zip(names, values))


def _describe(value) -> Any:
    """A setting as plain data: containers item by item (sets sorted), objects
    with `__slots__` slot by slot, anything else by its repr; `Unkeyable` where
    the repr holds a memory address."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(_describe(v)) for v in value))
    if hasattr(value, "items") and callable(value.items):
        return tuple(sorted((repr(_describe(k)), repr(_describe(v)))
                            for k, v in value.items()))
    slots = [n for n in getattr(type(value), "__slots__", ()) if n != "__weakref__"]
    if slots and not isinstance(value, enum.Enum):
        return (type(value).__qualname__,
                tuple((n, _describe(getattr(value, n, None))) for n in slots))
    text = repr(value)
    if " at 0x" in text:
        raise Unkeyable(f"JAX's setting {text}")
    return text


def _equinox_settings() -> tuple:
    """Equinox's settings from the environment that change programs:
    `EQX_ON_ERROR` (`nan` or `off` turn `eqx.error_if`'s checks into NaNs or
    nothing, and programs that raise into programs that can be stored)."""
    from equinox import _config

    return (_config.EQX_ON_ERROR, _config.EQX_ON_ERROR_BREAKPOINT_FRAMES)


def _environment() -> str:
    """The process's part of the key, as text (recomputed at each call: it is
    cheap, and a test may change any of it)."""
    return repr((
        ("format", FORMAT),
        ("python", sys.version),
        ("cdiff", _cdiff_version(), cdiff_source_hash()),
        ("jax", jax.__version__),
        ("jaxlib", jaxlib.__version__),
        ("dependencies", _dependency_versions()),
        ("jax_enable_x64", bool(jax.config.jax_enable_x64)),
        ("trace_context", _trace_context()),
        ("equinox", _equinox_settings()),
        ("export_calling_convention",
         jax.config.jax_export_calling_convention_version),
        ("backend", jax.default_backend(), _device()),
    ))


# --------------------------------------------------------------------------
# Fingerprints


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _written_in_python(cls: type) -> bool:
    """Whether `cls` and its bases (`object` aside) are defined in `.py` files:
    then an object's state is in its `__dict__` and slots, which the key reads
    (a C object, such as a lock or a file, keeps its state out of sight)."""
    for kls in cls.__mro__[:-1]:
        file = getattr(sys.modules.get(kls.__module__), "__file__", None) or ""
        if not file.endswith(".py"):
            return False
    return True


def _slot_names(cls: type) -> list[str]:
    """The attributes that `__slots__` declare along `cls`'s MRO (private names
    mangled, as they are stored)."""
    names = []
    for kls in cls.__mro__:
        slots = kls.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{kls.__name__.lstrip('_')}{name}"
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _Fingerprint:
    """A sha256 of a stream of tagged, length-prefixed records describing values:
    equal streams for equal programs, whatever the process (no `id`, no `hash`
    of strings, no memory address)."""

    def __init__(self):
        self._h = hashlib.sha256()
        self._seen: dict[int, int] = {}  # id -> position, for shared and cyclic refs
        self._alive: list[Any] = []  # keep ids unique while hashing
        self._files: set[str] = set()  # user source files already in the stream
        self._classes: set[type] = set()  # user classes whose body is in it

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def atom(self, tag: str, data: bytes | str = b"") -> None:
        if isinstance(data, str):
            data = data.encode()
        self._h.update(f"{tag}:{len(data)}:".encode())
        self._h.update(data)

    def _first_visit(self, x) -> bool:
        key = id(x)
        if key in self._seen:
            self.atom("ref", str(self._seen[key]))
            return False
        self._seen[key] = len(self._seen)
        self._alive.append(x)
        return True

    # -- values ------------------------------------------------------------

    def feed(self, x) -> None:  # noqa: C901  (one dispatch on the kind of value)
        t = type(x)
        if x is None or t in (bool, int, float, complex, str):
            self.atom(t.__name__, repr(x))
            return
        if t is bytes:
            self.atom("bytes", x)
            return
        if x is Ellipsis:
            self.atom("...")
            return
        if t in (slice, range):
            self.atom(t.__name__)
            for part in (x.start, x.stop, x.step):
                self.feed(part)
            return
        if isinstance(x, (np.ndarray, np.generic)):
            self._numpy(np.asarray(x))
            return
        if isinstance(x, jax.core.Tracer):
            raise Unkeyable("a traced value outside the arguments")
        if isinstance(x, jax.Array):
            self.atom("jax.Array", f"weak={bool(x.weak_type)}")
            self._numpy(np.asarray(x))
            return
        if isinstance(x, np.dtype):
            self.atom("dtype", x.str)
            return
        # Functions, classes, containers, objects: once each (cycles; a value
        # shared in one process is shared in another running the same code).
        if not self._first_visit(x):
            return
        if isinstance(x, type):
            self._type(x)
        elif isinstance(x, types.ModuleType):
            self._module(x)
        elif isinstance(x, types.FunctionType):
            self._function(x)
        elif isinstance(x, types.MethodType):
            self.atom("method")
            self.feed(x.__self__)
            self.feed(x.__func__)
        elif isinstance(x, functools.partial):
            self.atom("partial")
            self.feed(x.func)
            self.feed(x.args)
            self.feed(x.keywords)
        elif isinstance(x, (types.BuiltinFunctionType, np.ufunc)):
            self._builtin(x)
        elif t in (tuple, list):
            self.atom(t.__name__, str(len(x)))
            for item in x:
                self.feed(item)
        elif t is dict:
            self.atom("dict", str(len(x)))
            for k, v in x.items():
                self.feed(k)
                self.feed(v)
        elif t in (set, frozenset):
            digests = []
            for item in x:
                sub = _Fingerprint()
                sub.feed(item)
                digests.append(sub.hexdigest())
            self.atom(t.__name__, ",".join(sorted(digests)))
        elif isinstance(x, inspect.Signature):  # kept by decorators (jaxtyping)
            self.atom("signature")
            for parameter in x.parameters.values():
                self.atom("parameter", f"{parameter.name}:{parameter.kind.name}")
                self.feed(parameter.default)
                self.feed(parameter.annotation)
            self.feed(x.return_annotation)
        elif isinstance(x, enum.Enum):
            self.atom("enum")
            self._type(t)
            self.feed(x.name)
        elif self._pytree(x):
            pass
        elif dataclasses.is_dataclass(x):
            self.atom("dataclass")
            self._type(t)
            for field in dataclasses.fields(x):
                self.feed(field.name)
                self.feed(getattr(x, field.name))
        elif isinstance(x, (types.GenericAlias, types.UnionType)) or (
                t.__module__ == "typing"):
            self.atom("annotation", repr(x))
        elif callable(x) and hasattr(x, "__wrapped__"):  # jax.jit, custom_jvp, ...
            self.atom("wrapper")
            self._type(t)
            self.feed(x.__wrapped__)
            for name, value in sorted(getattr(x, "__dict__", {}).items()):
                if not name.startswith("_"):
                    self.feed(name)
                    self.feed(value)
        elif _written_in_python(t):  # an object of a class written in Python
            self.atom("object")
            self._type(t)  # its code
            for name in _slot_names(t):  # and its state
                self.atom("slot", name)
                if hasattr(x, name):
                    self.feed(getattr(x, name))
            for name, value in sorted(getattr(x, "__dict__", {}).items()):
                self.atom("attribute", name)
                self.feed(value)
        else:  # a C object (a lock, a file, ...): no state the key can read
            raise Unkeyable(f"a {t.__module__}.{t.__qualname__} object")

    def _numpy(self, a: np.ndarray) -> None:
        if a.dtype.hasobject:
            raise Unkeyable("a NumPy array of Python objects")
        self.atom("ndarray", f"{a.dtype.str}{a.shape}")
        self.atom("data", np.ascontiguousarray(a).tobytes())

    def _pytree(self, x) -> bool:
        leaves, treedef = jax.tree_util.tree_flatten(x)
        if jax.tree_util.treedef_is_leaf(treedef) and leaves and leaves[0] is x:
            return False
        self.atom("pytree")
        self.treedef(treedef)
        for leaf in leaves:
            self.feed(leaf)
        return True

    def treedef(self, treedef) -> None:
        """A tree structure: each node's type and auxiliary data (an
        `equinox.Module`'s static fields among them), depth first."""
        data = treedef.node_data()
        if data is None:
            self.atom("*")
        else:
            kind, aux = data
            self.atom("node", str(treedef.num_nodes))
            self._type(kind)
            self.feed(aux)
        children = treedef.children()
        self.atom("children", str(len(children)))
        for child in children:
            self.treedef(child)

    # -- code --------------------------------------------------------------

    def _source(self, origin: tuple, module: types.ModuleType | None) -> None:
        """The origin of some code; for a file of yours, its contents and those of
        the modules of yours it imports."""
        if origin[0] != "file":
            self.atom("origin", repr(origin))
            return
        self._user_files(origin[1], module)

    def _user_files(self, path: str, module: types.ModuleType | None) -> None:
        """`path`'s digest, and when it is `module`'s file, the digests of the
        files of the modules of yours that `module` refers to (what it imports,
        directly or by importing names from them), transitively: code reached
        through `helpers.f()` is covered."""
        todo = [(path, module)]
        while todo:
            path, module = todo.pop()
            if path in self._files:
                continue
            self._files.add(path)
            self.atom("file", path)
            self.atom("sha256", _file_digest(path))
            if module is None or getattr(module, "__file__", None) is None or (
                    os.path.realpath(module.__file__) != path):
                continue
            for name, value in sorted(vars(module).items()):
                other = value if isinstance(value, types.ModuleType) else (
                    sys.modules.get(getattr(value, "__module__", None) or "")
                    if isinstance(value, (type, types.FunctionType)) else None)
                other_file = getattr(other, "__file__", None)
                if other is None or other is module or other_file is None:
                    continue
                origin = _origin(other_file)
                if origin[0] == "file":
                    todo.append((origin[1], other))
                else:
                    self.atom("imports", repr((other.__name__, origin)))

    def _module(self, module: types.ModuleType) -> None:
        file = getattr(module, "__file__", None)
        self.atom("module", module.__name__)
        if file is None:
            if module.__name__ not in sys.builtin_module_names:
                raise Unkeyable(f"module {module.__name__} has no source file")
            return
        self._source(_origin(file), module)

    def _type(self, cls: type) -> None:
        """A class: where each class of its MRO is defined; for classes of yours,
        also the values of their class attributes and what their methods read
        (their code is in the file's digest)."""
        self.atom("class", f"{cls.__module__}.{cls.__qualname__}")
        for kls in cls.__mro__:
            module = sys.modules.get(kls.__module__)
            file = getattr(module, "__file__", None)
            if file is None:
                if kls.__module__ not in ("builtins", *sys.builtin_module_names):
                    raise Unkeyable(f"class {kls.__qualname__} has no source file")
                self.atom("builtin", f"{kls.__module__}.{kls.__qualname__}")
                continue
            origin = _origin(file)
            self.atom("base", f"{kls.__module__}.{kls.__qualname__}")
            self._source(origin, module)
            if origin[0] == "file" and kls not in self._classes:
                self._classes.add(kls)
                self._class_body(kls)

    def _class_body(self, kls: type) -> None:
        for name, value in sorted(vars(kls).items()):
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = (value.fget, value.fset, value.fdel)
            elif isinstance(value, functools.cached_property):
                value = value.func
            if _is_dunder(name) or name.startswith("_abc_"):
                # The class's machinery (the dataclass's generated methods and
                # fields, the docstring, ...); methods written in the file count.
                code = getattr(value, "__code__", None)
                if code is None or _origin_or_none(code.co_filename) is None:
                    continue
            self.atom("attribute", name)
            self.feed(value)

    def _function(self, fn: types.FunctionType) -> None:
        """A function: its code's identity (file, qualified name and line: the
        code itself is in the file's digest or in its distribution's version),
        what it reads from its module's globals, its defaults and its closure."""
        code = fn.__code__
        origin = _origin(code.co_filename)
        qualname = getattr(code, "co_qualname", code.co_name)
        if (origin[0] == "dist" and origin[1].startswith("jaxtyping" + os.sep)
                and qualname.startswith("jaxtyped.<locals>.")
                and hasattr(fn, "__wrapped__")):
            # jaxtyping's run-time type checks (`@jaxtyped`, its import hook):
            # they raise or pass, the program is the wrapped function's.
            self.atom("type-checked")
            self.feed(fn.__wrapped__)
            return
        self.atom("function", f"{qualname}@{code.co_firstlineno}")
        if origin[0] == "file":
            self._source(origin, sys.modules.get(fn.__module__))
            # The module-level values it reads (a model, a constant computed at
            # start-up): by value. (Attribute names among `co_names` are looked
            # up too; those that are no global are skipped.)
            for name in sorted(_global_names(code)):
                if name in fn.__globals__:
                    self.atom("global", name)
                    self.feed(fn.__globals__[name])
        else:
            self.atom("origin", repr(origin))
        self.feed(fn.__defaults__)
        self.feed(fn.__kwdefaults__)
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (a name assigned later)
                self.atom("empty cell")
            else:
                self.feed(value)

    def _builtin(self, fn) -> None:
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            raise Unkeyable(f"a method of a {type(owner).__qualname__} object")
        name = getattr(fn, "__qualname__", None) or fn.__name__
        module_name = getattr(fn, "__module__", None) or "builtins"
        self.atom("builtin", f"{module_name}.{name}")
        module = sys.modules.get(module_name)
        if module is not None:
            self._module(module)


def _origin_or_none(filename: str) -> tuple | None:
    try:
        return _origin(filename)
    except Unkeyable:
        return None


# --------------------------------------------------------------------------
# The programs


class _Call(typing.NamedTuple):
    """One call, split as `eqx.filter_jit` splits it: the array leaves are the
    program's inputs, the rest (and the tree structure) are part of the program."""

    treedef: Any
    leaves: list
    is_input: list[bool]

    @classmethod
    def of(cls, fn, args, kwargs) -> "_Call":
        leaves, treedef = jax.tree_util.tree_flatten((fn, args, kwargs))
        return cls(treedef, leaves, [eqx.is_array(x) for x in leaves])

    @property
    def inputs(self) -> list:
        return [x for x, i in zip(self.leaves, self.is_input) if i]

    def traced(self) -> bool:
        return any(isinstance(x, jax.core.Tracer) for x in self.inputs)

    def quick_key(self) -> tuple | None:
        """A key for later calls in this process: the static leaves by identity
        (as `jax.jit` takes its function: later changes to them go unseen), the
        rest by value; `None` where the tree structure cannot be hashed."""
        from jax._src import config as jax_config

        key = (jax_config.trace_context(), self.treedef,
               tuple(None if i else id(x) for x, i in zip(self.leaves, self.is_input)),
               tuple((s.shape, s.dtype, s.weak_type) for s in self.specs()))
        try:
            hash(key)
        except TypeError:  # e.g. a NumPy array in a static field
            return None
        return key

    def specs(self) -> list[jax.ShapeDtypeStruct]:
        specs = []
        for x in self.inputs:
            aval = jax.typeof(x)
            specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                              weak_type=aval.weak_type))
        return specs

    def key(self) -> str:
        """The key: sha256 over the environment, the tree structure, the static
        leaves' values and the inputs' shapes, dtypes and weak types."""
        fp = _Fingerprint()
        fp.atom("environment", _environment())
        fp.treedef(self.treedef)
        specs = iter(self.specs())
        for leaf, is_input in zip(self.leaves, self.is_input):
            if is_input:
                s = next(specs)
                fp.atom("input", f"{s.dtype}{s.shape} weak={s.weak_type}")
            else:
                fp.feed(leaf)
        return fp.hexdigest()

    def flat_function(self, box: list, name: str) -> Callable:
        """The function of the input arrays alone, returning the output's array
        leaves; the output's structure and other leaves are appended to `box`
        when it is traced."""
        treedef, leaves, is_input = self.treedef, self.leaves, self.is_input

        def flat(*inputs):
            it = iter(inputs)
            fn, args, kwargs = jax.tree_util.tree_unflatten(
                treedef, [next(it) if i else x for x, i in zip(leaves, is_input)])
            out = fn(*args, **kwargs)
            out_leaves, out_treedef = jax.tree_util.tree_flatten(out)
            out_is_array = [eqx.is_array(x) for x in out_leaves]
            box.append(_Output(out_treedef,
                               [None if a else x for x, a in zip(out_leaves,
                                                                 out_is_array)],
                               out_is_array))
            return [x for x, a in zip(out_leaves, out_is_array) if a]

        flat.__name__ = flat.__qualname__ = name
        return flat


class _Output(typing.NamedTuple):
    """A program's output, less its arrays: kept beside the program."""

    treedef: Any
    static: list  # the leaves that are not arrays (None where one is)
    is_array: list[bool]

    def rebuild(self, arrays) -> Any:
        it = iter(arrays)
        return jax.tree_util.tree_unflatten(
            self.treedef, [next(it) if a else x for x, a in zip(self.static,
                                                                self.is_array)])

    def skeleton(self) -> Any:
        """The output with a `_Slot` for each array: what the file keeps (a tree
        structure does not pickle faithfully: equinox's marks a missing field
        with a sentinel object, which comes back as another object)."""
        return self.rebuild(_Slot() for a in self.is_array if a)

    @classmethod
    def from_skeleton(cls, skeleton) -> "_Output":
        leaves, treedef = jax.tree_util.tree_flatten(skeleton)
        is_array = [isinstance(x, _Slot) for x in leaves]
        return cls(treedef, [None if a else x for x, a in zip(leaves, is_array)],
                   is_array)


class _Slot:
    """Where an output array goes, in a stored output."""

    __slots__ = ()


def _name(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name if name.isidentifier() else "fn"


class _Program(typing.NamedTuple):
    compiled: Any  # a jax.stages.Compiled of the input arrays
    output: _Output
    source: str  # "disk", "exported" (written now) or "jit"

    def run(self, call: _Call):
        return self.output.rebuild(self.compiled(*call.inputs))


# --------------------------------------------------------------------------
# The folder


_WARNED: set[str] = set()
_MADE: set[Path] = set()


def directory() -> Path | None:
    """`<jax_compilation_cache_dir>/exported`, created if needed; `None` when
    JAX's persistent cache is off, or the folder cannot be used (a warning says
    why, once)."""
    base = jax.config.jax_compilation_cache_dir
    if not base:
        return None
    if "://" in str(base):  # a remote cache (gs://...): JAX's own, not ours
        return None
    path = Path(base).expanduser() / "exported"
    if path in _MADE:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        _warn_once(path, f"{path} (or a folder above it) is a file, not a folder")
        return None
    except OSError as e:
        _warn_once(path, f"cannot create {path}: {e.strerror}")
        return None
    _MADE.add(path)
    return path


@functools.cache
def _serializable() -> bool:
    """Whether `jax.export` can serialize here (it needs `flatbuffers`, a
    dependency of cdiff's, not of jax's)."""
    import importlib.util

    if importlib.util.find_spec("flatbuffers") is None:
        logger.debug("cdiff: flatbuffers is not installed: cached_jit is jax.jit")
        return False
    return True


def _warn_once(path: Path, why: str) -> None:
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        warnings.warn(f"cdiff: {why}; compiled programs are not kept there "
                      "(cdiff.cached_jit compiles as jax.jit does)", stacklevel=5)


def _read(path: Path, key: str) -> dict | None:
    """The record stored at `path` for `key`; `None` if absent or unusable (a
    damaged or foreign file is logged and will be overwritten)."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.debug("cdiff: cannot read %s: %s", path, e)
        return None
    n = len(_MAGIC)
    payload = blob[n + 32:]
    if blob[:n] != _MAGIC or hashlib.sha256(payload).digest() != blob[n:n + 32]:
        logger.debug("cdiff: ignoring %s: damaged (checksum)", path)
        return None
    try:
        record = pickle.loads(payload)
    except Exception as e:  # a class that no longer exists, ...
        logger.debug("cdiff: ignoring %s: %r", path, e)
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        logger.debug("cdiff: ignoring %s: written for another key", path)
        return None
    return record


def _write(path: Path, data: bytes) -> bool:
    """Write atomically: a temporary file in the same folder, then `os.replace`
    (readers see the old file or the new one, never half of one)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        logger.debug("cdiff: cannot write in %s: %s", path.parent, e)
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError as e:
        logger.debug("cdiff: cannot write %s: %s", path, e)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def _store(path: Path, key: str, exported, output: _Output) -> None:
    try:
        payload = pickle.dumps({"key": key, "output": output.skeleton(),
                                "exported": bytes(exported.serialize())},
                               protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # e.g. an output of a class local to a function
        _no_export(path, key, f"it cannot be stored: {e!r}")
        return
    _write(path, _MAGIC + hashlib.sha256(payload).digest() + payload)


def _no_export(path: Path, key: str, reason: str) -> None:
    logger.debug("cdiff: %s is compiled by jax.jit: %s", path.stem, reason)
    _write(path.with_suffix(_NO_EXPORT_SUFFIX), f"{key}\n{reason}\n".encode())


# --------------------------------------------------------------------------
# cached_jit


class CachedJit:
    """What [`cdiff.cached_jit`][] returns: call it as the function."""

    def __init__(self, fn: Callable, compiler_options: dict[str, Any] | None = None):
        self.fn = fn
        self.compiler_options = dict(compiler_options or {})
        self._programs: dict[str, _Program | None] = {}  # by key; None: jit
        self._recent: dict[tuple, tuple] = {}  # by `_Call.quick_key`
        self._jit = None  # eqx.filter_jit, made on first need
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        program, call, _ = self._program(args, kwargs)
        if program is None:
            return self._filter_jit()(*args, **kwargs)
        return program.run(call)

    def compile(self, *args, **kwargs) -> Callable:
        """Look up, or trace, export and compile, the program for these
        arguments without running it.

        **Returns:** a callable taking the same arguments (arrays of the same
        shapes and dtypes, equal static values) and returning what the function
        returns. It has an attribute `source`: `"disk"` (loaded), `"exported"`
        (traced now, and stored), or `"jit"` (not cached: see the module
        docstring).
        """
        program, _, key = self._program(args, kwargs)
        if program is None:
            compiled = self._filter_jit().lower(*args, **kwargs).compile()
            return _Bound(lambda a, k: compiled(*a, **k), "jit")

        def run(a, k):
            _, call, again = self._program(a, k)
            if again != key:
                raise ValueError(f"{_name(self.fn)}: called with arguments other "
                                 "than those it was compiled for")
            return program.run(call)

        return _Bound(run, program.source)

    def _filter_jit(self):
        """What runs the calls the cache does not take: `eqx.filter_jit`."""
        if self._jit is None:
            options = ({"compiler_options": self.compiler_options}
                       if self.compiler_options else {})
            self._jit = eqx.filter_jit(self.fn, **options)
        return self._jit

    def _program(self, args, kwargs
                 ) -> tuple[_Program | None, _Call | None, str | None]:
        """The program for this call (`None` where the cache does not apply:
        then `eqx.filter_jit` runs it), the call split into inputs, and its
        key."""
        folder = directory()
        if folder is None or jax.config.jax_disable_jit or not _serializable():
            return None, None, None
        call = _Call.of(self.fn, args, kwargs)
        if call.traced():
            return None, call, None  # under an outer transformation
        quick = call.quick_key()
        if quick in self._recent:
            program, key, _ = self._recent[quick]
            return program, call, key
        try:
            key = call.key()
        except Exception as e:  # Unkeyable; anything else is a gap in `_Fingerprint`
            logger.debug("cdiff: %s is compiled by jax.jit: %r", _name(self.fn), e)
            key = program = None
        else:
            if key not in self._programs:
                self._programs[key] = self._make(folder / (key + _SUFFIX), key,
                                                 call, args, kwargs)
            program = self._programs[key]
        if quick is not None:
            if len(self._recent) >= _RECENT:  # static objects made anew per call
                self._recent.clear()
            # (The static leaves kept alive: their ids are in `quick`.)
            self._recent[quick] = (program, key, [
                x for x, i in zip(call.leaves, call.is_input) if not i])
        return program, call, key

    def _make(self, path: Path, key: str, call: _Call, args, kwargs
              ) -> _Program | None:
        """Load the program, or trace, export and store it; `None` where
        `jax.export` refuses it (now, or in an earlier process)."""
        name = _name(self.fn)
        if path.with_suffix(_NO_EXPORT_SUFFIX).exists():
            return None
        specs = call.specs()
        record = _read(path, key)
        if record is not None:
            try:
                exported = jax.export.deserialize(bytearray(record["exported"]))
                compiled = _compile_exported(exported, specs, name,
                                             self.compiler_options)
                logger.debug("cdiff: %s loaded from %s", name, path)
                output = _Output.from_skeleton(record["output"])
                return _Program(compiled, output, "disk")
            except Exception as e:  # written by a jax that reads it differently
                logger.debug("cdiff: ignoring %s: %r", path, e)
        box: list[_Output] = []
        try:
            exported = jax.export.export(jax.jit(call.flat_function(box, name)))(
                *specs)
        except Exception as e:
            # Refused by jax.export (host callbacks, ...), or the function itself
            # failed: then tracing it for eqx.filter_jit raises its error here,
            # and nothing is marked.
            self._filter_jit().lower(*args, **kwargs)
            _no_export(path, key, f"jax.export refused it: {e}")
            return None
        output = box[-1]
        _store(path, key, exported, output)
        compiled = _compile_exported(exported, specs, name, self.compiler_options)
        logger.debug("cdiff: %s exported to %s", name, path)
        return _Program(compiled, output, "exported")


class _Bound:
    """A compiled program bound to its arguments' kind: `CachedJit.compile`'s
    result."""

    def __init__(self, run: Callable, source: str):
        self._run = run
        self.source = source

    def __call__(self, *args, **kwargs):
        return self._run(args, kwargs)


def _compile_exported(exported, specs, name: str, compiler_options):
    """XLA's compile of an exported program, kept in JAX's persistent cache
    however short it was (JAX keeps programs that took a second or more,
    `jax_persistent_cache_min_compile_time_secs`): a later process that loads the
    program finds XLA's output there too, and compiles nothing.

    JAX never overwrites an entry of its cache: one it cannot read (truncated,
    garbage) would make every later process warn and compile again. Such an
    entry is removed and the program compiled once more, which writes it anew;
    a warning names the file and says it was replaced."""
    from jax._src import config as jax_config

    def compile_once():
        # A new function each time: JAX keeps a compile in memory by lowering, and
        # a function lowered again gets other names inside (another key).
        def call(*inputs):
            return exported.call(*inputs)

        # The persistent cache's file name (`jit_<name>-<hash>`) names it.
        call.__name__ = call.__qualname__ = name
        lowered = jax.jit(call).lower(*specs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with jax_config.persistent_cache_min_compile_time_secs(0):
                compiled = lowered.compile(compiler_options or None)
        unreadable = []
        for w in caught:
            if str(w.message).startswith(_UNREADABLE):
                unreadable.append(str(w.message))
            else:  # not ours: as it was
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                       source=w.source)
        return compiled, unreadable

    compiled, unreadable = compile_once()
    if unreadable:
        removed = _remove_unreadable(f"jit_{name}")
        if removed:
            compiled, _ = compile_once()
            warnings.warn(
                f"cdiff: JAX's compilation cache entry {', '.join(removed)} could not "
                f"be read ({unreadable[0].split(': ', 1)[-1]}); replaced by the "
                "program compiled now, which later processes load", stacklevel=4)
        else:
            warnings.warn(
                f"cdiff: {unreadable[0]}; compiled anew, but cdiff found no "
                f"unreadable jit_{name}-*-cache file in "
                f"{jax.config.jax_compilation_cache_dir} to replace: remove the "
                "damaged entry, or the folder, so that the program is stored again",
                stacklevel=4)
    return compiled


#: How JAX's warning about an entry of its persistent cache it cannot read starts.
_UNREADABLE = "Error reading persistent compilation cache entry"


def _remove_unreadable(module: str) -> list[str]:
    """Remove the entries of JAX's persistent cache for `module` (`jit_NAME`) that
    JAX cannot read (their compressed payload is truncated or garbage); returns
    their paths. JAX's `put` skips a key whose file exists, so a damaged entry
    would otherwise stay for good."""
    from jax._src import compilation_cache

    base = jax.config.jax_compilation_cache_dir
    if not base or "://" in str(base):
        return []
    removed = []
    for path in sorted(Path(base).expanduser().glob(f"{module}-*-cache")):
        try:
            entry = compilation_cache.decompress_executable(path.read_bytes())
            if len(entry) > 4:  # (4 bytes of compile time, then XLA's program)
                continue
        except OSError:
            continue
        except Exception:  # JAX could not read it either
            pass
        try:
            path.unlink()
            path.with_name(path.name[:-len("cache")] + "atime").unlink(
                missing_ok=True)
            removed.append(str(path))
        except OSError as e:
            logger.debug("cdiff: cannot remove %s: %s", path, e)
    return removed


def cached_jit(fn: Callable, *, compiler_options: dict[str, Any] | None = None
               ) -> CachedJit:
    """Compile `fn` as `eqx.filter_jit` does, and keep the traced program on disk,
    so that a later process with the same function, settings and kinds of
    arguments compiles nothing: it neither traces nor lowers (it reads the
    program, a `jax.export` program) nor runs XLA (whose output it finds in JAX's
    persistent cache).

    It is on while [`cdiff.use_compilation_cache`][] is (the programs go in the
    folder's `exported` subfolder); otherwise `cached_jit(fn)` is
    `eqx.filter_jit(fn)`. As with `eqx.filter_jit`, the arrays anywhere in the
    arguments (and in `fn`, if it is a pytree) are the program's inputs, and
    everything else is part of the program.

    A program is found by a key computed without tracing, from everything that
    can change it: cdiff's version and a hash of its source files; the versions of
    Python, jax, jaxlib and cdiff's dependencies; JAX's tracing settings
    (`jax_enable_x64`, the dtype promotion, ...) and Equinox's `EQX_ON_ERROR`; the
    backend and device kind; `fn`'s code (for code of yours, the contents of its
    source file and of the files of your modules it imports), the values of the
    globals and closure variables it reads, and the arguments bound by
    `functools.partial`; the arguments' tree structure, their static values, and
    each array's shape, dtype and weak type. Where the key cannot describe
    something deterministically, the call is compiled by `eqx.filter_jit` instead,
    never answered by a stale program: code without a source file (a notebook
    cell), an object whose state lives in C (a lock, an open file), a source file
    modified since the process started. So are programs that `jax.export` cannot
    store, those with host callbacks (`simulate(..., throw=True)` inside `fn`, a
    progress bar, `jax.debug.print`), and calls under an outer `jax.jit`,
    `jax.vmap` or `jax.grad`.

    `fn` must read nothing at trace time beyond its arguments, globals and closure
    (no files, environment variables or other modules' mutable state), as
    `jax.jit` assumes too. Within a process, a later call with the same static
    objects reuses its program without computing the key again (so, as with
    `jax.jit`, a global changed after the first call goes unseen there; a new
    process sees it). Loading a program unpickles the structure of its output:
    keep the folder as private as JAX's cache itself.

    ```python
    cdiff.use_compilation_cache()

    @cdiff.cached_jit
    def final_state(model, q0, v0):
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=1.0,
                             dt=1e-3, saveat=cdiff.SaveAt(t1=True), throw=False)
        return sol.q[-1], sol.result
    ```

    **Arguments:**

    - `fn`: the function, of pytrees (`equinox.Module`s, arrays, settings).
    - `compiler_options`: XLA's compiler options for every compilation, e.g.
      [`cdiff.compiler_options`][]`()`.

    **Returns:** a callable with `fn`'s signature. Its `compile(*args, **kwargs)`
    prepares the program without running it (to time compilation apart from the
    run) and returns a callable of the same arguments, whose `source` says
    `"disk"` (loaded), `"exported"` (traced now and stored) or `"jit"` (not
    stored).
    """
    return CachedJit(fn, compiler_options)
