"""The result codes of every solve: diffrax's, plus cdiff's own."""

from __future__ import annotations

import diffrax

#: The largest growth a solve may show before it is reported as diverged (the
#: default of `cdiff.simulate(..., divergence=)`).
DIVERGENCE = 1e8


class RESULTS(diffrax.RESULTS):
    """Result codes of [`cdiff.simulate`][] (`Solution.result`): diffrax's, plus
    those of [`cdiff.BDF`][] and the divergence test. Compare them within this
    enumeration (`sol.result == cdiff.RESULTS.successful`); diffrax's own codes
    are promoted to it."""

    step_size_too_small = (
        "cdiff.BDF: the step size fell below the smallest representable step: the "
        "Newton iteration or the error test failed at every step size (a "
        "discontinuity not listed in jump_ts, a singular or inconsistent DAE, or "
        "tolerances below what the floating-point precision allows)."
    )
    singular_configuration = (
        "cdiff.BDF: the DAE reached a singular configuration: the reduction index "
        "matrix A_v M^-1 A_v^T lost rank (Costa-Castello Proposition 1), where the "
        "DAE has no index and does not determine its solution (the multipliers have "
        "a pole); the solution ends at the last step before it. cdiff.Regularized "
        "integrates through such points."
    )
    diverged = (
        "cdiff.simulate: the solution diverged: a saved coordinate, velocity or "
        "constraint residual grew beyond `divergence` times the initial state's "
        "size (or beyond `divergence` where that is below 1). Usually a step above "
        "the integrator's stability limit (take a smaller dt), or constraints that "
        "cannot be met together."
    )
