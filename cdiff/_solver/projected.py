r"""Post-step projection onto the constraint manifold, as a solver wrapper.

diffrax has no projection hook; as its maintainer suggests (diffrax issue #200), a
wrapper solver calls the inner solver and then changes `y1` with one of the
projections of `cdiff._projection`.
"""

from __future__ import annotations

from typing import ClassVar

import diffrax
import jax

from .._formulation.base import Context
from .._projection import AbstractProjection
from .base import AbstractForwardingSolver


class Projected(AbstractForwardingSolver):
    r"""Wraps any diffrax solver so that every step ends on the constraints:
    `y1` is mapped by `projection` ([`cdiff.NewtonProjection`][] or
    [`cdiff.GradientProjection`][]) before it is accepted.

    ```python
    solver = cdiff.Projected(cdiff.RK4(), cdiff.NewtonProjection(iterations=3))
    sol = cdiff.simulate(model, cdiff.Projection(), q0, v0, t1=10.0, dt=1e-3,
                         solver=solver)
    ```

    It works with every formulation: the formulation says how its state is
    projected ([`cdiff.AbstractFormulation.project`][]); for
    [`cdiff.NullSpace`][], whose velocities satisfy the velocity constraints by
    construction, only the positions are projected and $\nu$ is refitted by least
    squares. Use it through [`cdiff.simulate`][] (it reads the model and the
    formulation from the solve's arguments). The inner solver is told that the
    vector field jumped after every step (its first-same-as-last stage would be
    stale), and the dense output (`SaveAt(ts=...)`) ends at the projected state;
    between step ends it is the inner solver's interpolant, off the constraints by
    its interpolation error. With an adaptive step-size controller every attempted
    step is projected; a rejected one is discarded like any other, and the error
    estimate is the inner solver's, of the step before projection.

    The projection is an ordinary function of the state (a fixed number of
    iterations), so the solve vmaps and differentiates: reverse mode through
    `diffrax.RecursiveCheckpointAdjoint` sees the projection (diffrax's
    `BacksolveAdjoint` would not).

    **Arguments:**

    - `solver`: the diffrax solver to wrap (e.g. [`cdiff.RK4`][]).
    - `projection`: a [`cdiff.AbstractProjection`][].

    **Declarations:** `projects_steps = True`: every step of `solver` is followed by
    `projection` (cdiff's event loop, which takes the steps itself, applies it).
    """

    projects_steps: ClassVar[bool] = True
    solver: diffrax.AbstractSolver
    projection: AbstractProjection

    def __check_init__(self):
        if not isinstance(self.solver, diffrax.AbstractSolver):
            raise TypeError(
                "Projected(solver, projection): solver must be a diffrax solver, got "
                f"{type(self.solver).__name__}"
            )
        if not isinstance(self.projection, AbstractProjection):
            raise TypeError(
                "Projected(solver, projection): projection must be e.g. "
                "cdiff.NewtonProjection() or cdiff.GradientProjection(), got "
                f"{type(self.projection).__name__}"
            )

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        context = args[0] if isinstance(args, tuple) and args else None
        if not isinstance(context, Context) or context.formulation is None:
            raise ValueError(
                "cdiff.Projected must be used through cdiff.simulate(..., "
                "solver=cdiff.Projected(...)): it needs the model and formulation."
            )
        y1_free, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, True
        )
        y1 = context.formulation.project(t1, y1_free, context, self.projection)
        if isinstance(dense_info, dict) and "y1" in dense_info:
            dense_info = dict(dense_info, y1=y1)
            k = dense_info.get("k")
            if k is not None and jax.tree.structure(k) == jax.tree.structure(y1):
                # Interpolants that never read y1 (Tsit5's, Dopri8's: y0 plus
                # weights b_i(theta) times the stage increments k_i, with
                # sum_i b_i(theta) = theta) end at the projected state when every
                # increment carries the projection's displacement.
                dense_info["k"] = jax.tree.map(
                    lambda k_, a, b: k_ + (a - b), k, y1, y1_free)
        return y1, y_error, dense_info, solver_state, result
