"""R6, a sphere rolling on a sphere (Yun-Sarkar Sec. V-A, Figs. 2-3): the model
against autodiff and exact solutions, its reference against a closed form, and
the paper's contact scenarios with cdiff.NullSpace."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import expm
from scipy.spatial.transform import Rotation

import cdiff
from cdiff import kinematics
from cdiff.models import RollingSphere

# private on purpose: the models' internal reference solver, on this file's own ODE
from cdiff.models._reference import solve_minimal

T1, DT = 10.0, 0.01
TS = jnp.linspace(0.0, T1, 1001)  # every step
GAP = 0.01  # initial gap of the Fig. 2 run (m)
# "In contact": |holonomic residual| below 1e-4 m, 1% of the 1 cm gaps (the
# paper's "about five time constants 1/alpha": e^-4.6 = 1%).
CONTACT = 1e-4


# --- independent kinematics -----------------------------------------------------


def _rotation(angles):
    """z-x-z body rotations R_z(phi) R_x(theta) R_z(psi), by matrix products."""
    phi, theta, psi = angles

    def rz(a):
        return jnp.array([[jnp.cos(a), -jnp.sin(a), 0.0],
                          [jnp.sin(a), jnp.cos(a), 0.0], [0.0, 0.0, 1.0]])

    rx = jnp.array([[1.0, 0.0, 0.0], [0.0, jnp.cos(theta), -jnp.sin(theta)],
                    [0.0, jnp.sin(theta), jnp.cos(theta)]])
    return rz(phi) @ rx @ rz(psi)


def _hat(w):
    return jnp.array([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])


def _centre(q):
    rho, lat, lon = q[0], q[1], q[2]
    return rho * jnp.array([jnp.cos(lat) * jnp.cos(lon), jnp.cos(lat) * jnp.sin(lon),
                            -jnp.sin(lat)])


def _omega(q, v):
    """World angular velocity from [omega]_x = Rdot R^T, by autodiff."""
    R, Rdot = jax.jvp(_rotation, (q[3:],), (v[3:],))
    W = Rdot @ R.T
    return jnp.array([W[2, 1], W[0, 2], W[1, 0]])


def _kinetic(model, q, v):
    """T = m |pdot|^2 / 2 + I |omega|^2 / 2 from the rotation matrix."""
    pdot = jax.jvp(_centre, (q,), (v,))[1]
    w = _omega(q, v)
    return 0.5 * model.m * pdot @ pdot + 0.5 * 0.4 * model.m * model.r**2 * w @ w


def _invariants(model, q, v, centre=(0.0, 0.0, 0.0)):
    """Energy, spin n.omega and the angular momentum about the contact point
    I omega + m r n x pdot: constant while the sphere rolls on the large sphere
    centred at `centre`."""
    c = jnp.asarray(centre, jnp.float64)

    def one(q, v):
        p, pdot = jax.jvp(_centre, (q,), (v,))
        n = (p - c) / jnp.linalg.norm(p - c)
        w = _omega(q, v)
        inertia = 0.4 * model.m * model.r**2
        L = inertia * w + model.m * model.r * jnp.cross(n, pdot)
        return jnp.concatenate([jnp.stack([_kinetic(model, q, v), n @ w]), L])

    return jax.vmap(one)(q, v)


def _states(n, seed=0):
    """Random states around the scenario's, in and out of contact."""
    rng = np.random.default_rng(seed)
    q = np.column_stack([
        0.6 + rng.uniform(-0.02, 0.02, n), rng.uniform(-0.6, 0.6, n),
        rng.uniform(-3, 3, n), rng.uniform(-3, 3, n), rng.uniform(0.5, 2.6, n),
        rng.uniform(-3, 3, n),
    ])
    return jnp.asarray(q), jnp.asarray(rng.normal(size=(n, 6)))


# --- the model --------------------------------------------------------------------


def test_rotation_and_angular_velocity():
    """The test's rotation is scipy's intrinsic ZXZ; the model's omega is
    [omega]_x = Rdot R^T."""
    model = RollingSphere()
    q, v = _states(5)
    for qi, vi in zip(q, v):
        # Round-off (measured at most 4.4e-16 on both).
        np.testing.assert_allclose(
            _rotation(qi[3:]), Rotation.from_euler("ZXZ", qi[3:]).as_matrix(),
            rtol=0, atol=2e-15)
        np.testing.assert_allclose(model.angular_velocity(qi, vi), _omega(qi, vi),
                                   rtol=0, atol=2e-15)


def test_mass_matrix_and_forces_are_lagranges_equations():
    """M = d2T/dv2 and Q = dT/dq - (d2T/dv dq) v for T from the rotation matrix
    (the hand-written M and forces of the model, which the paper does not print)."""
    model = RollingSphere()
    T = functools.partial(_kinetic, model)

    @jax.jit
    @jax.vmap
    def compare(q, v):
        M = jax.hessian(T, argnums=1)(q, v)
        Q = jax.grad(T, argnums=0)(q, v) - jax.jacfwd(
            jax.grad(T, argnums=1), argnums=0)(q, v) @ v
        return (model.mass_matrix(0.0, q) - M, model.forces(0.0, q, v) - Q,
                model.energy(0.0, q, v) - T(q, v))

    dM, dQ, dE = compare(*_states(8))
    # Round-off: measured 2.2e-16, 4.4e-16 and 8.9e-16.
    assert float(jnp.max(jnp.abs(dM))) < 1e-15
    assert float(jnp.max(jnp.abs(dQ))) < 2e-15
    assert float(jnp.max(jnp.abs(dE))) < 1e-15


def _free_rhs(t, y, model):
    q, v = y[:6], y[6:]
    acc = jnp.linalg.solve(model.mass_matrix(t, q), model.forces(t, q, v))
    return jnp.concatenate([v, acc])


def test_free_sphere_moves_uniformly():
    """Without constraints, M qdd = Q is a free sphere: its centre moves on a
    straight line at constant speed and it spins with constant omega,
    R(t) = exp(t [omega]_x) R(0) (Dopri8 at 1e-12 on the model's M and Q)."""
    model = RollingSphere()
    q0 = jnp.array([0.6, 0.2, 0.3, 0.4, 1.3, -0.5])
    v0 = jnp.array([0.3, -0.4, 0.5, 2.0, -1.0, 3.0])
    ts = jnp.array([0.25, 0.5, 1.0])
    ys = solve_minimal(_free_rhs, jnp.concatenate([q0, v0]), ts, model)
    p0, pdot0 = jax.jvp(_centre, (q0,), (v0,))
    w0 = _omega(q0, v0)
    # Per time, bounds on the centre, the rotation and omega (measured: 5.8e-15,
    # 1.2e-11, 2.0e-11 at 0.25 s; 2.2e-16, 2.3e-12, 1.1e-11 at 0.5 s; 2.2e-16,
    # 2.0e-13, 2.7e-13 at 1 s).
    bounds = [(2e-14, 5e-11, 1e-10), (1e-15, 1e-11, 5e-11), (1e-15, 1e-12, 1e-12)]
    for t, y, (centre, rotation, omega) in zip(ts, ys, bounds, strict=True):
        np.testing.assert_allclose(_centre(y[:6]), p0 + t * pdot0, rtol=0,
                                   atol=centre)
        np.testing.assert_allclose(_rotation(y[3:6]),
                                   expm(t * _hat(w0)) @ _rotation(q0[3:]), rtol=0,
                                   atol=rotation)
        np.testing.assert_allclose(_omega(y[:6], y[6:]), w0, rtol=0, atol=omega)


def _velocity(q, pdot, w):
    """Coordinate rates of a state with centre velocity pdot and angular velocity w."""
    jac = jax.jacfwd(lambda e: _omega(q, jnp.concatenate([jnp.zeros(3), e])))
    rates = jnp.linalg.solve(jac(jnp.zeros(3)), w)
    J = jax.jacfwd(_centre)(q)[:, :3]
    return jnp.concatenate([jnp.linalg.solve(J, pdot), rates])


@pytest.mark.parametrize("t", [1.0, 6.0], ids=["undisplaced", "displaced"])
def test_constraints_are_contact_kinematics(t):
    """The holonomic residual is |p - c(t)| - (R + r); the rolling residual vanishes
    iff the point p - r n has no tangential velocity, in and out of contact:
    any normal velocity is allowed, and a tangential slip s gives
    |Phi_v| = |e_z x n| |s|."""
    model = RollingSphere()
    c = jnp.array(model.displacement) if t > model.t_displace else jnp.zeros(3)
    q, v = _states(6, seed=1)
    rng = np.random.default_rng(2)
    for qi, wi in zip(q, v[:, 3:]):
        p = _centre(qi)
        n = (p - c) / jnp.linalg.norm(p - c)
        assert float(model.holonomic(t, qi)[0]) == pytest.approx(
            float(jnp.linalg.norm(p - c) - 0.6), abs=1e-15)
        rolling = model.r * jnp.cross(wi, n) + rng.normal() * n
        zero = model.nonholonomic(t, qi, _velocity(qi, rolling, wi))
        np.testing.assert_allclose(zero, 0.0, rtol=0, atol=2e-16)  # measured 5.7e-17
        slip = jnp.cross(n, jnp.asarray(rng.normal(size=3)))
        phi = model.nonholonomic(t, qi, _velocity(qi, rolling + slip, wi))
        expected = jnp.linalg.norm(jnp.cross(jnp.array([0.0, 0.0, 1.0]), n)) * \
            jnp.linalg.norm(slip)
        # measured 5.5e-16 relative (both builds)
        assert float(jnp.linalg.norm(phi)) == pytest.approx(float(expected), rel=2e-15,
                                                            abs=0)


def test_rolling_rows_in_coordinates():
    """The rows written out in the docstring (undisplaced): the model's residuals
    are cos(lat) times them, for any rho (in contact or not)."""
    model = RollingSphere()
    q, v = _states(6, seed=3)
    for (rho, lat, lon, phi, theta, psi), (_, dlat, dlon, dphi, dtheta, dpsi) in zip(
            q, v):
        d, r = phi - lon, model.r
        rows = jnp.stack([
            rho * dlat - r * (dtheta * jnp.sin(d) - dpsi * jnp.sin(theta) * jnp.cos(d)),
            rho * jnp.cos(lat) * dlon - r * (
                jnp.sin(lat) * (dtheta * jnp.cos(d)
                                + dpsi * jnp.sin(theta) * jnp.sin(d))
                + jnp.cos(lat) * (dphi + dpsi * jnp.cos(theta))),
        ])
        qi = jnp.stack([rho, lat, lon, phi, theta, psi])
        vi = jnp.stack([0.3, dlat, dlon, dphi, dtheta, dpsi])
        np.testing.assert_allclose(model.nonholonomic(0.0, qi, vi),
                                   jnp.cos(lat) * rows, rtol=0,
                                   atol=1e-15)  # measured 2.2e-16


def test_float32():
    """Every model method keeps float32 (strict promotion), autodiff included."""
    model = RollingSphere()
    q0, v0 = (x.astype(jnp.float32) for x in model.initial_state())

    @jax.jit
    def everything(t):
        return (model.mass_matrix(t, q0), model.forces(t, q0, v0),
                model.holonomic(t, q0), model.nonholonomic(t, q0, v0),
                model.energy(t, q0, v0), model.observable(q0),
                kinematics(model, t, q0, v0))

    for t in (0.0, 6.0):
        for out in jax.tree.leaves(everything(jnp.float32(t))):
            assert out.dtype == jnp.float32
            assert bool(jnp.all(jnp.isfinite(out)))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(displacement=(0.01, 0.0)), "displacement"),
        (dict(omega0=(1.0, 2.0, 3.0, 4.0)), "omega0"),
        (dict(r=0.0), "`r` must be positive"),
        (dict(m=-1.0), "`m` must be positive"),
        (dict(gap=-0.7), "R + r + gap"),
    ],
)
def test_bad_parameters(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("+", r"\+")):
        RollingSphere(**kwargs)


# --- the reference ------------------------------------------------------------------


@functools.cache
def _reference():
    """The reference at every saved time but 0 (one compilation)."""
    return RollingSphere().reference(TS[1:])


def test_reference_matches_the_closed_form():
    """omega - (5/7)(n.omega) n = w0 is constant, so n turns uniformly about w0 at
    the rate (r/(R + r))|w0| and R(t) = E(t) exp(t [c]_x) R(0) with
    E(t) = exp(Omega t [w0/|w0|]_x), c = w0 + (5/7) s n0 - Omega w0/|w0|."""
    model = RollingSphere()
    q0, v0 = model.initial_state()
    n0, w = _centre(q0) / q0[0], _omega(q0, v0)
    s = n0 @ w
    w0 = w - 5 / 7 * s * n0
    rate = model.r / (model.R + model.r) * jnp.linalg.norm(w0)
    axis = w0 / jnp.linalg.norm(w0)
    c = w0 + 5 / 7 * s * n0 - rate * axis
    rows = np.array([49, 249, 499, 749, 999])
    ref = _reference()
    ts, ref_q, ref_v = ref.ts[rows], ref.q[rows], ref.v[rows]
    # Per row, bounds on n and on the rotation (measured: n 2.2e-16, 1.7e-16,
    # 6.7e-16, 2.4e-15, 1.7e-15; the rotation 3.7e-11, 5.3e-12, 3.4e-12, 1.1e-11,
    # 3.2e-12); omega to 3e-14 (measured at most 3.7e-15; 9.8e-15 with XLA's
    # default fusion emitter).
    bounds = [(1e-15, 2e-10), (1e-15, 3e-11), (3e-15, 2e-11), (1e-14, 5e-11),
              (6e-15, 2e-11)]
    for t, q, v, (normal, rotation) in zip(ts, ref_q, ref_v, bounds, strict=True):
        E = expm(rate * t * _hat(axis))
        np.testing.assert_allclose(_centre(q) / q[0], E @ n0, rtol=0, atol=normal)
        np.testing.assert_allclose(_rotation(q[3:]),
                                   E @ expm(t * _hat(c)) @ _rotation(q0[3:]),
                                   rtol=0, atol=rotation)
        np.testing.assert_allclose(_omega(q, v), w0 + 5 / 7 * s * E @ n0, rtol=0,
                                   atol=3e-14)
    inv = _invariants(model, ref.q, ref.v)
    np.testing.assert_allclose(inv, jnp.broadcast_to(_invariants(
        model, q0[None], v0[None]), inv.shape), rtol=0, atol=1e-14)  # measured 3.3e-15
    zero = jnp.zeros_like(ref.ts)  # the undisplaced large sphere
    assert float(jnp.max(jnp.abs(jax.vmap(model.holonomic)(zero, ref.q)))) < 1e-15
    assert float(jnp.max(jnp.abs(jax.vmap(model.nonholonomic)(
        zero, ref.q, ref.v)))) < 1e-15  # measured 1.8e-16


# --- the paper's scenarios with NullSpace -------------------------------------------

CASES = {  # alpha, initial gap, displacement of the large sphere at 5 s, dt
    "fig2": (10.0, GAP, RollingSphere.displacement, DT),  # start out of contact
    "fig3": (0.0, 0.0, RollingSphere.displacement, DT),  # start in contact
    "contact": (10.0, 0.0, (0.0, 0.0, 0.0), DT),  # in contact, undisplaced
    "contact_dt/2": (10.0, 0.0, (0.0, 0.0, 0.0), DT / 2),
}


@functools.cache
def _runs():
    """All cases in one jax.vmap (one compilation), every 0.01 s over 10 s."""

    def run(alpha, gap, d, dt):
        model = RollingSphere(gap=gap, displacement=(d[0], d[1], d[2]))
        q0, v0 = model.initial_state()
        return cdiff.simulate(model, cdiff.NullSpace(alpha=alpha, dof=3), q0, v0,
                              t1=T1, dt=dt, max_steps=int(round(T1 / DT * 2)),
                              saveat=cdiff.SaveAt(ts=TS))

    alpha, gap, d, dt = (jnp.asarray(x) for x in zip(*CASES.values()))
    sol = jax.jit(jax.vmap(run))(alpha, gap, d, dt)
    assert bool(jnp.all(sol.result == cdiff.RESULTS.successful))
    return {name: jax.tree.map(lambda x, i=i: x[i], sol)
            for i, name in enumerate(CASES)}


def _first_in_contact(ts, gap, t_start, t_end):
    """First saved time in [t_start, t_end) from which |gap| < CONTACT up to t_end."""
    ts, gap = np.asarray(ts), np.abs(np.asarray(gap))
    window = (ts >= t_start - 1e-9) & (ts < t_end - 1e-9)
    out = np.flatnonzero(window & (gap >= CONTACT))
    last = out.max() if out.size else np.flatnonzero(window).min() - 1
    return float(ts[last + 1])


def test_fig2_contact_engaged_and_regained_with_alpha_10(capsys):
    """Issue acceptance: from a 1 cm gap, contact within 0.6 s, and again within
    0.6 s after the large sphere moves away at 5 s; the gap decays as
    C0 exp(-alpha t) (eq. 18) meanwhile."""
    sol = _runs()["fig2"]
    gap = sol.holonomic_residual[:, 0]
    engaged = _first_in_contact(sol.ts, gap, 0.0, 5.0)
    regained = _first_in_contact(sol.ts, gap, 5.0, T1) - 5.0
    with capsys.disabled():
        print(f"\nR6 alpha=10: contact engaged at {engaged:.2f} s, regained "
              f"{regained:.2f} s after the displacement (gap {float(gap[501]):.4f} m)")
    assert engaged <= 0.6 and regained <= 0.6
    assert float(jnp.max(jnp.abs(gap[60:500]))) < CONTACT
    assert float(jnp.max(jnp.abs(gap[560:]))) < CONTACT
    # The sphere moves just after t = 5 s (row 500 is still in contact); the first
    # row after it, 5.01 s, has already decayed through most of one step,
    # e^{-alpha dt} = 0.90.
    assert float(jnp.abs(gap[500])) < 3e-15  # measured 6.7e-16 (C0 e^-50 = 2e-24)
    assert float(gap[501]) > 0.8 * np.linalg.norm(RollingSphere.displacement)
    # Eq. 18 over the approach and the re-approach (RK4 on e^{-alpha t}).
    early = TS[:61]
    np.testing.assert_allclose(gap[:61], GAP * jnp.exp(-10.0 * early), atol=1e-8)
    late = TS[501:561] - TS[501]
    np.testing.assert_allclose(gap[501:561], gap[501] * jnp.exp(-10.0 * late),
                               atol=1e-8)


def test_fig3_contact_not_regained_with_alpha_0():
    """Issue acceptance: started in contact, alpha = 0 keeps it until 5 s, and after
    the displacement the gap stays (the velocity constraint only holds dC/dt = 0)."""
    sol = _runs()["fig3"]
    gap = sol.holonomic_residual[:, 0]
    # Round-off until the sphere moves, just after 5 s (measured 1.1e-16).
    assert float(jnp.max(jnp.abs(gap[:501]))) < 5e-16
    after = gap[501:]
    assert float(jnp.min(after)) > 0.9 * np.linalg.norm(RollingSphere.displacement)
    assert float(jnp.max(jnp.abs(after - after[0]))) < 1e-12


@pytest.mark.parametrize("case", ["fig2", "fig3"])
def test_rolling_residual_stays_below_1e_8(case):
    """Issue acceptance: the nonholonomic part of Solution.velocity_residual."""
    sol = _runs()[case]
    # Round-off, far below the 1e-8: measured 2.2e-16 (fig2), 1.8e-16 (fig3).
    assert float(jnp.max(jnp.abs(sol.velocity_residual[:, 1:]))) < 1e-15


def test_in_contact_agrees_with_the_reference(capsys):
    """In contact and undisplaced, NullSpace with RK4 at dt = 0.01 converges to the
    reference at fourth order."""
    ref = _reference()
    err = {}
    for case in ("contact", "contact_dt/2"):
        sol = _runs()[case]
        err[case] = (float(jnp.max(jnp.abs(sol.q[1:] - ref.q))),
                     float(jnp.max(jnp.abs(sol.v[1:] - ref.v))))
    with capsys.disabled():
        print(f"\nR6 in contact vs reference, max |q|, |v| error: dt=0.01 "
              f"{err['contact']}, dt=0.005 {err['contact_dt/2']}")
    assert err["contact"][0] < 2e-6
    assert err["contact"][1] < 1e-5
    assert err["contact"][0] / err["contact_dt/2"][0] > 12
    assert err["contact"][1] / err["contact_dt/2"][1] > 12


def _drift(model, sol, lo, hi, centre=(0.0, 0.0, 0.0)):
    """Max change of (energy, spin, |L| components) over saved rows lo:hi."""
    inv = _invariants(model, sol.q[lo:hi], sol.v[lo:hi], centre)
    d = jnp.max(jnp.abs(inv - inv[0]), axis=0)
    return float(d[0]), float(d[1]), float(jnp.max(d[2:]))


def test_in_contact_conserves_the_invariants():
    """Energy (0.066 J), spin n.omega (-0.21 rad/s) and the angular momentum about
    the contact point (0.02 kg m^2/s) are constant up to RK4's truncation error,
    which falls at fourth order with dt."""
    model = RollingSphere()
    sol = _runs()["contact"]
    energy, spin, L = _drift(model, sol, 0, None)
    assert energy < 1e-8
    assert spin < 5e-6
    assert L < 5e-8
    half = _drift(model, _runs()["contact_dt/2"], 0, None)
    assert energy / half[0] > 12 and spin / half[1] > 12 and L / half[2] > 12
    assert float(jnp.max(jnp.abs(sol.energy - _invariants(model, sol.q, sol.v)[:, 0]))
                 ) < 2e-16  # measured 5.6e-17


def test_fig2_rolls_again_once_in_contact():
    """Once contact is made (from 1 s) and made again (from 6 s), the alpha = 10 run
    is a rolling motion again, on the large sphere where it now is: the invariants
    about its centre (0, then the displacement) are constant to the in-contact
    run's truncation level; they are not across the gaps."""
    model = RollingSphere()
    sol = _runs()["fig2"]
    d = model.displacement
    for lo, hi, centre in ((100, 500, (0.0, 0.0, 0.0)), (600, None, d)):
        energy, spin, L = _drift(model, sol, lo, hi, centre)
        assert energy < 2e-7
        assert spin < 5e-6
        assert L < 5e-8
    energy, spin, L = _drift(model, sol, 0, None, d)
    assert energy > 1e-3 and L > 1e-5  # the approaches do work on the sphere


def test_fig3_keeps_rolling_out_of_contact():
    """With alpha = 0 the sphere rolls on at its new distance after 5 s (the rolling
    rows use the displaced normal): the invariants about the displaced centre
    stay constant."""
    model = RollingSphere()
    energy, spin, L = _drift(model, _runs()["fig3"], 501, None, model.displacement)
    assert energy < 1e-8
    assert spin < 5e-6
    assert L < 5e-8
