"""cdiff.compiler_options: what it returns per backend, that XLA applies it (no
YNNPACK library fusions left in a CPU program with reductions), that results do
not change with it, and the fallback for a jaxlib that does not know it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff
from cdiff import _xla

CPU = jax.default_backend() == "cpu"


def _batch(dq):
    """The slider-crank with UK (c + e) from 8 perturbed starts, 20 RK4 steps."""
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()

    def one(dq):
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(energy_correction=True),
                             q0 + dq, v0, t1=0.2, dt=1e-2,
                             saveat=cdiff.SaveAt(t1=True))
        return sol.q[-1]

    return jax.vmap(one)(dq)


def _batch_one(dq):
    """`_batch` for one perturbation (the item `map_batches` maps)."""
    return _batch(dq[None])[0]


def _dq():
    return jnp.zeros((8, 6)).at[:, 2].set(jnp.linspace(0.0, 1e-3, 8))


def test_backends():
    assert cdiff.compiler_options("gpu") == {}
    options = cdiff.compiler_options("cpu")
    assert isinstance(options, dict)
    options["mutated"] = "1"  # a new dict each call
    assert "mutated" not in cdiff.compiler_options("cpu")


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_applied_and_results_unchanged():
    options = cdiff.compiler_options()
    if not options:
        pytest.skip("this jaxlib has no YNNPACK fusion option")
    lowered = jax.jit(_batch).lower(_dq())
    default, tuned = lowered.compile(), lowered.compile(options)
    # JAX's defaults hand this program's reductions to YNNPACK; the options keep
    # every fusion in XLA's code generator.
    assert "__ynn_fusion" in default.as_text()
    assert "__ynn_fusion" not in tuned.as_text()
    a, b = np.asarray(default(_dq())), np.asarray(tuned(_dq()))
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_map_batches_options():
    dq = np.asarray(_dq())
    tuned = cdiff.studies.map_batches(_batch_one, dq, chunk_size=8, progress=False)
    default = cdiff.studies.map_batches(_batch_one, dq, chunk_size=8, progress=False,
                                        compiler_options={})
    np.testing.assert_allclose(tuned, default, rtol=0, atol=1e-12)
    with pytest.raises(Exception, match="xla_cpu_no_such_option"):
        cdiff.studies.map_batches(_batch_one, dq, chunk_size=8, progress=False,
                                  compiler_options={"xla_cpu_no_such_option": "1"})


def test_unknown_option_falls_back(monkeypatch):
    """A jaxlib without the option: the probe compile fails and the dict is empty."""
    monkeypatch.setattr(_xla, "_CPU", {"xla_cpu_no_such_option": ""})
    _xla._supported_cpu_options.cache_clear()
    try:
        assert cdiff.compiler_options("cpu") == {}
    finally:
        monkeypatch.undo()
        _xla._supported_cpu_options.cache_clear()
