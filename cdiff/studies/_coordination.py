r"""Coordination between the processes of a [`cdiff.studies.map_batches`][] run
across `jax.distributed`: the timeout, polling the shared checkpoint directory
(for process 0's manifest and the other processes' chunks), and `_Peers`, the
processes' exchange of their arguments and failures through JAX's distributed
runtime."""

from __future__ import annotations

import json
import numbers
import os
import time
from collections.abc import Callable
from pathlib import Path

from ._checkpoint import _MANIFEST, _chunk_path, _differences

#: Seconds between two looks at the checkpoint directory while waiting: the first
#: and the longest (the interval doubles while nothing new appears).
_POLL = (0.02, 1.0)


def _check_timeout(timeout, name: str):
    if timeout is None:
        return None
    if (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
            or not timeout > 0):
        raise ValueError(f"{name}: timeout must be a positive number of seconds or "
                         f"None, got {timeout!r}")
    return float(timeout)


def _listing(directory: Path) -> set[str]:
    """The names in `directory` (a fresh listing: on a network file system, a
    file another host has just renamed into place shows up here)."""
    try:
        return set(os.listdir(directory))
    except FileNotFoundError:
        return set()


def _ranges(indices) -> str:
    """`[0, 1, 2, 5, 7, 8]` as "0-2, 5, 7-8"."""
    out, indices = [], sorted(indices)
    for k, i in enumerate(indices):
        if k and i == indices[k - 1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _wait_for_manifest(directory: Path, timeout, name: str, process: int,
                       count: int, peers: _Peers | None = None) -> float:
    """Wait (up to `timeout` seconds; None: no limit) for process 0 to write the
    manifest; the seconds waited."""
    start = time.monotonic()
    delay = _POLL[0]
    while _MANIFEST not in _listing(directory):
        if peers is not None:
            peers.check()
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            raise TimeoutError(
                f"{name}: process {process} of {count} waited {waited:.0f} s for "
                f"{directory / _MANIFEST}, which process 0 writes when it starts the "
                f"sweep. Check that every process calls map_batches with the same "
                f"checkpoint, a directory that all processes (all hosts) share, and "
                f"look for an error in process 0's log; or pass a longer timeout.")
        time.sleep(delay)
        delay = min(2 * delay, _POLL[1])
    return time.monotonic() - start


class _Peers:
    """The other processes of a `jax.distributed` run, reached through the
    distributed runtime's key-value store (keys scoped to one `map_batches` call,
    the `call`-th of this process; every process makes the same calls in the same
    order). Each process publishes its sweep's manifest, so that processes called
    with different arguments all stop at once naming the difference, and a
    process that fails publishes its error, so that the others stop within a poll
    instead of waiting `timeout` seconds for its chunks."""

    _calls = 0  # map_batches calls across processes so far, in this process

    def __init__(self, client, process: int, count: int, name: str):
        self.client, self.process, self.count, self.name = client, process, count, name
        self.prefix = f"cdiff/map_batches/{_Peers._calls}"
        _Peers._calls += 1

    @classmethod
    def join(cls, process: int, count: int, name: str) -> _Peers | None:
        """None outside `jax.distributed` (or in one process)."""
        from jax._src import distributed  # the runtime's client: no public API

        client = distributed.global_state.client
        if count < 2 or client is None:
            return None
        return cls(client, process, count, name)

    def agree(self, manifest: dict, timeout) -> None:
        """Publish this process's manifest and compare it with every other
        process's: a `ValueError` naming what differs, a `RuntimeError` when
        another process failed before it got here, a `TimeoutError` naming the
        processes that have not arrived within `timeout` seconds."""
        mine = json.dumps(manifest, sort_keys=True)
        self.client.key_value_set(f"{self.prefix}/args/{self.process}", mine)
        start, delay, theirs = time.monotonic(), _POLL[0], {}
        while len(theirs) < self.count - 1:
            for p in range(self.count):
                if p == self.process or p in theirs:
                    continue
                try:
                    theirs[p] = json.loads(self.client.key_value_try_get(
                        f"{self.prefix}/args/{p}"))
                except Exception:  # not there yet (the runtime's NOT_FOUND)
                    pass
            self.check()
            waited = time.monotonic() - start
            if len(theirs) < self.count - 1 and timeout is not None and waited > timeout:
                late = [p for p in range(self.count)
                        if p != self.process and p not in theirs]
                raise TimeoutError(
                    f"{self.name}: process {self.process} of {self.count} waited "
                    f"{waited:.0f} s for process{'es' if len(late) > 1 else ''} "
                    f"{', '.join(map(str, late))} to call map_batches. Check that "
                    f"every process makes the same map_batches calls, and look for "
                    f"an error in their logs; or pass a longer timeout.")
            if len(theirs) < self.count - 1:
                time.sleep(delay)
                delay = min(2 * delay, _POLL[1])
        for p, other in sorted(theirs.items()):
            differ = _differences(other, manifest, (f"process {p}",
                                                    f"process {self.process}"))
            if differ:
                raise ValueError(
                    f"{self.name}: processes {p} and {self.process} of {self.count} "
                    f"were called with different arguments; they differ in "
                    + "; ".join(differ) + ". Every process calls map_batches with the same inputs, "
                    "chunk_size, key and fn.")

    def check(self) -> None:
        """A `RuntimeError` if another process has published a failure."""
        for key, message in self.client.key_value_dir_get(f"{self.prefix}/failed/"):
            p = int(key.rsplit("/", 1)[-1])
            if p != self.process:
                raise RuntimeError(
                    f"{self.name}: process {p} of {self.count} stopped: {message}. "
                    f"Process {self.process} stops too; the chunks written stay in "
                    f"the checkpoint, and a rerun resumes.")

    def fail(self, error: BaseException) -> None:
        """Publish this process's failure (best effort: the runtime may be gone)."""
        message = f"{type(error).__name__}: {error}".splitlines()[0]
        try:
            self.client.key_value_set(f"{self.prefix}/failed/{self.process}", message,
                                      allow_overwrite=True)
        except Exception:
            pass


def _gather(directory: Path, missing: list, load: Callable, timeout, name: str,
            process: int, count: int, loaded: Callable,
            peers: _Peers | None = None) -> float:
    """Load the chunks `missing` (the other processes' share) as they appear in
    `directory`, waiting for them; `TimeoutError` naming those still missing when
    none has appeared for `timeout` seconds (None: no limit). The seconds spent
    waiting (not loading)."""
    missing = list(missing)
    waited = 0.0
    last = time.monotonic()  # the last time a chunk appeared
    delay = _POLL[0]
    while True:
        names = _listing(directory)
        ready = [i for i in missing if _chunk_path(directory, i).name in names]
        for i in ready:
            load(i)
            loaded(i)
        if ready:
            missing = [i for i in missing if i not in ready]
            last, delay = time.monotonic(), _POLL[0]
        if not missing:
            return waited
        if peers is not None:
            peers.check()
        idle = time.monotonic() - last
        if timeout is not None and idle > timeout:
            owners = sorted({i % count for i in missing})
            raise TimeoutError(
                f"{name}: process {process} of {count} has waited {idle:.0f} s "
                f"without a new chunk in {directory}; chunks {_ranges(missing)} "
                f"({len(missing)} of them, the share of process"
                f"{'es' if len(owners) > 1 else ''} "
                f"{', '.join(map(str, owners))}) are still missing. Check that "
                f"every process calls map_batches with the same inputs, chunk_size "
                f"and checkpoint (a directory all hosts share) and look for an "
                f"error in their logs; rerun to resume, or pass a longer timeout.")
        start = time.monotonic()
        time.sleep(delay)
        waited += time.monotonic() - start
        delay = min(2 * delay, _POLL[1])
