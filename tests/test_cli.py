"""The `cdiff` command line, called in-process through `cdiff.cli.main`."""

import contextlib
import io
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

import cdiff
from cdiff import cli

def _table_value(out: str, key: str) -> float:
    match = re.search(rf"^{key}\s+(\S+)", out, re.MULTILINE)
    assert match, f"no {key!r} row in:\n{out}"
    return float(match.group(1))


def _exit_code(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    return info.value.code, capsys.readouterr().err


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [*cdiff.models.MODELS, *cli.FORMULATIONS, *cli.PROJECTIONS]:
        assert name in out
    assert "Braun & Goldfarb" in out


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short default run (udwadia-kalaba, float64), shared by the tests below."""
    out = tmp_path_factory.mktemp("out")
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        code = cli.main(["run", "slider-crank", "--t1", "0.5", "--dt", "0.01",
                         "--out", str(out)])
    return code, capture.getvalue(), out


def test_run_prints_table(short_run):
    code, out, _ = short_run
    assert code == 0
    assert _table_value(out, "max constraint error") < 1e-6
    assert _table_value(out, "max energy error") < 1e-4
    assert _table_value(out, "max observable error") < 1e-4
    assert _table_value(out, "steps") == 50
    assert _table_value(out, "dt") == pytest.approx(0.01)
    assert "(asked" not in out
    assert "UdwadiaKalaba()" in out


def test_run_writes_figure_and_data(short_run):
    _, out, folder = short_run
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
        assert data["ts"][-1] == pytest.approx(0.5)
        assert np.max(np.abs(data["holonomic_residual"])) < 1e-6
        assert np.max(data["observable_error"]) < 1e-4
        settings = json.loads(str(data["settings"]))
    assert settings["formulation"] == "udwadia-kalaba"
    assert settings["constraint_correction"] is True
    assert settings["energy_correction"] is False
    assert settings["dtype"] == "float64"
    assert settings["steps"] == 50


def test_float32_failed_solve_still_writes_and_exits_1(tmp_path, capsys):
    # Lagrange without Baumgarte gains at a huge step diverges.
    argv = ["run", "slider-crank", "--float32", "--formulation", "lagrange",
            "--dt", "0.7", "--t1", "50", "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "cdiff: warning: the solve stopped early" in captured.err
    assert "(asked 0.7)" in captured.out  # diffrax takes 50 / ceil(50 / 0.7)
    assert (tmp_path / "slider-crank.png").exists()
    with np.load(tmp_path / "slider-crank.npz") as data:
        assert np.all(np.isfinite(data["ts"])) and data["ts"][-1] < 50
        assert data["q"].dtype == np.float32
        assert data["reference_q"].dtype == np.float64
        settings = json.loads(str(data["settings"]))
    assert settings["dtype"] == "float32"
    assert settings["alpha"] == settings["beta"] == 0.0
    assert settings["result"] != ""


def test_beta_defaults_to_alpha():
    parser = cli._parser()
    args = parser.parse_args(["run", "slider-crank", "--formulation", "lagrange",
                              "--alpha", "5"])
    assert cli._formulation(args, parser) == cdiff.Lagrange(alpha=5.0, beta=5.0)
    args = parser.parse_args(["run", "slider-crank", "--formulation", "lagrange",
                              "--alpha", "5", "--beta", "2"])
    assert cli._formulation(args, parser) == cdiff.Lagrange(alpha=5.0, beta=2.0)


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
    assert err.startswith("cdiff: error: _Broken.mass_matrix")
    assert not (tmp_path / "broken.npz").exists()


@pytest.mark.parametrize("extra", [["--formulation", "projection", "--inertia",
                                    "Mc_sym"],
                                   ["--formulation", "null-space", "--alpha", "5"],
                                   ["--formulation", "projection", "--projection",
                                    "newton"]])
def test_other_formulations_run(extra, tmp_path, capsys):
    code = cli.main(["run", "particle-on-circle", "--t1", "0.2", "--out",
                     str(tmp_path), "--no-progress", *extra])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("max constraint error"))
    assert float(line.split()[3]) < (1e-14 if "--projection" in extra else 1e-6)


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
