import mmap
import os
from pathlib import Path

import jax
import jaxlib
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

#: The suite compiles with XLA's older CPU code generator for fusions: the test
#: programs are compiled once and run briefly, and this halves the suite (default
#: tier on 2 cores: 43:38 -> 18:27, most in the gradient programs). Results move
#: by round-off only (on this jaxlib, 6 of ~650 check sites changed, by 1-2 ulp,
#: and one damped-pseudoinverse multiplier, which the tests bound by its documented
#: limit). Users' programs keep XLA's default. `CDIFF_TEST_XLA_FLAGS=0` runs the
#: suite with the default, as users compile.
TEST_XLA_FLAG = "xla_cpu_use_fusion_emitters"
#: And no YNNPACK library fusions, as `cdiff.configure_xla_flags()` asks for: the
#: suite's own `jax.jit`s of simulations then compile as cdiff's top-level
#: programs do (`cdiff.compiler_options()`). Results are bitwise the same.
CDIFF_XLA_FLAG = "xla_cpu_experimental_ynn_fusion_type"


def _jaxlib_knows(flag: str) -> bool:
    """Whether jaxlib's XLA defines `flag` (XLA aborts on an unknown one): the name
    is in the shared library that parses XLA_FLAGS (as `cdiff._compiler` probes
    it; this file sets the flags before anything imports cdiff)."""
    for path in Path(jaxlib.__file__).parent.glob("*.so"):
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0,
                                                  access=mmap.ACCESS_READ) as m:
                if m.find(flag.encode()) >= 0:
                    return True
        except (OSError, ValueError):  # unreadable, or empty
            continue
    return False


def _add_test_xla_flag() -> None:
    """Before any test starts JAX's backend (XLA reads XLA_FLAGS once); in the
    controller of `-n 2`, whose environment the workers inherit."""
    if os.environ.get("CDIFF_TEST_XLA_FLAGS") == "0":
        return
    for flag, value in ((TEST_XLA_FLAG, "false"), (CDIFF_XLA_FLAG, "")):
        flags = os.environ.get("XLA_FLAGS", "")
        if flag not in flags and _jaxlib_knows(flag):
            os.environ["XLA_FLAGS"] = f"{flags} --{flag}={value}".strip()


_add_test_xla_flag()

# The command line keeps compiled programs in a persistent cache (~/.cache/cdiff);
# the suite compiles each program afresh, unless a test asks for a cache of its own.
os.environ.setdefault("CDIFF_COMPILATION_CACHE", "0")

# Linux allows a process 65530 memory mappings (`vm.max_map_count`).
_MAPPINGS_BEFORE_CLEARING = 20_000


def _mappings() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True, scope="module")
def _bound_compiled_programs():
    """Free the compiled programs after a test file once they hold many mappings.

    A test worker runs half the suite in one process, and every compiled XLA CPU
    program holds memory mappings (un-jitted `jax.grad` through `simulate`
    compiles ~2000 small programs; the documentation's examples left 12,000 mappings).
    Kept for the worker's life, they reached the limit above and XLA crashed
    while compiling (segfault or abort) late in the run. Below the threshold the
    caches are kept, so that later files reuse earlier files' compilations.
    """
    yield
    if _mappings() > _MAPPINGS_BEFORE_CLEARING:
        jax.clear_caches()
