"""The folder of exported programs and its files: read, written atomically with a
checksum, and the markers of programs `jax.export` refuses."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:
    from ._call import _Output

logger = logging.getLogger("cdiff")

_MAGIC = b"cdiff-exported-program\n"
_SUFFIX = ".exported"
_NO_EXPORT_SUFFIX = ".jit"  # a marker: this key's program cannot be exported


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
