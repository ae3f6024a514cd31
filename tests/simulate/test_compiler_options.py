"""XLA's CPU option (no YNNPACK library fusions): `import cdiff` leaves XLA_FLAGS
alone (unless CDIFF_XLA_FLAGS=1); cdiff passes the option as compiler options where
it compiles at the top level (simulate outside jit/grad, also under vmap; the
studies) and warns once where a solve is traced into a program without it;
`cdiff.configure_xla_flags()` puts it in XLA_FLAGS; results unchanged by it; the
fallback for a jaxlib that does not know the option."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
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
import os, sys, warnings
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
if "--start-backend" in sys.argv:
    jax.numpy.ones(1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import cdiff
    flags_after_import = os.environ.get("XLA_FLAGS", "")
    from cdiff import _compiler
    status = (cdiff.configure_xla_flags() if "--configure" in sys.argv
              else _compiler.FLAGS_STATUS)
sys.path.insert(0, "tests/simulate")
from test_compiler_options import _batch, _dq
lowered = jax.jit(_batch).lower(_dq())
plain = lowered.compile()
tuned = lowered.compile(cdiff.compiler_options())
np.savez(sys.argv[1], plain=np.asarray(plain(_dq())), status=status,
         tuned=np.asarray(tuned(_dq())),
         flags=flags_after_import, options=repr(cdiff.compiler_options()),
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
def test_import_leaves_the_environment_alone(tmp_path):
    """A fresh process: `import cdiff` writes nothing to XLA_FLAGS; a plain
    `jax.jit` then keeps JAX's library fusions and `cdiff.compiler_options()`
    removes them, with bitwise-equal results."""
    fresh = _run(tmp_path)
    assert str(fresh["status"]) == "not configured"
    assert _compiler._FLAG not in str(fresh["flags"])
    assert bool(fresh["ynn_plain"]) and not bool(fresh["ynn_tuned"])
    assert "xla_cpu_experimental_ynn_fusion_type" in str(fresh["options"])
    assert str(fresh["warnings"]) == "[]"
    # This process has the option in XLA_FLAGS (conftest.py): same numbers.
    np.testing.assert_array_equal(np.asarray(jax.jit(_batch)(_dq())), fresh["plain"])
    np.testing.assert_array_equal(fresh["tuned"], fresh["plain"])


def test_jax_defaults_on_request(monkeypatch):
    """CDIFF_XLA_FLAGS=0: no options from cdiff, and nothing set."""
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv(_compiler.ENV, "0")
    monkeypatch.setattr(_compiler, "FLAGS_STATUS", "not configured")
    assert cdiff.compiler_options() == {} and _compiler.top_level_options() == {}
    assert cdiff.configure_xla_flags() == "off"
    assert os.environ["XLA_FLAGS"] == ""


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_configure_xla_flags(tmp_path):
    """The documented call (here through CDIFF_XLA_FLAGS=1 at import, which makes
    it) puts the option in XLA_FLAGS: a plain `jax.jit` has no library fusion left
    and no options are needed; too late (backend started) it warns and sets
    nothing; the user's own flag is left as it is."""
    at_import = _run(tmp_path, CDIFF_XLA_FLAGS="1")
    assert str(at_import["status"]) == "set"
    assert f"--{_compiler._FLAG}=" in str(at_import["flags"])
    assert not bool(at_import["ynn_plain"]) and str(at_import["options"]) == "{}"
    late = _run(tmp_path, "--start-backend", "--configure")
    assert str(late["status"]) == "too late"
    assert "before the first JAX computation" in str(late["warnings"])
    assert bool(late["ynn_plain"]) and not bool(late["ynn_tuned"])
    yours = _run(tmp_path, "--configure",
                 XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=")
    assert str(yours["status"]) == "yours" and str(yours["warnings"]) == "[]"
    assert not bool(yours["ynn_plain"])


@pytest.fixture
def without_the_flag(monkeypatch):
    """This process as if XLA_FLAGS did not hold the option (XLA has read it
    already, so only cdiff's decisions change) and the hint not yet given."""
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.delenv(_compiler.ENV, raising=False)
    monkeypatch.setattr(_compiler, "FLAGS_STATUS", "not configured")
    monkeypatch.setattr(_compiler, "_HINTED", False)


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_options_where_jax_takes_them(without_the_flag):
    """The options go on a `jax.jit` called with nothing around it or under
    `jax.vmap` only; under `jax.jit` and `jax.grad` JAX refuses them."""
    seen = {}

    def probe(name):
        def f(x):
            seen[name] = _compiler.top_level_options()
            return x * 2.0
        return f

    option = _compiler.cpu_options()
    assert option
    probe("call")(1.0)
    jax.vmap(probe("vmap"))(jnp.ones(2))
    jax.vmap(jax.vmap(probe("vmap2")))(jnp.ones((2, 2)))
    jax.jit(probe("jit"))(1.0)
    jax.grad(probe("grad"))(1.0)
    jax.vmap(jax.jit(probe("jit in vmap")))(jnp.ones(2))
    assert seen == {"call": option, "vmap": option, "vmap2": option, "jit": {},
                    "grad": {}, "jit in vmap": {}}


@pytest.mark.skipif(not CPU, reason="CPU option")
def test_simulate_under_vmap_and_jit(without_the_flag):
    """`simulate` at the top level, under `jax.vmap` (its program compiled with
    the options) and under `jax.jit` (without: one warning, once) give the same
    numbers; under the studies' own compilation, which passes the options, no
    warning. (XLA read this process's flags at its start, so the options change
    no number here: `test_import_leaves_the_environment_alone` compares them.)"""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vmapped = np.asarray(_batch(_dq()))
        assert caught == []
        jitted = np.asarray(jax.jit(_batch)(_dq()))
        again = np.asarray(jax.jit(lambda d: _batch(d) * 1.0)(_dq()))
    hints = [w for w in caught if "configure_xla_flags" in str(w.message)]
    assert len(hints) == 1, [str(w.message) for w in caught]
    assert "compiler_options=cdiff.compiler_options()" in str(hints[0].message)
    # One program against two (the solve, then the indexing): round-off apart.
    np.testing.assert_allclose(jitted, vmapped, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(again, jitted)
    _compiler._HINTED = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mapped = cdiff.studies.map_batches(_batch_one, np.asarray(_dq()),
                                           chunk_size=8, progress=False)
    assert not [w for w in caught if "configure_xla_flags" in str(w.message)]
    np.testing.assert_allclose(mapped, vmapped, rtol=1e-14, atol=1e-14)


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
