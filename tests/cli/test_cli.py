"""The `cdiff` command line, called in-process through `cdiff.cli.main`."""

import contextlib
import dataclasses
import io
import json
import math
import re
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
import pytest

import cdiff
import cdiff_cli_entry

# private on purpose: the TeX-to-text converter of `cdiff list` and the figure
# layout of `cdiff run` are kernels that no public call returns.
from cdiff import cli
from cdiff.cli import _figure, _outputs, _solve
from cdiff.cli import _plain_text


def _table_value(out: str, key: str) -> float:
    match = re.search(rf"^{key}\s+(\S+)", out, re.MULTILINE)
    assert match, f"no {key!r} row in:\n{out}"
    return float(match.group(1))


def _exit_code(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    return info.value.code, capsys.readouterr().err


def _list_entries(out: str) -> dict[str, str]:
    """`cdiff list`'s entries: name -> its description (the wrapped lines
    joined; the last line, the defaults or the Python constructor, left out)."""
    entries: dict[str, list[str]] = {}
    name = None
    for line in out.splitlines():
        if not line.startswith("  "):
            name = None
        elif line[2] != " ":
            name, _, text = line[2:].partition(" ")
            entries[name] = [text.strip()] if text.strip() else []
        elif name is not None:
            entries[name].append(line.strip())
    return {k: " ".join(v[:-1]) for k, v in entries.items()}


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [*cdiff.models.MODELS, *cli.FORMULATIONS, *cli.PROJECTIONS]:
        assert name in out
    assert "Braun & Goldfarb" in out
    # Plain text: no LaTeX, no Markdown code or cross-references.
    assert "$" not in out and "`" not in out and "][" not in out
    assert not re.search(r"\\[A-Za-z]", out), re.search(r".*\\[A-Za-z].*", out)
    entries = _list_entries(out)
    assert set(entries) == {*cdiff.models.MODELS, *cdiff.models.MJCF_LIBRARY,
                            *cli.FORMULATIONS, *cli.PROJECTIONS}
    assert "I = 2/5 mr²" in entries["rolling-sphere"]
    # Names that build the same class are told apart.
    for a, b in [("ggl", "ggl-no-inverse"), ("newton", "newton-weighted"),
                 ("gradient", "gradient-second")]:
        assert entries[a] != entries[b]
    assert 'variant="no_inverse"' in entries["ggl-no-inverse"]
    # Whole sentences: no description ends mid-sentence (index-one's used to
    # stop at the colon before its equations).
    for name in [*cdiff.models.MODELS, *cli.FORMULATIONS, *cli.PROJECTIONS]:
        assert entries[name].endswith("."), (name, entries[name])
    assert entries["index-one"].endswith("the acceleration-level constraints.")


@pytest.mark.parametrize("tex, text", [
    (r"I = \tfrac25 mr^2", "I = 2/5 mr²"),
    (r"\frac{a+b}{2}", "(a+b)/2"),
    (r"\dot q = M^{-1}(Q + G^T\mu)", "q\u0307 = M⁻¹(Q + Gᵀμ)"),
    (r"A_v\ddot q = b_v", "A_v q\u0308 = b_v"),
    (r"\sqrt{\text{damping}} \lesssim \|A\|_F", "√damping ≲ ‖A‖_F"),
    (r"\unknowncommand x", "unknowncommand x"),
])
def test_tex_to_plain_text(tex, text):
    assert _plain_text.from_tex(tex) == text


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short default run (udwadia-kalaba, float64), shared by the tests below:
    its exit status, stdout, output folder and stderr."""
    out = tmp_path_factory.mktemp("out")
    capture, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(capture), contextlib.redirect_stderr(errors):
        code = cli.main(["run", "slider-crank", "--t1", "0.5", "--dt", "0.01",
                         "--out", str(out), "--no-progress"])
    return code, capture.getvalue(), out, errors.getvalue()


def test_run_says_what_it_does_and_times_the_whole_command(short_run):
    _, out, folder, err = short_run
    # One line on stderr as each phase starts, in order, with the time so far.
    starts = ["setting up slider-crank", "compiling the solve", "running from t = 0 "
              "to 0.5 s (50 steps)", "computing the reference solution",
              f"plotting {folder / 'slider-crank.png'}",
              f"writing {folder / 'slider-crank.npz'}"]
    lines = err.splitlines()
    assert len(lines) == len(starts), err
    seconds = []
    for line, start in zip(lines, starts):
        match = re.fullmatch(r"\[\s*(\S+) s\] (.*) \.\.\.", line)
        assert match and match.group(2).startswith(start), (line, start)
        seconds.append(float(match.group(1)))
    assert seconds == sorted(seconds)
    # The wall time: the whole command, with each phase.
    total = _table_value(out, "wall time")
    table = out[out.index("wall time"):]
    parts = {k: float(v) for k, v in re.findall(r"([a-z-]+) (\d+\.\d+) s", table)}
    assert {"set-up", "compile", "run", "reference", "plotting", "writing"} <= set(
        parts)
    # `other` is the total less the phases; each is printed to 0.01 s: the sum is
    # the total to half a unit of each printed part and of the total (measured
    # 8.9e-16 and 0.01 in two runs).
    assert sum(parts.values()) == pytest.approx(
        total, rel=0, abs=0.005 * (len(parts) + 1))
    # The last phase started before the end: its start is printed to 0.1 s and the
    # total to 0.01 s, so each is off by up to half a unit (4.35 against a start
    # printed 4.4 is a start at 4.35).
    assert total >= seconds[-1] - 0.05 - 0.005 - 1e-9
    with np.load(folder / "slider-crank.npz") as data:
        settings = json.loads(str(data["settings"]))
    # To the printed digits, 0.01 s (measured up to 2.8e-3).
    assert settings["reference_time_s"] == pytest.approx(parts["reference"],
                                                         rel=0, abs=0.005)
    assert settings["plot_time_s"] == pytest.approx(parts["plotting"], rel=0,
                                                    abs=0.005)


def test_run_figure_panels(short_run):
    # One quantity with one unit per panel, named by the axes' gid.
    _, _, folder, _ = short_run
    with np.load(folder / "slider-crank.npz") as data:
        fig = _figure.figure(dict(data), ("slider x_s [m]",), "title")
    panels = [ax.get_gid() for ax in fig.axes]
    assert panels == ["observable[m]", "error[m]", "position residual",
                      "velocity residual", "energy"]
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert "[m]" in labels[0] and "[m]" in labels[1] and "[J]" in labels[-1]
    assert "Phi_q" in labels[2] and "dot" in labels[3] and "/ s" in labels[3]
    assert all(ax.get_yscale() == "log" for ax in fig.axes[1:])
    # A short run: every saved row, no windows, no envelope.
    assert len(fig.axes[0].lines[1].get_xdata()) == 51
    assert fig.axes[1].get_title(loc="right") == ""


def test_figure_of_a_long_run_windows_and_envelopes(tmp_path):
    # 200 periods of two observables in metres and one in radians, with a
    # reference drifting away; no constraints; an energy exactly conserved.
    ts = np.linspace(0.0, 200.0, 4001)
    ref = np.stack([np.sin(2 * np.pi * ts), np.cos(2 * np.pi * ts), ts], axis=1)
    obs = ref + 1e-6 * ts[:, None]
    data = {"ts": ts, "q": obs, "observable": obs, "reference_observable": ref,
            "observable_error": np.max(np.abs(obs - ref), axis=1),
            "holonomic_residual": np.zeros((ts.size, 0)),
            "velocity_residual": np.zeros((ts.size, 0)),
            "energy": np.full(ts.size, 3.0)}
    fig = _figure.figure(data, ("x [m]", "y [m]", "phi [rad]"), "long run")
    axes = {ax.get_gid(): ax for ax in fig.axes}
    assert list(axes) == ["observable[m]:first", "observable[m]:last",
                          "observable[rad]:first", "observable[rad]:last",
                          "error[m]", "error[rad]", "no constraints", "energy"]
    # The windows: the first and the last three periods.
    first, last = axes["observable[m]:first"], axes["observable[m]:last"]
    assert first.get_xlim()[1] < 4 and last.get_xlim()[0] > 196
    # Each component its colour; its reference the same colour, wide and pale.
    sim = [line for line in first.lines if line.get_linewidth() == 1]
    ref_lines = [line for line in first.lines if line.get_linewidth() > 1]
    assert len(sim) == len(ref_lines) == 2
    assert sim[0].get_color() != sim[1].get_color()
    assert [r.get_color() for r in ref_lines] == [s.get_color() for s in sim]
    # The error panels: one line per observable of that unit, the upper envelope
    # over 400 bins.
    assert [line.get_label() for line in axes["error[m]"].lines] == ["x", "y"]
    assert len(axes["error[m]"].lines[0].get_xdata()) == _figure.BINS
    assert "maximum over 0.5 s" in axes["error[m]"].get_title(loc="right")
    # |E - E0| is exactly 0: said, not left out silently.
    assert "exactly 0 throughout" in axes["energy"].texts[0].get_text()
    _figure.plot(tmp_path / "long.png", data, ("x [m]", "y [m]", "phi [rad]"), "t")
    assert (tmp_path / "long.png").read_bytes()[:4] == b"\x89PNG"


def test_run_prints_table(short_run):
    code, out, _, _ = short_run
    assert code == 0
    # R2 over 0.5 s at dt = 1e-2, UK with constraint correction: measured 1.09e-8,
    # 3.71e-6 J, 8.17e-8 and 4.57e-8 m.
    assert _table_value(out, "max constraint error") < 1e-7
    assert _table_value(out, "max energy error") < 3e-5
    assert _table_value(out, "max velocity constraint error") < 8e-7
    assert "energy change" not in out and not re.search(
        r"^result", out, re.MULTILINE)
    assert _table_value(out, "max observable error") < 4e-7
    assert _table_value(out, "steps") == 50
    # dt = 0.5 / 50 is the double nearest 0.01, printed "0.01" (measured equal).
    assert _table_value(out, "dt") == 0.01
    assert "(asked" not in out
    assert "UdwadiaKalaba()" in out


def test_run_writes_figure_and_data(short_run):
    _, out, folder, _ = short_run
    png, npz = folder / "slider-crank.png", folder / "slider-crank.npz"
    assert f"wrote {png}" in out and f"wrote {npz}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with np.load(npz) as data:  # no pickles needed
        assert {
            "ts", "q", "v", "holonomic_residual", "velocity_residual", "energy",
            "reference_q", "observable", "reference_observable", "observable_error",
            "settings",
        } <= set(data.files)
        assert data["q"].shape == data["reference_q"].shape == (51, 6)
        assert data["q"].dtype == np.float64
        assert data["ts"][-1] == 0.5  # the grid ends at t1 itself
        # As in the table above (measured 1.09e-8 and 4.57e-8).
        assert np.max(np.abs(data["holonomic_residual"])) < 1e-7
        assert np.max(data["observable_error"]) < 4e-7
        settings = json.loads(str(data["settings"]))
        residual, energy = data["holonomic_residual"], data["energy"]
    assert settings["formulation"] == "udwadia-kalaba"
    assert settings["constraint_correction"] is True
    assert settings["energy_correction"] is False
    assert settings["dtype"] == "float64"
    assert settings["steps"] == 50
    # The summary: the table's errors, from the saved rows.
    assert settings["conservative"] is True and settings["t_diverged"] is None
    # The same arithmetic on the same rows, through JSON's exact round trip.
    assert settings["max_constraint_error"] == np.max(np.abs(residual))
    assert settings["max_energy_error"] == np.max(np.abs(energy - energy[0]))
    assert 0 < settings["max_velocity_constraint_error"] < 8e-7  # 8.17e-8
    assert 0 < settings["max_observable_error"] < 4e-7  # 4.57e-8


def test_float32_diverged_solve_reports_and_writes_the_rows_before(tmp_path,
                                                                   capsys):
    # Lagrange without Baumgarte gains at a huge step diverges.
    argv = ["run", "slider-crank", "--float32", "--formulation", "lagrange",
            "--dt", "0.7", "--t1", "50", "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    # The failure, with the time it diverged; the table says it too.
    match = re.search(r"cdiff: error: the solve diverged at t = (\S+) s", captured.err)
    assert match, captured.err
    t_diverged = float(match.group(1))
    assert 0 < t_diverged < 50
    assert re.search(r"^result\s+diverged$", captured.out, re.MULTILINE)
    assert "(asked 0.7)" in captured.out  # diffrax takes 50 / ceil(50 / 0.7)
    assert (tmp_path / "slider-crank.png").read_bytes()[:4] == b"\x89PNG"
    with np.load(tmp_path / "slider-crank.npz") as data:
        # The rows before the divergence only, all finite.
        assert data["ts"][0] == 0 and np.all(data["ts"] < t_diverged)
        for key in ("q", "v", "energy", "holonomic_residual", "observable_error"):
            assert np.all(np.isfinite(data[key])), key
        assert data["q"].dtype == np.float32
        assert data["reference_q"].dtype == np.float64
        settings = json.loads(str(data["settings"]))
    assert settings["dtype"] == "float32"
    assert settings["alpha"] == settings["beta"] == 0.0
    assert settings["result"] != ""
    # To the printed digits (`:g`, 6 significant): measured 1.2e-6 of 5e-6.
    half_unit = 0.5 * 10.0 ** (math.floor(math.log10(t_diverged)) - 5)
    assert settings["t_diverged"] == pytest.approx(t_diverged, rel=0, abs=half_unit)
    assert settings["max_energy_error"] == pytest.approx(
        _table_value(captured.out, "max energy error"), rel=1e-3)


def test_beta_defaults_to_alpha(monkeypatch, tmp_path, capsys):
    # (The two-step `_Pushed` model below: one quick compilation for both runs.)
    monkeypatch.setitem(cli.MODELS, "pushed", _Pushed)
    cases = ((["--alpha", "5"], 5.0), (["--alpha", "5", "--beta", "2"], 2.0))
    for gains, beta in cases:
        assert cli.main(["run", "pushed", "--formulation", "lagrange", *gains, "--out",
                         str(tmp_path), "--no-progress"]) == 0
        assert f"Lagrange(alpha=5.0, beta={beta})" in capsys.readouterr().out
        with np.load(tmp_path / "pushed.npz") as data:
            settings = json.loads(str(data["settings"]))
        assert (settings["alpha"], settings["beta"]) == (5.0, beta)


def test_unknown_model(capsys):
    code, err = _exit_code(["run", "no-such-model"], capsys)
    assert code == 2
    assert "no-such-model" in err
    for name in cdiff.models.MODELS:
        assert name in err


def test_unknown_formulation(capsys):
    code, err = _exit_code(["run", "slider-crank", "--formulation", "euler"], capsys)
    assert code == 2
    assert "udwadia-kalaba" in err and "lagrange" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--dt", "-1"], ["--dt", "positive"]),
        (["--dt", "0"], ["--dt", "positive"]),
        (["--t1", "-2"], ["--t1", "positive"]),
        (["--dt", "nan"], ["--dt", "finite"]),
        (["--dt", "abc"], ["--dt", "not a number"]),
        (["--alpha", "3"], ["--alpha", "lagrange"]),
        (["--formulation", "projection", "--alpha", "3"], ["--alpha", "lagrange"]),
        (["--inertia", "Mc_sym"], ["--inertia", "projection"]),
        (["--projection", "svd"], ["--projection", "newton"]),
        (["--formulation", "null-space", "--beta", "3"], ["--beta", "lagrange"]),
        (["--formulation", "lagrange", "--energy-correction"], ["udwadia-kalaba"]),
        (["--formulation", "lagrange", "--alpha", "-1"], ["--alpha", "non-negative"]),
        (["--formulation", "lagrange", "--inertia", "Mc"], ["--inertia", "projection"]),
    ],
)
def test_bad_options_exit_2(argv, words, capsys):
    code, err = _exit_code(["run", "slider-crank", *argv], capsys)
    assert code == 2
    assert "error:" in err and "Traceback" not in err
    for word in words:
        assert word in err


class _Broken(cdiff.AbstractModel):
    """A model whose mass matrix has the wrong shape."""

    default_t1 = 1.0
    default_dt = 0.1

    def mass_matrix(self, t, q):
        return jnp.eye(3, dtype=q.dtype)

    def initial_state(self):
        return jnp.zeros(2), jnp.zeros(2)


def test_library_value_error_is_a_user_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(cli.MODELS, "broken", _Broken)
    code, err = _exit_code(["run", "broken", "--out", str(tmp_path)], capsys)
    assert code == 2
    # (After the line saying what it was doing.)
    assert err.splitlines()[0].endswith("setting up broken: building the model and "
                                        "checking it at its initial state ...")
    assert err.splitlines()[-1].startswith("cdiff: error: _Broken.mass_matrix")
    assert not (tmp_path / "broken.npz").exists()


# Each with its bound on the constraint error of R1 over 0.2 s (measured 1.39e-13,
# 1.79e-9 and 0: the Newton projection lands on the circle exactly).
@pytest.mark.parametrize("extra, bound", [
    (["--formulation", "projection", "--inertia", "Mc_sym"], 1e-12),
    (["--formulation", "null-space", "--alpha", "5"], 1.5e-8),
    (["--formulation", "projection", "--projection", "newton"], 0.0),
])
def test_other_formulations_run(extra, bound, tmp_path, capsys):
    code = cli.main(["run", "particle-on-circle", "--t1", "0.2", "--out",
                     str(tmp_path), "--no-progress", *extra])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("max constraint error"))
    assert float(line.split()[3]) <= bound


def test_dae_run_stops_at_the_singular_configuration(tmp_path, capsys):
    code = cli.main(["run", "planar-arm-on-curve", "--curve", "line_x0",
                     "--formulation", "ggl", "--rtol", "1e-6", "--atol", "1e-6",
                     "--t1", "1.5", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    assert "BDF(rtol=1e-06" in captured.out
    assert "singular configuration" in captured.err
    assert "Stopped at t = 1.09" in captured.err and "3.141593" in captured.err
    assert (tmp_path / "planar-arm-on-curve.npz").exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--formulation", "ggl", "--alpha", "1"], ["--alpha", "ggl"]),
        (["--formulation", "lagrange", "--rtol", "1e-6"], ["--rtol", "DAE"]),
        (["--formulation", "ggl", "--eps", "1e-6"], ["--eps", "regularized"]),
        (["--curve", "circle"], ["--curve", "planar-arm-on-curve"]),
    ],
)
def test_bad_dae_options_exit_2(argv, words, capsys):
    code, err = _exit_code(["run", "slider-crank", *argv], capsys)
    assert code == 2
    for word in words:
        assert word in err


def test_plot_leaves_out_non_finite_values(tmp_path):
    # The rows of `cdiff run slider-crank --dt 0.5` as it blows up: huge, then inf
    # and NaN; the log axes used to raise OverflowError in matplotlib's ticks.
    ts = np.linspace(0.0, 2.0, 5)
    huge = np.array([0.0, 1e-3, 2e15, 1e246, np.nan])
    data = {"ts": ts, "q": np.stack([huge, ts], axis=1),
            "holonomic_residual": huge[:, None], "velocity_residual": huge[:, None],
            "energy": np.array([7.0, 6.0, 2e32, np.inf, np.nan]),
            "observable": huge[:, None], "reference_observable": ts[:, None],
            "observable_error": huge}
    with np.errstate(all="ignore"):
        _figure.plot(tmp_path / "a.png", data, ("x",), "non-finite rows")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("where, words", [
    ("file", ["--out", "exists and is not a directory"]),
    ("file/sub", ["--out", "cannot create it", "is a file"]),
    ("dir-in-the-way", ["--out", "slider-crank.png", "a directory of that name"]),
    ("read-only", ["--out", "cannot write in", "permission denied"]),
])
def test_out_is_checked_before_the_run(where, words, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    (tmp_path / "dir-in-the-way" / "slider-crank.png").mkdir(parents=True)
    if where == "read-only":  # (root may write anywhere: os.access is what asks)
        (tmp_path / where).mkdir()
        monkeypatch.setattr(_outputs.os, "access", lambda path, mode: False)
    before = sorted(tmp_path.rglob("*"))
    for argv in (["run", "slider-crank"], ["study", "step-size", "slider-crank"]):
        if where == "dir-in-the-way" and argv[0] == "study":
            continue
        code, err = _exit_code([*argv, "--out", str(tmp_path / where)], capsys)
        assert code == 2
        assert "error:" in err and "Traceback" not in err
        for word in words:
            assert word in err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, nothing run


def test_energy_correction_is_refused_for_a_non_conservative_model(capsys):
    code, err = _exit_code(["run", "snakeboard", "--energy-correction"], capsys)
    assert code == 2
    assert "--energy-correction: snakeboard is not conservative" in err


class _Pushed(cdiff.AbstractModel):
    """A unit mass pushed by a unit force: no constraints, and not conservative
    (the force's work, t^2/2 J by time t, is its energy change; RK4 is exact)."""

    default_t1: ClassVar[float] = 0.1
    default_dt: ClassVar[float] = 0.05
    conservative: ClassVar[bool] = False

    def mass_matrix(self, t, q):
        return jnp.eye(1, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.ones_like(v)

    def energy(self, t, q, v):
        return 0.5 * v @ v

    def initial_state(self):
        return jnp.zeros(1), jnp.zeros(1)


def test_non_conservative_model_reports_its_energy_change(monkeypatch, tmp_path,
                                                          capsys):
    # (A two-step run of a one-coordinate model, like the snakeboard not
    # conservative, compiles in a second; the snakeboard's run takes many.)
    monkeypatch.setitem(cli.MODELS, "pushed", _Pushed)
    code = cli.main(["run", "pushed", "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^max constraint error\s+n/a \(no holonomic constraints\)$",
                     out, re.MULTILINE)
    assert re.search(r"^max velocity constraint error\s+n/a \(no constraints\)$",
                     out, re.MULTILINE)
    assert "max energy error" not in out
    assert re.search(r"^energy change over the run\s+5\.000e-03 J  \(E\(t_end\) - "
                     r"E0; the model is not conservative\)$", out, re.MULTILINE)
    with np.load(tmp_path / "pushed.npz") as data:
        settings = json.loads(str(data["settings"]))
        # 0.5 * 0.1**2: measured 8.7e-19, one ulp of 0.005.
        assert data["energy"][-1] - data["energy"][0] == pytest.approx(
            0.005, rel=7e-16, abs=0)
    assert settings["conservative"] is False
    # null where the table says n/a
    for key in ("max_constraint_error", "max_velocity_constraint_error",
                "max_energy_error", "max_observable_error", "t_diverged"):
        assert settings[key] is None, key
    assert settings["energy_change"] == pytest.approx(0.005, rel=7e-16, abs=0)


@pytest.mark.parametrize("model, energy_row", [("snakeboard", False),
                                               ("slider-crank", True)])
def test_step_size_study_leaves_out_energy_correction_if_not_conservative(
        model, energy_row, tmp_path, monkeypatch, capsys):
    # The sweeps themselves are not run: only which formulations are asked for.
    asked = {}

    class _Stop(Exception):
        pass

    class _Sweep:
        def best_formulation(self):
            return cdiff.Lagrange()

    def study(model, formulations, *args, **kwargs):
        asked.update(formulations)
        raise _Stop

    monkeypatch.setattr(cdiff.studies, "gain_sweep", lambda *a, **k: _Sweep())
    monkeypatch.setattr(cdiff.studies, "step_size_study", study)
    with pytest.raises(_Stop):
        cli.main(["study", "step-size", model, "--t1", "1", "--dts", "0.1",
                  "--out", str(tmp_path)])
    out = capsys.readouterr().out
    row = "UK, constraint + energy correction"
    assert (row in asked) is energy_row
    assert "UK, constraint correction" in asked
    skipped = f"leaving out {row!r}: snakeboard is not conservative"
    assert (skipped in out) is not energy_row


# The options that reach `cdiff.simulate`: each run's call is caught (the fake below
# stops the command there, before compilation) and compared with the objects the
# option documents; `test_regularized_run_equals_a_direct_simulate` checks one such
# run's files against a direct call.


class _Bead(cdiff.AbstractModel):
    """A bead of mass diag(1, 2) on the unit circle q.q = 1, under gravity 1 along
    -q2: one holonomic constraint, an energy, conservative; four steps, no
    reference."""

    default_t1: ClassVar[float] = 0.2
    default_dt: ClassVar[float] = 0.05

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.array([1.0, 2.0], dtype=q.dtype))

    def forces(self, t, q, v):
        return jnp.array([0.0, -2.0], dtype=q.dtype)

    def holonomic(self, t, q):
        return jnp.stack([q @ q - 1.0])

    def energy(self, t, q, v):
        return 0.5 * (v[0] ** 2 + 2 * v[1] ** 2) + 2 * q[1]

    def initial_state(self):
        return jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])


class _Simulated(Exception):
    """Raised by the fake `cdiff.simulate` with what `cdiff run` called it with."""

    def __init__(self, model, formulation, q0, v0, kwargs):
        super().__init__("cdiff.simulate called")
        self.model, self.formulation, self.kwargs = model, formulation, kwargs


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (the progress bar's condition)."""

    def isatty(self):
        return True


def _simulate_call(argv, monkeypatch, out, terminal=False) -> _Simulated:
    """What `cdiff run *argv` passes to `cdiff.simulate` (stopped there)."""
    def fake(model, formulation, q0, v0, **kwargs):
        raise _Simulated(model, formulation, q0, v0, kwargs)

    monkeypatch.setitem(cli.MODELS, "bead", _Bead)
    monkeypatch.setattr(cdiff, "simulate", fake)
    stderr = _Terminal() if terminal else io.StringIO()
    with pytest.raises(_Simulated) as info, contextlib.redirect_stderr(stderr):
        cli.main(["run", *argv, "--out", str(out)])
    return info.value


@pytest.mark.parametrize("argv, formulation, solver", [
    (["--energy-correction"], cdiff.UdwadiaKalaba(energy_correction=True), None),
    (["--no-constraint-correction"], cdiff.UdwadiaKalaba(constraint_correction=False),
     None),
    # The defaults of --eps and --horizon (1e-8 and 1e-2, as the help says), then
    # both given.
    (["--formulation", "regularized"], cdiff.Regularized(eps=1e-8, h=1e-2), None),
    (["--formulation", "regularized", "--eps", "1e-4", "--horizon", "0.05"],
     cdiff.Regularized(eps=1e-4, h=0.05), None),
    (["--formulation", "projection"], cdiff.Projection(inertia="Mc"), None),
    (["--formulation", "projection", "--inertia", "Mc"], cdiff.Projection(), None),
    (["--formulation", "projection", "--inertia", "Mc_gamma"],
     cdiff.Projection(inertia="Mc_gamma"), None),
    (["--projection", "newton-weighted"], cdiff.UdwadiaKalaba(),
     cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection(mass_weighted=True))),
    (["--projection", "gradient"], cdiff.UdwadiaKalaba(),
     cdiff.Projected(cdiff.RK4(), cdiff.GradientProjection())),
    (["--formulation", "lagrange", "--alpha", "3", "--projection", "gradient-second"],
     cdiff.Lagrange(alpha=3.0, beta=3.0),
     cdiff.Projected(cdiff.RK4(), cdiff.GradientProjection(partition="second"))),
    # The DAEs: BDF at its default tolerances (1e-8, as the help says), and
    # --rtol and --atol each where it belongs.
    (["--formulation", "index-one"], cdiff.IndexOne(), cdiff.BDF(1e-8, 1e-8)),
    (["--formulation", "index-one", "--rtol", "1e-5", "--atol", "1e-7"],
     cdiff.IndexOne(), cdiff.BDF(rtol=1e-5, atol=1e-7)),
    (["--formulation", "ggl-no-inverse", "--atol", "1e-6"],
     cdiff.GGL(variant="no_inverse"), cdiff.BDF(rtol=1e-8, atol=1e-6)),
])
def test_run_options_reach_simulate(argv, formulation, solver, monkeypatch,
                                    tmp_path):
    call = _simulate_call(["bead", "--t1", "0.3", "--dt", "0.1", *argv], monkeypatch,
                          tmp_path)
    # (As `simulate` binds it: the DAEs settle their sizes from the start.)
    formulation = formulation.bind(_Bead(), 0.0, *_Bead().initial_state())
    assert type(call.formulation) is type(formulation)
    assert call.formulation == formulation, (call.formulation, formulation)
    assert call.kwargs["solver"] == solver
    assert (call.kwargs["t0"], call.kwargs["t1"], call.kwargs["dt"]) == (0.0, 0.3, 0.1)


def test_no_progress_turns_the_progress_bar_off_on_a_terminal(monkeypatch,
                                                               tmp_path):
    # On a terminal the bar is shown unless --no-progress; never with BDF (which
    # has none: simulate refuses progress=True there).
    for argv, progress in [([], True), (["--no-progress"], False),
                           (["--formulation", "ggl"], False)]:
        call = _simulate_call(["bead", *argv], monkeypatch, tmp_path,
                              terminal=True)
        assert call.kwargs["progress"] is progress, argv
    # Not on a terminal (a pipe, a file): no bar.
    assert _simulate_call(["bead"], monkeypatch, tmp_path).kwargs["progress"] is False


def test_curve_builds_the_arm_on_that_curve(monkeypatch, tmp_path):
    # (Stopped before the solve: the arm is only built and checked. Its arrays
    # are traced there; its curve, a static field, is not.)
    for argv, curve in [([], "line_x1"), (["--curve", "circle"], "circle"),
                        (["--curve", "line_x0"], "line_x0")]:
        call = _simulate_call(["planar-arm-on-curve", *argv], monkeypatch, tmp_path)
        assert type(call.model) is cdiff.models.PlanarArmOnCurve
        assert call.model.curve == curve, argv
        # Started after the release of the holding torques (an RK4 run).
        assert call.kwargs["t0"] == 0.5


def test_regularized_run_equals_a_direct_simulate(monkeypatch, tmp_path, capsys):
    # --eps and --horizon end to end: the rows written are those of a direct
    # cdiff.simulate call with Regularized(eps=1e-4, h=0.05) (far from the
    # defaults 1e-8 and 1e-2: measured 1e-4 apart in q after four steps).
    monkeypatch.setitem(cli.MODELS, "bead", _Bead)
    assert cli.main(["run", "bead", "--formulation", "regularized", "--eps", "1e-4",
                     "--horizon", "0.05", "--out", str(tmp_path),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^formulation\s+regularized: Regularized\(eps=0\.0001, "
                     r"h=0\.05\)$", out, re.MULTILINE)
    q0, v0 = _Bead().initial_state()
    sol = cdiff.simulate(_Bead(), cdiff.Regularized(eps=1e-4, h=0.05), q0, v0,
                         t1=0.2, dt=0.05)
    with np.load(tmp_path / "bead.npz") as data:
        settings = json.loads(str(data["settings"]))
        np.testing.assert_array_equal(data["ts"], sol.ts)
        # (The same computation: measured equal.)
        for key in ("q", "v", "holonomic_residual", "energy"):
            np.testing.assert_array_equal(data[key], getattr(sol, key), err_msg=key)
    assert settings["formulation_repr"] == "Regularized(eps=0.0001, h=0.05)"
    # The regularisation leaves a constraint error of the order of eps (measured
    # 2.1e-4), against 5.5e-9 for the default udwadia-kalaba.
    assert 1e-5 < _table_value(out, "max constraint error") < 1e-3


class _Swept(Exception):
    """Raised by the fake studies with what `cdiff study` called them with."""


def _study_calls(argv, monkeypatch, out) -> dict:
    """The arguments `cdiff study *argv` passes to `cdiff.studies.gain_sweep` and
    `step_size_study` (stopped at the last one it calls)."""
    calls = {}

    class _Sweep:
        def best_formulation(self):
            return cdiff.Lagrange()

    def gain_sweep(model, formulation, gains, dts, t1, **kwargs):
        calls["gain_sweep"] = dict(formulation=formulation, gains=gains, dts=dts,
                                   t1=t1, **kwargs)
        if argv[0] == "gains":
            raise _Swept
        return _Sweep()

    def step_size_study(model, formulations, dts, t1, **kwargs):
        calls["step_size_study"] = dict(formulations=formulations, dts=dts, t1=t1,
                                        **kwargs)
        raise _Swept

    monkeypatch.setattr(cdiff.studies, "gain_sweep", gain_sweep)
    monkeypatch.setattr(cdiff.studies, "step_size_study", step_size_study)
    with pytest.raises(_Swept), contextlib.redirect_stdout(io.StringIO()):
        cli.main(["study", *argv, "--out", str(out)])
    return calls


def test_study_n_save_and_no_time_each(monkeypatch, tmp_path):
    common = ["step-size", "slider-crank", "--t1", "2", "--dts", "0.1", "0.05"]
    calls = _study_calls(common, monkeypatch, tmp_path)
    # The defaults: errors measured every 0.1 s (20 times over 2 s), each step
    # size also timed alone.
    assert calls["gain_sweep"]["n_save"] == calls["step_size_study"]["n_save"] == 20
    assert calls["step_size_study"]["time_each"] is True
    assert calls["step_size_study"]["dts"] == [0.1, 0.05]
    calls = _study_calls([*common, "--n-save", "7", "--no-time-each"], monkeypatch,
                         tmp_path)
    assert calls["gain_sweep"]["n_save"] == calls["step_size_study"]["n_save"] == 7
    assert calls["step_size_study"]["time_each"] is False
    # The gains study measures the same way.
    calls = _study_calls(["gains", "slider-crank", "--t1", "0.5", "--dts", "0.1",
                          "--n-save", "3"], monkeypatch, tmp_path)
    assert calls["gain_sweep"]["n_save"] == 3
    assert _study_calls(["gains", "slider-crank", "--t1", "0.5", "--dts", "0.1"],
                        monkeypatch, tmp_path)["gain_sweep"]["n_save"] == 5


def test_study_gains_formulation(monkeypatch, tmp_path):
    common = ["gains", "particle-on-circle", "--t1", "1", "--dts", "0.1",
              "--alphas", "1", "4"]
    # lagrange (the default): alpha and beta swept, beta over the alphas unless
    # --betas; null-space: alpha only (Yun-Sarkar's gain).
    for argv, formulation, gains in [
        ([], cdiff.Lagrange(), {"alpha": [1.0, 4.0], "beta": [1.0, 4.0]}),
        (["--betas", "2"], cdiff.Lagrange(), {"alpha": [1.0, 4.0], "beta": [2.0]}),
        (["--formulation", "null-space"], cdiff.NullSpace(), {"alpha": [1.0, 4.0]}),
    ]:
        sweep = _study_calls([*common, *argv], monkeypatch, tmp_path)["gain_sweep"]
        assert sweep["formulation"] == formulation, argv
        assert sweep["gains"] == gains, argv
        # The model has a reference: the best gains are those of least error.
        assert sweep["metric"] == "max_error"


@pytest.mark.parametrize("argv, words", [
    (["run", "slider-crank", "--formulation", "lagrange", "--horizon", "0.1"],
     ["--eps and --horizon apply to --formulation regularized only"]),
    (["run", "slider-crank", "--formulation", "regularized", "--eps", "0"],
     ["--eps", "must be a positive finite number, got 0"]),
    (["run", "slider-crank", "--formulation", "regularized", "--horizon", "-1"],
     ["--horizon", "must be a positive finite number, got -1"]),
    (["run", "slider-crank", "--formulation", "regularized", "--energy-correction"],
     ["--energy-correction do not apply to --formulation regularized"]),
    (["run", "slider-crank", "--formulation", "index-one", "--projection", "newton",
      "--no-constraint-correction"],
     ["--no-constraint-correction, --projection do not apply to --formulation "
      "index-one"]),
    (["run", "slider-crank", "--formulation", "projection",
      "--no-constraint-correction"],
     ["--no-constraint-correction apply to --formulation udwadia-kalaba only"]),
    (["run", "slider-crank", "--formulation", "ggl-no-inverse", "--atol", "0"],
     ["--atol", "must be a positive finite number, got 0"]),
    (["run", "slider-crank", "--atol", "1e-6"],
     ["--rtol and --atol apply to the DAE formulations (ggl, ggl-no-inverse, "
      "index-one) only"]),
    (["run", "slider-crank", "--formulation", "projection", "--inertia", "M"],
     ["--inertia", "invalid choice: 'M'", "'Mc_gamma'"]),
    (["run", "planar-arm-on-curve", "--curve", "ellipse"],
     ["--curve", "invalid choice: 'ellipse'", "'line_x1'"]),
    # A study too long to hold is refused before its reference fills the memory.
    (["study", "step-size", "slider-crank", "--t1", "1e12"],
     ["--t1 1e+12 takes", "more than a solve can take (2**31)"]),
    (["study", "step-size", "slider-crank", "--t1", "1e6", "--dts", "0.1"],
     ["--t1 1e+06 saves 1e+07 rows per solve", "pass a smaller --n-save"]),
    (["run", "no-such-file.xml"], ["no such file: no-such-file.xml"]),
    (["study", "gains", "slider-crank", "--formulation", "null-space", "--betas",
      "1"], ["--betas apply to --formulation lagrange only"]),
    (["study", "gains", "slider-crank", "--formulation", "projection"],
     ["--formulation", "invalid choice: 'projection'", "'null-space'"]),
    (["study", "gains", "slider-crank", "--alphas", "1", "-1"],
     ["--alphas", "must be a non-negative finite number, got -1"]),
    (["study", "step-size", "slider-crank", "--n-save", "0"],
     ["--n-save must be a positive integer"]),
    (["study", "gains", "slider-crank", "--n-save", "2.5"],
     ["--n-save", "invalid int value: '2.5'"]),
    (["study", "step-size", "slider-crank", "--dts", "0.1", "0.05", "0.1"],
     ["--dts values must be distinct"]),
    (["study", "step-size", "slider-crank", "--t1", "1", "--dts", "0.5", "2"],
     ["every --dts value must be at most --t1 = 1.0"]),
])
def test_bad_option_values_are_named(argv, words, tmp_path, capsys):
    code, err = _exit_code([*argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert "error:" in err and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert not (tmp_path / "out").exists()  # stopped before any work


def test_mjcf_models_by_name_and_by_path(monkeypatch, tmp_path):
    # MODEL as a shipped MJCF mechanism: its library entry's horizon and step
    # (changed here, to tell them from the defaults); as the path of the same
    # file: any file's defaults (10 s at 1e-3 s). (The pendulum: the cheapest to
    # set up.)
    name = "iftomm-a01-simple-pendulum"
    entry = dataclasses.replace(cdiff.models.MJCF_LIBRARY[name], t1=0.5, dt=0.05)
    monkeypatch.setitem(cli.MJCF_LIBRARY, name, entry)
    for model, t1, dt in [(name, 0.5, 0.05), (str(entry.path), 10.0, 1e-3)]:
        call = _simulate_call([model], monkeypatch, tmp_path)
        assert (call.kwargs["t1"], call.kwargs["dt"]) == (t1, dt), model
        assert call.formulation == cdiff.UdwadiaKalaba()


def test_compilation_cache_is_reused_by_a_second_process(tmp_path):
    """`cdiff run` keeps its compiled programs in `CDIFF_COMPILATION_CACHE`: the
    first process writes them, the solve among them (compiled without host
    callbacks, which JAX would not store), and a second one with the same model and
    settings finds every program there and writes nothing new."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "cache"
    # Every program kept, also those that compile in under JAX's default 1 s.
    env = {**os.environ, "CDIFF_COMPILATION_CACHE": str(cache),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    command = [sys.executable, "-m", "cdiff.cli", "run", "slider-crank",
               "--t1", "0.02", "--no-progress", "--out", str(tmp_path / "out")]

    def entries():
        return sorted(p.name for p in cache.rglob("*") if p.is_file())

    first = subprocess.run(command, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    written = entries()
    assert any(name.startswith("jit_simulate-") for name in written), written
    second = subprocess.run(command, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert entries() == written


def test_loaded_models_label_coordinates_by_joint_name():
    """`cdiff run model.xml` labels a coordinate by its joint's name (`[k]` for a
    free or ball joint's entries), `qpos[i]` only for an unnamed joint."""
    xml = """<mujoco><worldbody>
      <body><freejoint name="base"/><geom size="0.1"/>
        <body pos="0 0 -1"><joint name="knee" type="hinge"/><geom size="0.1"/>
          <body pos="0 0 -1"><joint type="slide"/><geom size="0.1"/></body>
        </body>
      </body></worldbody></mujoco>"""
    model = cdiff.models.from_mujoco(xml)
    names = cli._qpos_names(model, model.nq)
    assert names == ("base[0] [m]", "base[1] [m]", "base[2] [m]", "base[3] [-]",
                     "base[4] [-]", "base[5] [-]", "base[6] [-]", "knee [rad]",
                     "qpos[8] [m]")


def test_ctrl_c_stops_the_solve_at_once(tmp_path):
    """Ctrl-C during a compiled solve (which Python cannot interrupt): the command
    stops within seconds, not when the solve returns, with one line saying so and
    the shell's status 130; the --out folders it created, still empty, are gone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "new" / "out"
    env = {**os.environ, "CDIFF_COMPILATION_CACHE": str(tmp_path / "cache")}
    # About 10^7 steps: minutes of solving.
    command = [sys.executable, "-m", "cdiff.cli", "run", "slider-crank", "--t1",
               "1e4", "--no-progress", "--out", str(out)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if "running from t = 0 to 10000 s" in line:
            break
    time.sleep(1.0)  # well inside the compiled call
    assert process.poll() is None, "".join(lines)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < 5.0
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (
        "cdiff: interrupted during the solve; nothing written")
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert stdout == ""
    assert not (tmp_path / "new").exists()


def test_the_console_script_reads_its_names_from_the_real_lists():
    """The console script parses before it imports cdiff, from lists of its own:
    they are the names `cdiff.cli` and `cdiff.models` offer, in their order."""
    from cdiff.cli import _study

    entry = cdiff_cli_entry
    assert entry.MODELS == tuple(cdiff.models.MODELS)
    assert entry.MJCF_MECHANISMS == tuple(cdiff.models.MJCF_LIBRARY)
    assert entry.FORMULATIONS == tuple(cli.FORMULATIONS)
    assert entry.PROJECTIONS == tuple(cli.PROJECTIONS)
    assert set(entry.DAE_FORMULATIONS) <= set(entry.FORMULATIONS)
    assert (entry.DEFAULT_DTS, entry.DEFAULT_GAINS, entry.MAX_STUDY_ROWS) == (
        _study.DEFAULT_DTS, _study.DEFAULT_GAINS, _study._MAX_ROWS)
    # The installed `cdiff` command is that module's (after `pip install -e .`).
    import importlib.metadata

    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts")
                 if e.name == "cdiff"]
    assert script.value == "cdiff_cli_entry:main", (
        "reinstall the package (pip install -e .): the cdiff script is " + script.value)


_NO_JAX = """
import json, sys
import cdiff_cli_entry

codes = []
for argv in json.loads(sys.argv[1]):
    try:
        cdiff_cli_entry.main(argv)
        codes.append("ran")
    except SystemExit as e:
        codes.append(e.code)
heavy = [m for m in ("jax", "cdiff", "numpy", "diffrax") if m in sys.modules]
print()
print("RESULT " + json.dumps([codes, heavy]))
"""


def test_help_and_user_errors_answer_without_importing_jax():
    """`cdiff --help`, the commands' help and the user errors the parser finds
    (unknown names, bad numbers, options that do not go together, a missing
    file) answer before `cdiff` (JAX) is imported."""
    import subprocess
    import sys

    cases = [(["--help"], 0), (["run", "--help"], 0), (["study", "--help"], 0),
             (["study", "gains", "--help"], 0), (["list", "--help"], 0),
             (["run", "no-such-model"], 2), (["run", "slider-crank", "--bogus"], 2),
             (["run", "slider-crank", "--dt", "0"], 2),
             (["run", "slider-crank", "--rtol", "1e-6"], 2),
             (["run", "slider-crank", "--curve", "circle"], 2),
             (["run", "no-such-file.xml"], 2),
             (["study", "step-size", "slider-crank", "--dts", "0.1", "0.1"], 2),
             (["study", "step-size", "no-such-model"], 2)]
    done = subprocess.run([sys.executable, "-c", _NO_JAX,
                           json.dumps([argv for argv, _ in cases])],
                          capture_output=True, text=True, timeout=60, check=False)
    codes, heavy = json.loads(done.stdout.rsplit("RESULT ", 1)[1])
    assert codes == [code for _, code in cases], done.stderr
    assert heavy == []
    assert "usage: cdiff [-h] COMMAND" in done.stdout
    assert "cdiff run: error: unknown MODEL 'no-such-model'" in done.stderr
    assert "no such file: no-such-file.xml" in done.stderr
    assert "Traceback" not in done.stderr


def test_ctrl_c_during_start_up_stops_at_once():
    """Ctrl-C while `cdiff list` imports JAX: exit status 130 at once, one line,
    no traceback, nothing listed (it used to be ignored, or a traceback)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # -X importtime: a line on stderr as each module is imported; the first
    # JAX module says that the import of JAX is under way.
    command = [sys.executable, "-X", "importtime", "-m", "cdiff_cli_entry", "list"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen = []
    for line in process.stderr:
        seen.append(line)
        if re.search(r"\|\s*jax(\.|$)", line.rstrip()):
            break
    assert process.poll() is None, "".join(seen)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < 5.0
    lines = [line for line in stderr.splitlines()
             if line and not line.startswith("import time:")]
    assert process.returncode == 130, stderr[-2000:]
    assert lines == ["cdiff: interrupted during start-up; nothing written"], lines
    assert stdout == ""


def test_start_up_time_counts_from_the_command_not_its_parent():
    """The start-up that `cdiff run` reports counts from the command's first
    statement: not the second a shell spent before it ran the command
    (`sh -c 'sleep 1; exec cdiff ...'`; the process's start in /proc, which the
    command used, is that shell's fork)."""
    import shlex
    import subprocess
    import sys
    import time

    # cdiff.cli stood in for by a module that prints what it was given.
    script = """
import sys, time, types
import cdiff_cli_entry
cli = types.ModuleType("cdiff.cli")
cli.main = lambda args, started: print(f"STARTUP {time.perf_counter() - started}")
sys.modules["cdiff"] = types.SimpleNamespace(cli=cli)
sys.modules["cdiff.cli"] = cli
cdiff_cli_entry.main(["run", "slider-crank"])
"""
    shell = f"sleep 1; exec {shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    began = time.monotonic()
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True,
                          timeout=60, check=False)
    took = time.monotonic() - began
    startup = float(done.stdout.split("STARTUP ")[1])
    assert took > 1.0
    assert 0.0 < startup < took - 0.9, (startup, took, done.stderr)


def test_start_up_time_reaches_the_table(monkeypatch):
    """`cdiff.cli.main(args=..., started=...)` (the console script's call) counts
    the start-up from `started`."""
    import time

    phases = []

    class Quiet(cli.Interrupt):  # (no handler taken over in the test process)
        def install(self):
            return self

    monkeypatch.setattr(cli, "Interrupt", Quiet)
    monkeypatch.setattr(cli._run, "run", lambda args, parser, p: phases.append(p) or 0)
    args = cli._parser().parse_args(["run", "slider-crank"])
    assert cli.main(args=args, started=time.perf_counter() - 5.0) == 0
    (p,) = phases
    assert 5.0 <= p.before < 6.0
    assert p.interrupt.during == "start-up"


def test_ctrl_c_in_a_step_size_study_keeps_the_finished_formulations(
        monkeypatch, tmp_path):
    """What an interrupt of `cdiff study step-size` writes: the rows of the
    formulations finished, here Ctrl-C pressed while the second one runs."""
    from cdiff.cli import _interrupt
    from cdiff.studies import _step_size_study

    interrupts = []

    class Recorded(_interrupt.Interrupt):
        def __init__(self):
            super().__init__()
            interrupts.append(self)

    class _Stop(Exception):
        pass

    class _Sweep:
        def best_formulation(self):
            return cdiff.Lagrange(alpha=5.0, beta=5.0)

    run, calls = _step_size_study._run, []

    def run_until_the_second(*args, **kwargs):
        calls.append(interrupts[0].during)
        if len(calls) == 2:  # Ctrl-C now: what would the watcher write?
            calls.append(interrupts[0].keep())
            raise _Stop
        return run(*args, **kwargs)

    monkeypatch.setattr(cli, "Interrupt", Recorded)
    monkeypatch.setattr(cdiff.studies, "gain_sweep", lambda *a, **k: _Sweep())
    monkeypatch.setattr(_step_size_study, "_run", run_until_the_second)
    with pytest.raises(_Stop):
        cli.main(["study", "step-size", "particle-on-circle", "--t1", "0.2",
                  "--dts", "0.1", "0.05", "--no-time-each", "--out", str(tmp_path)])
    csv = tmp_path / "particle-on-circle-step-size.csv"
    assert calls == ["the step-size study", "the step-size study",
                     f"wrote the 2 rows finished (Baumgarte (best gains)) to {csv} "
                     f"and {csv.with_suffix('.npz')}"]
    with np.load(csv.with_suffix(".npz")) as saved:
        assert list(saved["formulation"]) == ["Baumgarte (best gains)"] * 2
        np.testing.assert_array_equal(saved["dt"], [0.1, 0.05])
        assert np.all(np.isfinite(saved["max_constraint_error"]))


class _Ball(cdiff.AbstractModel):
    """A ball dropped on the floor (the row q0 >= 0, plastic impacts), beside a
    coordinate that does not move."""

    def mass_matrix(self, t, q):
        return jnp.eye(2)

    def forces(self, t, q, v):
        return jnp.array([-9.81, 0.0])

    def unilateral(self, t, q):
        return q[:1]

    def energy(self, t, q, v):
        return 0.5 * jnp.sum(v**2) + 9.81 * q[0]


def test_run_with_limits_reports_impacts_apart(monkeypatch, tmp_path, capsys):
    """A model with unilateral rows (a ball that falls onto the floor): the plastic
    impacts' losses are reported as such, apart from the energy error, in the
    table and in the npz (count, energy lost, the impacts, the held rows); the
    figure shows the coordinates that move. And Ctrl-C once the figure is written
    keeps it, and says so (it said "(no figure)")."""
    case = cli._Case("ball", _Ball(), np.array([0.2, 1.0]), np.zeros(2), 0.5, 0.01,
                     None, None, ("height [m]", "still [m]"))
    monkeypatch.setattr(_solve, "case", lambda args, parser: case)
    kept = []
    start = cli._Phases.start

    def start_and_stop_at_writing(self, key, message):
        if key == "writing":  # Ctrl-C now: what would the watcher write?
            kept.append(self.interrupt.keep())
        start(self, key, message)

    monkeypatch.setattr(cli._Phases, "start", start_and_stop_at_writing)
    out = tmp_path / "out"
    assert cli.main(["run", "ball", "--no-progress", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    png, npz = out / "ball.png", out / "ball.npz"
    assert kept == [f"wrote {png}; wrote the solve's 51 saved states to {npz}"]
    with np.load(npz) as data:
        settings = json.loads(str(data["settings"]))
        count, lost = settings["impacts"], settings["energy_lost_at_impacts"]
        assert count == 1 and data["impact_t"].shape == (1,)
        # The ball hits at t = sqrt(2 h / g) with all its kinetic energy lost.
        assert data["impact_t"][0] == pytest.approx(np.sqrt(0.4 / 9.81), rel=1e-6)
        assert lost == pytest.approx(9.81 * 0.2, rel=1e-6)
        np.testing.assert_allclose(data["impact_energy_lost"], [lost])
        energy, so_far = data["energy"], data["energy_lost_so_far"]
        # The energy error leaves out the impact's loss: round-off, while the
        # energy itself dropped by what the impact took.
        assert energy[0] - energy[-1] == pytest.approx(lost, rel=1e-6)
        assert settings["max_energy_error"] == pytest.approx(
            np.max(np.abs(energy - energy[0] + so_far)))
        assert settings["max_energy_error"] < 1e-9
        assert data["active"].shape == (51, 1)
        assert data["active"][-1, 0] and not data["active"][0, 0]
        assert settings["rows_active_at_end"] == [0]
    assert re.search(r"^impacts\s+1; energy lost at them "
                     + re.escape(f"{lost:.3e} J") + "$", table,
                     re.MULTILINE), table
    assert re.search(r"^unilateral rows\s+1; held at some saved state: 0; at the "
                     r"end: 0$", table, re.MULTILINE), table
    assert "(|E - E0 + lost at impacts so far|, J)" in table
    # The figure: the coordinate that moves, not the one that does not.
    with np.load(npz) as data:
        fig = _figure.figure(dict(data), (), "t", case.observable_names)
    (ax,) = [a for a in fig.axes if a.get_gid() == "observable[m]"]
    assert [line.get_label() for line in ax.get_lines()] == ["height"]
