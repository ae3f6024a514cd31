import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(autouse=True, scope="module")
def _clear_jax_caches_after_each_file():
    """Free each test file's compiled programs when it is done.

    A test worker runs half the suite in one process, and every compiled XLA CPU
    program holds memory mappings; un-jitted `jax.grad` through `simulate` (as in
    the README) compiles ~2000 small programs. Kept for the worker's life, they
    reached Linux's limit of 65530 mappings per process (`vm.max_map_count`), and
    XLA then crashed while compiling (segfault or abort) late in the run. Tests of
    one file still share their compilations.
    """
    yield
    jax.clear_caches()
