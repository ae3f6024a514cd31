"""Impacts with Coulomb friction: Newton's law on the normal with a Coulomb
tangential impulse, against an independent solve of the plastic impact (SciPy)
over random impacts, and a disk dropped spinning-free onto a floor against its
closed form."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import GRAVITY, Disk
from jaxtyping import Array
from scipy.optimize import minimize

import cdiff


class Linear(cdiff.AbstractModel):
    """One contact of a body with mass matrix `M`: the gap `a . q`, the slip
    `W v` (`d` tangential directions)."""

    M: Array
    a: Array
    W: Array
    friction: Array = 0.0
    restitution: Array = 0.0

    def mass_matrix(self, t, q):
        return self.M

    def forces(self, t, q, v):
        return jnp.zeros_like(v)

    def unilateral(self, t, q):
        return (self.a @ q)[None]

    def slip(self, t, q, v):
        return (self.W @ v)[None]


def _random_impacts(d, count, seed):
    """`count` random single-contact impacts: mass matrices, contact normals and
    tangents coupled through them, coefficients across stick and slip."""
    rng = np.random.default_rng(seed)
    n = 4
    models, vs = [], []
    for _ in range(count):
        B = rng.normal(size=(n, n))
        M = B @ B.T + 0.5 * np.eye(n)
        a, W = rng.normal(size=n), rng.normal(size=(d, n))
        v = rng.normal(size=n)
        if a @ v > 0:  # (approaching: the gap's rate negative)
            v = -v
        models.append((M, a, W, rng.uniform(0.0, 1.5), rng.uniform(0.0, 1.0)))
        vs.append(v)
    stacked = [np.stack(x) for x in zip(*models)]
    return Linear(*map(jnp.asarray, stacked)), jnp.asarray(np.stack(vs))


def _reference(M, a, W, mu, e, v):
    """The same law solved independently: the plastic impact as the impulse in
    the cone that leaves the least kinetic energy with the contact stopped
    (Coulomb's law is this problem's optimality condition), by SciPy's SLSQP;
    then the restitution `-e a.v` by the normal impulse alone. Returns the
    velocity after it and the plastic impulse (normal, tangential)."""
    Minv = np.linalg.inv(M)
    d = W.shape[0]

    def after(x):
        return v + Minv @ (a * x[0] + W.T @ x[1:])

    def energy(x):
        w = after(x)
        return 0.5 * w @ M @ w

    x0 = np.concatenate([[-(a @ v) / (a @ Minv @ a)], np.zeros(d)])
    res = minimize(energy, x0, method="SLSQP", tol=1e-15, options={"maxiter": 500},
                   constraints=[{"type": "eq", "fun": lambda x: a @ after(x)},
                                {"type": "ineq",
                                 "fun": lambda x: (mu * x[0])**2 - x[1:] @ x[1:]},
                                {"type": "ineq", "fun": lambda x: x[0]}])
    v1 = after(res.x)
    return v1 + Minv @ a * (-e * (a @ v) - a @ v1) / (a @ Minv @ a), res.x


@pytest.mark.parametrize("d", [1, 2], ids=["plane", "space"])
def test_random_impacts_follow_the_law_and_never_gain_energy(d):
    """Over random impacts (masses, contact geometry coupling the normal and the
    slip, mu in [0, 1.5], e in [0, 1]): Newton's normal law exactly, the
    tangential impulse inside the cone, the velocity of an independent solve,
    and kinetic energy lost, never gained."""
    models, vs = _random_impacts(d, 24, seed=d)
    q = jnp.zeros(4)
    out = jax.jit(jax.vmap(lambda m, v: cdiff.impact(m, 0.0, q, v)))(models, vs)
    M, a = np.asarray(models.M), np.asarray(models.a)
    mu, e = np.asarray(models.friction), np.asarray(models.restitution)
    v, w = np.asarray(vs), np.asarray(out.v)
    before = np.einsum("bi,bij,bj->b", v, M, v)
    after = np.einsum("bi,bij,bj->b", w, M, w)
    assert np.all(after <= before * (1 + 1e-12)), (after - before).max()
    np.testing.assert_allclose(np.einsum("bi,bi->b", a, w),
                               -e * np.einsum("bi,bi->b", a, v), rtol=1e-9, atol=1e-12)
    normal = np.asarray(out.impulse[:, 0])
    tangential = np.linalg.norm(np.asarray(out.friction[:, 0]), axis=-1)
    assert np.all(normal > 0)
    assert np.all(tangential <= mu * normal * (1 + 1e-9))
    slips = []
    for i in range(len(v)):
        ref, x = _reference(M[i], a[i], np.asarray(models.W[i]), mu[i], e[i], v[i])
        np.testing.assert_allclose(w[i], ref, atol=2e-6 * np.abs(v[i]).max(),
                                   err_msg=f"impact {i}")
        slips.append(np.linalg.norm(x[1:]) > mu[i] * x[0] * (1 - 1e-6))
    # Both regimes are drawn: some stick, some slip (the cone reached).
    assert 0 < sum(slips) < len(slips)


@pytest.mark.parametrize("d", [1, 2], ids=["plane", "space"])
def test_gradients_of_random_impacts_match_central_differences(d):
    """The velocity after the impact, differentiated in mu and in the velocity
    before it (reverse mode), against central differences: through the stick or
    slip decision, and in space through the slip direction's search (its
    derivative the implicit function theorem's)."""
    models, vs = _random_impacts(d, 8, seed=10 + d)
    q = jnp.zeros(4)
    weights = jnp.asarray(np.random.default_rng(0).normal(size=4))

    def loss(mu, v, model):
        model = eqx.tree_at(lambda m: m.friction, model, mu)
        return cdiff.impact(model, 0.0, q, v).v @ weights

    grad = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))
    value = jax.jit(jax.vmap(loss))
    d_mu, d_v = grad(models.friction, vs, models)
    h = 1e-6
    fd_mu = (value(models.friction + h, vs, models)
             - value(models.friction - h, vs, models)) / (2 * h)
    np.testing.assert_allclose(np.asarray(d_mu), np.asarray(fd_mu), rtol=1e-6,
                               atol=1e-7)
    for j in range(4):
        e = jnp.zeros(4).at[j].set(h)
        fd_v = (value(models.friction, vs + e, models)
                - value(models.friction, vs - e, models)) / (2 * h)
        np.testing.assert_allclose(np.asarray(d_v[:, j]), np.asarray(fd_v),
                                   rtol=1e-6, atol=1e-7)


HEIGHT, TOL = 0.2, 1e-11
TS = np.linspace(0.0, 1.0, 11)


@eqx.filter_jit
def _drop(mu, speed):
    """The disk dropped from `HEIGHT` above the floor at horizontal `speed`,
    without spin (plastic impact)."""
    return cdiff.simulate(
        Disk(0.5, mu), cdiff.Lagrange(), jnp.array([0.0, 0.5 + HEIGHT, 0.0]),
        jnp.stack([speed, 0.0, 0.0]), t1=TS[-1], dt=1e-3, solver=diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=TOL, atol=TOL),
        saveat=diffrax.SaveAt(ts=jnp.asarray(TS)), max_steps=20000)


def _drop_closed_form(mu, speed, ts):
    """x(t) and the events' times: the impact at t_h with normal speed u; it
    sticks where speed / 3 <= mu u (rolls at 2/3 speed from there), else leaves
    slipping at speed - mu u and rolls from t_h + (speed - 3 mu u) / (3 mu g)."""
    t_h = np.sqrt(2 * HEIGHT / GRAVITY)
    u = GRAVITY * t_h
    roll = 2 / 3 * speed
    if speed <= 3 * mu * u:
        x_h, t_r = speed * t_h, t_h
    else:
        t_r = t_h + (speed - 3 * mu * u) / (3 * mu * GRAVITY)
        x_h = speed * t_h
    after = speed - mu * u
    x = np.where(ts < t_h, speed * ts, np.where(
        ts < t_r, x_h + after * (ts - t_h) - 0.5 * mu * GRAVITY * (ts - t_h)**2,
        x_h + after * (t_r - t_h) - 0.5 * mu * GRAVITY * (t_r - t_h)**2
        + roll * (ts - t_r)))
    return x, t_h, t_r


@pytest.mark.parametrize("speed", [1.0, 6.0], ids=["sticks-at-impact",
                                                    "slips-then-rolls"])
def test_disk_dropped_onto_a_floor_matches_its_closed_form(speed):
    """Plastic impact with friction: stuck by the impact (rolling at 2/3 of its
    speed at once) where the cone allows, else slipping from it with the
    tangential impulse mu u and rolling later; the events and their times."""
    mu = 0.3
    sol = _drop(jnp.asarray(mu), jnp.asarray(speed))
    x, t_h, t_r = _drop_closed_form(mu, speed, TS)
    np.testing.assert_allclose(np.asarray(sol.q[:, 0]), x, atol=1e-8)
    events = sol.stats["events"]
    kinds = [cdiff.EVENT_KINDS[k] for k in np.asarray(events.kind[:int(events.count)])]
    if t_r == t_h:
        assert kinds == ["impact", "stick"]
    else:
        assert kinds == ["impact", "slip", "stick"]
        np.testing.assert_allclose(float(events.t[2]), t_r, atol=1e-10)
    np.testing.assert_allclose(float(events.t[0]), t_h, atol=1e-10)
    # The impact's normal impulse stops the fall: u.
    np.testing.assert_allclose(float(events.impulse[0, 0]), GRAVITY * t_h, rtol=1e-9)


@pytest.mark.slow
def test_gradient_through_a_slipping_impact_matches_the_closed_form():
    """d x(T) / d mu through an impact that leaves the disk slipping and the
    rolling event after it: the closed form's derivative (its central
    differences, exact to ~1e-9 on the closed form)."""
    mu, speed, h = 0.3, 6.0, 1e-5

    def x_end(mu):
        return _drop(mu, jnp.asarray(speed)).q[-1, 0]

    grad = float(jax.grad(x_end)(jnp.asarray(mu)))
    closed = (_drop_closed_form(mu + h, speed, TS)[0][-1]
              - _drop_closed_form(mu - h, speed, TS)[0][-1]) / (2 * h)
    np.testing.assert_allclose(grad, closed, rtol=1e-6)
