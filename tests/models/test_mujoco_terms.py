"""`MuJoCoModel.terms`: the terms of the equations of motion from one MJX pass
(constraint Jacobians from MJX's body Jacobians, velocity-product terms from its bias
accelerations, the energy law from the power balance), checked against the
autodiff derivation of `cdiff.Terms` from the same model's methods, values and
derivatives; and that every formulation reads one MJX pass per state.
"""

import contextlib
import functools
import io
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mjx_jit

mujoco = pytest.importorskip("mujoco")
with contextlib.redirect_stdout(io.StringIO()):  # MJX's notice about Warp
    pytest.importorskip("mujoco.mjx")

import cdiff

# private on purpose: the internal MJX stage function, whose calls the jaxprs count
from cdiff.models._mujoco import _mjx_stages
from test_mujoco import FOUR_BAR, SINK

MODELS = Path(__file__).parents[2] / "benchmarks" / "models"

# Every joint type, springs, dampers, armature, gravity compensation and every
# supported equality (SINK); a spatial tendon through sites in a tendon equality
# and welds with a relative pose (every_equality.xml); a shipped closed loop.
SOURCES = {
    "sink": SINK,
    "every-equality": MODELS / "every_equality.xml",
    "double-four-bar": cdiff.models.mjcf_path("double-four-bar-mjcf"),
    "four-bar": FOUR_BAR,
}

FIELDS = ("mass_matrix", "forces", "input_matrix", "holonomic", "energy")
KINEMATICS = ("phi_q", "dphi_q", "A_q", "b_q", "A_v", "b_v")


@functools.cache
def _load(name):
    with jax.ensure_compile_time_eval(), pytest.warns(UserWarning) if name == "sink" \
            else contextlib.nullcontext():
        return cdiff.models.from_mujoco(SOURCES[name])


def _states(model, n, seed):
    """`n` random states: the first keyframe (or qpos0) moved by 0.4 rad-scale
    displacements (quaternions stay unit), standard normal velocities."""
    rng = np.random.default_rng(seed)
    q0, _ = model.initial_state()
    dq = jnp.asarray(0.4 * rng.standard_normal((n, model.nv)))
    q = jax.vmap(model.integrate_position, in_axes=(None, 0))(q0, dq)
    return q, jnp.asarray(rng.standard_normal((n, model.nv)))


def _flat(terms, q):
    """Every term that `terms` gives at its state, by name."""
    out = {name: getattr(terms, name) for name in FIELDS}
    kin = terms.kinematics
    out.update({name: getattr(kin, name) for name in KINEMATICS})
    out["residual_v"] = terms.residuals[1]
    out["r_v"], out["A_v (velocity_constraints)"] = terms.velocity_constraints
    law = terms.energy_law()
    out["A_e"], out["b_e"] = law.A_e, law.b_e
    position = type(terms)(terms.model, terms.t, q)  # without velocities
    out["A_q (holonomic_jacobian)"] = position.holonomic_jacobian[1]
    return out


@mjx_jit
def _both(model, q, v):
    def one(q, v):
        return (_flat(model.terms(0.0, q, v), q),
                _flat(cdiff.Terms(model, 0.0, q, v), q))
    return jax.vmap(one)(q, v)


@pytest.mark.parametrize("name", [
    "sink",
    pytest.param("every-equality", marks=pytest.mark.slow),
    pytest.param("double-four-bar", marks=pytest.mark.slow)])
def test_terms_are_the_autodiff_terms(name):
    model = _load(name)
    q, v = _states(model, 4, seed=3)
    # The model's own terms (the one-MJX-pass subclass of cdiff.Terms that
    # MuJoCoModel declares), not the autodiff ones compared with.
    terms = model.terms(0.0, q[0], v[0])
    assert isinstance(terms, cdiff.Terms) and type(terms) is not cdiff.Terms
    assert terms.one_pass
    fast, slow = jax.tree.map(np.asarray, _both(model, q, v))
    for key in slow:
        scale = max(1.0, np.abs(slow[key]).max(initial=0.0))
        # Round-off of two evaluation orders of the same quantities, relative to
        # the largest entry (or 1): measured up to 1.1e-15 (b_q of the sink, whose
        # one-pass value is exactly 0).
        np.testing.assert_allclose(fast[key], slow[key], rtol=0,
                                   atol=4e-15 * scale, err_msg=f"{name}: {key}")


def _terms_of(fast):
    if fast:
        return lambda model, q, v: model.terms(0.0, q, v)
    return lambda model, q, v: cdiff.Terms(model, 0.0, q, v)


def _some_terms(terms_of, model, q, v, pos, mass):
    terms = terms_of(model.tree_replace({"body_pos": pos, "body_mass": mass}), q, v)
    kin = terms.kinematics
    return {"A_v": kin.A_v, "b_v": kin.b_v, "forces": terms.forces,
            "mass_matrix": terms.mass_matrix, "b_e": terms.energy_law().b_e}


@mjx_jit
def _derivatives(model, x, tangent, cotangent):
    out = {}
    for fast in (True, False):
        f = lambda *x: _some_terms(_terms_of(fast), model, *x)  # noqa: B023, E731
        _, jvp = jax.jvp(f, x, tangent)
        _, pullback = jax.vjp(f, *x)
        out[fast] = (jvp, pullback(cotangent))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["four-bar", "sink"])
def test_terms_derivatives_are_the_autodiff_derivatives(name):
    """Forward and reverse derivatives of the one-pass terms, with respect to the
    state and to model parameters (body positions and masses), against those of
    the autodiff terms: on a four-bar, and on the sink (every joint type and
    equality; third derivatives through MJX, minutes to compile)."""
    model = _load(name)
    q, v = _states(model, 1, seed=5)
    m = model.mjx_model
    x = (q[0], v[0], m.body_pos, m.body_mass)
    rng = np.random.default_rng(6)
    tangent = tuple(jnp.asarray(rng.standard_normal(np.shape(a))) for a in x)
    shapes = jax.eval_shape(lambda *x: _some_terms(_terms_of(True), model, *x), *x)
    cotangent = jax.tree.map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape)), shapes)
    out = jax.tree.map(np.asarray, _derivatives(model, x, tangent, cotangent))
    (fast_jvp, fast_vjp), (slow_jvp, slow_vjp) = out[True], out[False]
    # Relative to the largest entry (or 1); measured: four-bar 5.0e-16 (jvp of
    # b_e), sink 8.6e-16 (jvp of A_v).
    bound = {"four-bar": 2e-15, "sink": 4e-15}[name]
    for key in slow_jvp:
        scale = max(1.0, np.abs(slow_jvp[key]).max())
        np.testing.assert_allclose(fast_jvp[key], slow_jvp[key], rtol=0,
                                   atol=bound * scale, err_msg=f"jvp of {key}")
    for i, label in enumerate(("q", "v", "body_pos", "body_mass")):
        scale = max(1.0, np.abs(slow_vjp[i]).max())
        np.testing.assert_allclose(fast_vjp[i], slow_vjp[i], rtol=0,
                                   atol=bound * scale, err_msg=f"vjp, {label}")


def _mjx_passes(jaxpr) -> int:
    """The number of calls of MJX's stages in a jaxpr, sub-jaxprs included."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.params.get("name") == _mjx_stages.__name__:
            count += 1
            continue
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            count += _mjx_passes(sub)
    return count


@pytest.mark.filterwarnings("ignore:cdiff.(GGL|IndexOne). constraint rows")
@pytest.mark.parametrize("formulation", [
    cdiff.UdwadiaKalaba(), cdiff.Lagrange(alpha=1.0, beta=1.0), cdiff.Projection(),
    cdiff.GGL(), cdiff.IndexOne()], ids=type)
def test_one_mjx_pass_per_state(formulation):
    """A formulation's vector field (a DAE's residual) runs MJX once per state,
    where it ran it for the mass matrix, forces, input matrix and each derivative
    of the constraints before."""
    model = _load("sink")
    q, v = (x[0] for x in _states(model, 1, seed=7))
    f = formulation.bind(model, 0.0, q, v)
    context = cdiff.Context(model, lambda t, q, v: jnp.ones(model.nu, q.dtype),
                            jnp.asarray(jnp.nan), None, f)
    if isinstance(f, cdiff.UdwadiaKalaba | cdiff.Lagrange | cdiff.Projection):
        frozen = f.freeze(0.0, 0.01, (q, v), context)
        closed = jax.make_jaxpr(lambda y: f.dynamics(0.0, y, context, frozen).rate)(
            (q, v))
    else:
        x = jnp.concatenate([q, v, jnp.zeros(sum(f.algebraic_sizes(*f.sizes)))])
        closed = jax.make_jaxpr(lambda x, xdot: f.residual(0.0, x, xdot, context))(
            x, jnp.zeros_like(x))
    assert _mjx_passes(closed.jaxpr) == 1


class _ExtraRow(cdiff.models.MuJoCoModel):
    """The four-bar with one more holonomic row of its own: the coupler's origin
    (the crank's tip) held at height 1."""

    def holonomic(self, t, q):
        tip = self.body_position(q, "coupler")
        return jnp.concatenate([super().holonomic(t, q), tip[2:] - 1.0])


def test_subclass_constraints_by_autodiff():
    """A subclass's own `holonomic` is differentiated by autodiff (the one-pass
    rows cover MuJoCo's equalities only), and agrees with it."""
    model = cdiff.models.from_mujoco(FOUR_BAR, cls=_ExtraRow)
    q, v = jnp.array([0.3, -0.2, 0.1]), jnp.array([0.5, -1.0, 0.7])
    fast = jax.jit(lambda q, v: model.terms(0.0, q, v).kinematics)(q, v)
    slow = jax.jit(lambda q, v: cdiff.Terms(model, 0.0, q, v).kinematics)(q, v)
    assert fast.A_q.shape == (4, 3)
    for name in KINEMATICS:
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name))


def test_new_states_and_parameters_reuse_the_compiled_solve():
    """`simulate` on a loaded model compiles once: another initial state, or the
    same model with other parameter values (`tree_replace`), neither traces the
    solve again nor compiles anything (JAX's compile events, counted)."""
    model = _load("four-bar")
    q0, v0 = model.initial_state()
    _, A = model.terms(0.0, q0).holonomic_jacobian
    null = np.linalg.svd(np.asarray(A))[2][-1]  # a consistent velocity
    v1, v2 = jnp.asarray(null), jnp.asarray(2 * null)
    heavier = model.tree_replace(
        {"body_mass": model.mjx_model.body_mass * jnp.array([1.0, 1.0, 3.0, 1.0])})
    jax.block_until_ready((v1, v2, heavier))
    events = []

    def listen(event, duration, **kwargs):
        del duration
        if event in (BACKEND_COMPILE, TRACE):
            events.append((event, kwargs.get("fun_name")))

    def final(model, q, v):
        sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q, v, t1=0.02, dt=0.01,
                             saveat=cdiff.SaveAt(t1=True))
        return jax.block_until_ready(sol.q)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        first = final(model, q0, v1)
        assert (TRACE, "run_route") in events  # the listener hears the first solve
        events.clear()
        again = [final(model, q0, v2), final(heavier, q0, v1)]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert not [e for e in events if e[0] == BACKEND_COMPILE], events
    assert (TRACE, "run_route") not in events, events
    # The new inputs were used: each result differs from the first, far beyond
    # round-off (measured 0.013 and 6.1e-7).
    for q in again:
        assert float(jnp.abs(q - first).max()) > 1e-9


BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
