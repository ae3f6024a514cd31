"""JAX's persistent compilation cache and cdiff's exported programs beside it
(`cdiff.cached_jit`), as cdiff's command line uses them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax

#: Environment variable: a directory for the command line's compilation cache, or
#: "0" to compile without one.
ENV = "CDIFF_COMPILATION_CACHE"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/cdiff/jax`, or `~/.cache/cdiff/jax`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cdiff" / "jax"


def use_compilation_cache(directory: str | os.PathLike | None = None) -> Path:
    """Keep compiled programs on disk, so that a later process compiling the same
    program (the same model structure, formulation, solver settings and shapes)
    loads it instead of compiling it again. Call it once, before the first
    compilation; `cdiff run` and `cdiff study` do so themselves.

    It turns on two caches in `directory`. JAX's persistent compilation cache
    keeps XLA's output for every `jax.jit` of the process: a later process still
    traces and lowers its program (seconds for a loaded MuJoCo model, see the
    MuJoCo guide) and finds XLA's output by a hash of the lowered program, the
    compiler options, the jaxlib version and the device. JAX stores programs that
    took at least `jax_persistent_cache_min_compile_time_secs` (default 1 s) to
    compile, and none with host callbacks: an eager `cdiff.simulate` call has
    none, nor does a `jax.jit` of a function calling `simulate(..., throw=False)`;
    `throw=True` inside your own `jit` and progress bars do. A changed model
    parameter *value* hits the cache (values are inputs, not constants) while a
    changed structure does not.

    [`cdiff.cached_jit`][] also keeps the traced program itself (a `jax.export`
    program, in `directory / "exported"`), found without tracing: a later process
    then neither traces, lowers nor compiles (XLA's compile of the loaded program
    is a hit in the first cache, which keeps these programs whatever their
    compile time). `cdiff run` compiles its solve with it.

    **Arguments:**

    - `directory`: where to keep the programs; default `$XDG_CACHE_HOME/cdiff/jax`
      (`~/.cache/cdiff/jax`). Several processes may share it. Keep it private:
      it holds programs that the processes using it load and run.

    **Returns:** the directory, created if needed.

    **Raises:** `ValueError` if `directory` is a file, or cannot be created.
    """
    path = Path(default_cache_dir() if directory is None else directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"cdiff.use_compilation_cache: {path} (or a folder above "
                         "it) is a file, not a folder") from None
    except OSError as e:
        raise ValueError(f"cdiff.use_compilation_cache: cannot create {path}: "
                         f"{e.strerror}") from None
    jax.config.update("jax_compilation_cache_dir", str(path))
    return path


def cli_compilation_cache() -> Path | None:
    """The command line's cache: `CDIFF_COMPILATION_CACHE` (a directory, or `0`
    for none), else the default directory; `None` when off or when the process
    already set a cache directory of its own (left as it is)."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or jax.config.jax_compilation_cache_dir is not None:
        return None
    try:
        return use_compilation_cache(setting or None)
    except ValueError as e:  # the command runs on, without a cache
        print(f"cdiff: warning: {e} ({ENV}); compiling without a cache",
              file=sys.stderr)
        return None
