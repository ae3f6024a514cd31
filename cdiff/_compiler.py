"""XLA's flags and compiler options for cdiff's programs: what
`import cdiff` puts in `XLA_FLAGS`, and `cdiff.compiler_options`."""

from __future__ import annotations

import functools
import mmap
import os
import warnings
from pathlib import Path

import jax

# XLA's CPU backend hands reductions to YNNPACK library fusions by default. cdiff's vector fields reduce over axes of 5 or 6 entries (C C^T, A x,
# the Runge-Kutta stage sums); a library call per reduction then costs more than
# the arithmetic, and it splits XLA's own fusions around it. The empty list keeps
# every fusion in XLA's code generator.
_FLAG = "xla_cpu_experimental_ynn_fusion_type"
_CPU = {_FLAG: ""}
#: Environment variable: "0" leaves XLA_FLAGS alone at import.
ENV = "CDIFF_XLA_FLAGS"

#: How `import cdiff` configured XLA (see `configure_xla_flags`).
FLAGS_STATUS = "not configured"


def configure_xla_flags() -> str:
    """Add `--xla_cpu_experimental_ynn_fusion_type=` to `XLA_FLAGS`, which XLA reads
    once, when JAX's backend starts: every later compilation, the caller's own
    `jax.jit` included, then keeps reductions in XLA's own code generator.
    Called by `import cdiff`, before anything initialises the backend.

    **Returns** (and stores in `FLAGS_STATUS`): `"set"`; `"yours"` (XLA_FLAGS
    already names the flag: left as it is); `"off"` (`CDIFF_XLA_FLAGS=0`);
    `"too late"` (JAX's backend was started before `import cdiff`: a warning says
    what to do); `"unknown"` (this jaxlib does not define the flag: XLA aborts
    the process on an unknown flag, so it is not set).
    """
    global FLAGS_STATUS
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get(ENV, "1").strip() == "0":
        FLAGS_STATUS = "off"
    elif f"--{_FLAG}" in flags:
        FLAGS_STATUS = "yours"
    elif _backend_started():
        FLAGS_STATUS = "too late"
        warnings.warn(
            "cdiff: JAX's backend was started before `import cdiff`, so cdiff could "
            f"not add --{_FLAG}= to XLA_FLAGS, and programs you compile yourself run "
            "several times slower on CPU. Import cdiff before the first JAX computation, "
            "or compile with jax.jit(fn, compiler_options=cdiff.compiler_options()); "
            f"set {ENV}=0 to silence this.", stacklevel=3)
    elif not _jaxlib_knows(_FLAG):
        FLAGS_STATUS = "unknown"
    else:
        os.environ["XLA_FLAGS"] = f"{flags} --{_FLAG}=".strip()
        FLAGS_STATUS = "set"
    return FLAGS_STATUS


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
    r"""The XLA compiler options a top-level compilation of cdiff's programs needs
    beyond what `import cdiff` set: usually none (`{}`).

    `import cdiff` adds `--xla_cpu_experimental_ynn_fusion_type=` to the
    environment's `XLA_FLAGS` before JAX's backend starts (if it has not started
    yet, the flag is not there already and `CDIFF_XLA_FLAGS` is not `0`). XLA's CPU
    backend then keeps reductions out of YNNPACK library fusions in every program,
    a plain `jax.jit` of yours included; a library call per 5- or 6-entry reduction
    costs more than the arithmetic, several times the run time of a batched solve
    (`benchmarks/throughput.py`, figures in `benchmarks/RESULTS.md`). The flag applies to the whole process; set
    `CDIFF_XLA_FLAGS=0` (or the flag yourself, in `XLA_FLAGS`) to keep your own.

    When the backend started before `import cdiff` (a warning then says so),
    this returns the same setting as compiler options, for
    `jax.jit(fn, compiler_options=cdiff.compiler_options())` or
    `jax.jit(fn).lower(...).compile(cdiff.compiler_options())` (JAX accepts them on
    the outermost `jax.jit` only). cdiff's own top-level compilations
    ([`cdiff.studies.map_batches`][], the studies, the command line) pass them.
    On other backends, with `CDIFF_XLA_FLAGS=0`, or with a jaxlib that does not
    know the option (checked once by compiling a trivial function), `{}`.

    **Arguments:**

    - `backend`: `"cpu"`, `"gpu"`, ...; default `jax.default_backend()`.

    **Returns:** a new dict (safe to modify).
    """
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu" or FLAGS_STATUS != "too late":
        return {}
    return dict(_supported_cpu_options())


@functools.cache
def _supported_cpu_options() -> tuple[tuple[str, str], ...]:
    try:
        x = jax.device_put(0.0, jax.devices("cpu")[0])
        jax.jit(lambda x: x + 1, compiler_options=_CPU).lower(x).compile()
    except (RuntimeError, ValueError):  # an older jaxlib without the option
        return ()
    return tuple(_CPU.items())


def cpu_options() -> dict[str, str]:
    """The CPU option itself, whatever `import cdiff` did (`{}` where this jaxlib
    does not know it): for benchmarks and tests that compare with JAX's
    defaults."""
    return dict(_supported_cpu_options())
