"""The shipped MJCF mechanisms over their benchmarks' horizons, measured against
their references and the benchmarks' bars."""

from __future__ import annotations

import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .._formulation.udwadia_kalaba import UdwadiaKalaba
from .._simulate import simulate
from ..models._library import (
    MJCF_LIBRARY,
    andrews_squeezer_reference,
    flyball_governor_energy,
    flyball_governor_reference,
    n_four_bar_b0,
)
from ..models._mujoco import from_mujoco


def acceptance(name: str, formulation=None, *, t1=None, dt=None, outputs=None,
               **simulate_kwargs) -> dict[str, float]:
    r"""Run a shipped mechanism over its benchmark's horizon with
    [`cdiff.simulate`][] and measure it against its reference and the benchmark's
    bar. Long (A02: 20 s of an 81-coordinate model), so not part of the tests.

    What is measured, by mechanism:

    - `"reduction"` references: `q_error`, `v_error`, the largest
      $|q - q_\text{ref}|$ and $|v - v_\text{ref}|$ over the outputs; for A02
      also `B0_error`, the largest error of B0's position and velocity (MJX's site
      kinematics against the reduction), the benchmark's measure;
    - A03: `q_error`, `v_error` at 0.03 s against the published values, and
      `energy_balance_error`, the largest $|E - E_0 - \tau(\beta - \beta_0)|$;
    - A05: `s_error`, the largest error of the slider height $s$ (the benchmark's
      output), and `energy_error`, the largest $|E - E_\text{ref}|$ against the
      reduction's energy at the same times (the dampers dissipate);
    - every mechanism: `constraint_error` (largest $|\Phi_q|$), and for the
      conservative ones `energy_error` (largest $|E - E_0|$);
    - `passed`: 1.0 or 0.0 against the bar where the benchmark states one
      (A01, A02: 1e-3 on the outputs), else absent;
    - `seconds`: the wall time of the call, compilation included.

    **Arguments:**

    - `name`: a key of `MJCF_LIBRARY`.
    - `formulation`: default `cdiff.UdwadiaKalaba(rtol=entry.pinv_rtol)`.
    - `t1`, `dt`: default the entry's (A02: the benchmark's 20 s).
    - `outputs`: number of output intervals (default: A01 and A02 the benchmark's
      rate, 400 over 20 s and 2 per second; A03 one, at 0.03 s; A05 ten per second,
      the rate of its published reference curve; others 100).
    - `simulate_kwargs`: passed to `cdiff.simulate` (`solver`,
      `stepsize_controller`, ...). A05 with an implicit solver:
      `formulation=cdiff.Lagrange(), solver=cdiff.BDF(rtol=..., atol=...)` (BDF
      takes no formulation with per-step data, such as `UdwadiaKalaba`).

    **Returns:** a dict of floats.
    """
    start = time.perf_counter()
    entry = MJCF_LIBRARY[name]
    if formulation is None:
        formulation = UdwadiaKalaba(rtol=entry.pinv_rtol)
    t1 = entry.t1 if t1 is None else t1
    dt = entry.dt if dt is None else dt
    if outputs is None:
        outputs = {"iftomm-a01-simple-pendulum": max(1, round(2 * t1)),
                   "iftomm-a02-n-four-bar": max(1, round(20 * t1)),
                   "iftomm-a03-andrews-squeezer": 1,
                   "iftomm-a05-flyball-governor": max(1, round(10 * t1))}.get(name, 100)
    model = from_mujoco(entry.path)
    q0, v0 = model.initial_state()
    ts = np.linspace(0.0, t1, outputs + 1)
    sol = simulate(model, formulation, q0, v0, t1=t1, dt=dt,
                   saveat=diffrax.SaveAt(ts=jnp.asarray(ts)), **simulate_kwargs)
    q, v = np.asarray(sol.q), np.asarray(sol.v)
    out = {"constraint_error": float(sol.max_constraint_error)}
    if name == "iftomm-a03-andrews-squeezer":
        ref = andrews_squeezer_reference()
        out["q_error"] = float(np.abs(q[-1] - ref.q[0]).max())
        out["v_error"] = float(np.abs(v[-1] - ref.v[0]).max())
        torque = float(model.mjx_model.actuator_biasprm[0, 0])
        balance = np.asarray(sol.energy) - float(sol.energy[0]) - torque * (
            q[:, 0] - q[0, 0])
        out["energy_balance_error"] = float(np.abs(balance).max())
    elif name == "iftomm-a05-flyball-governor":
        ref = flyball_governor_reference(ts)
        energy_ref = [flyball_governor_energy(*x) for x in zip(ref.q, ref.v)]
        out["energy_error"] = float(np.abs(np.asarray(sol.energy) - energy_ref).max())
        out["s_error"] = float(np.abs(q[:, 1] - np.asarray(ref.q[:, 1])).max())
    else:
        out["energy_error"] = float(sol.max_energy_error)
    if entry.reference_kind == "reduction":
        ref = entry.reference(ts[1:])
        out["q_error"] = float(np.abs(q[1:] - ref.q).max())
        out["v_error"] = float(np.abs(v[1:] - ref.v).max())
    if name == "iftomm-a02-n-four-bar":
        b0 = jax.jit(jax.vmap(lambda q, v: jnp.concatenate([
            model.site_position(q, "B0")[:2], model.site_velocity(q, v, "B0")[:2]])))
        err = np.abs(np.asarray(b0(sol.q[1:], sol.v[1:]))
                     - np.asarray(n_four_bar_b0(ref)))
        out["B0_error"] = float(err.max())
        out["passed"] = float(err.max() <= 1e-3)
    if name == "iftomm-a01-simple-pendulum":
        p1 = np.stack([np.cos(q[1:, 0]), np.sin(q[1:, 0])], -1)
        p1_ref = np.stack([np.cos(ref.q[:, 0]), np.sin(ref.q[:, 0])], -1)
        out["P1_error"] = float(np.abs(p1 - p1_ref).max())
        out["passed"] = float(out["P1_error"] <= 1e-3)
    out["seconds"] = time.perf_counter() - start
    return out
