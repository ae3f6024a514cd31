r"""Post-step projection onto the constraint manifold, as a solver wrapper.

diffrax has no projection hook; as its maintainer suggests (diffrax issue #200), a
wrapper solver calls the inner solver and then changes `y1` with one of the
projections of `cdiff._projection`.
"""

from __future__ import annotations

import diffrax

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
    stale), and the dense output ends at the projected state.

    The projection is an ordinary function of the state (a fixed number of
    iterations), so the solve vmaps and differentiates: reverse mode through
    `diffrax.RecursiveCheckpointAdjoint` sees the projection (diffrax's
    `BacksolveAdjoint` would not).

    **Arguments:**

    - `solver`: the diffrax solver to wrap (e.g. [`cdiff.RK4`][]).
    - `projection`: a [`cdiff.AbstractProjection`][].
    """

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
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, True
        )
        y1 = context.formulation.project(t1, y1, context, self.projection)
        if isinstance(dense_info, dict) and "y1" in dense_info:
            dense_info = dict(dense_info, y1=y1)
        return y1, y_error, dense_info, solver_state, result
