"""The process's part of the key: cdiff's version and source hash, the versions of
Python, jax, jaxlib and cdiff's dependencies, JAX's tracing settings, Equinox's
settings, the backend and the device kind."""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import sys
from typing import Any

import jax
import jaxlib

from ._sources import _CDIFF_DIR, Unkeyable, tree_digest

#: The layout of the files and the recipe of the key; a change of either must
#: change this number, so that old files are never read as new ones.
FORMAT = 1


def cdiff_source_hash() -> str:
    """sha256 of cdiff's source files: a program made by other cdiff code never
    matches, whatever the version number says."""
    return tree_digest(_CDIFF_DIR)


#: cdiff's optional dependencies that run while tracing (MuJoCo models).
_TRACED_EXTRAS = ("mujoco",)


@functools.cache
def _dependency_versions() -> tuple[tuple[str, str], ...]:
    """The installed versions of cdiff's dependencies and theirs (diffrax,
    equinox, lineax, optax, ..., and MJX where installed): the code they run
    while cdiff traces. (Not the test and documentation tools.)"""
    import re

    found: dict[str, str] = {}
    todo = ["cdiff"]
    while todo:
        package = todo.pop()
        try:
            requires = importlib.metadata.requires(package) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            extra = re.search(r"extra\s*==\s*['\"]([\w.-]+)['\"]", requirement)
            if extra and not (package == "cdiff"
                              and extra.group(1) in _TRACED_EXTRAS):
                continue
            name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower()
            if not name or name in found:
                continue
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:  # not installed
                continue
            todo.append(name)
    return tuple(sorted(found.items()))


@functools.cache
def _cdiff_version() -> str:
    try:
        return importlib.metadata.version("cdiff")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return "0.0.0"


def _device() -> tuple[str, str, str]:
    """The default backend's platform, device kind and platform version."""
    device = jax.devices()[0]
    return (device.platform, device.device_kind,
            str(getattr(device.client, "platform_version", "")))


def _trace_context() -> tuple:
    """JAX's settings that change what a function traces to, the ones `jax.jit`
    keys its own cache on (x64, dtype promotion, default matmul precision, the
    mesh and axis contexts, ...), as names and plain values."""
    from jax._src import config as jax_config

    values = jax_config.trace_context()
    try:
        names = jax_config.trace_context_names()
    except NotImplementedError:  # an older jaxlib: the values, in order
        names = range(len(values))
    return tuple((str(name), _describe(value)) for name, value in zip(names, values))


def _describe(value) -> Any:
    """A setting as plain data: containers item by item (sets sorted), objects
    with `__slots__` slot by slot, anything else by its repr; `Unkeyable` where
    the repr holds a memory address."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(_describe(v)) for v in value))
    if hasattr(value, "items") and callable(value.items):
        return tuple(sorted((repr(_describe(k)), repr(_describe(v)))
                            for k, v in value.items()))
    slots = [n for n in getattr(type(value), "__slots__", ()) if n != "__weakref__"]
    if slots and not isinstance(value, enum.Enum):
        return (type(value).__qualname__,
                tuple((n, _describe(getattr(value, n, None))) for n in slots))
    text = repr(value)
    if " at 0x" in text:
        raise Unkeyable(f"JAX's setting {text}")
    return text


def _equinox_settings() -> tuple:
    """Equinox's settings from the environment that change programs:
    `EQX_ON_ERROR` (`nan` or `off` turn `eqx.error_if`'s checks into NaNs or
    nothing, and programs that raise into programs that can be stored)."""
    from equinox import _config

    return (_config.EQX_ON_ERROR, _config.EQX_ON_ERROR_BREAKPOINT_FRAMES)


def _environment() -> str:
    """The process's part of the key, as text (recomputed at each call: it is
    cheap, and a test may change any of it)."""
    return repr((
        ("format", FORMAT),
        ("python", sys.version),
        ("cdiff", _cdiff_version(), cdiff_source_hash()),
        ("jax", jax.__version__),
        ("jaxlib", jaxlib.__version__),
        ("dependencies", _dependency_versions()),
        ("jax_enable_x64", bool(jax.config.jax_enable_x64)),
        ("trace_context", _trace_context()),
        ("equinox", _equinox_settings()),
        ("export_calling_convention",
         jax.config.jax_export_calling_convention_version),
        ("backend", jax.default_backend(), _device()),
    ))
