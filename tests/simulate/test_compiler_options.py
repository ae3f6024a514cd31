"""XLA's CPU option (no YNNPACK library fusions): set in XLA_FLAGS by `import
cdiff`, so that a plain `jax.jit` has no library fusion left; results unchanged
by it; the warning and `cdiff.compiler_options()` when JAX's backend started
first; and the fallback for a jaxlib that does not know the option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff

# private on purpose: tests the probe of the options the pinned jaxlib knows.
from cdiff import _compiler

CPU = jax.default_backend() == "cpu"
ROOT = Path(__file__).resolve().parents[2]


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


_PROGRAM = """
import sys, warnings
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
if "--start-backend" in sys.argv:
    jax.numpy.ones(1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import cdiff
sys.path.insert(0, "tests/simulate")
from test_compiler_options import _batch, _dq
from cdiff import _compiler
lowered = jax.jit(_batch).lower(_dq())
plain = lowered.compile()
tuned = lowered.compile(cdiff.compiler_options())
np.savez(sys.argv[1], plain=np.asarray(plain(_dq())), status=_compiler.FLAGS_STATUS,
         options=repr(cdiff.compiler_options()),
         ynn_plain="__ynn_fusion" in plain.as_text(),
         ynn_tuned="__ynn_fusion" in tuned.as_text(),
         warnings=repr([str(w.message) for w in caught]))
"""


def _run(tmp_path, *args, **env):
    """`_PROGRAM` in a new process (XLA reads XLA_FLAGS once, at its start)."""
    out = tmp_path / "out.npz"
    environ = {k: v for k, v in os.environ.items()
               if k not in ("XLA_FLAGS", _compiler.ENV)}
    # The suite's own flag (conftest.py) is kept, so that results compare with
    # this process's; cdiff's flag is what the new process decides.
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if _compiler._FLAG not in f]
    if kept and "XLA_FLAGS" not in env:
        environ["XLA_FLAGS"] = " ".join(kept)
    subprocess.run([sys.executable, "-c", _PROGRAM, str(out), *args],
                   env={**environ, **env}, check=True, cwd=ROOT, timeout=300)
    with np.load(out) as f:
        return {k: f[k][()] for k in f.files}


def test_backends():
    assert cdiff.compiler_options("gpu") == {}
    options = _compiler.cpu_options()
    assert isinstance(options, dict)
    options["mutated"] = "1"  # a new dict each call
    assert "mutated" not in _compiler.cpu_options()


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_set_at_import_and_results_unchanged(tmp_path):
    # This process imported cdiff before any JAX computation: the flag is in the
    # environment (a jaxlib that drops it fails here instead of slowing down).
    assert _compiler.FLAGS_STATUS == "set", _compiler.FLAGS_STATUS
    assert "--xla_cpu_experimental_ynn_fusion_type=" in os.environ["XLA_FLAGS"]
    assert cdiff.compiler_options() == {}
    compiled = jax.jit(_batch).lower(_dq()).compile()
    # A plain jax.jit (no options) keeps every fusion in XLA's code generator ...
    assert "__ynn_fusion" not in compiled.as_text()
    # ... where JAX's defaults (CDIFF_XLA_FLAGS=0) hand the reductions to YNNPACK.
    default = _run(tmp_path, CDIFF_XLA_FLAGS="0")
    assert str(default["status"]) == "off"
    assert bool(default["ynn_plain"]) and str(default["options"]) == "{}"
    a, b = default["plain"], np.asarray(compiled(_dq()))
    assert np.all(np.isfinite(a))
    np.testing.assert_array_equal(b, a)  # measured: identical


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_backend_started_first(tmp_path):
    """JAX's backend started before `import cdiff`: a warning, and the option as
    compiler options, which remove the library fusions."""
    late = _run(tmp_path, "--start-backend")
    assert str(late["status"]) == "too late"
    assert "CDIFF_XLA_FLAGS=0" in str(late["warnings"])
    assert bool(late["ynn_plain"]) and not bool(late["ynn_tuned"])
    assert "xla_cpu_experimental_ynn_fusion_type" in str(late["options"])
    # Your own flag in XLA_FLAGS is left as it is.
    yours = _run(tmp_path, XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=")
    assert str(yours["status"]) == "yours" and str(yours["warnings"]) == "[]"
    assert not bool(yours["ynn_plain"])


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_map_batches_options():
    dq = np.asarray(_dq())
    tuned = cdiff.studies.map_batches(_batch_one, dq, chunk_size=8, progress=False)
    default = cdiff.studies.map_batches(_batch_one, dq, chunk_size=8, progress=False,
                                        compiler_options={})
    np.testing.assert_array_equal(tuned, default)  # measured: identical
    with pytest.raises(Exception, match="xla_cpu_no_such_option"):
        cdiff.studies.map_batches(_batch_one, dq, chunk_size=8, progress=False,
                                  compiler_options={"xla_cpu_no_such_option": "1"})


def test_unknown_option_falls_back(monkeypatch):
    """A jaxlib without the option: the probe compile fails and the dict is empty,
    and the flag is not put in XLA_FLAGS (XLA aborts on an unknown flag)."""
    monkeypatch.setattr(_compiler, "_CPU", {"xla_cpu_no_such_option": ""})
    _compiler._supported_cpu_options.cache_clear()
    try:
        assert _compiler.cpu_options() == {}
        assert not _compiler._jaxlib_knows("xla_cpu_no_such_option")
        assert _compiler._jaxlib_knows("xla_cpu_experimental_ynn_fusion_type")
    finally:
        monkeypatch.undo()
        _compiler._supported_cpu_options.cache_clear()
