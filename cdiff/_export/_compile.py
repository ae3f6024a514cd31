"""XLA's compile of an exported program, kept in JAX's persistent cache, and the
entries of that cache JAX cannot read removed (JAX never overwrites them)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import jax

logger = logging.getLogger("cdiff")


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
