"""JAX's persistent compilation cache and cdiff's exported programs beside it
(`cdiff.cached_jit`), as cdiff's command line uses them."""

from __future__ import annotations

import os
import sys
import warnings
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
    loads it instead of compiling it again. Call it before the first
    compilation; `cdiff run` and `cdiff study` do so themselves. A later call
    with another folder switches both caches to it: what compiles after it is
    kept there (programs compiled before stay in memory).

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
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(path))
    if before is not None and before != str(path):
        _reopen_jax_cache(before, path)
    return path


def _reopen_jax_cache(before: str, path: Path) -> None:
    """Make JAX's persistent cache follow a changed `jax_compilation_cache_dir`.

    JAX opens its cache once, at the first compilation after the folder is set,
    and keeps that folder for the life of the process whatever the setting says
    later (jax 0.10: `jax._src.compilation_cache._initialize_cache`). Its
    `reset_cache()` forgets the open cache, so that the next compilation opens
    the new folder; programs already compiled stay in memory. (cdiff's exported
    programs follow the setting at each call.) Where that helper is missing, a
    warning says that XLA's programs still go to the first folder."""
    try:
        from jax._src import compilation_cache

        compilation_cache.reset_cache()
    except (ImportError, AttributeError):  # another jax: say what happens
        warnings.warn(
            f"cdiff.use_compilation_cache: JAX keeps its compilation cache in "
            f"{before}, the folder it opened first in this process: XLA's programs "
            f"still go there, cdiff's exported programs go to {path / 'exported'}. "
            "Call use_compilation_cache once, before the first compilation.",
            stacklevel=3)


def cli_compilation_cache() -> Path | None:
    """The command line's cache: `CDIFF_COMPILATION_CACHE` (a directory, or `0`
    for none), else the default directory; `None` when off or when the process
    already set a cache directory of its own (left as it is).

    **Raises:** `ValueError` naming the variable and its path when
    `CDIFF_COMPILATION_CACHE` names a folder that cannot be used (a file, or
    below one; not writable): the user asked for that folder. The default
    folder failing only warns, and the command compiles without a cache."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or jax.config.jax_compilation_cache_dir is not None:
        return None
    try:
        return use_compilation_cache(setting or None)
    except ValueError as e:
        why = str(e).removeprefix("cdiff.use_compilation_cache: ")
        if setting:
            raise ValueError(f"{ENV}={setting}: {why}; set it to a folder, or to 0 "
                             "to compile without a cache") from None
        # (The default folder: the command runs on, without a cache.)
        print(f"cdiff: warning: {why} (the default compilation cache; set {ENV} "
              "to another folder, or to 0); compiling without a cache",
              file=sys.stderr)
        return None
