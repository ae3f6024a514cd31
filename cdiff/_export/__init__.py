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

The rooms: `_sources` (where code comes from: origins, source files' digests,
`Unkeyable`), `_process` (the process's part of the key: versions, cdiff's source
hash, JAX's and Equinox's settings, the device), `_fingerprint` (values and code
written down as a digest), `_call` (a call split into the program's inputs and
the rest, its key, its output), `_store` (the folder and its files), `_compile`
(XLA's compile of an exported program, JAX's cache mended) and `_jit`
(`CachedJit`, `cached_jit`). A test that patches what the key reads patches it
where it lives: `_process.cdiff_source_hash`, `_process._device`,
`_sources._PROCESS_START`.
"""

from ._jit import CachedJit as CachedJit
from ._jit import cached_jit as cached_jit
from ._process import FORMAT as FORMAT
from ._sources import Unkeyable as Unkeyable
from ._sources import tree_digest as tree_digest
from ._store import directory as directory
