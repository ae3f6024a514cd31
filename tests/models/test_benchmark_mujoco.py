"""benchmarks/against_mujoco.py at a tiny size: its measures, MuJoCo's C engine and the
hand-written R2 through the script's own functions, and its table. (cdiff on the
MJCF file itself compiles for a minute or more on a 2-core CPU: the script's
`--quick` run covers it, not this file.)"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("mujoco.mjx")

import cdiff

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "against_mujoco.py"


@pytest.fixture(scope="module")
def bench():
    # The script imports the benchmarks' own helpers (`_config`, `_record`).
    if str(SCRIPT.parent) not in sys.path:
        sys.path.append(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("against_mujoco", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def case(bench):
    return bench.Case.build("slider-crank-mjcf", 0.2, 0.1)


def test_same_observable_as_the_hand_written_model(case):
    """The file's site `slider` on the library's reference is the hand-written
    model's slider x_s on its own reference."""
    crank = cdiff.models.SliderCrank()
    ref = crank.reference(jnp.asarray(case.ts))
    # Measured 0 (2 l cos(theta) through MuJoCo's slide joint, and the model's
    # 3h cos + h cos): two ulps of x_s ~ 1.4 m.
    np.testing.assert_allclose(case.reference, np.asarray(crank.observable(ref.q)),
                               rtol=0, atol=4.5e-16)
    assert case.rows.tolist() == [0, 1, 2]
    # The reference is on the constraints, and is its own zero error.
    exact = cdiff.models.MJCF_LIBRARY["slider-crank-mjcf"].reference(jnp.asarray(case.ts))
    assert case.equality_error(np.asarray(exact.q)) < 1e-15  # measured 2.2e-16
    assert case.error(case.reference) == 0.0
    assert case.error(np.full_like(case.reference, np.nan)) == math.inf


def test_mujoco_rows(bench, case):
    rows = bench.mujoco_rows(case, 1e-3, repeats=0)
    assert [r.method.split(",")[0] for r in rows] == [
        "MuJoCo C RK4", "MuJoCo C RK4", "MuJoCo C implicitfast",
        "MuJoCo C implicitfast"]
    assert "(0.002, 1), (0.9999, 0.9999, 0.001, 0.5, 2)" in rows[1].method
    assert all(r.steps == 200 and r.trajectories == 1 for r in rows)
    file_rk4, stiff_rk4, file_implicit, stiff_implicit = rows
    # Measured (max abs(Phi), slider x error) over 0.2 s: RK4 1.6e-4, 3.3e-6 with the
    # file's solref/solimp and 4.0e-9, 8.3e-10 stiff; implicitfast 1.7e-4, 6.0e-4
    # and 2.4e-6, 6.0e-4.
    assert 5e-5 < file_rk4.constraint < 5e-4 and file_rk4.error < 1e-5
    assert stiff_rk4.constraint < 1e-8 and stiff_rk4.error < 5e-9
    assert (stiff_implicit.constraint  # not a tolerance: an ordering of two errors
            < file_implicit.constraint)
    assert max(file_implicit.error, stiff_implicit.error) < 2e-3
    assert all(math.isfinite(r.error) for r in rows)


def test_hand_written_rows(bench, case):
    rows = bench.hand_written_rows(case, cdiff.UdwadiaKalaba(), 1e-2, batch=4,
                                   repeats=0, options={})
    one, batch = rows
    assert (one.steps, one.trajectories, batch.trajectories) == (20, 1, 4)
    # Measured: Phi 1.0e-10, slider x 4.8e-10 over 0.2 s at dt = 1e-2.
    assert one.constraint < 1e-9 and one.error < 2e-9
    assert batch.error == one.error
    assert one.seconds > 0 and batch.seconds > 0


def test_starts_are_consistent_and_distinct(bench):
    model = cdiff.models.SliderCrank()
    q0, v0 = model.initial_state()
    qs, vs = bench.starts(model, q0, v0, 3)
    np.testing.assert_array_equal(qs[0], q0)
    residual = np.abs(np.asarray([model.holonomic(0.0, q) for q in qs]))
    assert residual.max() < 1.5e-12  # measured 3.7e-13
    np.testing.assert_array_equal(vs, 0.0)  # at rest, as the start
    # Moved, by at most PERTURBATION = 1e-6 (measured 2.1e-7).
    assert 0 < np.abs(np.asarray(qs[2] - q0)).max() < 1e-6


def test_ratios_and_table(bench):
    row = bench.Row
    rows = [row("slider-crank-mjcf", "MuJoCo C RK4, stiff", 1e-3, 1000, 1, 1e-7, 1e-6,
                math.nan, 0.1),
            row("slider-crank-mjcf", "cdiff on the file (MJX), 1 trajectory", 1e-2, 100, 1,
                math.nan, math.inf, 5.0, 0.02),
            row("slider-crank-mjcf", "cdiff hand-written SliderCrank, 1 trajectory", 1e-2,
                100, 1, 1e-9, 1e-8, 1.0, 0.01),
            row("slider-crank-mjcf", "cdiff on the file (MJX), batch 4", 1e-2, 100, 4,
                1e-9, 1e-8, 5.0, 0.06),
            row("slider-crank-mjcf", "cdiff hand-written SliderCrank, batch 4", 1e-2, 100, 4,
                1e-9, 1e-8, 1.0, 0.02)]
    bench.add_ratios(rows)
    # Python floats: measured 0 and 4.4e-16, one ulp of 3 (0.06 / 0.02 rounds).
    assert [r.ratio for r in rows[1::2]] == pytest.approx([2.0, 3.0], rel=5e-16, abs=0)
    assert math.isnan(rows[0].ratio) and math.isnan(rows[2].ratio)
    text = bench.table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| failed |" in lines[3] and "| — |" in lines[3]
    assert "| 5,000 | 2.00 |" in lines[3]  # 100 steps in 0.02 s


def test_quick_arguments(bench):
    args = bench.parse(["--quick"])
    assert (args.mechanisms, args.t1, args.batch, args.repeats) == (
        ["slider-crank-mjcf", "double-four-bar-mjcf"], 1.0, 4, 1)
    args = bench.parse(["--quick", "--batch", "8", "--mechanisms",
                        "iftomm-a01-simple-pendulum"])
    assert (args.mechanisms, args.batch) == (["iftomm-a01-simple-pendulum"], 8)
    args = bench.parse([])
    assert args.t1 is None and "iftomm-a02-n-four-bar" not in args.mechanisms
    assert {"slider-crank-mjcf", "double-four-bar-mjcf"} <= set(args.mechanisms)
