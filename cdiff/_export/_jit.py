"""`cached_jit`: the wrapper that finds a call's program by its key, loads it or
traces, exports and stores it, and otherwise calls `eqx.filter_jit`."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax

from .._compiler import at_top_level, tracing_for
from ._call import _Call, _name, _Output, _Program
from ._compile import _compile_exported
from ._store import (
    _NO_EXPORT_SUFFIX,
    _SUFFIX,
    _no_export,
    _read,
    _serializable,
    _store,
    directory,
)

logger = logging.getLogger("cdiff")

_RECENT = 256  # calls a `CachedJit` remembers by the identity of their statics


class CachedJit:
    """What [`cdiff.cached_jit`][] returns: call it as the function."""

    def __init__(self, fn: Callable, compiler_options: dict[str, Any] | None = None):
        self.fn = fn
        self.compiler_options = dict(compiler_options or {})
        self._programs: dict[str, _Program | None] = {}  # by key; None: jit
        self._recent: dict[tuple, tuple] = {}  # by `_Call.quick_key`
        self._jit = None  # eqx.filter_jit with the options, made on first need
        self._plain_jit = None  # and without (under an outer transformation)
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        with tracing_for(self.compiler_options):
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
        with tracing_for(self.compiler_options):
            program, _, key = self._program(args, kwargs)
            if program is None:
                lowered = self._filter_jit().lower(*args, **kwargs)
        if program is None:
            compiled = lowered.compile()
            return _Bound(lambda a, k: compiled(*a, **k), "jit")

        def run(a, k):
            _, call, again = self._program(a, k)
            if again != key:
                raise ValueError(f"{_name(self.fn)}: called with arguments other "
                                 "than those it was compiled for")
            return program.run(call)

        return _Bound(run, program.source)

    def _filter_jit(self):
        """What runs the calls the cache does not take: `eqx.filter_jit`, with
        the compiler options where JAX takes them (not under an outer `jax.jit`
        or `jax.grad`)."""
        if self.compiler_options and at_top_level():
            if self._jit is None:
                self._jit = eqx.filter_jit(self.fn,
                                           compiler_options=self.compiler_options)
            return self._jit
        if self._plain_jit is None:
            self._plain_jit = eqx.filter_jit(self.fn)
        return self._plain_jit

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
