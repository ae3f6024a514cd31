"""One process of a two-process `cdiff.studies.map_batches` run (for
tests/studies/test_distributed.py): `python tests/studies/distributed_worker.py PROCESS_ID PORT
CHECKPOINT OUT MODE`.

It joins `jax.distributed` on localhost:PORT as process PROCESS_ID of 2, maps
tests/studies/test_chunked.py's `final_state` over `INPUTS` (32 pendulums, 8 chunks of 4) with the checkpoint
directory CHECKPOINT, and saves its results and report in OUT/result_{PROCESS_ID}.npz.
MODE "run" runs the sweep; MODE "kill" dies by SIGKILL partway: process 1 when it
has computed chunks 1 and 3 (at chunk 5), process 0 when it has computed chunks 0
and 2 (at chunk 4) and chunk 3 is on disk, leaving chunks 0 to 3 in CHECKPOINT.
MODE "other-key" runs process 1 with another key; MODE "fail" raises a
`RuntimeError` in process 1 after its chunk 3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")

import numpy as np  # noqa: E402
from test_chunked import final_state  # noqa: E402  (this folder is on sys.path)

# 32 pendulums (length r, initial angle theta0): 8 chunks of 4.
R, THETA0 = np.meshgrid(np.linspace(0.5, 2.0, 8), np.linspace(-1.2, 0.0, 4))
INPUTS = {"r": R.ravel(), "theta0": THETA0.ravel()}
CHUNK = 4
KEY = "ParticleOnCircle, UK, t1=0.5, dt=5e-2"


def _die_partway(checkpoint: Path):
    def on_chunk(i, out):
        if i == 4:  # process 0: chunks 0 and 2 written; wait for process 1's 3
            deadline = time.monotonic() + 60
            while (not (checkpoint / "chunk_00003.npz").exists()
                   and time.monotonic() < deadline):
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)
        if i == 5:  # process 1: chunks 1 and 3 written
            os.kill(os.getpid(), signal.SIGKILL)
    return on_chunk


def _fail_partway(i, out):
    if i == 3:
        raise RuntimeError("process 1 fails on purpose after chunk 3")


def main(process_id: int, port: int, checkpoint: Path, out: Path, mode: str):
    jax.distributed.initialize(coordinator_address=f"localhost:{port}",
                               num_processes=2, process_id=process_id,
                               initialization_timeout=60,
                               heartbeat_timeout_seconds=30)
    assert jax.process_count() == 2 and jax.process_index() == process_id
    # private on purpose: map_batches plus its report (chunks computed, loaded)
    from cdiff.studies._chunked import _sweep

    start = time.perf_counter()
    on_chunk = {"kill": _die_partway(checkpoint),
                "fail": _fail_partway if process_id == 1 else None}.get(mode)
    key = KEY + " (another)" if mode == "other-key" and process_id == 1 else KEY
    result, report = _sweep(final_state, INPUTS, chunk_size=CHUNK,
                            checkpoint=checkpoint, key=key, progress=True,
                            timeout=120, on_chunk=on_chunk)
    report = dict(dataclasses.asdict(report), seconds=time.perf_counter() - start)
    np.savez(out / f"result_{process_id}.npz", angle=result["angle"], q=result["q"],
             report=np.asarray(json.dumps(report)))


if __name__ == "__main__":
    pid, port, checkpoint, out, mode = sys.argv[1:]
    main(int(pid), int(port), Path(checkpoint), Path(out), mode)
