"""What `cdiff run` simulates, built from its parsed arguments: the case (a
reference model, a shipped MJCF mechanism or a MuJoCo file, with its start,
default horizon and step, and its reference), the formulation and the solver;
and the tables of formulations and projections by command-line name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import cdiff
import cdiff_cli_entry as _entry
from cdiff.models import MJCF_LIBRARY, MODELS

#: Command-line names of the formulations.
FORMULATIONS = {
    "udwadia-kalaba": cdiff.UdwadiaKalaba,
    "lagrange": cdiff.Lagrange,
    "projection": cdiff.Projection,
    "null-space": cdiff.NullSpace,
    "regularized": cdiff.Regularized,
    "ggl": cdiff.GGL,
    "ggl-no-inverse": cdiff.GGL,
    "index-one": cdiff.IndexOne,
}

#: Formulations that are DAEs, integrated by `cdiff.BDF`.
DAE_FORMULATIONS = _entry.DAE_FORMULATIONS

#: Post-step projections (`--projection`), wrapped around RK4 by `cdiff.Projected`.
PROJECTIONS = {
    "newton": cdiff.NewtonProjection(),
    "newton-weighted": cdiff.NewtonProjection(mass_weighted=True),
    "gradient": cdiff.GradientProjection(),
    "gradient-second": cdiff.GradientProjection(partition="second"),
}


def formulation(args, parser):
    """The formulation the options ask for; `parser.error` on options that do not
    belong to it."""
    _entry.check_formulation(args, parser)
    if args.formulation == "regularized":
        return cdiff.Regularized(
            eps=1e-8 if args.eps is None else args.eps,
            h=1e-2 if args.horizon is None else args.horizon,
        )
    if args.formulation == "index-one":
        return cdiff.IndexOne()
    if args.formulation in ("ggl", "ggl-no-inverse"):
        return cdiff.GGL("no_inverse" if args.formulation == "ggl-no-inverse"
                         else "mass")
    if args.formulation == "lagrange":
        alpha = 0.0 if args.alpha is None else args.alpha
        beta = alpha if args.beta is None else args.beta
        return cdiff.Lagrange(alpha=alpha, beta=beta)
    if args.formulation == "projection":
        return cdiff.Projection(inertia=args.inertia or "Mc")
    if args.formulation == "null-space":
        return cdiff.NullSpace(alpha=0.0 if args.alpha is None else args.alpha)
    return cdiff.UdwadiaKalaba(
        constraint_correction=not args.no_constraint_correction,
        energy_correction=args.energy_correction,
    )


def solver(args, release):
    """The solver the options ask for: `cdiff.BDF` (`--rtol`, `--atol`; it steps
    to the jump at `release`, a time or None) for a DAE formulation, RK4 wrapped
    by `cdiff.Projected` for a `--projection`, else None (`cdiff.simulate`'s
    default, RK4)."""
    if args.formulation in DAE_FORMULATIONS:
        rtol = 1e-8 if args.rtol is None else args.rtol
        atol = 1e-8 if args.atol is None else args.atol
        return cdiff.BDF(rtol, atol, jump_ts=release)
    if args.projection is not None:
        return cdiff.Projected(cdiff.RK4(), PROJECTIONS[args.projection])
    return None


class Case(NamedTuple):
    """What `cdiff run` simulates: a model, its start, its default horizon and step,
    and its reference (`reference(ts) -> Reference` and `observable(q)`, or None)."""

    name: str
    model: cdiff.AbstractModel
    q0: np.ndarray
    v0: np.ndarray
    t1: float
    dt: float
    reference: Any
    observable: Any
    observable_names: tuple[str, ...]


def mujoco_case(name: str, path: Path, entry) -> Case:
    """A MuJoCo file (a shipped mechanism when `entry` is given) as a `Case`: from
    its first keyframe or `qpos0`, projected onto the constraints."""
    model = cdiff.models.from_mujoco(path)
    q0, v0 = cdiff.consistent_state(model, *model.initial_state())
    names = qpos_names(model, q0.shape[0])
    if entry is None:
        return Case(name, model, q0, v0, 10.0, 1e-3, None, None, names)
    reference = entry.reference
    return Case(name, model, q0, v0, entry.t1, entry.dt, reference,
                None if reference is None else (lambda q: q), names)


#: The units of the qpos entries of MuJoCo's joint types (free, ball, slide,
#: hinge): positions in metres, angles in radians, quaternions without unit.
_JOINT_UNITS = {0: ("m",) * 3 + ("-",) * 4, 1: ("-",) * 4, 2: ("m",), 3: ("rad",)}


def qpos_names(model, nq: int) -> tuple[str, ...]:
    """`name [unit]` for each coordinate of a MuJoCo model: its joint's name (with
    `[k]` for a ball or free joint's k-th entry; `qpos[i]` for an unnamed joint),
    the unit from the joint's type (no unit where it is not known)."""
    labels = {i: f"qpos[{i}]" for i in range(nq)}
    units: dict[int, str] = {}
    names = getattr(model, "joint_names", ())
    for j, joint in enumerate(getattr(model, "joints", ())):
        size = len(_JOINT_UNITS.get(int(joint.type), ()))
        for k, unit in enumerate(_JOINT_UNITS.get(int(joint.type), ())):
            units[joint.qposadr + k] = unit
            if j < len(names) and names[j]:
                labels[joint.qposadr + k] = names[j] + (f"[{k}]" if size > 1 else "")
    return tuple(labels[i] + (f" [{units[i]}]" if i in units else "")
                 for i in range(nq))


def case(args, parser) -> Case:
    """The model `cdiff run MODEL` names: a reference model, a shipped MJCF
    mechanism or a MuJoCo file; `parser.error` for anything else."""
    _entry.check_model(args, parser, MODELS, MJCF_LIBRARY)
    if args.model in MODELS:
        model = MODELS[args.model](*(() if args.curve is None else (args.curve,)))
        q0, v0 = model.initial_state()
        names = tuple(getattr(model, "observable_names", ()))
        return Case(args.model, model, q0, v0, model.default_t1, model.default_dt,
                    getattr(model, "reference", None),
                    getattr(model, "observable", None), names)
    if args.model in MJCF_LIBRARY:
        entry = MJCF_LIBRARY[args.model]
        return mujoco_case(args.model, entry.path, entry)
    path = Path(args.model)  # (an existing MuJoCo file: check_model says so)
    return mujoco_case(path.stem, path, None)
