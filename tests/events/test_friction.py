"""Coulomb friction on unilateral rows (stick, slip and their events), against
closed forms: a block on a slope, a disk launched sliding on a floor."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import GRAVITY, Disk

import cdiff

THETA = 0.3  # the slope's angle: tan(THETA) = 0.309


class Block(cdiff.AbstractModel):
    """A unit block on a slope of angle `theta`: `x` up the slope, `y` its height
    above it (the unilateral row), the slip `dx/dt`."""

    theta: float = THETA
    friction: float = 0.5

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return -GRAVITY * jnp.stack([jnp.sin(self.theta),
                                     jnp.cos(self.theta)]).astype(v.dtype)

    def unilateral(self, t, q):
        return q[1:]

    def slip(self, t, q, v):
        return v[None, :1]


TOL = 1e-11


def _solve(model, q0, v0, ts, formulation=None, throw=True):
    return cdiff.simulate(
        model, formulation or cdiff.Lagrange(), jnp.asarray(q0, float),
        jnp.asarray(v0, float), t1=jnp.asarray(ts, float)[-1], dt=1e-3, solver=diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=TOL, atol=TOL),
        saveat=diffrax.SaveAt(ts=jnp.asarray(ts, float)), max_steps=20000,
        throw=throw)


# One compilation for the block's runs with friction: the coefficient and the
# speed are arrays (traced), the save times' count static.
_block_jit = eqx.filter_jit(lambda model, v0, ts: _solve(model, [0.0, 0.0], [v0, 0.0],
                                                         ts, throw=False))


def _block(mu, v0, ts):
    """The block from x = 0 at speed `v0` up the slope (no error raised: a bad
    member's result code is read instead)."""
    mu = mu if isinstance(mu, float) and mu == 0.0 else jnp.asarray(mu, float)
    return _block_jit(Block(jnp.asarray(THETA), mu), jnp.asarray(v0, float),
                      jnp.asarray(ts, float))


def _block_closed_form(mu, v0, ts):
    """The block's position up the slope from x = 0 at speed `v0` (Coulomb)."""
    s, c = np.sin(THETA), np.cos(THETA)
    ts = np.asarray(ts)
    if v0 == 0:
        a = GRAVITY * max(s - mu * c, 0.0)
        return -0.5 * a * ts**2
    up = GRAVITY * (s + mu * c)  # deceleration while sliding up
    t_stop = v0 / up
    x_top = v0 * t_stop - 0.5 * up * t_stop**2
    down = GRAVITY * max(s - mu * c, 0.0)
    return np.where(ts < t_stop, v0 * ts - 0.5 * up * ts**2,
                    x_top - 0.5 * down * (ts - t_stop)**2)


TS = np.linspace(0.0, 2.0, 21)


@pytest.mark.parametrize("mu,v0", [(0.5, 0.0), (0.2, 0.0), (0.5, 2.0), (0.1, 2.0)],
                         ids=["sticks", "slides", "up-stops-sticks",
                              "up-stops-slides-down"])
def test_block_on_a_slope_follows_coulombs_law(mu, v0):
    """Sticks for tan(theta) <= mu, slides at g(sin - mu cos) otherwise; launched up
    the slope, stops at v0 / (g(sin + mu cos)), then stays or slides back down."""
    sol = _block(mu, v0, TS)
    x = np.asarray(sol.q[:, 0])
    events = sol.stats["events"]
    kinds = [cdiff.EVENT_KINDS[k] for k in np.asarray(events.kind[:int(events.count)])]
    # The impact that takes the row at the start, then its mode; launched up, it
    # stops at the closed-form time, and sticks or turns (a second slip).
    mode = "stick" if mu > np.tan(THETA) else "slip"
    assert kinds == (["impact", mode] if v0 == 0 else ["impact", "slip", mode])
    if v0:
        t_stop = v0 / (GRAVITY * (np.sin(THETA) + mu * np.cos(THETA)))
        np.testing.assert_allclose(float(events.t[2]), t_stop, rtol=0, atol=1e-10)
    np.testing.assert_allclose(x, _block_closed_form(mu, v0, TS), rtol=0, atol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.q[:, 1]), 0.0, atol=1e-12)
    # The friction force: Coulomb's mu lambda_N against the slip while it slides,
    # the slope's pull g sin(theta) while it sticks; lambda_N = g cos(theta).
    modes = np.asarray(sol.contact_mode[1:, 0])
    force = np.asarray(sol.friction_force[1:, 0, 0])
    normal = GRAVITY * np.cos(THETA)
    np.testing.assert_allclose(np.asarray(sol.unilateral_multipliers[1:, 0]), normal,
                               rtol=1e-10)
    sliding = modes == cdiff.CONTACT_MODES.index("slip")
    np.testing.assert_allclose(
        force[sliding], -mu * normal * np.sign(np.asarray(sol.v[1:, 0])[sliding]),
        rtol=1e-10)
    np.testing.assert_allclose(force[~sliding], GRAVITY * np.sin(THETA), rtol=1e-10)


def test_a_stuck_block_does_not_creep():
    """Inside the cone, held over 10 s: no creep, to round-off (where a soft
    contact model drifts)."""
    ts = np.linspace(0.0, 10.0, TS.shape[0])  # (as many as TS: one compilation)
    sol = _block(0.35, 0.0, ts)
    assert float(jnp.max(jnp.abs(sol.q[1:, 0] - sol.q[1, 0]))) <= 1e-14
    assert float(jnp.max(jnp.abs(sol.q[:, 0]))) <= 1e-12
    # Held by the friction that the slope's pull needs, inside the cone.
    stick = cdiff.CONTACT_MODES.index("stick")
    assert np.all(np.asarray(sol.contact_mode[1:]) == stick)
    np.testing.assert_allclose(np.asarray(sol.unilateral_multipliers[1:, 0]),
                               GRAVITY * np.cos(THETA), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sol.multipliers[1:, -1]),
                               GRAVITY * np.sin(THETA), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sol.friction_force[1:, 0, 0]),
                               GRAVITY * np.sin(THETA), rtol=1e-12)


def test_vmap_over_mu_across_the_threshold():
    """Members on both sides of tan(theta) in one batch: each its own closed form.
    A negative or NaN coefficient, which a vmap cannot refuse before tracing, ends
    its member's solve with `bad_friction` at its start, and the others go on."""
    mus = jnp.array([0.1, 0.25, 0.3, 0.32, 0.6, -1.0, jnp.nan])
    sol = jax.vmap(lambda mu: _block(mu, 0.0, TS))(mus)
    for mu, x in zip(np.asarray(mus[:5]), np.asarray(sol.q[:5, :, 0])):
        np.testing.assert_allclose(x, _block_closed_form(mu, 0.0, TS), atol=1e-8)
    assert [int(r) for r in sol.result._value] == [
        int(cdiff.RESULTS.successful._value)] * 5 + [
        int(cdiff.RESULTS.bad_friction._value)] * 2


def test_zero_friction_is_the_frictionless_path():
    """mu = 0 known before tracing: the model without friction (its solve is the
    one of a model that declares none), sliding freely."""
    sol = _block(0.0, 0.0, TS)
    np.testing.assert_allclose(np.asarray(sol.q[:, 0]),
                               -0.5 * GRAVITY * np.sin(THETA) * TS**2, atol=1e-9)


V0 = 3.0


def _disk_x(mu, ts):
    """The disk's position, launched at V0 without spin: it slides until
    t* = V0 / (3 mu g), then rolls at 2/3 V0."""
    t_star = V0 / (3 * mu * GRAVITY)
    ts = np.asarray(ts)
    return np.where(ts < t_star, V0 * ts - 0.5 * mu * GRAVITY * ts**2,
                    2 / 3 * V0 * ts + V0**2 / (18 * mu * GRAVITY))


@pytest.mark.parametrize("formulation", [
    cdiff.Lagrange(),
    # (Another formulation through the same friction solve: in the slow tier.)
    pytest.param(cdiff.NullSpace(), marks=pytest.mark.slow)],
    ids=["lagrange", "null-space"])
def test_disk_slides_then_rolls(formulation):
    """Rolls from t* = v0 / (3 mu g) on, at 2/3 v0, its slip held at zero."""
    mu = 0.3
    ts = np.linspace(0.0, 2.0, 11)
    sol = _solve(Disk(0.5, mu), [0.0, 0.5, 0.0], [V0, 0.0, 0.0], ts, formulation)
    np.testing.assert_allclose(np.asarray(sol.q[:, 0]), _disk_x(mu, ts), atol=1e-8)
    rolling = ts > V0 / (3 * mu * GRAVITY)
    v = np.asarray(sol.v)
    np.testing.assert_allclose(v[rolling, 0], 2 / 3 * V0, rtol=1e-9)
    np.testing.assert_allclose(v[rolling, 0] + 0.5 * v[rolling, 2], 0.0, atol=1e-9)
    # (Open at the start: at contact, the row is taken by the first event.)
    modes = np.asarray(sol.contact_mode[1:, 0])
    assert list(modes) == [cdiff.CONTACT_MODES.index("stick" if roll else "slip")
                           for roll in rolling[1:]]
    # Recorded: the impact that takes the row at the start, its slip from there,
    # and the stick at t*, located to round-off.
    events = sol.stats["events"]
    kinds = [cdiff.EVENT_KINDS[k] for k in np.asarray(events.kind[:int(events.count)])]
    assert kinds == ["impact", "slip", "stick"]
    np.testing.assert_allclose(float(events.t[2]), V0 / (3 * mu * GRAVITY),
                               rtol=0, atol=1e-10)
    # The floor carries the weight; rolling needs no friction.
    np.testing.assert_allclose(np.asarray(sol.unilateral_multipliers[1:, 0]),
                               GRAVITY, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(sol.multipliers[rolling, -1]), 0.0,
                               atol=1e-9)
    # Coulomb's mu g against the slip while it slides (every row: the friction
    # force whatever the mode).
    force = np.asarray(sol.friction_force[1:, 0, 0])
    np.testing.assert_allclose(force, np.where(rolling[1:], 0.0, -mu * GRAVITY),
                               atol=1e-9)


def test_gradient_with_respect_to_mu_through_the_rolling_transition():
    """d x(T) / d mu through the stick event (its time by the implicit function
    theorem) equals the closed form's, -v0^2 / (18 mu^2 g)."""
    mu, t1 = 0.3, 1.0

    def x_end(mu):
        sol = _solve(Disk(0.5, mu), [0.0, 0.5, 0.0], [V0, 0.0, 0.0], [t1])
        return sol.q[-1, 0]

    value, grad = jax.value_and_grad(x_end)(jnp.asarray(mu))
    np.testing.assert_allclose(float(value), _disk_x(mu, [t1])[0], atol=1e-9)
    np.testing.assert_allclose(float(grad), -V0**2 / (18 * mu**2 * GRAVITY),
                               rtol=1e-6)


class Sphere(cdiff.AbstractModel):
    """A uniform ball of unit mass and radius `radius` on a floor: its centre
    `(x, y, z)` and three coordinates whose rates are its angular velocity (its
    orientation does not enter its dynamics); the slip of its contact point in
    the floor's plane."""

    radius: float = 0.5
    friction: float = 0.3

    def mass_matrix(self, t, q):
        inertia = 0.4 * self.radius**2
        return jnp.diag(jnp.array([1.0, 1.0, 1.0, inertia, inertia, inertia],
                                  q.dtype))

    def forces(self, t, q, v):
        return jnp.array([0.0, 0.0, -GRAVITY, 0.0, 0.0, 0.0], v.dtype)

    def unilateral(self, t, q):
        return q[2:3] - self.radius

    def slip(self, t, q, v):
        # The centre's velocity plus omega x (0, 0, -radius).
        return jnp.stack([v[0] - self.radius * v[4],
                          v[1] + self.radius * v[3]])[None]


def test_sphere_slides_then_rolls_in_space():
    """Launched sliding without spin along a diagonal of the floor: the circular
    cone's force against the slip, rolling from t* = 2 v0 / (7 mu g) on at 5/7 v0
    along the same line."""
    mu, speed, angle = 0.3, 3.0, 0.6
    direction = np.array([np.cos(angle), np.sin(angle)])
    ts = np.linspace(0.0, 1.0, 6)
    v0 = np.concatenate([speed * direction, [0.0, 0.0, 0.0, 0.0]])
    sol = _solve(Sphere(0.5, mu), [0.0, 0.0, 0.5, 0.0, 0.0, 0.0], v0, ts)
    t_star = 2 * speed / (7 * mu * GRAVITY)
    along = np.where(ts < t_star, speed * ts - 0.5 * mu * GRAVITY * ts**2,
                     5 / 7 * speed * ts + 2 * speed**2 / (49 * mu * GRAVITY))
    np.testing.assert_allclose(np.asarray(sol.q[:, :2]), along[:, None] * direction,
                               atol=1e-8)
    rolling = ts > t_star
    np.testing.assert_allclose(np.asarray(sol.v[rolling, :2]),
                               5 / 7 * speed * np.broadcast_to(
                                   direction, (rolling.sum(), 2)), rtol=1e-9)
    assert np.all(np.asarray(sol.contact_mode[rolling, 0])
                  == cdiff.CONTACT_MODES.index("stick"))


class Particle(cdiff.AbstractModel):
    """A unit particle on a slope of angle `theta`: `x` up the slope, `y` across
    it, `z` its height above it; the slip `(dx/dt, dy/dt)`."""

    theta: float = THETA
    friction: float = 0.2

    def mass_matrix(self, t, q):
        return jnp.eye(3, dtype=q.dtype)

    def forces(self, t, q, v):
        return -GRAVITY * jnp.stack([jnp.sin(self.theta), jnp.zeros(()),
                                     jnp.cos(self.theta)]).astype(v.dtype)

    def unilateral(self, t, q):
        return q[2:]

    def slip(self, t, q, v):
        return v[None, :2]


def test_particle_launched_across_a_slope_turns_as_scipy_says():
    """mu < tan(theta), launched across the slope: the sliding direction turns
    downhill; the positions agree with SciPy's tight solve of the sliding
    equations (DOP853, rtol 1e-12)."""
    from scipy.integrate import solve_ivp

    mu, ts = 0.2, np.linspace(0.0, 1.5, 7)
    sol = _solve(Particle(THETA, mu), [0.0, 0.0, 0.0], [0.0, 2.0, 0.0], ts)

    def sliding(t, state):
        x, y, vx, vy = state
        speed = np.hypot(vx, vy)
        pull = mu * GRAVITY * np.cos(THETA) / speed
        return [vx, vy, -GRAVITY * np.sin(THETA) - pull * vx, -pull * vy]

    ref = solve_ivp(sliding, (0.0, ts[-1]), [0.0, 0.0, 0.0, 2.0], t_eval=ts,
                    method="DOP853", rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(sol.q[:, :2]), ref.y[:2].T, atol=1e-7)
    assert np.all(np.asarray(sol.contact_mode[1:, 0])
                  == cdiff.CONTACT_MODES.index("slip"))


class Rod(cdiff.AbstractModel):
    """Painleve's rod: a uniform rod of unit mass and half-length 1, `(x, y,
    angle)` of its centre, its lower end on the floor."""

    friction: float = 2.0

    def mass_matrix(self, t, q):
        return jnp.diag(jnp.array([1.0, 1.0, 1.0 / 3.0], q.dtype))

    def forces(self, t, q, v):
        return jnp.array([0.0, -GRAVITY, 0.0], v.dtype)

    def unilateral(self, t, q):
        return q[1:2] - jnp.sin(q[2:3])

    def slip(self, t, q, v):
        return (v[0] + jnp.sin(q[2]) * v[2]).reshape(1, 1)


def test_painleves_rod_stops_with_a_message_naming_it():
    """Sliding with its lower end leading at tan(angle) = 2, the rod has no
    consistent normal force for mu > 4/3 (1 - d lambda_N / d p = 1 - 3 mu sin cos
    / (1 + 3 cos^2) < 0): the solve says so, instead of picking one."""
    angle = np.arctan(2.0)
    with pytest.raises(Exception, match="Painleve's paradox"):
        _solve(Rod(2.0), [0.0, np.sin(angle), angle], [-1.0, 0.0, 0.0], [0.1])
    # Without raising, the solve ends with its own result code; under vmap, that
    # member alone: below the critical coefficient (4/3 here) the rod slides on.
    sol = jax.vmap(lambda mu: _solve(
        Rod(mu), [0.0, np.sin(angle), angle], [-1.0, 0.0, 0.0], [0.1],
        throw=False))(jnp.array([1.0, 2.0]))
    assert [int(r) for r in sol.result._value] == [
        int(cdiff.RESULTS.successful._value), int(cdiff.RESULTS.painleve._value)]
    assert "Painleve's paradox" in sol.message
    assert np.all(np.isfinite(np.asarray(sol.q[0])))


# -- refusals ---------------------------------------------------------------------


class NoSlip(cdiff.AbstractModel):
    friction: float = 0.5

    def mass_matrix(self, t, q):
        return jnp.eye(2, dtype=q.dtype)

    def unilateral(self, t, q):
        return q[1:]


def _simulate(model, **kwargs):
    kwargs.setdefault("solver", diffrax.Tsit5())
    kwargs.setdefault("stepsize_controller", diffrax.PIDController(rtol=1e-8,
                                                                   atol=1e-8))
    return cdiff.simulate(model, kwargs.pop("formulation", cdiff.Lagrange()),
                          jnp.zeros(2), jnp.zeros(2), t1=0.1, dt=1e-2, **kwargs)


@pytest.mark.parametrize("model,match", [
    (Block(THETA, -0.1), "friction must be finite and non-negative"),
    (Block(THETA, jnp.array([0.1, 0.2])), "friction has shape"),
    (NoSlip(), "no slip"),
])
def test_bad_friction_is_refused_before_tracing(model, match):
    with pytest.raises(ValueError, match=match):
        _simulate(model)


def test_routes_without_friction_are_refused():
    with pytest.raises(ValueError, match="RK4 loop does not take it"):
        _simulate(Block(), solver=cdiff.RK4(), stepsize_controller=None)
    with pytest.raises(ValueError, match="BDF does not simulate"):
        _simulate(Block(), formulation=cdiff.GGL(), solver=cdiff.BDF(),
                  stepsize_controller=None)
