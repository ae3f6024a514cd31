"""XLA compiler options for cdiff's programs."""

from __future__ import annotations

import functools

import jax

# XLA's CPU backend (jaxlib 0.10) hands reductions to YNNPACK library fusions by
# default. cdiff's vector fields reduce over axes of 5 or 6 entries (C C^T, A x,
# the Runge-Kutta stage sums); a library call per reduction then costs more than
# the arithmetic, and it splits XLA's own fusions around it. The empty list keeps
# every fusion in XLA's code generator.
_CPU = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(backend: str | None = None) -> dict[str, str]:
    r"""XLA compiler options that make cdiff's programs faster, to pass to the
    top-level compilation: `jax.jit(fn, compiler_options=cdiff.compiler_options())`
    or `jax.jit(fn).lower(...).compile(cdiff.compiler_options())`.

    On CPU they keep reductions out of YNNPACK library fusions
    (`xla_cpu_experimental_ynn_fusion_type=""`), which cost a library call per
    small reduction: R2 with `UdwadiaKalaba(energy_correction=True)` and RK4,
    a batch of 4096 in float64 on 2 cores, runs 1.88x faster (350,000 against
    659,000 steps/s in one `benchmarks/throughput.py` run), one trajectory 1.2x. On other backends, and with a jaxlib that does not know the
    option (checked once by compiling a trivial function), the dict is empty.

    cdiff's own top-level compilations ([`cdiff.studies.map_batches`][], the
    studies, the command line) use them. They cannot be set on
    [`cdiff.simulate`][]'s internal `jax.jit`: JAX accepts compiler options only
    on the outermost one, which is usually the caller's.

    **Arguments:**

    - `backend`: `"cpu"`, `"gpu"`, ...; default `jax.default_backend()`.

    **Returns:** a new dict (safe to modify).
    """
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu":
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
