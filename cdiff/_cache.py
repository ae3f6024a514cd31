"""JAX's persistent compilation cache, as cdiff's command line uses it."""

from __future__ import annotations

import os
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
    """Keep compiled programs on disk, in JAX's persistent compilation cache, so
    that a later process compiling the same program (the same model structure,
    formulation, solver settings and shapes) loads it instead of compiling it
    again. Call it once, before the first compilation; `cdiff run` and
    `cdiff study` do so themselves.

    Only XLA's compilation is cached: the later process still traces and lowers
    its program (seconds for a loaded MuJoCo model, see the MuJoCo guide). JAX
    stores no program with host callbacks: an eager `cdiff.simulate` call has none,
    nor does a `jax.jit` of a function calling `simulate(..., throw=False)`;
    `throw=True` inside your own `jit` and progress bars do. A
    program is looked up by a hash of its lowered form, the compiler options, the
    jaxlib version and the device, so a changed model parameter *value* hits the
    cache (values are inputs, not constants) while a changed structure does not.
    JAX stores programs that took at least
    `jax_persistent_cache_min_compile_time_secs` (default 1 s) to compile.

    **Arguments:**

    - `directory`: where to keep the programs; default `$XDG_CACHE_HOME/cdiff/jax`
      (`~/.cache/cdiff/jax`). Several processes may share it.

    **Returns:** the directory, created if needed.
    """
    path = Path(default_cache_dir() if directory is None else directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return path


def cli_compilation_cache() -> Path | None:
    """The command line's cache: `CDIFF_COMPILATION_CACHE` (a directory, or `0`
    for none), else the default directory; `None` when off or when the process
    already set a cache directory of its own (left as it is)."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or jax.config.jax_compilation_cache_dir is not None:
        return None
    return use_compilation_cache(setting or None)
