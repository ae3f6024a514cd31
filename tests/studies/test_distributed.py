"""cdiff.studies.map_batches across processes (jax.distributed): two real processes
on this machine sharing the chunks through the checkpoint, equal to one process;
killed partway and resumed; and, in this process with jax.process_count and
jax.process_index patched, the checkpoint requirement, the waits and their
timeouts."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import distributed_worker as worker
import jax
import numpy as np
import pytest
from helpers import double_x

# private on purpose: map_batches plus its report (chunks computed, loaded; devices)
from cdiff.studies._chunked import _sweep

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "distributed_worker.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_WORKER)))  # the repository


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_pair(checkpoint, out, mode="run", timeout=120):
    """Both processes of a two-process run (killed after `timeout` seconds): their
    return codes and stderr (in files: a full pipe would block a process)."""
    out.mkdir()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([_ROOT, env.get("PYTHONPATH", "")])
    port = _free_port()
    logs = [out / f"stderr_{i}.txt" for i in (0, 1)]
    procs = []
    for i, log in enumerate(logs):
        with open(log, "w") as f:
            procs.append(subprocess.Popen(
                [sys.executable, _WORKER, str(i), str(port), str(checkpoint),
                 str(out), mode], env=env, cwd=_ROOT, stdout=subprocess.DEVNULL,
                stderr=f))
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    errs = [log.read_text() for log in logs]
    for log in logs:
        log.unlink()
    return [p.returncode for p in procs], errs


def _assert_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y, strict=True)


def _result(out, i):
    with np.load(out / f"result_{i}.npz") as data:
        return ({"angle": data["angle"], "q": data["q"]},
                json.loads(str(data["report"])))


@functools.cache
def _one_process():
    """The same batch in this one process: one jax.vmap over all 32 items."""
    return jax.tree.map(np.asarray,
                        jax.jit(jax.vmap(worker.final_state))(worker.INPUTS))


def _assert_equal_one_process(result):
    # Bit for bit: the workers' chunks of 4 and this batch of 32 (both multiples
    # of the CPU's vector width) are computed alike, whatever process runs them.
    one = _one_process()
    assert jax.tree.structure(result) == jax.tree.structure(one)
    for x, y in zip(jax.tree.leaves(result), jax.tree.leaves(one)):
        assert x.shape == y.shape and x.dtype == y.dtype == np.float64
        np.testing.assert_array_equal(x, y)


def test_two_processes_share_the_chunks(tmp_path):
    codes, errs = _run_pair(tmp_path / "checkpoint", tmp_path / "out")
    assert codes == [0, 0], "\n".join(e[-3000:] for e in errs)
    (r0, rep0), (r1, rep1) = _result(tmp_path / "out", 0), _result(tmp_path / "out", 1)
    # Chunk i by process i % 2; each reads the other's from the checkpoint.
    assert rep0["computed"] == [0, 2, 4, 6] and rep0["loaded"] == [1, 3, 5, 7]
    assert rep1["computed"] == [1, 3, 5, 7] and rep1["loaded"] == [0, 2, 4, 6]
    assert [rep0["process_index"], rep1["process_index"]] == [0, 1]
    assert rep0["process_count"] == rep1["process_count"] == 2
    # Both return the whole batch, equal to one process.
    _assert_equal(r0, r1)
    _assert_equal_one_process(r0)
    names = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert names == [f"chunk_{i:05d}.npz" for i in range(8)] + ["manifest.json"]
    # The progress bar on process 0 only.
    assert "map_batches:" in errs[0] and "map_batches:" not in errs[1]
    # The checkpoint resumes in one process: everything loaded.
    out, report = _sweep(worker.final_state, worker.INPUTS, chunk_size=worker.CHUNK,
                         checkpoint=tmp_path / "checkpoint", key=worker.KEY,
                         progress=False)
    assert report.loaded == list(range(8)) and report.computed == []
    _assert_equal(out, r0)


def test_killed_processes_resume(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    codes, errs = _run_pair(checkpoint, tmp_path / "killed", mode="kill")
    # Process 0 kills itself; process 1 too, or JAX's runtime aborts it when the
    # coordinator (process 0) is gone.
    assert codes[0] == -signal.SIGKILL, errs[0][-3000:]
    assert codes[1] in (-signal.SIGKILL, -signal.SIGABRT), errs[1][-3000:]
    assert not list((tmp_path / "killed").iterdir())
    chunks = sorted(p.name for p in checkpoint.glob("chunk_*.npz"))
    assert chunks == [f"chunk_{i:05d}.npz" for i in range(4)]
    # Rerun: each process skips its chunks present and computes the rest.
    codes, errs = _run_pair(checkpoint, tmp_path / "out")
    assert codes == [0, 0], "\n".join(e[-3000:] for e in errs)
    (r0, rep0), (r1, rep1) = _result(tmp_path / "out", 0), _result(tmp_path / "out", 1)
    assert rep0["computed"] == [4, 6] and rep0["loaded"] == [0, 1, 2, 3, 5, 7]
    assert rep1["computed"] == [5, 7] and rep1["loaded"] == [0, 1, 2, 3, 4, 6]
    _assert_equal(r0, r1)
    _assert_equal_one_process(r0)


def test_processes_called_differently_both_stop_naming_it(tmp_path):
    # Process 1 has another key: both refuse within seconds (each waits up to 120 s
    # for chunks otherwise, and the test kills them at 60 s), naming the key.
    start = time.monotonic()
    codes, errs = _run_pair(tmp_path / "checkpoint", tmp_path / "out",
                            mode="other-key", timeout=60)
    assert codes == [1, 1], "\n".join(e[-3000:] for e in errs)
    assert time.monotonic() - start < 50
    for err in errs:
        assert ("ValueError: cdiff.studies.map_batches: processes " in err
                and "were called with different arguments; they differ in the key: "
                in err and "(another)" in err), err[-3000:]
    assert not list((tmp_path / "checkpoint").glob("chunk_*"))


def test_a_process_that_fails_stops_the_others(tmp_path):
    # Process 1 raises after its chunk 3; process 0 stops at its next look instead
    # of waiting for chunks 5 and 7, naming process 1's error.
    start = time.monotonic()
    codes, errs = _run_pair(tmp_path / "checkpoint", tmp_path / "out", mode="fail",
                            timeout=60)
    assert codes == [1, 1], "\n".join(e[-3000:] for e in errs)
    assert time.monotonic() - start < 50
    assert "RuntimeError: process 1 fails on purpose after chunk 3" in errs[1]
    assert ("RuntimeError: cdiff.studies.map_batches: process 1 of 2 stopped: "
            "RuntimeError: process 1 fails on purpose after chunk 3. Process 0 "
            "stops too" in errs[0]), errs[0][-3000:]
    # What was written stays: a rerun resumes.
    assert (tmp_path / "checkpoint" / "chunk_00001.npz").exists()


# In this process, posing as one of two processes.


def _as_process(monkeypatch, index, count=2):
    monkeypatch.setattr(jax, "process_index", lambda *a, **k: index)
    monkeypatch.setattr(jax, "process_count", lambda *a, **k: count)


_SIX = {"x": np.arange(6.0)}
_sweep_six = functools.partial(_sweep, double_x, _SIX, chunk_size=1, key="double",
                               progress=False)


def test_a_checkpoint_is_required_across_processes(monkeypatch, tmp_path):
    _as_process(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"across processes \(jax.process_count\(\) "
                       r"= 2\) a checkpoint directory is required"):
        _sweep_six()
    monkeypatch.undo()
    # Devices of another process are refused (there is no collective).
    other = type("Device", (), {"process_index": 1, "__repr__": lambda s: "Dev1"})()
    with pytest.raises(ValueError, match="Dev1 belongs to process 1"):
        _sweep_six(devices=[other])


def test_waits_time_out_naming_what_is_missing(monkeypatch, tmp_path):
    # Process 1 waits for the manifest that process 0 writes.
    _as_process(monkeypatch, 1)
    with pytest.raises(TimeoutError, match=r"process 1 of 2 waited 0 s for .*"
                       r"manifest\.json, which process 0 writes"):
        _sweep_six(checkpoint=tmp_path, timeout=0.2)
    assert list(tmp_path.iterdir()) == []  # it writes nothing
    # Process 0 writes the manifest, computes chunks 0, 2, 4 of six and waits for
    # process 1's.
    _as_process(monkeypatch, 0)
    with pytest.raises(TimeoutError, match=r"process 0 of 2 has waited 0 s without "
                       r"a new chunk in .*; chunks 1, 3, 5 \(3 of them, the share "
                       r"of process 1\) are still missing"):
        _sweep_six(checkpoint=tmp_path, timeout=0.2)
    # Process 1 (its manifest there now) computes its share and gathers all.
    _as_process(monkeypatch, 1)
    out, report = _sweep_six(checkpoint=tmp_path, timeout=0.2)
    assert report.computed == [1, 3, 5] and report.loaded == [0, 2, 4]
    np.testing.assert_array_equal(out["y"], 2.0 * _SIX["x"])
    # A rerun as process 0 (or with three processes) loads everything.
    _as_process(monkeypatch, 0)
    out, report = _sweep_six(checkpoint=tmp_path)
    assert report.computed == [] and report.loaded == list(range(6))
    np.testing.assert_array_equal(out["y"], 2.0 * _SIX["x"])
    _as_process(monkeypatch, 2, count=3)
    out, report = _sweep_six(checkpoint=tmp_path)
    assert report.computed == [] and report.loaded == list(range(6))
    # A manifest of another sweep is refused by the waiting processes too.
    _as_process(monkeypatch, 1)
    with pytest.raises(ValueError, match="the key"):
        _sweep_six(checkpoint=tmp_path, key="other")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        _sweep_six(checkpoint=tmp_path, timeout=0)


def test_missing_chunks_are_named_as_ranges(monkeypatch, tmp_path):
    # Process 0 of three: chunks 1, 2, 4, 5, 7, 8 of nine are the others'.
    _as_process(monkeypatch, 0, count=3)
    with pytest.raises(TimeoutError, match=r"chunks 1-2, 4-5, 7-8 \(6 of them, the "
                       r"share of processes 1, 2\)"):
        _sweep(double_x, {"x": np.arange(9.0)}, chunk_size=1, checkpoint=tmp_path,
               progress=False, timeout=0.1)
