"""XLA's CPU option for cdiff's programs: `cdiff.compiler_options` (passed where
cdiff compiles a program itself) and `cdiff.configure_xla_flags` (the documented
call that puts it in `XLA_FLAGS` for the whole process). `import cdiff` changes no
environment variable unless `CDIFF_XLA_FLAGS=1` asks it to."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import mmap
import os
import warnings
from pathlib import Path

import jax

# XLA's CPU backend hands reductions to YNNPACK library fusions by default. cdiff's
# vector fields reduce over axes of 5 or 6 entries (C C^T, A x, the Runge-Kutta
# stage sums); a library call per reduction then costs more than the arithmetic,
# and it splits XLA's own fusions around it. The empty list keeps every fusion in
# XLA's code generator.
_FLAG = "xla_cpu_experimental_ynn_fusion_type"
_CPU = {_FLAG: ""}
#: Environment variable: "1" configures XLA_FLAGS at `import cdiff`; "0" keeps
#: JAX's defaults everywhere (no compiler options from cdiff either).
ENV = "CDIFF_XLA_FLAGS"

#: What `configure_xla_flags` did ("not configured" until it is called).
FLAGS_STATUS = "not configured"


def configure_xla_flags(*, warn: bool = True) -> str:
    """Put XLA's CPU option `--xla_cpu_experimental_ynn_fusion_type=` in the
    environment's `XLA_FLAGS`, for every program the process compiles, your own
    `jax.jit` of a function calling [`cdiff.simulate`][] included.

    XLA reads `XLA_FLAGS` once, when JAX's backend starts: call this before the
    first JAX computation (right after `import cdiff`). `import cdiff` itself
    leaves the environment alone; it calls this only under `CDIFF_XLA_FLAGS=1`.
    Without it, cdiff passes the option as compiler options to the programs it
    compiles at the top level ([`cdiff.simulate`][] outside `jax.jit` and
    `jax.grad`, the studies, the command line), and a `jax.jit` of yours takes
    `compiler_options=cdiff.compiler_options()`.

    Why: XLA's CPU backend hands reductions to YNNPACK library fusions; cdiff's
    vector fields reduce over axes of 5 or 6 entries, where a library call costs
    more than the arithmetic: a batched solve runs several times slower without
    the option (figures in `benchmarks/RESULTS.md`). Results are bitwise the same.

    **Arguments:**

    - `warn`: warn when JAX's backend has already started (then nothing is set).

    **Returns** (and stores in `cdiff._compiler.FLAGS_STATUS`): `"set"`;
    `"yours"` (`XLA_FLAGS` already names the option: left as it is); `"off"`
    (`CDIFF_XLA_FLAGS=0`); `"too late"` (JAX's backend had started);
    `"unknown"` (this jaxlib does not define the option, and XLA aborts on an
    unknown flag, so it is not set).
    """
    global FLAGS_STATUS
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get(ENV, "").strip() == "0":
        FLAGS_STATUS = "off"
    elif f"--{_FLAG}" in flags:
        FLAGS_STATUS = "yours"
    elif _backend_started():
        FLAGS_STATUS = "too late"
        if warn:
            warnings.warn(
                "cdiff.configure_xla_flags: JAX's backend has already started, so "
                f"--{_FLAG}= cannot take effect through XLA_FLAGS. Call it before the "
                "first JAX computation, or compile your own programs with "
                "jax.jit(fn, compiler_options=cdiff.compiler_options()).",
                stacklevel=2)
    elif not _jaxlib_knows(_FLAG):
        FLAGS_STATUS = "unknown"
    else:
        os.environ["XLA_FLAGS"] = f"{flags} --{_FLAG}=".strip()
        FLAGS_STATUS = "set"
    return FLAGS_STATUS


def configure_at_import() -> None:
    """`import cdiff`: `configure_xla_flags()` only where `CDIFF_XLA_FLAGS=1`."""
    if os.environ.get(ENV, "").strip() == "1":
        configure_xla_flags()


def _backend_started() -> bool:
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    if started is not None:
        return bool(started())
    return bool(getattr(xla_bridge, "_backends", {}))


def _jaxlib_knows(flag: str) -> bool:
    """Whether jaxlib's XLA defines `flag`: its name is in the shared library that
    parses XLA_FLAGS (a few milliseconds: the name sits near the start of the
    flag table)."""
    import jaxlib

    needle = flag.encode()
    for path in Path(jaxlib.__file__).parent.glob("*.so"):
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0,
                                                  access=mmap.ACCESS_READ) as m:
                if m.find(needle) >= 0:
                    return True
        except (OSError, ValueError):  # unreadable, or empty
            continue
    return False


def compiler_options(backend: str | None = None) -> dict[str, str]:
    r"""The XLA compiler options for a top-level compilation of a program that
    runs cdiff's solves: on CPU, `{"xla_cpu_experimental_ynn_fusion_type": ""}`
    (no YNNPACK library fusions; see [`cdiff.configure_xla_flags`][] for why),
    else `{}`.

    For `jax.jit(fn, compiler_options=cdiff.compiler_options())` or
    `jax.jit(fn).lower(...).compile(cdiff.compiler_options())`: JAX accepts
    compiler options on the outermost `jax.jit` only. cdiff passes them itself
    where it compiles at the top level ([`cdiff.simulate`][] called outside
    `jax.jit` and `jax.grad`, also under `jax.vmap`; [`cdiff.studies.map_batches`][],
    the studies, the command line).

    `{}` where they are not needed or not wanted: another backend; the option
    already in `XLA_FLAGS` ([`cdiff.configure_xla_flags`][], or yours);
    `CDIFF_XLA_FLAGS=0` (JAX's defaults throughout); a jaxlib that does not know
    the option (checked once by compiling a trivial function).

    **Arguments:**

    - `backend`: `"cpu"`, `"gpu"`, ...; default `jax.default_backend()`.

    **Returns:** a new dict (safe to modify).
    """
    backend = jax.default_backend() if backend is None else backend
    if (backend != "cpu" or os.environ.get(ENV, "").strip() == "0"
            or _flag_in_effect()):
        return {}
    return dict(_supported_cpu_options())


def _flag_in_effect() -> bool:
    """Whether the option is in `XLA_FLAGS` (assumed read when the backend
    started: set before, as `configure_xla_flags` and a user's environment do)."""
    return FLAGS_STATUS in ("set", "yours") or (
        f"--{_FLAG}" in os.environ.get("XLA_FLAGS", ""))


def top_level_options() -> dict[str, str]:
    """`compiler_options()` for a `jax.jit` called here, where JAX takes them: no
    transformation around the call, or only `jax.vmap`s (a `jax.jit`, `jax.grad`,
    `lax.scan`, ... stages it into an outer program, and JAX refuses compiler
    options there). `{}` otherwise, and where JAX's trace stack cannot be read."""
    options = compiler_options()
    if options and not at_top_level():
        return {}
    return options


def at_top_level() -> bool:
    """Whether a `jax.jit` called here compiles a program of its own (and takes
    compiler options): no transformation around it but `jax.vmap`s."""
    from jax._src import core

    try:
        trace = core.trace_ctx.trace
        while isinstance(trace, _batch_trace()):
            trace = trace.parent_trace
        return isinstance(trace, core.EvalTrace)
    except Exception:  # JAX's internals moved: no options  # noqa: BLE001
        return False


@functools.cache
def _batch_trace() -> type:
    from jax._src.interpreters import batching

    return batching.BatchTrace


_HINTED = False
# Set while cdiff traces a program it compiles with the option itself.
_WITH_OPTION = contextvars.ContextVar("cdiff_with_option", default=False)


@contextlib.contextmanager
def tracing_for(options: dict | None):
    """Within: cdiff traces a program that it compiles with `options` (no hint
    where they hold the CPU option)."""
    token = _WITH_OPTION.set(bool(options) and _FLAG in options)
    try:
        yield
    finally:
        _WITH_OPTION.reset(token)



def hint_if_nested(caller: str) -> None:
    """Warn once per process where a solve is traced into a program that gets
    XLA's library fusions: on CPU, inside a `jax.jit`, `jax.grad`, ... (which
    refuse compiler options), with the option neither in `XLA_FLAGS` nor turned
    down by `CDIFF_XLA_FLAGS=0`."""
    global _HINTED
    if _HINTED or _WITH_OPTION.get() or not compiler_options() or at_top_level():
        return
    _HINTED = True
    warnings.warn(
        f"{caller}: traced inside a jax.jit, jax.grad or another staging "
        "transformation on CPU, whose program XLA compiles with its YNNPACK library "
        "fusions: cdiff's small reductions then run several times slower. Call "
        "cdiff.configure_xla_flags() right after `import cdiff`, before any JAX "
        "computation, or compile your outermost function with jax.jit(fn, "
        "compiler_options=cdiff.compiler_options()) (if you already do, ignore "
        "this: it cannot be seen from inside). CDIFF_XLA_FLAGS=0 keeps JAX's "
        "defaults and silences this.", stacklevel=3)


@functools.cache
def _supported_cpu_options() -> tuple[tuple[str, str], ...]:
    try:  # (shapes, not arrays: it may first be asked while a trace is open)
        x = jax.ShapeDtypeStruct((), "float32")
        jax.jit(lambda x: x + 1, compiler_options=_CPU).lower(x).compile()
    except (RuntimeError, ValueError):  # an older jaxlib without the option
        return ()
    return tuple(_CPU.items())


def cpu_options() -> dict[str, str]:
    """The CPU option itself, whatever is in `XLA_FLAGS` (`{}` where this jaxlib
    does not know it): for benchmarks and tests that compare with JAX's
    defaults."""
    return dict(_supported_cpu_options())
