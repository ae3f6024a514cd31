"""A call split as `eqx.filter_jit` splits it (the array leaves are the program's
inputs, the rest is part of the program), its key, and the program's output less
its arrays."""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from ._fingerprint import _Fingerprint
from ._process import _environment


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
