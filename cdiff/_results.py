"""The result codes of every solve: diffrax's, plus cdiff's own."""

from __future__ import annotations


import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

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
    event_limit = (
        "cdiff.simulate: a step of cdiff's RK4 loop needed more than its 64 "
        "sub-steps (events located, impacts and the sub-steps between them): "
        "unilateral rows hit and released over and over within one step "
        "(chattering). Take a smaller dt."
    )
    too_many_events = (
        "cdiff.simulate: the solve had more events (impacts and releases) than "
        "simulate(..., max_events=) allows (default 256), and stopped at the first "
        "one beyond them. Raise max_events for a run with more of them (a solve "
        "with a diffrax solver, an adaptive step, save times or cdiff.BDF runs one "
        "segment per event; cdiff's RK4 loop has no such cap)."
    )
    penetrating_start = (
        "cdiff.simulate: the initial state violates a unilateral row: g(t0, q0) < 0 "
        "beyond round-off (sqrt(eps) times the size of q0). Start on the allowed "
        "side of every row, or at contact (g = 0)."
    )
    bad_restitution = (
        "cdiff.simulate: the model's restitution (a coefficient per unilateral row) "
        "is outside [0, 1] or NaN: e > 1 would gain energy at every impact. It was "
        "traced (inside jit, vmap or grad), so only the run could check it."
    )
    bad_friction = (
        "cdiff.simulate: the model's friction (a Coulomb coefficient per unilateral "
        "row) is negative or not finite. It was traced (inside jit, vmap or grad), "
        "so only the run could check it."
    )
    painleve = (
        "cdiff.simulate: Painleve's paradox: a sliding contact's friction takes "
        "away more of its normal force than the contact is pushed with (1 - d "
        "lambda_N / d p <= 0), so that no normal force is consistent with "
        "Coulomb's law, or several are. The friction coefficient is above this "
        "contact's critical value at the state where the solve stopped (its last "
        "saved row); a smaller one, or a compliant contact, has a solution."
    )
    infeasible_contact = (
        "cdiff.simulate: at an event, the unilateral rows at contact cannot hold "
        "together with the equality constraints and the other held rows: no motion "
        "keeps them all (a row that an equality holds in place while it moves "
        "through, a body squeezed between two rows closing on it). The solve "
        "stops at the step of that event (Solution.stats['events'] has it)."
    )
    inconsistent_constraints = (
        "cdiff.simulate: the holonomic constraints are inconsistent: no "
        "configuration satisfies them all (the solve ended at a nonzero "
        "least-squares minimum of |Phi_q|, see cdiff.analysis.inconsistency). Check "
        "the model's holonomic(t, q) rows and parameters."
    )


# Equinox prints an item as `module.class<message>`, and diffrax's `successful`
# has no message: a successful result printed as `cdiff._results.RESULTS<>`. It
# prints as `cdiff.RESULTS<successful>` (`Solution.message` stays '' on success).
RESULTS.__module__ = "cdiff"
RESULTS._index_to_message[RESULTS.successful._value.item()] = "successful"


def message(result) -> str:
    """The text of a (concrete) result code, '' on success; of a batch of codes,
    the array of their texts as a str."""
    ok = RESULTS.successful._value.item()
    text = np.vectorize(lambda i: "" if i == ok else RESULTS._index_to_message[i],
                        otypes=[object])(np.asarray(result._value))
    return str(text.astype(str)) if text.ndim else str(text.item())


def is_concrete(*xs) -> bool:
    """Whether no array in `xs` is traced: its values are known before tracing, so
    that checks can raise there instead of inside `jit`."""
    leaves = jax.tree.leaves(eqx.filter(xs, eqx.is_array))
    return not any(isinstance(x, jax.core.Tracer) for x in leaves)


def error_if(x, pred, msg: str, *, throw: bool):
    """`eqx.error_if` for a check at a state the solver reached: with `throw` it
    raises (or follows `EQX_ON_ERROR`); without, it turns `x` into NaN so that the
    solve ends with `RESULTS.nonfinite` (`simulate(..., throw=False)`), or with the
    code of the check where the route names it. Under `vmap`, only the members
    whose check fails (equinox's "nan" would turn every member into NaN where one
    fails: it reduces the predicate over the batch)."""
    if throw:
        return eqx.error_if(x, pred, msg)

    def nan(x):
        return jax.tree.map(lambda a: jnp.full_like(a, jnp.nan)
                            if jnp.issubdtype(a.dtype, jnp.inexact) else a, x)

    # (A conditional, as equinox's: under `vmap` a select per member.)
    return jax.lax.cond(jnp.any(pred), nan, lambda x: x, x)
