r"""The checkpoint of [`cdiff.studies.map_batches`][]: its files and their format
(a `manifest.json` describing the sweep, one `chunk_{i:05d}.npz` per finished
chunk recording which chunk it holds), written atomically, read back and
checked against the sweep being run."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

_FORMAT = "cdiff.studies.map_batches checkpoint, version 2"
_MANIFEST = "manifest.json"
#: The entry of a chunk file that says which chunk of which sweep it holds.
_RECORD = "chunk_record"


def _fingerprint(paths, arrays) -> str:
    """SHA-256 of arrays' paths, dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for path, a in zip(paths, arrays):
        h.update(f"\0{path}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _arrays_of(fn):
    """The array leaves of `fn` (an `equinox.Module`'s fields; none for a plain
    function) on the host, and their paths."""
    flat = jax.tree_util.tree_flatten_with_path(eqx.filter(fn, eqx.is_array))[0]
    return ([jax.tree_util.keystr(p) for p, _ in flat],
            [np.asarray(x) for _, x in flat])


def _write(path: Path, write) -> None:
    """Write a file atomically: to a hidden temporary name, then `os.replace`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _chunk_path(directory: Path, i: int) -> Path:
    return directory / f"chunk_{i:05d}.npz"


def _open_checkpoint(directory: Path, manifest: dict, name: str,
                     write: bool = True) -> None:
    """Create the checkpoint directory and its manifest, or check that the
    manifest already there describes the same sweep. With `write=False` (the
    processes other than 0) the manifest must already be there."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _MANIFEST
    if write and not path.exists():
        if any(directory.glob("chunk_*.npz")):
            raise ValueError(f"{name}: {directory} holds chunk files but no "
                             f"{_MANIFEST}; use an empty directory")
        _write(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{name}: cannot read {path} ({e})") from e
    differ = _differences(saved, manifest)
    if differ:
        raise ValueError(
            f"{name}: the checkpoint in {directory} is of another sweep; it differs "
            f"in " + "; ".join(differ) + ". Resume with the same inputs, chunk_size "
            "and key (and fn), or use another (or an emptied) directory.")


def _differences(saved: dict, manifest: dict,
                 labels: tuple[str, str] = ("saved", "now")) -> list[str]:
    """What differs between two manifests, in words ("the key: saved 'a', now
    'b'", with `labels` naming the two); the fingerprints by name only."""
    what = {"format": "the file format", "n": "the batch size",
            "chunk_size": "the chunk size", "key": "the key",
            "inputs": "the inputs (values, shapes or dtypes)",
            "fn_arrays": "the array leaves of fn (values, shapes or dtypes)",
            "outputs": "fn's output shapes or dtypes",
            "output_structure": "fn's output structure (its names or nesting)"}
    return [f"{text}: {labels[0]} {_short(saved.get(k))}, {labels[1]} "
            f"{_short(manifest[k])}"
            if k not in ("inputs", "fn_arrays") else text
            for k, text in what.items() if saved.get(k) != manifest[k]]


def _short(value, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _sweep_id(manifest: dict) -> str:
    """SHA-256 of the manifest: the sweep's fingerprint, stored in every chunk."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _chunk_record(sweep: str, i: int, lo: int, hi: int, paths, arrays) -> dict:
    """What identifies chunk `i` (rows `lo:hi`) of the sweep `sweep`: stored in its
    file and checked when it is loaded."""
    return {"format": _FORMAT, "sweep": sweep, "index": i, "rows": [lo, hi],
            "items": _fingerprint(paths, [a[lo:hi] for a in arrays])}


def _load_chunk(path: Path, structs, record: dict, name: str) -> list[np.ndarray]:
    """The output leaves saved in `path`, after checking that it holds the chunk
    `record` describes (its index, rows and items, of this sweep): `ValueError`
    naming the file and what differs otherwise (a file copied or moved over
    another, or from another sweep's checkpoint)."""
    i, (lo, hi) = record["index"], record["rows"]
    fix = f"Delete it to recompute chunk {i}."
    try:
        with np.load(path) as data:
            leaves = [data[f"arr_{k}"] for k in range(len(structs))]
            saved = json.loads(str(data[_RECORD])) if _RECORD in data.files else None
    except Exception as e:  # a damaged file: say which one
        raise ValueError(f"{name}: cannot read {path} ({e}); delete it to "
                         f"recompute that chunk") from e
    if not isinstance(saved, dict):
        raise ValueError(f"{name}: {path} does not say which chunk it holds (no "
                         f"{_RECORD!r} entry: not written by {_FORMAT}). {fix}")
    differ = []
    if saved.get("sweep") != record["sweep"]:
        differ.append("it belongs to another sweep (its sweep fingerprint differs "
                      "from the manifest's)")
    if saved.get("index") != i or saved.get("rows") != [lo, hi]:
        rows = saved.get("rows")
        rows = (f"rows {rows[0]}:{rows[1]}" if isinstance(rows, list)
                and len(rows) == 2 else "unknown rows")
        differ.append(f"it holds chunk {saved.get('index')} ({rows}), not chunk {i} "
                      f"(rows {lo}:{hi})")
    if saved.get("items") != record["items"]:
        differ.append(f"its items (input rows) differ from rows {lo}:{hi} of the "
                      f"inputs")
    if differ:
        raise ValueError(f"{name}: {path} is not chunk {i} of this sweep: "
                         + "; ".join(differ) + f". It may have been copied or "
                         f"renamed over another chunk file. {fix}")
    for a, s in zip(leaves, structs):
        if a.shape != (hi - lo, *s.shape) or a.dtype != s.dtype:
            raise ValueError(f"{name}: {path} holds an array of shape {a.shape} and "
                             f"dtype {a.dtype}; expected {(hi - lo, *s.shape)} and "
                             f"{s.dtype}. {fix}")
    return leaves


def _manifest(n: int, size: int, n_chunks: int, key: str, paths, arrays, fn,
              out_structs, out_treedef) -> dict:
    """The manifest of a sweep: what a checkpoint (and every process) checks."""
    return {
        "format": _FORMAT, "n": n, "chunk_size": size, "chunks": n_chunks,
        "key": key, "inputs": _fingerprint(paths, arrays),
        "fn_arrays": _fingerprint(*_arrays_of(fn)),
        "outputs": [[list(s.shape), s.dtype.str] for s in out_structs],
        "output_structure": str(out_treedef),
    }


def _save_chunk(directory: Path, sweep: str, i: int, lo: int, hi: int, paths,
                arrays, leaves) -> None:
    """Write chunk `i` (rows `lo:hi`, output `leaves`) of the sweep `sweep`, with
    the record that `_load_chunk` checks."""
    record = json.dumps(_chunk_record(sweep, i, lo, hi, paths, arrays))
    _write(directory / f"chunk_{i:05d}.npz",
           lambda f, leaves=leaves, record=record: np.savez(
               f, *leaves, **{_RECORD: np.asarray(record)}))
