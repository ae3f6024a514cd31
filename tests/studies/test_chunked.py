"""cdiff.studies.map_batches: chunks (a ragged last one), resuming from a checkpoint
directory, refusing another sweep's checkpoint and a chunk file copied over another,
sharding over four (forced) CPU devices in a subprocess, bad input, and gain_sweep
in chunks."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cdiff

# private on purpose: map_batches plus its report (chunks computed, loaded; devices)
from cdiff.studies._chunked import _sweep

# Ten pendulums (length r, initial angle theta0): chunks of 4, 4 and 2 (padded).
R, THETA0 = np.meshgrid(np.linspace(0.5, 2.0, 5), np.array([-1.0, -0.2]))
INPUTS = {"r": R.ravel(), "theta0": THETA0.ravel()}
CHUNK = 4


def final_state(item):
    """A pendulum of length r released at rest from theta0: its final angle and
    position after 0.5 s (ten RK4 steps)."""
    r, theta0 = item["r"], item["theta0"]
    model = cdiff.models.ParticleOnCircle(rho=r, g=9.81, speed=0.0)
    q0 = r * jnp.stack([jnp.cos(theta0), jnp.sin(theta0)])
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, jnp.zeros(2), t1=0.5,
                         dt=5e-2, saveat=cdiff.SaveAt(t1=True))
    return {"angle": jnp.arctan2(sol.q[-1, 1], sol.q[-1, 0]), "q": sol.q[-1]}


@functools.cache
def _reference():
    """One jax.vmap over the whole batch."""
    return jax.tree.map(np.asarray, jax.jit(jax.vmap(final_state))(INPUTS))


@functools.cache
def _chunked():
    return _sweep(final_state, INPUTS, chunk_size=CHUNK, progress=False)


# A difference in the last bit (relative 2 eps_mach, with margin).
LAST_BIT = 4 * float(np.finfo(np.float64).eps)


def _assert_equal(a, b, rtol=0.0):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert isinstance(x, np.ndarray) and x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=rtol, atol=0.0)


class _Interrupted(Exception):
    pass


def test_chunks_equal_one_vmapped_call():
    out, report = _chunked()
    assert report.computed == [0, 1, 2] and report.loaded == []
    assert report.width == CHUNK and report.compile_time > 0
    assert out["angle"].shape == (10,) and out["q"].shape == (10, 2)
    # Another batch size may round differently in the last bit, no more (measured:
    # identical on CPU).
    _assert_equal(out, _reference(), rtol=LAST_BIT)
    # The pendulums fell (toward -pi/2) and stayed near their circles (dt = 0.05).
    assert np.all(out["angle"] < INPUTS["theta0"])
    np.testing.assert_allclose(np.linalg.norm(out["q"], axis=1), INPUTS["r"],
                               rtol=3e-5)  # measured 8.1e-6
    # The public function returns the same numbers (one compilation for both).
    _assert_equal(cdiff.studies.map_batches(final_state, INPUTS, chunk_size=CHUNK,
                                            progress=False), out)


def test_resume_computes_only_missing_chunks(tmp_path):
    full, _ = _chunked()

    def stop_at_1(i, out):
        # The chunk's output is still on the device, padding included.
        assert out["angle"].shape == (CHUNK,)
        if i == 1:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        _sweep(final_state, INPUTS, chunk_size=CHUNK, checkpoint=tmp_path,
               key="pendulums", progress=False, on_chunk=stop_at_1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk_00000.npz",
                                                          "manifest.json"]
    out, report = _sweep(final_state, INPUTS, chunk_size=CHUNK, checkpoint=tmp_path,
                         key="pendulums", progress=False)
    assert report.loaded == [0] and report.computed == [1, 2]
    _assert_equal(out, full)  # bit for bit
    # Lose a chunk in the middle: only it is recomputed, the others are not touched.
    (tmp_path / "chunk_00001.npz").unlink()
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    out, report = _sweep(final_state, INPUTS, chunk_size=CHUNK, checkpoint=tmp_path,
                         key="pendulums", progress=True)
    assert report.loaded == [0, 2] and report.computed == [1]
    _assert_equal(out, full)
    for p in tmp_path.iterdir():
        if p.name != "chunk_00001.npz":
            assert p.stat().st_mtime_ns == mtimes[p.name], p.name
    # Everything saved: nothing runs, nothing compiles.
    out, report = _sweep(final_state, INPUTS, chunk_size=CHUNK, checkpoint=tmp_path,
                         key="pendulums", progress=False)
    assert report.computed == [] and report.compile_time == 0.0
    _assert_equal(out, full)
    assert not list(tmp_path.glob(".*"))  # no temporary files left


def _stop_at_1(i, out):
    if i == 1:
        raise _Interrupted


def test_another_sweeps_checkpoint_is_refused(tmp_path):
    with pytest.raises(_Interrupted):  # leaves the manifest and chunk 0
        _sweep(final_state, INPUTS, chunk_size=CHUNK, checkpoint=tmp_path,
               key="pendulums", progress=False, on_chunk=_stop_at_1)
    other = dict(INPUTS, theta0=INPUTS["theta0"] + 1e-9)
    cases = [
        (dict(inputs=INPUTS, chunk_size=CHUNK + 1), "chunk size: saved 4, now 5"),
        (dict(inputs=other, chunk_size=CHUNK), "the inputs"),
        (dict(inputs=INPUTS, chunk_size=CHUNK, key="other"), "the key"),
        (dict(inputs={"r": INPUTS["r"][:8], "theta0": INPUTS["theta0"][:8]},
              chunk_size=CHUNK), "the batch size: saved 10, now 8"),
    ]
    for kwargs, match in cases:
        kwargs.setdefault("key", "pendulums")
        with pytest.raises(ValueError, match=match):
            cdiff.studies.map_batches(final_state, checkpoint=tmp_path,
                                      progress=False, **kwargs)
    # Other outputs from the same inputs.
    with pytest.raises(ValueError, match="output shapes"):
        cdiff.studies.map_batches(lambda item: final_state(item)["q"], INPUTS,
                                  chunk_size=CHUNK, checkpoint=tmp_path,
                                  key="pendulums", progress=False)
    # The same leaves under other names, or as a tuple: the structure is named
    # (it was not compared, and the error blamed a copied chunk file).
    for renamed in (lambda item: {"theta": final_state(item)["angle"],
                                  "q": final_state(item)["q"]},
                    lambda item: (final_state(item)["angle"], final_state(item)["q"])):
        with pytest.raises(ValueError, match="output structure"):
            cdiff.studies.map_batches(renamed, INPUTS, chunk_size=CHUNK,
                                      checkpoint=tmp_path, key="pendulums",
                                      progress=False)
    # Chunk files without a manifest are not adopted.
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(ValueError, match="no manifest.json"):
        cdiff.studies.map_batches(final_state, INPUTS, chunk_size=CHUNK,
                                  checkpoint=tmp_path, progress=False)


_SHARDED = """
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
import numpy as np
import tests.studies.test_chunked as t
# private on purpose: map_batches plus its report (devices, width)
from cdiff.studies._chunked import _sweep

assert len(jax.devices()) == 4, jax.devices()
seen = []

def look(i, out):
    leaf = out["angle"]
    seen.append((len(leaf.sharding.device_set),
                 sorted(s.data.shape for s in leaf.addressable_shards)))

kwargs = dict(chunk_size=t.CHUNK + 1, progress=False)  # 5: padded to 8 = 4 x 2
out, report = _sweep(t.final_state, t.INPUTS, checkpoint=CHECKPOINT, on_chunk=look,
                     **kwargs)
assert report.devices == 4 and report.width == 8, report
assert seen == [(4, [(2,), (2,), (2,), (2,)])] * 2, seen
one, report = _sweep(t.final_state, t.INPUTS, devices=jax.devices()[:1], **kwargs)
assert report.devices == 1 and report.width == 5, report
for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(one)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
print("sharded ok")
"""


def test_chunks_are_sharded_over_four_devices(tmp_path):
    root = str(Path(__file__).resolve().parents[2])  # the repository
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          " --xla_force_host_platform_device_count=4").strip())
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    code = f"CHECKPOINT = {str(tmp_path)!r}\n" + textwrap.dedent(_SHARDED)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sharded ok" in proc.stdout
    # The checkpoint written on four devices resumes on this process's one,
    # equal to a single-device run.
    out, report = _sweep(final_state, INPUTS, chunk_size=CHUNK + 1,
                         checkpoint=tmp_path, progress=False)
    assert report.loaded == [0, 1] and report.computed == []
    _assert_equal(out, _reference(), rtol=LAST_BIT)


def test_bad_input():
    def double(item):
        return item["x"] * 2.0

    x = np.arange(6.0)
    cases = [
        ({"x": x, "y": np.zeros(5)}, {}, "same leading"),
        ({"x": x, "y": np.float64(1.0)}, {}, "same leading"),
        ({"x": x[:0]}, {}, "empty batch"),
        ({}, {}, "no arrays"),
        ({"x": x, "name": "pendulum"}, {}, "must be an array"),
        ({"x": x}, {"chunk_size": 0}, "chunk_size must be a positive int"),
        ({"x": x}, {"chunk_size": 2.5}, "chunk_size must be a positive int"),
        ({"x": x}, {"devices": []}, "devices is empty"),
    ]
    for inputs, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            _sweep(double, inputs, progress=False, **kwargs)
    with pytest.raises(ValueError, match="pytree of arrays"):
        cdiff.studies.map_batches(lambda item: (item["x"], "label"), {"x": x},
                                  progress=False)


def test_gain_sweep_in_chunks_equals_one_call(tmp_path):
    model = cdiff.models.ParticleOnCircle(g=9.81, speed=0.0)
    args = (model, cdiff.Lagrange(), {"alpha": [1.0, 10.0], "beta": [1.0, 10.0]},
            [0.05, 0.1], 0.5)
    one = cdiff.studies.gain_sweep(*args, n_save=5, chunk_size=8)
    assert one.meta["chunks"] == 1 and "in one call" in one.title
    # The default on CPU: one chunk per step size (its four gain combinations).
    default = cdiff.studies.gain_sweep(*args, n_save=5)
    if jax.default_backend() == "cpu":
        assert default.meta["chunks"] == 2 and "2 chunks of 4" in default.title
    for name in one.names:
        # (measured: identical, with XLA's default fusion emitter and the suite's)
        np.testing.assert_allclose(default[name], one[name], rtol=LAST_BIT, atol=0)
    chunked = cdiff.studies.gain_sweep(*args, n_save=5, chunk_size=3,
                                       checkpoint=tmp_path)
    assert len(chunked) == 8
    assert chunked.meta["chunks"] == 3 and "3 chunks of 3" in chunked.title
    # Chunks of 3 are another program, which may round differently in the last bit:
    # of the states and energies, so an error column (a difference of values of
    # size ~1, or ~10 for the energy, m g l = 9.81) at their scale. Measured:
    # identical with XLA's default fusion emitter; 1 ulp of 1 and of 10 (2.2e-16,
    # 1.8e-15) with the suite's (conftest.py).
    scale = {"max_energy_error": 10.0}
    for name in one.names:
        np.testing.assert_allclose(chunked[name], one[name], rtol=LAST_BIT,
                                   atol=LAST_BIT * scale.get(name, 1.0))
    np.testing.assert_array_equal(chunked.best["alpha"], one.best["alpha"])
    # Resumed whole from the checkpoint: the same table, nothing computed.
    resumed = cdiff.studies.gain_sweep(*args, n_save=5, chunk_size=3,
                                       checkpoint=tmp_path)
    assert resumed.meta["chunks_loaded"] == 3 and resumed.meta["compile_time"] == 0
    for name in one.names:
        np.testing.assert_array_equal(resumed[name], chunked[name])
    # Another model (a different array-free repr) is another sweep.
    with pytest.raises(ValueError, match="the key"):
        cdiff.studies.gain_sweep(cdiff.models.ParticleOnCircle(g=1.0, speed=0.0),
                                 *args[1:], n_save=5, chunk_size=3,
                                 checkpoint=tmp_path)


def test_a_chunk_file_over_another_is_refused(tmp_path):
    # Six items in chunks of 2 (a cheap fn: one tiny compilation). (Imported here:
    # the subprocesses that import this module do not have tests/ on their path.)
    from helpers import double_x

    inputs = {"x": np.arange(6.0)}
    sweep = functools.partial(_sweep, double_x, chunk_size=2, key="double",
                              progress=False)
    out, _ = sweep(inputs, checkpoint=tmp_path / "a")
    np.testing.assert_array_equal(out["y"], 2.0 * inputs["x"])
    first, second = (tmp_path / "a" / f"chunk_0000{i}.npz" for i in (0, 1))
    # Chunk 0 copied over chunk 1: same shapes, wrong rows; refused, not loaded.
    second.write_bytes(first.read_bytes())
    with pytest.raises(ValueError, match=r"chunk_00001\.npz is not chunk 1 of this "
                       r"sweep: it holds chunk 0 \(rows 0:2\), not chunk 1 \(rows "
                       r"2:4\); its items"):
        sweep(inputs, checkpoint=tmp_path / "a")
    # The same chunk of another sweep (other inputs, another checkpoint).
    sweep({"x": np.arange(6.0) + 1.0}, checkpoint=tmp_path / "b")
    second.write_bytes((tmp_path / "b" / "chunk_00001.npz").read_bytes())
    with pytest.raises(ValueError, match=r"chunk_00001\.npz is not chunk 1 of this "
                       r"sweep: it belongs to another sweep"):
        sweep(inputs, checkpoint=tmp_path / "a")
    # A chunk file that does not say which chunk it is (an older format).
    np.savez(second, np.zeros(2))
    with pytest.raises(ValueError, match="does not say which chunk"):
        sweep(inputs, checkpoint=tmp_path / "a")
    # Deleted, as the messages say: recomputed, and the sweep is right again.
    second.unlink()
    out, report = sweep(inputs, checkpoint=tmp_path / "a")
    assert report.loaded == [0, 2] and report.computed == [1]
    np.testing.assert_array_equal(out["y"], 2.0 * inputs["x"])
