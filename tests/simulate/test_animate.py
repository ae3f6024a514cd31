"""Sketches of the planar reference models and `cdiff.animate`.

The sketches are checked against the models: along a short trajectory (each
model's exact reference, a tight-tolerance solve, and one `cdiff.simulate` run)
every rigid link has its model's length, and the points that the constraints join
(a pin, a slider on its track, an end point on its curve) are joined."""

import contextlib
import io

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.animation
import numpy as np
import pytest
from PIL import Image

import cdiff
from cdiff import cli
from cdiff.models import (
    DoubleFourBar,
    ParticleOnCircle,
    PlanarArmOnCurve,
    RollingSphere,
    SliderCrank,
    SliderCrankJoint,
    Snakeboard,
    TwoLinkOnCircle,
)

TS = np.linspace(0.0, 0.2, 21)


def _length(p, link):
    i, j = link
    return np.linalg.norm(p[:, j] - p[:, i], axis=-1)


def _joined(p, q, v, model):
    """Residuals (shape (T, ...)) that vanish where the sketch meets the model's
    constraints."""
    if isinstance(model, ParticleOnCircle):
        return p[:, 0]  # the centre at the origin
    if isinstance(model, SliderCrank):
        return np.concatenate([p[:, 0], p[:, 1] - p[:, 2], p[:, 3, 1:]], axis=-1)
    if isinstance(model, SliderCrankJoint):
        return np.concatenate([p[:, 0], p[:, 2, 1:]], axis=-1)
    if isinstance(model, DoubleFourBar):
        pivots = np.array([[0.0, 0.0], [model.l, 0.0], [2 * model.l, 0.0]])
        return p[:, :3] - pivots
    if isinstance(model, TwoLinkOnCircle):
        end = np.linalg.norm(p[:, 3], axis=-1) - model.l3
        return np.concatenate([p[:, 0], p[:, 1] - p[:, 2], end[:, None]], axis=-1)
    if isinstance(model, PlanarArmOnCurve):
        on_curve = np.asarray(model.curve_residual(jnp.asarray(p[:, 2])))
        return np.concatenate([p[:, 0], on_curve[:, None]], axis=-1)
    if isinstance(model, Snakeboard):
        # No sideways slip of the axles' centres: their velocities (by jax.jvp of
        # the sketch) are normal to the axles.
        def velocities(q, v):
            return jax.jvp(lambda q: model.sketch(q).points, (q,), (v,))[1]

        dp = np.asarray(jax.jit(jax.vmap(velocities))(q, v))
        axle_b = (p[:, 4] - p[:, 3]) / model.l
        axle_f = (p[:, 6] - p[:, 5]) / model.l
        centre = p[:, 1] - np.asarray(q[:, :2])
        slip_b = np.sum(dp[:, 0] * axle_b, axis=-1)
        slip_f = np.sum(dp[:, 2] * axle_f, axis=-1)
        return np.concatenate([centre, slip_b[:, None], slip_f[:, None]], axis=-1)
    raise AssertionError(type(model))


# (model, the length of each rigid link of its sketch, t0); non-default lengths
# where the model allows, so that a sketch cannot get them right by accident.
CASES = {
    "particle-on-circle": (ParticleOnCircle(rho=2.0, g=9.81),
                           {(0, 1): 2.0}, 0.0),
    "slider-crank": (SliderCrank(l=1.5), {(0, 1): 1.5, (2, 3): 1.5}, 0.0),
    "slider-crank-joint": (SliderCrankJoint(l=0.7), {(0, 1): 0.7, (1, 2): 0.7}, 0.0),
    "double-four-bar": (DoubleFourBar(l=0.8),
                        dict.fromkeys([(0, 3), (1, 4), (2, 5), (3, 4), (4, 5)], 0.8),
                        0.0),
    "two-link-on-circle": (TwoLinkOnCircle(), {(0, 1): 2.0, (2, 3): 1.0}, 0.0),
    # (its exact reference on x = 1 takes longer: that curve is checked in
    # test_scenery_curves)
    "planar-arm-on-curve": (PlanarArmOnCurve("circle", l1=1.2, l2=0.9),
                            {(0, 1): 1.2, (1, 2): 0.9}, 0.5),
    "snakeboard": (Snakeboard(), {(0, 1): 0.2, (1, 2): 0.2, (3, 4): 0.2,
                                  (5, 6): 0.2, (7, 8): 0.16}, 0.0),
}
# Per case, bounds on the links' lengths and on the joined residuals (0: exact).
# Each link is drawn from its own body's coordinates: its length holds to
# round-off (measured 2.2e-16, or 1.1e-16 for the slider-crank joint and the
# double four-bar, 5.6e-17 for the snakeboard). The joints meet to the constraint
# error: of the simulation (UdwadiaKalaba with constraint correction, measured
# 3.7e-11) and of the snakeboard's reference (the axles' slip, 6.3e-11); the
# other references keep the constraints to round-off (measured 4.4e-16 at most),
# and the particle's centre and the four-bar's pivots are placed exactly.
TOLS = {
    "particle-on-circle": (1e-15, 0.0),
    "slider-crank": (1e-15, 2e-10),
    "slider-crank-joint": (5e-16, 2e-15),
    "double-four-bar": (5e-16, 0.0),
    "two-link-on-circle": (1e-15, 2e-15),
    "planar-arm-on-curve": (1e-15, 2e-15),
    "snakeboard": (2.5e-16, 3e-10),
}


@pytest.fixture(scope="module")
def solution():
    """A `cdiff.simulate` run of the slider-crank, with t0 and 20 steps."""
    model = CASES["slider-crank"][0]
    return cdiff.simulate(model, cdiff.UdwadiaKalaba(), *model.initial_state(),
                          t1=TS[-1], dt=TS[1])


@pytest.fixture(scope="module")
def runs(solution):
    """The slider-crank's simulation, and the other models' exact references from
    their initial states (one compiled solve each, cheaper than a simulation)."""
    return {name: solution if name == "slider-crank" else model.reference(t0 + TS)
            for name, (model, _, t0) in CASES.items()}


def _check_sketch(name, sol):
    model, lengths, _ = CASES[name]
    length_tol, joined_tol = TOLS[name]
    sketch = model.sketch(sol.q[0])
    assert isinstance(sketch, cdiff.Sketch)
    assert sketch.points.ndim == 2 and sketch.points.shape[1] == 2
    # Every link of the sketch is one of the model's rigid links.
    assert set(sketch.links) == set(lengths)
    frames = jax.jit(jax.vmap(model.sketch))(sol.q)
    assert frames.links == sketch.links
    p = np.asarray(frames.points)
    assert p.shape == (sol.ts.shape[0], *sketch.points.shape)
    for link, length in lengths.items():
        np.testing.assert_allclose(_length(p, link), length, rtol=0,
                                   atol=length_tol, err_msg=f"{name}: link {link}")
    residual = _joined(p, sol.q, sol.v, model)
    if joined_tol == 0.0:
        np.testing.assert_array_equal(residual, 0.0)
    else:
        assert np.max(np.abs(residual)) < joined_tol
    # The mechanism moves (the test is not of a state at rest).
    assert np.max(np.abs(p - p[:1])) > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_sketch_matches_the_model(name, runs):
    sol = runs[name]
    if isinstance(sol, cdiff.Solution):
        # Each link is drawn from its own body's coordinates: the lengths hold
        # to round-off, and the joints meet to the constraint error.
        assert 0 < sol.max_constraint_error < 2e-10  # measured 3.7e-11
    _check_sketch(name, sol)


@pytest.mark.parametrize("name", list(CASES))
def test_scenery_is_polylines(name):
    model = CASES[name][0]
    for polyline in getattr(model, "scenery", lambda: [])():
        assert isinstance(polyline, np.ndarray)
        assert polyline.ndim == 2 and polyline.shape[1] == 2
        assert np.all(np.isfinite(polyline))


def test_scenery_curves():
    """The drawn curves are the constraint curves (on them phi = 0)."""
    # The lines exactly, the circle to round-off (measured 2.2e-16).
    for curve, tol in (("line_x1", 0.0), ("line_x0", 0.0), ("circle", 1e-15)):
        arm = PlanarArmOnCurve(curve)
        line, base = arm.scenery()
        np.testing.assert_array_equal(base, [[0.0, 0.0]])
        assert len(line) >= 2
        phi = np.asarray(arm.curve_residual(jnp.asarray(line)))
        if tol == 0.0:
            np.testing.assert_array_equal(phi, 0.0)
        else:
            assert np.max(np.abs(phi)) < tol
    model = TwoLinkOnCircle()
    circle, _ = model.scenery()
    np.testing.assert_allclose(np.linalg.norm(circle, axis=-1), model.l3, rtol=0,
                               atol=2e-15)  # measured 4.4e-16


@pytest.mark.parametrize("name", list(CASES))
def test_gif_frames(name, runs, tmp_path):
    model = CASES[name][0]
    path = cdiff.animate(model, runs[name], tmp_path / "sub" / "a.gif", max_frames=5,
                         trail=-1, title=name)
    assert path == tmp_path / "sub" / "a.gif"
    with Image.open(path) as image:
        assert image.format == "GIF"
        assert image.n_frames == 5


def test_non_finite_rows_are_skipped(solution, tmp_path):
    model, sol = CASES["slider-crank"][0], solution
    rows = sol.ts.shape[0]  # 21
    # As a solve with spare max_steps leaves them: inf rows at the end; and a
    # non-finite state inside.
    ts = sol.ts.at[-12:].set(jnp.inf)
    q = sol.q.at[-12:].set(jnp.inf).at[4].set(jnp.nan)
    bad = eqx.tree_at(lambda s: (s.ts, s.q), sol, (ts, q))
    path = bad.animate(model, tmp_path / "a.gif", fps=10)  # the method delegates
    with Image.open(path) as image:
        assert image.n_frames == rows - 13


def test_no_sketch_or_bad_suffix(solution, tmp_path):
    sol = solution
    with pytest.raises(ValueError, match="RollingSphere has no `sketch"):
        cdiff.animate(RollingSphere(), sol, tmp_path / "a.gif")
    with pytest.raises(ValueError, match=r"\.gif or \.mp4"):
        cdiff.animate(SliderCrank(l=1.5), sol, tmp_path / "a.png")
    with pytest.raises(ValueError, match="trail=9"):
        cdiff.animate(SliderCrank(l=1.5), sol, tmp_path / "a.gif", trail=9)
    with pytest.raises(ValueError, match="one trajectory"):
        batched = eqx.tree_at(lambda s: (s.ts, s.q), sol,
                              (jnp.stack([sol.ts] * 2), jnp.stack([sol.q] * 2)))
        cdiff.animate(SliderCrank(l=1.5), batched, tmp_path / "a.gif")
    assert not list(tmp_path.iterdir())


def test_mp4_without_ffmpeg(solution, tmp_path, monkeypatch):
    monkeypatch.setattr(matplotlib.animation.FFMpegWriter, "isAvailable",
                        classmethod(lambda cls: False))
    with pytest.raises(RuntimeError, match=r"ffmpeg.*\.gif"):
        cdiff.animate(SliderCrank(l=1.5), solution, tmp_path / "a.mp4")


def test_cli_animate(runs, tmp_path):
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        # (--t1 0.2: the reference solve compiled by `runs` is reused)
        code = cli.main(["run", "particle-on-circle", "--t1", "0.2", "--out",
                         str(tmp_path), "--no-progress", "--animate"])
    assert code == 0
    gif = tmp_path / "particle-on-circle.gif"
    assert f"wrote {gif}" in capture.getvalue()
    with Image.open(gif) as image:
        assert image.n_frames == 21  # t0 and 20 steps


def test_cli_animate_path_and_errors(tmp_path, capsys):
    # private on purpose: where --animate writes, without running a simulation.
    parser = cli._parser()
    args = parser.parse_args(["run", "slider-crank", "--animate", "x/a.gif"])
    assert cli._animation_path(args, parser, SliderCrank()) == cli.Path("x/a.gif")
    args = parser.parse_args(["run", "slider-crank", "--animate", "--out", "d"])
    assert cli._animation_path(args, parser, SliderCrank()) == cli.Path(
        "d/slider-crank.gif")
    for argv, words in [
        (["rolling-sphere", "--animate"], ["rolling-sphere", "planar"]),
        (["slider-crank", "--animate", str(tmp_path / "a.avi")], [".gif or .mp4"]),
    ]:
        with pytest.raises(SystemExit) as info:
            cli.main(["run", *argv, "--out", str(tmp_path)])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and all(w in err for w in words)
    assert not list(tmp_path.iterdir())  # stopped before the run
