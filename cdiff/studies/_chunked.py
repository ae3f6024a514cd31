r"""Sweeps larger than memory: a function of one item mapped over a batch in chunks,
each chunk one compiled `jax.vmap`ped call split over the local devices
(`jax.sharding`), with a progress bar, and saved chunk by chunk so that an
interrupted sweep resumes where it stopped. Across processes (`jax.distributed`)
each process computes its share of the chunks on its own devices and the
processes exchange them through the shared checkpoint directory.

Here: chunk execution (the arguments' checks, the compiled call, the placement
on the devices, the loop over this process's chunks). The checkpoint files are
`_checkpoint`'s, the coordination between processes `_coordination`'s."""

from __future__ import annotations

import dataclasses
import numbers
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._compiler import compiler_options as _default_options
from .._compiler import tracing_for
from ._checkpoint import (
    _chunk_path,
    _chunk_record,
    _load_chunk,
    _manifest,
    _open_checkpoint,
    _save_chunk,
    _sweep_id,
)
from ._coordination import _check_timeout, _gather, _Peers, _wait_for_manifest

_NAME = "cdiff.studies.map_batches"


@eqx.filter_jit
def _vmapped(fn, chunk):
    # `fn` is an argument: its array leaves (an `equinox.Module`'s fields) are
    # traced, so a new `fn` of the same structure reuses the compilation.
    return jax.vmap(fn)(chunk)


@dataclasses.dataclass
class _Report:
    """How a sweep went in this process: the chunks it computed and loaded
    (indices; across processes, `loaded` holds the chunks found in the checkpoint
    and those the other processes computed), the items per compiled call (`width`:
    the chunk size rounded up to a multiple of the device count), its devices, the
    seconds spent compiling and running (the computed chunks only, their transfer
    to the host included), the process's index and the process count
    (`jax.process_index()`, `jax.process_count()`) and the seconds it spent
    waiting for the other processes' chunks (`wait_time`)."""

    chunk_size: int
    width: int
    devices: int
    computed: list = dataclasses.field(default_factory=list)
    loaded: list = dataclasses.field(default_factory=list)
    compile_time: float = 0.0
    run_time: float = 0.0
    process_index: int = 0
    process_count: int = 1
    wait_time: float = 0.0

    @property
    def chunks(self) -> int:
        return len(self.computed) + len(self.loaded)


def _check_inputs(inputs, name: str):
    """The inputs' leaves as host arrays (JAX's canonical dtypes), their key paths,
    tree structure and common leading size."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(inputs)
    if not flat:
        raise ValueError(f"{name}: inputs holds no arrays; pass a pytree of arrays "
                         f"whose leading axis is the batch")
    paths, arrays = [], []
    for path, x in flat:
        where = jax.tree_util.keystr(path) or "inputs"
        if not eqx.is_array_like(x):
            raise ValueError(f"{name}: every leaf of inputs must be an array, got "
                             f"{type(x).__name__} at {where}")
        a = np.asarray(x)
        if a.dtype.kind not in "biufc":
            raise ValueError(f"{name}: leaf {where} of inputs has dtype {a.dtype}; "
                             f"expected booleans or numbers")
        paths.append(where)
        arrays.append(a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False))
    shapes = {p: a.shape for p, a in zip(paths, arrays)}
    sizes = {a.shape[0] if a.ndim else None for a in arrays}
    if None in sizes or len(sizes) > 1:
        raise ValueError(f"{name}: every leaf of inputs needs the same leading "
                         f"(batch) axis; got shapes {shapes}")
    n = sizes.pop()
    if n == 0:
        raise ValueError(f"{name}: inputs is an empty batch (shapes {shapes})")
    return paths, arrays, treedef, n


def _check_chunk_size(chunk_size, n: int, name: str) -> int:
    if chunk_size is None:
        return n
    if (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
            or chunk_size < 1):
        raise ValueError(f"{name}: chunk_size must be a positive int or None, got "
                         f"{chunk_size!r}")
    return min(int(chunk_size), n)


def _placement(devices, name: str):
    """Shardings for a chunk (split along its leading axis) and for the array
    leaves of `fn` (replicated): over a 1-D mesh when there are several devices.
    The devices must be this process's own (no collective across processes)."""
    if devices is None:
        devices = jax.local_devices()
        if len(devices) == 1:
            return None, None, 1  # JAX's default placement (a local device)
    devices = list(devices)
    if not devices:
        raise ValueError(f"{name}: devices is empty")
    here = jax.process_index()
    for d in devices:
        if getattr(d, "process_index", here) != here:
            raise ValueError(
                f"{name}: devices must be this process's own (jax.local_devices(): "
                f"process {here}); {d} belongs to process {d.process_index}. Across "
                f"processes each one computes its share of the chunks on its local "
                f"devices.")
    if len(devices) == 1:
        one = jax.sharding.SingleDeviceSharding(devices[0])
        return one, one, 1
    mesh = jax.sharding.Mesh(np.asarray(devices), ("batch",))
    P = jax.sharding.PartitionSpec
    return (jax.sharding.NamedSharding(mesh, P("batch")),
            jax.sharding.NamedSharding(mesh, P()), len(devices))


def _sweep(
    fn: Callable,
    inputs: Any,
    *,
    chunk_size: Any = None,
    checkpoint: Any = None,
    key: str = "",
    progress: bool = True,
    devices: Sequence[Any] | None = None,
    compiler_options: dict[str, Any] | None = None,
    timeout: Any = 3600.0,
    name: str = _NAME,
    on_chunk: Callable | None = None,
) -> tuple[Any, _Report]:
    """[`cdiff.studies.map_batches`][], also returning a `_Report`. `name` (the
    public function) begins the error messages and labels the progress bar;
    `on_chunk(i, out)` is called with each computed chunk's output while it is
    still on the devices (with the padding). Across processes, a failure here
    (an interrupt too) is published to the others, which then stop."""
    peers = _Peers.join(jax.process_index(), jax.process_count(), name)
    try:
        return _sweep_here(fn, inputs, chunk_size=chunk_size, checkpoint=checkpoint,
                           key=key, progress=progress, devices=devices,
                           compiler_options=compiler_options, timeout=timeout,
                           name=name, on_chunk=on_chunk, peers=peers)
    except BaseException as error:
        if peers is not None:
            peers.fail(error)
        raise


def _sweep_here(fn, inputs, *, chunk_size, checkpoint, key, progress, devices,
                compiler_options, timeout, name, on_chunk,
                peers: _Peers | None) -> tuple[Any, _Report]:
    paths, arrays, treedef, n = _check_inputs(inputs, name)
    size = _check_chunk_size(chunk_size, n, name)
    if not isinstance(key, str):
        raise ValueError(f"{name}: key must be a str, got {type(key).__name__}")
    timeout = _check_timeout(timeout, name)
    process, count = jax.process_index(), jax.process_count()
    if count > 1 and checkpoint is None:
        raise ValueError(
            f"{name}: across processes (jax.process_count() = {count}) a checkpoint "
            f"directory is required, one that all processes share: each process "
            f"computes its share of the chunks and writes them there, and reads the "
            f"others' chunks from it")
    chunk_sharding, fn_sharding, n_dev = _placement(devices, name)
    width = -(-size // n_dev) * n_dev
    n_chunks = -(-n // size)
    report = _Report(size, width, n_dev, process_index=process, process_count=count)

    items = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
                                         for a in arrays])
    options = _default_options() if compiler_options is None else compiler_options
    with tracing_for(options):
        out_structs, out_treedef = jax.tree.flatten(eqx.filter_eval_shape(fn, items))
    for s in out_structs:
        if not isinstance(s, jax.ShapeDtypeStruct):
            raise ValueError(f"{name}: fn must return a pytree of arrays; it returned "
                             f"a leaf of type {type(s).__name__}")

    directory = None if checkpoint is None else Path(checkpoint)
    sweep = None
    if directory is not None:
        manifest = _manifest(n, size, n_chunks, key, paths, arrays, fn, out_structs,
                             out_treedef)
        if peers is not None:
            peers.agree(manifest, timeout)
        if process != 0:  # process 0 writes the manifest, the others read it
            directory.mkdir(parents=True, exist_ok=True)
            report.wait_time += _wait_for_manifest(directory, timeout, name, process,
                                                   count, peers)
        _open_checkpoint(directory, manifest, name, write=process == 0)
        sweep = _sweep_id(manifest)

    out = [np.empty((n, *s.shape), s.dtype) for s in out_structs]

    def load(i):
        lo, hi = i * size, min(n, (i + 1) * size)
        record = _chunk_record(sweep, i, lo, hi, paths, arrays)
        for o, a in zip(out, _load_chunk(_chunk_path(directory, i), out_structs,
                                         record, name)):
            o[lo:hi] = a
        report.loaded.append(i)

    # This process's share: chunk i is process i % count's (every chunk with one
    # process). The others' chunks are read from the checkpoint once computed.
    todo, others = [], []
    for i in range(n_chunks):
        if i % count != process:
            others.append(i)
        elif directory is not None and _chunk_path(directory, i).exists():
            load(i)
        else:
            todo.append(i)

    if fn_sharding is not None:
        dynamic, static = eqx.partition(fn, eqx.is_array)
        fn = eqx.combine(jax.device_put(dynamic, fn_sharding), static)
    compiled = None
    from tqdm.auto import tqdm

    def items(i):
        return min(n, (i + 1) * size) - i * size

    done = n - sum(items(i) for i in todo + others)
    with tqdm(total=n, initial=done, desc=name.rsplit(".", 1)[-1], unit="run",
              disable=not progress or process != 0) as bar:
        for i in todo:
            if peers is not None:
                peers.check()
            lo, hi = i * size, min(n, (i + 1) * size)
            # The ragged last chunk (and every chunk, to a multiple of the device
            # count) is padded with copies of its last item: one compilation.
            chunk = [a[lo:hi] if hi - lo == width else
                     np.concatenate([a[lo:hi], np.repeat(a[hi - 1:hi],
                                                         width - (hi - lo), 0)])
                     for a in arrays]
            chunk = jax.tree.unflatten(treedef, chunk)
            if chunk_sharding is not None:
                chunk = jax.device_put(chunk, chunk_sharding)
            if compiled is None:
                start = time.perf_counter()
                with tracing_for(options):
                    lowered = _vmapped.lower(fn, chunk)
                compiled = lowered.compile(options)
                report.compile_time = time.perf_counter() - start
            start = time.perf_counter()
            result = compiled(fn, chunk)
            if on_chunk is not None:
                on_chunk(i, result)
            leaves = [np.asarray(x)[:hi - lo]
                      for x in jax.tree.leaves(jax.device_get(result))]
            report.run_time += time.perf_counter() - start
            for o, a in zip(out, leaves):
                o[lo:hi] = a
            if directory is not None:
                _save_chunk(directory, sweep, i, lo, hi, paths, arrays, leaves)
            report.computed.append(i)
            bar.update(hi - lo)
        if others:
            report.wait_time += _gather(directory, others, load, timeout, name,
                                        process, count,
                                        lambda i: bar.update(items(i)), peers)
            report.loaded.sort()
    return jax.tree.unflatten(out_treedef, out), report


def map_batches(
    fn: Callable,
    inputs: Any,
    *,
    chunk_size: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    key: str = "",
    progress: bool = True,
    devices: Sequence[Any] | None = None,
    compiler_options: dict[str, Any] | None = None,
    timeout: float | None = 3600.0,
) -> Any:
    r"""`jax.vmap(fn)(inputs)` for batches larger than memory: in chunks of
    `chunk_size` items, each chunk **one compiled `jax.vmap`ped call split over
    the local devices**, with a progress bar, and (with `checkpoint`) saved as it
    finishes, so that **an interrupted sweep resumes where it stopped** and gives
    the same numbers as an uninterrupted one. **Across processes and hosts**
    (after `jax.distributed.initialize()`) each process computes its share of the
    chunks and all of them return the whole batch's results.

    `fn` maps one item (a pytree of arrays, the batch axis removed) to a pytree of
    arrays, typically running [`cdiff.simulate`][] and reducing its solution to a
    few numbers. It is compiled once: every chunk has the same shape, the ragged
    last one padded with copies of its last item, whose results are dropped.
    Each chunk's results are brought to the host (NumPy) before the next runs, so
    device memory bounds the chunk, not the batch; the results of the whole batch
    must fit in host memory.

    **Arguments:**

    - `fn`: `item -> outputs` (a pytree of arrays). Shared data can be closed
      over, or `fn` can be an `equinox.Module` whose array fields are then traced
      arguments (a new `fn` of the same structure reuses the compilation).
    - `inputs`: a pytree of arrays (NumPy or JAX) whose leaves all have the same
      leading size N, the batch; e.g. `{"l": lengths, "theta0": angles}`.
    - `chunk_size`: items per chunk, default N (one call). Choose it so that a
      chunk fits in device memory.
    - `checkpoint`: a directory (created if needed). Each finished chunk `i` is
      written there as `chunk_{i:05d}.npz` (atomically: to a temporary name, then
      renamed), next to a `manifest.json` holding N, `chunk_size`, `key`, SHA-256
      fingerprints of the inputs and of the array leaves of `fn` (values, shapes
      and dtypes) and the shapes and dtypes of `fn`'s outputs. A rerun with the
      same directory loads the chunks present and computes only the missing ones;
      with other inputs, chunk size, key, `fn` arrays or output shapes it raises a
      `ValueError` instead of mixing results. Each chunk file also records which
      chunk it is: its index, its rows `lo:hi`, a fingerprint of its items (those
      rows of the inputs) and the sweep's fingerprint (of the manifest). A chunk
      file that is not the chunk its name says (copied or renamed over another,
      or taken from another sweep's checkpoint), or that says nothing (written
      by an older version), is refused with a `ValueError` naming the file and
      what differs, rather than recomputed: a checkpoint that has been tampered
      with is worth a look before anything in it is overwritten; delete the file
      to recompute that chunk. The checkpoint cannot see `fn`'s
      code, nor the data a plain function closes over: when you change them,
      change `key` or the directory.
    - `key`: a description of the sweep (e.g. the model's `repr` and horizon),
      stored in and checked against the manifest.
    - `progress`: a progress bar over the items (tqdm), starting at those loaded.
    - `devices`: the devices to split each chunk over, default all local devices
      (`jax.local_devices()`); they must be this process's own. With more than
      one, each chunk is put on a 1-D `jax.sharding.Mesh` with
      `NamedSharding(mesh, PartitionSpec("batch"))` (the array leaves of `fn`
      replicated) and `jax.jit` runs the vmapped call split along the batch.
      The chunk is then padded to a multiple of the device count, like the last
      chunk; the saved chunks do not depend on it, so a sweep can be
      resumed on another number of devices.
    - `compiler_options`: XLA options for the compilation, default
      [`cdiff.compiler_options`][] (`{}` gives JAX's defaults).
    - `timeout`: across processes, the seconds a process waits **without a new
      chunk appearing** in the checkpoint (and, on processes other than 0, for
      the manifest) before it gives up with a `TimeoutError` naming the missing
      chunks; `None` waits without limit. Each new chunk restarts the clock, so
      only a single chunk slower than `timeout` (or a process that never runs
      its share) trips it. Unused in one process.

    **Across processes** (`jax.process_count() > 1`, after
    `jax.distributed.initialize(...)`; one process per host, or per GPU): every
    process calls `map_batches` with the same arguments. Chunk `i` is computed by
    process `i % jax.process_count()` on its own devices (`devices` defaults to
    `jax.local_devices()`; there is no mesh across processes and no collective),
    so the processes never wait on one another while they compute. `checkpoint`
    is required (a `ValueError` before anything runs otherwise) and must be a
    directory that all processes see (a shared file system): process 0 writes
    the manifest (the others wait for it and check it), each process writes its
    chunks there, skips the chunks of its share already there (a rerun resumes,
    also with another process count), then reads the other processes' chunks as
    they appear (polling the directory). **Every process returns the whole
    batch's results** (each holds them in host memory), so the code after the
    call runs the same everywhere; write files from process 0 only. The progress
    bar shows on process 0 only. The processes compare their arguments through
    JAX's distributed runtime before anything runs: when they differ (another
    `key`, other inputs), every process raises a `ValueError` naming the
    difference. A process that raises (an error in `fn`, an interrupt) tells the
    others, which stop at their next chunk or look at the checkpoint with a
    `RuntimeError` quoting its error. If a process dies, JAX's distributed runtime
    aborts the others: at once when process 0 (the coordinator) dies, otherwise
    after `heartbeat_timeout_seconds` (an argument of
    `jax.distributed.initialize`, 100 s by default). The chunks written stay, and
    a rerun resumes.

    **Returns:** `outputs`, the pytree that `fn` returns, with NumPy leaves of
    leading size N, in the order of `inputs`.

    **Raises:** `ValueError` for inputs that are not arrays with a common,
    non-zero leading size, a `chunk_size` below 1, an `fn` that does not return
    arrays, a checkpoint of another sweep, a chunk file that is unreadable or not
    the chunk its name says, devices of another process, and a missing
    `checkpoint` across processes, and processes called with different
    arguments; `RuntimeError` when another process failed; `TimeoutError` when,
    across processes, the other processes' chunks stop coming (see `timeout`).

    !!! example

        The final angle of a pendulum for 1000 lengths and initial angles, in
        chunks of 256, resumable:

        ```python
        def final_angle(item):
            model = cdiff.models.ParticleOnCircle(rho=item["r"], g=9.81, speed=0.0)
            q0 = item["r"] * jnp.stack([jnp.cos(item["theta0"]),
                                        jnp.sin(item["theta0"])])
            sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, jnp.zeros(2),
                                 t1=1.0, dt=1e-2, saveat=cdiff.SaveAt(t1=True))
            return jnp.arctan2(sol.q[-1, 1], sol.q[-1, 0])

        r, theta0 = np.meshgrid(np.linspace(0.5, 2.0, 40), np.linspace(-1, 0, 25))
        angles = cdiff.studies.map_batches(
            final_angle, {"r": r.ravel(), "theta0": theta0.ravel()},
            chunk_size=256, checkpoint="out/pendulum-sweep", key="t1=1, dt=1e-2")
        ```

    !!! example

        The same sweep over several hosts (or one process per GPU), e.g. with
        `srun python sweep.py` in a SLURM job, where
        `jax.distributed.initialize()` finds the coordinator, the process count
        and this process's index by itself, and gives each process one GPU, the
        `SLURM_LOCALID`-th (for one process per node driving all its GPUs, pass
        `local_device_ids=range(gpus_per_node)`; outside SLURM, pass
        `coordinator_address="host0:1234", num_processes=..., process_id=...`).
        The checkpoint must be on a file system every host sees:

        ```python
        import jax

        jax.distributed.initialize()  # before any other JAX call

        angles = cdiff.studies.map_batches(
            final_angle, {"r": r.ravel(), "theta0": theta0.ravel()},
            chunk_size=256, checkpoint="/shared/out/pendulum-sweep",
            key="t1=1, dt=1e-2")
        # Every process has all 1000 angles; process i computed chunks i, i + P, ...
        if jax.process_index() == 0:
            np.save("/shared/out/angles.npy", angles)
        ```
    """
    return _sweep(fn, inputs, chunk_size=chunk_size, checkpoint=checkpoint, key=key,
                  progress=progress, devices=devices,
                  compiler_options=compiler_options, timeout=timeout)[0]
