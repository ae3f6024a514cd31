"""Gradients through a loaded MuJoCo model across a kinematic singularity (issue 18):
with respect to a body mass, a link length and the initial state, under `jax.vmap`
and `jax.jit`, against central differences of the same simulation.

The model is the shipped MJCF slider-crank (R2 of Braun & Goldfarb 2012: crank and
rod of equal length l). Released at rest from the keyframe (crank at 45 degrees),
the crank falls through theta1 = -pi/2 (t ~ 0.9 s), where the rod folds back onto
it and the slider passes the origin: there the connect's two in-plane rows become
dependent (the velocity Jacobian drops from rank 2 to rank 1; its third, out-of-
plane row vanishes everywhere). `UdwadiaKalaba` with RK4 at dt = 1e-2 carries the
state, and its reverse-mode derivatives, through it.

One jitted, vmapped `value_and_grad` evaluates the three base points and the 48
points at +- h of every parameter, and the tests read its results. Its tracing and
compilation are nearly all of the file's time (reverse mode through RK4 through
UdwadiaKalaba's second derivatives of MJX's kinematics: 130-150 s of CPU time,
~45 s of it tracing, on the 2-core VM shared with other jobs; 125-200 s wall);
the 51 trajectories then run in ~2 s.
"""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mjx_jit

pytest.importorskip("mujoco")
with contextlib.redirect_stdout(io.StringIO()):  # MJX's notice about Warp
    pytest.importorskip("mujoco.mjx")

import cdiff

T1, DT = 1.2, 1e-2  # 120 RK4 steps; the singular passage is at 0.8-1.0 s

# A parameter vector p = [m1, l, dq (3), dv (3)]: the crank's body_mass, the common
# length of crank and rod, and the initial state q0 = q_key(l) + dq, v0 =
# v_key(l, omega) + dv, where (q_key, v_key) is the consistent start at the
# keyframe's crank angle with crank rate omega (a per-batch constant, not a
# parameter). The derivatives with respect to dq and dv are those with respect to
# q0 and v0 (simulate's raw initial state, not projected).
NAMES = ["m1", "l", "q0_crank", "q0_slider", "q0_rod", "v0_crank", "v0_slider",
         "v0_rod"]
GROUPS = {"mass": [0], "length": [1], "q0": [2, 3, 4], "v0": [5, 6, 7]}
BASES = np.array([  # three masses, three lengths, three initial states
    [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [1.3, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [0.8, 1.15, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
])
OMEGAS = np.array([0.0, 0.3, -0.2])  # initial crank rates (rad/s)
# Central-difference steps: 1e-5 relative, 1e-5 absolute for the zero entries.
STEPS = 1e-5 * np.maximum(np.abs(BASES), 1.0)
NB, NP = BASES.shape


@pytest.fixture(scope="module")
def base():
    return cdiff.models.from_mujoco(cdiff.models.mjcf_path("slider-crank-mjcf"))


def _model(base, mass, length):
    """R2 with crank mass `mass` and both links of length `length`: the connect's
    anchors (crank tip in the crank's frame, crank tip in the rod's frame), the
    links' centres of mass at mid-length and their inertias scaled by length^2
    (uniform links). The slider's joint sits at the rod's frame, so body_pos does
    not set a length."""
    mx = base.mjx_model
    return base.tree_replace({
        "body_mass": mx.body_mass.at[1].set(mass),
        "eq_data": mx.eq_data.at[0, 0].set(length).at[0, 3].set(-length),
        "body_ipos": mx.body_ipos.at[1, 0].set(length / 2).at[2, 0].set(-length / 2),
        "body_inertia": mx.body_inertia.at[1:, 1:].multiply(length**2),
    })


def _start(base, length, omega):
    """The consistent start at the keyframe's angles (theta1 = -theta2 = pi/4,
    slider at 2 l cos theta1), crank rate `omega`."""
    key = jnp.asarray(base.mjx_model.key_qpos[0])
    q0 = key * jnp.stack([jnp.ones_like(length), length, jnp.ones_like(length)])
    v0 = omega * jnp.stack([jnp.ones_like(length), -2 * length * jnp.sin(key[0]),
                            -jnp.ones_like(length)])
    return q0, v0


@pytest.fixture(scope="module")
def results(base):
    """Losses, gradients, trajectories, constraints and the singular values of
    their Jacobian at the base points, and central differences at every parameter
    +- its step, from one compiled call."""

    def loss(p, omega):
        model = _model(base, p[0], p[1])
        q0, v0 = _start(base, p[1], omega)
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0 + p[2:5], v0 + p[5:8],
                             t1=T1, dt=DT)  # saves t0 and every step
        q, v = sol.q[-1], sol.v[-1]
        return jnp.sum(q**2) + jnp.sum(v**2), sol.q

    def evaluate(p, omega):
        (value, qs), grad = jax.value_and_grad(loss, has_aux=True)(p, omega)
        # The constraints and their velocity Jacobian dPhi/dq (q' = v here) along
        # the trajectory and at the folded configuration (slider at the origin),
        # in one linearisation (each MJX derivative adds seconds of compilation).
        model = _model(base, p[0], p[1])
        folded = jnp.array([-jnp.pi / 2, 0.0, jnp.pi / 2])

        def constraints(q):
            phi, tangent = jax.linearize(lambda q: model.holonomic(0.0, q), q)
            return phi, jax.vmap(tangent, out_axes=1)(jnp.eye(3, dtype=q.dtype))

        phi, jac = jax.vmap(constraints)(jnp.concatenate([qs, folded[None]]))
        return {"value": value, "grad": grad, "q": qs, "phi": phi,
                "sv": jnp.linalg.svd(jac, compute_uv=False)}

    eye = np.eye(NP)
    points = np.concatenate([BASES, (BASES[:, None] + STEPS[:, None] * eye).reshape(
        -1, NP), (BASES[:, None] - STEPS[:, None] * eye).reshape(-1, NP)])
    omegas = np.concatenate([OMEGAS, np.repeat(OMEGAS, NP), np.repeat(OMEGAS, NP)])
    out = mjx_jit(jax.vmap(evaluate))(jnp.asarray(points), jnp.asarray(omegas))
    out = jax.tree.map(np.asarray, out)
    values = out["value"]
    plus = values[NB:NB + NB * NP].reshape(NB, NP)
    minus = values[NB + NB * NP:].reshape(NB, NP)
    out["fd"] = (plus - minus) / (2 * STEPS)
    return {k: (v if k == "fd" else v[:NB]) for k, v in out.items()}


def _rank(sv):
    """The numerical rank with `cdiff.analysis.constraint_rank`'s default
    thresholds: singular values above 10 sqrt(eps), relative and absolute."""
    tol = 10 * np.sqrt(np.finfo(np.float64).eps)
    return np.sum(sv > tol * max(sv[0], 1.0))


def test_trajectories_cross_the_singular_configuration(results):
    q, phi, sv = results["q"], results["phi"], results["sv"]
    assert q.shape == (NB, round(T1 / DT) + 1, 3)
    # On the constraints (UdwadiaKalaba's correction; measured 2.0e-8 at most) ...
    assert np.abs(phi[:, :-1]).max() < 2e-7
    for b in range(NB):
        # ... the crank passes theta1 = -pi/2 exactly once, where the only
        # configuration on the constraints is the folded one (slider at the
        # origin, theta2 = pi/2), and goes on through it: the slider ends at
        # x < 0 (measured -1.90, -1.80, -1.86; the folded branch keeps x = 0).
        crossing = np.nonzero(np.diff(np.sign(q[b, :, 0] + np.pi / 2)))[0]
        assert len(crossing) == 1, crossing
        assert 0.5 < crossing[0] * DT < T1 - 0.1  # measured 0.88, 0.86, 0.92 s
        assert q[b, -1, 1] < -0.5
    # The folded configuration is on the constraints and singular: the velocity
    # Jacobian (3 x 3, its out-of-plane row identically zero) has rank 2 along
    # the trajectory and rank 1 there.
    assert np.abs(phi[:, -1]).max() < 5e-15  # measured 5.1e-16
    assert [_rank(s) for s in sv[:, 0]] == [2] * NB
    assert [_rank(s) for s in sv[:, -1]] == [1] * NB
    # Exact: the out-of-plane row is identically zero (measured 0 at every step).
    assert np.abs(sv[:, :, 2]).max() == 0.0
    # Along the trajectory its smallest nonzero singular value falls from l at
    # the start (1.0, 0.9, 1.15) to the sampling's distance from the singular
    # point (measured 0.0129, 0.0104, 0.0112, at the step nearest the crossing)
    # and grows again (measured 1.09, 1.00, 1.32 at t1).
    trajectory = sv[:, :-1, 1]
    # measured 1.9e-16 relative
    np.testing.assert_allclose(trajectory[:, 0], BASES[:, 1], rtol=1e-15)
    assert np.all(trajectory.min(axis=1) < 0.05), trajectory.min(axis=1)
    assert np.all(trajectory[:, -1] > 0.3)


def test_gradients_are_finite_and_differ_across_the_batch(results):
    values, grad = results["value"], results["grad"]
    assert np.all(np.isfinite(values)) and np.all(np.isfinite(grad))
    # The losses differ across the batch (measured 74.987, 74.955, 74.480: the
    # closest two by 0.032), and so does every gradient entry (its range over
    # the batch is 63 % to 130 % of its largest magnitude).
    assert np.min(np.diff(np.sort(values))) > 3e-3
    spread = np.ptp(grad, axis=0) / np.abs(grad).max(axis=0)
    assert np.all(spread > 0.1), spread
    # No entry vanishes, so every relative comparison below means something
    # (smallest magnitude measured 1.20, largest 121).
    assert np.abs(grad).min() > 0.1


# Central differences of the same compiled simulation against reverse mode, every
# entry at the three base points. Acceptance: 1e-6 relative. Measured (largest over
# the batch and the group's entries): mass 6.5e-10, length 1.2e-8, q0 1.0e-9, v0
# 1.4e-9; what remains is the central differences' own error (h = 1e-5).
BOUNDS = {"mass": 3e-9, "length": 5e-8, "q0": 4e-9, "v0": 5e-9}


@pytest.mark.parametrize("group", GROUPS)
def test_gradient_matches_central_differences(results, group):
    cols = GROUPS[group]
    grad, fd = results["grad"][:, cols], results["fd"][:, cols]
    error = np.abs(grad - fd) / np.abs(fd)
    assert error.max() < BOUNDS[group], dict(zip([NAMES[c] for c in cols], error.T))
