"""Values and code written down as a digest (`_Fingerprint`): equal for equal
programs, whatever the process."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import sys
import types
from typing import Any

import jax
import numpy as np

from ._sources import Unkeyable, _file_digest, _origin, _origin_or_none


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
