import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

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
