"""`cdiff.cached_jit`: programs kept on disk as `jax.export` programs, found by a
key computed without tracing (the package cdiff/_export).

Checked against independent truth: results against `eqx.filter_jit`'s, traces
counted by a side effect in the traced function (an attribute of the function,
`fn.traces`), files on disk, and JAX's own persistent-cache hit events."""

import functools
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import compilation_cache

import cdiff
import export_cache_subjects as subjects

# private on purpose: the cache key's internal parts (source hash, device, file times)
from cdiff import _export
from export_cache_subjects import Spring, energy

#: cdiff's source hash, fixed: someone editing cdiff's files while the tests run
#: turns the cache off (rightly: see test_source_hashes_follow_the_files), and the
#: tests would see that instead of what they check.
SOURCE_HASH = "cdiff-source-under-test"

X = jnp.array([1.0, 2.0, 3.0])


@pytest.fixture(autouse=True)
def _fixed_source_hash(monkeypatch):
    monkeypatch.setattr(_export._process, "cdiff_source_hash", lambda: SOURCE_HASH)


def _set_cache(directory, min_compile_time) -> None:
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_time)
    compilation_cache.reset_cache()  # JAX reads the folder at its first compile


@pytest.fixture
def cache(tmp_path):
    """`cdiff.use_compilation_cache` in a fresh folder, JAX keeping every program
    (also those that compile in under a second); JAX's settings restored after."""
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    path = cdiff.use_compilation_cache(tmp_path / "cache")
    _set_cache(str(path), 0)
    # The references are jitted afresh: `jax.jit` keeps a program traced with
    # the globals of an earlier test (see "a global it reads" below).
    jax.clear_caches()
    yield path
    _set_cache(*before)


@pytest.fixture
def no_cache():
    """JAX's persistent cache off (as the suite runs), whatever an earlier test in
    this process did; restored after."""
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    _set_cache(None, before[1])
    yield
    _set_cache(*before)


def spring(power=2, k=3.0):
    return Spring(jnp.asarray(k, jnp.float64), power)  # strongly typed


def stored(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "exported").glob("*.exported"))


def assert_same(a, b) -> None:
    """The same tree, the same static leaves, and bit for bit the same arrays."""
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        if eqx.is_array(x):
            assert eqx.is_array(y) and x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            assert type(x) is type(y) and x == y


class Hits:
    """JAX's persistent-cache hits while it is open."""

    def __enter__(self):
        self.count = 0
        jax.monitoring.register_event_listener(self._event)
        return self

    def _event(self, event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            self.count += 1

    def __exit__(self, *_):
        jax.monitoring.unregister_event_listener(self._event)


# ---------------------------------------------------------------------------
# (a) what jax.jit returns


def test_a_cached_call_returns_what_jit_returns(cache):
    """A small function with a static output leaf, and a pendulum's solve (a
    model with its parameter an array input, a `cdiff.Solution`'s fields): the
    same as `eqx.filter_jit`'s, bit for bit, when traced and when loaded."""
    assert_same(cdiff.cached_jit(energy)(spring(), X),
                eqx.filter_jit(energy)(spring(), X))
    args = subjects.pendulum_arguments()
    expected = eqx.filter_jit(subjects.SOLVE)(*args)
    fresh = cdiff.cached_jit(subjects.SOLVE).compile(*args)
    assert fresh.source == "exported"
    assert_same(fresh(*args), expected)
    loaded = cdiff.cached_jit(subjects.SOLVE).compile(*args)
    assert loaded.source == "disk"
    assert_same(loaded(*args), expected)
    # Other values of the inputs (a heavier bob, another start): the same program.
    other = (subjects.Pendulum(m=jnp.asarray(2.5)), jnp.array([0.0, -1.0]),
             jnp.array([1.0, 0.0]))
    assert_same(loaded(*other), eqx.filter_jit(subjects.SOLVE)(*other))


# ---------------------------------------------------------------------------
# (b) loaded, not traced


def test_a_second_call_loads_from_disk_without_tracing(cache):
    """In memory: the same wrapper's second call neither traces nor reads. From
    disk (a new wrapper, JAX's in-memory caches cleared): nothing is traced, and
    XLA's compile of the loaded program is a persistent-cache hit, although it
    compiles in well under JAX's threshold for keeping a program (1 s)."""
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    first = cdiff.cached_jit(energy)
    traces = energy.traces
    out = first(spring(), X)
    assert energy.traces == traces + 1 and len(stored(cache)) == 1
    first(spring(), X * 2)  # other values, same kind: the same program
    assert energy.traces == traces + 1
    jax.clear_caches()
    with Hits() as hits:
        second = cdiff.cached_jit(energy).compile(spring(), X)
    assert second.source == "disk" and energy.traces == traces + 1
    assert hits.count >= 1
    assert_same(second(spring(), X), out)


def test_a_second_process_loads_the_program_and_traces_nothing(cache):
    """The pendulum's solve, stored by this process, loaded by a fresh one: no
    trace, XLA's compile answered by the persistent cache, the same numbers."""
    args = subjects.pendulum_arguments()
    compiled = cdiff.cached_jit(subjects.SOLVE).compile(*args)
    assert compiled.source == "exported"
    q, v, _ = compiled(*args)
    code = ("import sys; sys.path.insert(0, {!r}); import export_cache_subjects; "
            "export_cache_subjects.main({!r}, {!r})").format(
                str(Path(__file__).parent), str(cache), SOURCE_HASH)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["traces"] == 0 and child["source"] == "disk", child
    assert child["hits"] >= 1 and child["successful"]
    assert child["q"] == q.tolist() and child["v"] == v.tolist()


# ---------------------------------------------------------------------------
# (c) every part of the key


def _weak(x):
    """`x` as a weakly typed array (as a Python scalar becomes inside `jit`)."""
    return jax.jit(lambda: x)() if isinstance(x, float) else x


def _patched(monkeypatch, target, name, value):
    """The first call again, with `target.name` patched to `value`."""
    monkeypatch.setattr(target, name, value)
    return energy, (spring(), X), {}


CHANGES = {
    "a static field": lambda mp: (energy, (spring(power=3), X), {}),
    "a leaf's shape": lambda mp: (energy, (spring(), jnp.arange(4.0)), {}),
    "a leaf's dtype": lambda mp: (energy, (spring(), X.astype(jnp.float32)), {}),
    "a leaf's weak type": lambda mp: (energy, (Spring(_weak(3.0), 2), X), {}),
    "a setting passed": lambda mp: (energy, (spring(), X), {"scale": 2.0}),
    "a setting bound": lambda mp: (functools.partial(energy, scale=2.0),
                                   (spring(), X), {}),
    "a global it reads": lambda mp: _patched(mp, subjects, "OFFSET", 1.0),
    "cdiff's source": lambda mp: _patched(mp, _export._process, "cdiff_source_hash",
                                          lambda: "edited"),
    "jax's version": lambda mp: _patched(mp, jax, "__version__", "0.0.0+another"),
    "the device kind": lambda mp: _patched(mp, _export._process, "_device",
                                           lambda: ("cpu", "another", "")),
    "EQX_ON_ERROR": lambda mp: _patched(mp, eqx._config, "EQX_ON_ERROR", "nan"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_part_of_the_key_changed_misses(change, cache, monkeypatch):
    """With the program of `energy(spring(), X)` stored, a call that differs in
    one part of the key is traced again and stored beside it, and returns what
    `eqx.filter_jit` returns for it: never the stored program."""
    assert Spring(_weak(3.0), 2).k.weak_type and not spring().k.weak_type
    base = cdiff.cached_jit(energy)
    base(spring(), X)
    assert len(stored(cache)) == 1
    fn, args, kwargs = CHANGES[change](monkeypatch)
    expected = eqx.filter_jit(fn)(*args, **kwargs)
    traces = energy.traces
    compiled = cdiff.cached_jit(fn).compile(*args, **kwargs)
    assert compiled.source == "exported" and energy.traces == traces + 1
    assert len(stored(cache)) == 2
    assert_same(compiled(*args, **kwargs), expected)
    monkeypatch.undo()
    monkeypatch.setattr(_export._process, "cdiff_source_hash", lambda: SOURCE_HASH)
    # The first call's key still finds its own program.
    again = cdiff.cached_jit(energy).compile(spring(), X)
    assert again.source == "disk" and energy.traces == traces + 1


def test_jax_enable_x64_is_part_of_the_key(cache):
    """The same float32 call with x64 off and on: two programs."""
    x = X.astype(jnp.float32)
    s = Spring(jnp.asarray(3.0, jnp.float32), 2)
    cdiff.cached_jit(energy)(s, x)
    with jax.enable_x64(False):
        traces = energy.traces
        compiled = cdiff.cached_jit(energy).compile(s, x)
        assert compiled.source == "exported" and energy.traces == traces + 1
    assert len(stored(cache)) == 2


def test_an_edited_source_file_changes_the_key(cache, tmp_path, monkeypatch):
    """A function of yours in its own file: the file's contents are in the key
    (a later process with the edited file compiles again), and a file modified
    after this process started turns the cache off for it (the code in memory
    may not be the file's)."""
    import importlib

    path = tmp_path / "edited_module.py"
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(factor):
        path.write_text(f"def f(x):\n    return x * {factor}\n")
        # As if this process had started after the file was written.
        monkeypatch.setattr(_export._sources, "_PROCESS_START", time.time() + 1)

    write(2.0)
    module = importlib.import_module("edited_module")
    monkeypatch.setitem(sys.modules, "edited_module", module)  # removed after
    assert cdiff.cached_jit(module.f).compile(X).source == "exported"
    write(3.0)  # the same size
    module = importlib.reload(module)
    compiled = cdiff.cached_jit(module.f).compile(X)
    assert compiled.source == "exported" and len(stored(cache)) == 2
    assert_same(compiled(X), X * 3.0)
    # Modified after this process started: not cached.
    monkeypatch.setattr(_export._sources, "_PROCESS_START", time.time() - 1)
    path.touch()
    compiled = cdiff.cached_jit(module.f).compile(X)
    assert compiled.source == "jit" and len(stored(cache)) == 2
    assert_same(compiled(X), X * 3.0)


def test_source_hashes_follow_the_files(tmp_path, monkeypatch):
    """`tree_digest` (cdiff's source hash, on cdiff's folder): the `.py` files'
    paths and contents; a file modified after the process started refuses."""
    (tmp_path / "pkg").mkdir()

    def write(name, text):
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(_export._sources, "_PROCESS_START", time.time() + 1)

    write("a.py", "A = 1\n")
    write("pkg/b.py", "B = 2\n")
    write("notes.txt", "not code")
    first = _export.tree_digest(tmp_path)
    assert len(first) == 64 and first == _export.tree_digest(tmp_path)
    write("notes.txt", "still not code")
    assert _export.tree_digest(tmp_path) == first
    write("pkg/b.py", "B = 3\n")
    assert _export.tree_digest(tmp_path) != first
    write("pkg/b.py", "B = 2\n")
    assert _export.tree_digest(tmp_path) == first
    write("pkg/c.py", "")
    assert _export.tree_digest(tmp_path) != first
    monkeypatch.setattr(_export._sources, "_PROCESS_START", time.time() - 1)
    (tmp_path / "a.py").touch()
    with pytest.raises(_export.Unkeyable, match="modified after this process"):
        _export.tree_digest(tmp_path)


# ---------------------------------------------------------------------------
# (d) host callbacks, and what the key cannot describe


def test_a_program_with_a_host_callback_falls_back_to_jit(cache, monkeypatch):
    """`eqx.error_if` (a host callback) cannot be exported: the call is compiled
    by jax.jit, its check still raises, and a marker tells later processes not
    to try `jax.export` again."""
    compiled = cdiff.cached_jit(subjects.checked).compile(X)
    assert compiled.source == "jit"
    assert_same(compiled(X), X * 2.0)
    with pytest.raises(Exception, match="negative"):
        compiled(-X)
    assert stored(cache) == []
    assert len(list((cache / "exported").glob("*.jit"))) == 1

    def refuse(*_, **__):
        raise AssertionError("jax.export tried again")

    monkeypatch.setattr(jax.export, "export", refuse)
    again = cdiff.cached_jit(subjects.checked)
    assert_same(again(X), X * 2.0)
    with pytest.raises(eqx.EquinoxRuntimeError, match="negative"):
        again(-X)  # as eqx.filter_jit raises it
    assert again.compile(X).source == "jit"


def test_what_the_key_cannot_describe_is_compiled_by_jit(cache):
    """Code without a source file, a value the key cannot write down (a lock),
    and calls under an outer transformation: compiled as `eqx.filter_jit`
    compiles them, nothing stored."""
    namespace = {"jnp": jnp}
    exec("def g(x):\n    return jnp.sin(x)\n", namespace)
    g = namespace["g"]
    compiled = cdiff.cached_jit(g).compile(X)
    assert compiled.source == "jit"
    assert_same(compiled(X), jnp.sin(X))

    lock = threading.Lock()

    def locked(x):
        with lock:
            return x + 1.0

    assert cdiff.cached_jit(locked).compile(X).source == "jit"
    assert_same(cdiff.cached_jit(locked)(X), X + 1.0)

    def total(x):
        return cdiff.cached_jit(energy)(spring(), x)["energy"]

    def reference(x):
        return energy(spring(), x)["energy"]

    xs = jnp.stack([X, 2 * X])
    assert_same(jax.grad(total)(X), jax.jit(jax.grad(reference))(X))
    assert_same(jax.vmap(total)(xs), jax.jit(jax.vmap(reference))(xs))
    assert stored(cache) == []


def test_without_a_compilation_cache_it_is_filter_jit(no_cache):
    compiled = cdiff.cached_jit(energy).compile(spring(), X)
    assert compiled.source == "jit"
    assert_same(compiled(spring(), X), eqx.filter_jit(energy)(spring(), X))
    assert_same(cdiff.cached_jit(energy)(spring(), X),
                eqx.filter_jit(energy)(spring(), X))


# ---------------------------------------------------------------------------
# (e) damaged files


DAMAGE = {
    "truncated": lambda blob: blob[: len(blob) // 2],
    "empty": lambda blob: b"",
    "garbage": lambda blob: os.urandom(len(blob)),
    "one byte changed": lambda blob: blob[:-100] + bytes([blob[-100] ^ 1])
    + blob[-99:],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_ignored_and_rewritten(damage, cache):
    cdiff.cached_jit(energy)(spring(), X)
    (name,) = stored(cache)
    path = cache / "exported" / name
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    traces = energy.traces
    compiled = cdiff.cached_jit(energy).compile(spring(), X)
    assert compiled.source == "exported" and energy.traces == traces + 1
    assert_same(compiled(spring(), X), eqx.filter_jit(energy)(spring(), X))
    assert cdiff.cached_jit(energy).compile(spring(), X).source == "disk"


def test_an_unreadable_jax_cache_entry_is_replaced(cache):
    """An entry of JAX's own cache (XLA's program) truncated or garbage: JAX
    warns and compiles, but never writes over an existing file, so every later
    process would warn again. cdiff replaces it (saying so), and the next
    compile is a hit, silently."""
    cdiff.cached_jit(energy)(spring(), X)
    (entry,) = cache.glob("jit_energy-*-cache")
    whole = entry.read_bytes()
    entry.write_bytes(whole[:100])
    with pytest.warns(UserWarning, match=r"jit_energy-.*-cache could not be read "
                      r".*replaced by the program compiled now"):
        compiled = cdiff.cached_jit(energy).compile(spring(), X)
    assert compiled.source == "disk"  # (the exported program was fine)
    assert_same(compiled(spring(), X), eqx.filter_jit(energy)(spring(), X))
    # Written anew under the same key (XLA's bytes may differ a little).
    assert len(compilation_cache.decompress_executable(entry.read_bytes())) > 4
    assert abs(len(entry.read_bytes()) - len(whole)) < 0.1 * len(whole)
    with Hits() as hits, warnings.catch_warnings():
        warnings.simplefilter("error")
        cdiff.cached_jit(energy).compile(spring(), X)
    assert hits.count == 1


def test_a_second_cache_folder_takes_over(tmp_path, cache):
    """`use_compilation_cache(d2)` after a compile in `d1`: what compiles next
    goes to d2, JAX's programs as well as cdiff's exported ones (JAX opens its
    cache once; cdiff reopens it)."""
    cdiff.cached_jit(energy)(spring(), X)
    first = sorted(p.name for p in cache.rglob("*") if p.is_file())
    other = cdiff.use_compilation_cache(tmp_path / "other")
    assert other == tmp_path / "other"
    cdiff.cached_jit(energy)(spring(power=3), X)  # another program
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == first
    assert len(stored(other)) == 1 and len(list(other.glob("jit_energy-*"))) == 1


# ---------------------------------------------------------------------------
# (f) a file where a folder should be


def test_a_file_where_the_folder_should_be(tmp_path, capsys, monkeypatch, no_cache):
    file = tmp_path / "a-file"
    file.write_text("")
    with pytest.raises(ValueError, match="a-file .* is a file, not a folder"):
        cdiff.use_compilation_cache(file)
    with pytest.raises(ValueError, match="is a file, not a folder"):
        cdiff.use_compilation_cache(file / "below")
    # The command line: a CDIFF_COMPILATION_CACHE that names a file is a user
    # error, one line naming the variable and the path, exit 2, before any work.
    from cdiff import cli

    monkeypatch.setenv("CDIFF_COMPILATION_CACHE", str(file))
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "slider-crank", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.strip() == (f"cdiff: error: CDIFF_COMPILATION_CACHE={file}: {file} "
                           "(or a folder above it) is a file, not a folder; set it "
                           "to a folder, or to 0 to compile without a cache"), err
    assert not (tmp_path / "out").exists()
    # The default folder failing only warns: the command runs on, without one (on
    # to its next check, of an --out that is a file too, which stops it).
    monkeypatch.delenv("CDIFF_COMPILATION_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(file))
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "slider-crank", "--out", str(file)])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"--out {file}: exists and is not a directory" in err, err
    assert jax.config.jax_compilation_cache_dir is None
    warning = [line for line in err.splitlines() if line.startswith("cdiff: warning:")]
    assert len(warning) == 1 and "is a file, not a folder" in warning[0]
    assert "CDIFF_COMPILATION_CACHE" in warning[0] and "Traceback" not in err
    # JAX's cache in a folder whose `exported` is a file: a warning, then jit.
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "exported").write_text("")
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="exported .*is a file, not a folder"):
        out = cdiff.cached_jit(energy)(spring(), X)
    assert_same(out, eqx.filter_jit(energy)(spring(), X))


# ---------------------------------------------------------------------------
# Where cdiff uses it


def test_tune_loads_its_step_in_a_later_call(cache):
    """`cdiff.studies.tune`'s optimiser step: stored by the first fit, loaded by
    the second (nothing traced), the same losses as without a cache."""
    params = {"x": jnp.array([0.0, 3.0])}
    first = cdiff.studies.tune(subjects.quadratic_loss, params, steps=3,
                               progress=False)
    assert len(stored(cache)) == 1
    traces = subjects.quadratic_loss.traces
    second = cdiff.studies.tune(subjects.quadratic_loss, params, steps=3,
                                progress=False)
    assert subjects.quadratic_loss.traces == traces
    np.testing.assert_array_equal(second.history, first.history)
    assert_same(second.params, first.params)
    jax.config.update("jax_compilation_cache_dir", None)
    plain = cdiff.studies.tune(subjects.quadratic_loss, params, steps=3,
                               progress=False)
    np.testing.assert_array_equal(plain.history, first.history)


def test_cdiff_run_loads_its_solve_from_the_cache(tmp_path, monkeypatch):
    """`cdiff run` twice with one cache folder: the first run stores its solve,
    the second loads it (its npz says so) and writes nothing new."""
    from cdiff import cli

    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CDIFF_COMPILATION_CACHE", str(cache))
    sources = []
    try:
        for _ in range(2):
            _set_cache(None, 0)
            out = tmp_path / f"out{len(sources)}"
            assert cli.main(["run", "particle-on-circle", "--t1", "0.05",
                             "--no-progress", "--out", str(out)]) == 0
            with np.load(out / "particle-on-circle.npz") as data:
                sources.append(json.loads(str(data["settings"]))["program_source"])
            if len(sources) == 1:
                written = sorted(p.name for p in cache.rglob("*") if p.is_file())
    finally:
        _set_cache(*before)
    assert sources == ["exported", "disk"]
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == written
    # XLA's program of the loaded solve, in JAX's cache under the solve's name.
    assert any(name.startswith("jit_simulate-") for name in written), written
