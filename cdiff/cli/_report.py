"""What `cdiff run` reports once the solve is done: the largest errors
(`summary`), the table printed on stdout (`table`, `print_report`), the settings
saved in the npz (`settings`) and the figure's title."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import numpy as np

import cdiff
from cdiff.cli._phases import Phases, wall_time
from cdiff.cli._solve import SetUp, Solved


def summary(setup: SetUp, solved: Solved) -> dict:
    """The largest errors (`errors`), and with impacts, their count, the energy
    they took and the unilateral rows held."""
    data, found = solved.data, solved.impacts
    out = errors(data, setup.n_holonomic, setup.n_nonholonomic, setup.conservative)
    if found is not None:
        out.update(impacts=found["count"],
                   impacts_recorded=found["recorded"],
                   energy_lost_at_impacts=found["energy_lost"],
                   unilateral_rows=int(data["active"].shape[-1]),
                   rows_ever_active=[int(i) for i in np.flatnonzero(
                       np.any(data["active"], axis=0))],
                   rows_active_at_end=[int(i) for i in np.flatnonzero(
                       data["active"][-1])] if solved.ts.size else [])
    return out


def errors(data: dict, n_holonomic: int, n_nonholonomic: int,
           conservative: bool) -> dict:
    """The largest errors over the rows of `data`, as Python floats, `None` where
    one does not apply: no holonomic constraints, no constraints at all, no energy
    (or, for the energy *error*, a model that is not conservative: its energy
    change instead), no reference, or no rows. With impacts
    (`energy_lost_so_far`), the energy error leaves out what they took (the
    model's dissipation); `energy_change` is the whole change."""
    def largest(key, applies=True):
        x = data.get(key)
        if not applies or x is None or x.size == 0:
            return None
        return float(np.max(np.abs(x)))

    energy = data.get("energy")
    change = (None if energy is None or energy.size == 0
              else float(energy[-1] - energy[0]))
    if energy is not None and "energy_lost_so_far" in data:
        # What the impacts took is the model's dissipation: the error is the rest.
        energy = energy + data["energy_lost_so_far"]
    return {
        "max_constraint_error": largest("holonomic_residual", n_holonomic > 0),
        "max_velocity_constraint_error": largest(
            "velocity_residual", n_holonomic + n_nonholonomic > 0),
        "max_energy_error": (None if energy is None or not conservative
                             or energy.size == 0
                             else float(np.max(np.abs(energy - energy[0])))),
        "energy_change": change,
        "max_observable_error": largest("observable_error"),
    }


def table(args, setup: SetUp, solved: Solved, summary: dict,
          names: tuple[str, ...], run_time: float) -> list[tuple[str, str]]:
    """The rows of the printed table, but for the wall time (`print_report` adds
    it before the last row, steps/s)."""
    s, sol, ts = setup, solved.sol, solved.ts
    dt, dt_taken = s.dt, float(sol.dt)
    if s.dae:
        dt_row = (f"adaptive, {int(sol.stats['num_accepted_steps'])} accepted and "
                  f"{int(sol.stats['num_rejected_steps'])} rejected (first {dt:g} s)")
    else:
        asked = "" if math.isclose(dt_taken, dt, rel_tol=1e-6) else f" (asked {dt:g})"
        dt_row = f"{dt_taken:.6g} s{asked}"
    if ts.size == 0:
        na = "n/a (no row before the failure)"
        constraint_row = velocity_row = energy_row = obs_row = na
    else:
        constraint_row = _value(summary["max_constraint_error"], "(|Phi_q|)",
                                "n/a (no holonomic constraints)")
        velocity_row = _value(summary["max_velocity_constraint_error"],
                              "(|[dPhi_q/dt; Phi_v]|)", "n/a (no constraints)")
        energy_row = _value(summary["max_energy_error"], "(|E - E0|, J)" if (
            solved.impacts is None or "energy_lost_so_far" not in solved.data) else
            "(|E - E0 + lost at impacts so far|, J)",
            "n/a (the model defines no energy)")
        obs_row = _value(summary["max_observable_error"],
                         f"({_names_summary(names)})",
                         "n/a (no reference solution)")
    energy_key = "max energy error"
    if s.has_energy and not s.conservative:
        energy_key = "energy change over the run"
        if ts.size:
            energy_row = (f"{summary['energy_change']:.3e} J  (E(t_end) - E0; the "
                          "model is not conservative)")
    name = s.case.name
    rows = [
        ("model", args.model if name == args.model else f"{name} ({args.model})"),
        ("formulation", f"{args.formulation}: {s.formulation}"),
        ("solver", "RK4" if s.solver is None else str(s.solver)),
        ("precision", np.dtype(s.dtype).name),
        ("t0", f"{s.t0:g} s" + ("" if s.t0 == 0 else " (at rest before: the release)")),
        ("t1", f"{s.t1:g} s"),
        ("dt", dt_row),
        ("steps", f"{solved.steps}"),
        ("max constraint error", constraint_row),
        ("max velocity constraint error", velocity_row),
        (energy_key, energy_row),
        ("max observable error", obs_row),
        ("steps/s", f"{solved.steps / run_time:,.0f}  (run only)"),
    ]
    if solved.impacts is not None:
        rows[11:11] = _impact_rows(summary, solved.impacts)
    if sol.message:
        rows.insert(8, ("result", "diverged" if solved.diverged else "stopped early"))
    return rows


def settings(args, setup: SetUp, solved: Solved, summary: dict,
             names: tuple[str, ...], phases: Phases) -> dict:
    """The run's settings, times and errors, saved in the npz (`settings`, JSON);
    `write_data` adds the plotting and the wall time."""
    s, sol = setup, solved.sol
    formulation = s.formulation
    return {
        "model": s.case.name,
        "source": args.model,
        "curve": args.curve,
        "formulation": args.formulation,
        "formulation_repr": repr(formulation),
        "projection": args.projection,
        "alpha": getattr(formulation, "alpha", None),
        "beta": getattr(formulation, "beta", None),
        "constraint_correction": getattr(formulation, "constraint_correction", None),
        "energy_correction": getattr(formulation, "energy_correction", None),
        "t0": s.t0,
        "t1": s.t1,
        "solver": "RK4" if s.solver is None else repr(s.solver),
        "dt_requested": s.dt,
        "dt": float(sol.dt),
        "dtype": np.dtype(s.dtype).name,
        "steps": solved.steps,
        "compile_time_s": phases.times["compile"],
        # Where the compiled solve came from: "disk" (the cache: nothing traced
        # or compiled), "exported" (traced now and stored) or "jit" (not stored).
        "program_source": solved.source,
        "run_time_s": phases.times["run"],
        "reference_time_s": phases.times.get("reference"),
        "result": sol.message,
        "t_diverged": solved.t_diverged if solved.diverged else None,
        "conservative": s.conservative,
        # The errors over the saved rows (those before a failure); null where
        # they do not apply (printed as n/a).
        **summary,
        "observable_names": list(names),
        "cdiff_version": cdiff.__version__,
    }


def figure_title(setup: SetUp, solved: Solved) -> str:
    """The figure's title: the case, the formulation, the step (or BDF's
    tolerance), and where the solve diverged."""
    s = setup
    step = f"BDF rtol={s.solver.rtol:g}" if s.dae else f"dt={float(solved.sol.dt):g}"
    title = f"{s.case.name}, {s.formulation}, {step}"
    if solved.diverged:
        title += f" (diverged at t = {solved.t_diverged:g} s)"
    return title


def print_report(rows: list[tuple[str, str]], written: list[Path], solved: Solved,
                 npz_path: Path, phases: Phases) -> int:
    """The table (with the wall time, the whole command, phase by phase) and the
    files written on stdout; for a solve that failed, `cdiff: error: ...` on
    stderr. Returns the exit status: 1 if the solve failed, else 0."""
    ts, sol = solved.ts, solved.sol
    total, breakdown = wall_time(phases)
    rows[-1:-1] = [("wall time", total)] + [
        ("", line) for line in textwrap.wrap(breakdown, 64)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for path in written:
        print(f"wrote {path}")
    if not ts.size:
        print("wrote nothing: no saved state before the failure")
    if sol.message:
        if solved.diverged:
            what = f"diverged at t = {solved.t_diverged:g} s"
        else:
            what = "stopped early" + (f" after t = {ts[-1]:g} s" if ts.size else "")
        kept = (f"; the {ts.size} saved states before it are in {npz_path}"
                if ts.size else "")
        print(f"cdiff: error: the solve {what}{kept}. {sol.message}",
              file=sys.stderr)
        return 1
    return 0


def _value(x, unit: str, missing: str) -> str:
    """A table entry: `x` in scientific notation with its unit, `missing` for None."""
    return missing if x is None else f"{x:.3e}  {unit}"


def _names_summary(names: tuple[str, ...], most: int = 4) -> str:
    """`names` joined, the first `most` of a long list and a count of the rest."""
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f" and {len(names) - most} more"


def _impact_rows(summary: dict, impacts: dict) -> list[tuple[str, str]]:
    """The table's rows on the impacts and the held unilateral rows."""
    count, recorded = impacts["count"], impacts["recorded"]
    if count == 0:
        hits = "none"
    else:
        lost = ("" if impacts["energy_lost"] is None else
                f"; energy lost at them {impacts['energy_lost']:.3e} J")
        more = (f" (the first {recorded} recorded)" if recorded < count else "")
        hits = f"{count}{more}{lost}"
    held = summary["rows_ever_active"]
    at_end = summary["rows_active_at_end"]
    return [("impacts", hits),
            ("unilateral rows", f"{summary['unilateral_rows']}; held at some saved "
             f"state: {_row_list(held)}; at the end: {_row_list(at_end)}")]


def _row_list(rows: list[int]) -> str:
    return "none" if not rows else ", ".join(map(str, rows))
