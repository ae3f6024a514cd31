"""Where code comes from, as the key writes it (cdiff, the standard library, an
installed distribution, or a file of yours), and the digests of source files:
`Unkeyable` where a file was modified after this process started."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import site
import sys
import sysconfig
import time
from pathlib import Path


class Unkeyable(Exception):
    """Something the key cannot describe deterministically: the call is not
    cached."""


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
_CDIFF_DIR = Path(__file__).resolve().parent.parent


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


def _origin_or_none(filename: str) -> tuple | None:
    try:
        return _origin(filename)
    except Unkeyable:
        return None
