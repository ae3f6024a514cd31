"""The formulation interface and the pieces every formulation shares."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from .._kinematics import Terms
from .._linalg import MassFactor, PseudoInverse, matvec
from .._mass import checked_mass
from .._model import AbstractModel


def check_gains(owner: str, **gains) -> None:
    """Refuse, before tracing, a formulation parameter that is not a real number or
    array, or a concrete one that is negative or not finite (for `__check_init__`;
    traced values are left to the caller). `None` is skipped.

    **Raises:** `TypeError` or `ValueError` naming `owner` and the parameter."""
    for name, x in gains.items():
        if x is None or isinstance(x, jax.core.Tracer):
            continue
        value = None if isinstance(x, (str, bytes)) else np.asarray(x)
        if value is None or value.dtype.kind not in "fiu":
            raise TypeError(f"{owner}: `{name}` must be a real number or array, got "
                            f"{x!r}")
        if not (np.all(np.isfinite(value)) and np.all(value >= 0)):
            raise ValueError(f"{owner}: `{name}` must be finite and non-negative, got "
                             f"{value}")


class Context(eqx.Module):
    """What stays fixed during one solve: the model, the controller, `e0` (the
    energy at the initial state, NaN when the model defines no energy), `aux`,
    whatever the formulation's `prepare` computed from the initial state, and the
    formulation itself (for solver wrappers such as [`cdiff.Projected`][] that map
    the formulation's state).

    `simulate` builds it; a formulation's methods receive it. Build one yourself to
    evaluate a formulation outside a solve, e.g. the dynamics at one state:

    ```py
    f = cdiff.UdwadiaKalaba().bind(model, 0.0, q, v)
    aux = f.prepare(model, 0.0, q, v)
    context = cdiff.Context(model, None, model.energy(0.0, q, v), aux, f)
    y = f.init_state(0.0, q, v, context)
    dyn = f.dynamics(0.0, y, context, f.freeze(0.0, dt, y, context))
    ```

    `throw` says how the run-time checks of the model at the states a solver
    reaches (a mass matrix no longer positive definite, ...) behave: they raise
    (`True`, the default), or they turn the checked values into NaN so that the
    solve ends with `RESULTS.nonfinite` (`simulate(..., throw=False)`).
    """

    model: AbstractModel
    control: Any
    e0: Float[Array, ""]
    aux: Any = None
    formulation: Any = None
    throw: bool = eqx.field(static=True, default=True)


class Dynamics(eqx.Module):
    r"""What a formulation computes at one state.

    - `rate`: the time derivative of the state `y = (q, v)`.
    - `force`: the (ideal) generalized constraint force $Q_c$, shape `(nv,)`, in
      cdiff's sign convention $M\ddot q = Q + Eu + Q_c$.
    - `multipliers`: $\lambda$ with $Q_c = A_v^T\lambda$, one per row of
      $A_v = [A_q; \partial\Phi_v/\partial v]$. Unique only when $A_v$ has full row
      rank (Aghili, Remark 4); otherwise the minimum-norm choice up to round-off
      along the null space of $A_v^T$ (see `multipliers` in [`cdiff.Solution`][]).
    """

    rate: PyTree
    force: Float[Array, " nv"]
    multipliers: Float[Array, " k"]


class AbstractFormulation(eqx.Module):
    r"""Turns a model into a first-order vector field that diffrax can integrate.

    The state is `y = (q, v)`. A formulation implements `dynamics`, which returns
    the state's rate together with the constraint force and multipliers (under
    `jit`, computing only the rate costs nothing more). It may also need
    quantities *frozen* at the start of each step (Braun-Goldfarb's
    $\Delta = \Phi/dt$ terms): it returns them from `freeze`, and cdiff's solver
    wrapper computes them once per step and passes them to every Runge-Kutta
    stage.

    **Declarations** (class attributes a subclass sets):

    - `stepwise`: `True` when `freeze` returns per-step data or `end_step` maps the
      state: the formulation then needs a one-step solver (a multistep method such
      as [`cdiff.BDF`][] cannot provide either). Default `False`.
    - `corrects_energy`: `True` when the formulation holds the energy at its
      initial value (it then needs a conservative model and no controller).
      Default `False`.
    - `freezes_from_terms`: `True` when `freeze` reads only the model's terms at
      the step start, which the first stage's vector field evaluates anyway: its
      `vector_field_and_freeze` then takes both from one evaluation. Default
      `False`.
    - `supports_unilateral`: `True` when the formulation integrates a model with
      unilateral rows: `simulate` appends them to the model's holonomic rows, a
      held row as itself and a row not held as a zero row (fixed shapes under
      `vmap`), and after an impact or a change of the held rows it calls
      `restart`. A formulation that enforces the holonomic rows it is given at
      every state, and tolerates rank-deficient ones (a pseudoinverse, as cdiff's
      own), can set it. Default `False` (a solve of a model with unilateral rows is then refused
      before tracing, naming the formulation).
    - `state_feedback`: `True` when the formulation evaluates a state-feedback
      controller ([`cdiff.control.AbstractStateFeedback`][]) on its own state, as
      [`cdiff.NullSpace`][] does on Yun-Sarkar's $(q, \nu)$. Default `False`.

    **Hooks** (methods with defaults, overridden where a formulation needs them):
    `freeze`, `vector_field_and_freeze`, `dynamics_and_freeze`, `bind`, `prepare`,
    `init_state`, `coordinates`, `project`, `end_step`, `restart`. Only `dynamics`
    must be written; a formulation whose state is not `(q, v)` overrides
    `init_state`, `coordinates` and `project` together.
    """

    stepwise: ClassVar[bool] = False
    freezes_from_terms: ClassVar[bool] = False
    supports_unilateral: ClassVar[bool] = False
    state_feedback: ClassVar[bool] = False

    @property
    def corrects_energy(self) -> bool:
        """Whether the formulation holds the energy at its initial value."""
        return False

    @abc.abstractmethod
    def dynamics(self, t, y, context: Context, frozen: PyTree) -> Dynamics:
        """Rate, constraint force and multipliers at `(t, y)`."""

    def vector_field(self, t, y, context: Context, frozen: PyTree) -> PyTree:
        """The time derivative of the state `y = (q, v)`."""
        return self.dynamics(t, y, context, frozen).rate

    def freeze(self, t0, t1, y0, context: Context) -> PyTree:
        """Per-step quantities evaluated at the start `(t0, y0)` of a step to `t1`."""
        del t0, t1, y0, context
        return None

    def vector_field_and_freeze(self, t, y, context: Context, frozen: PyTree, dt,
                                first) -> tuple[PyTree, PyTree]:
        """The vector field at `(t, y)` with the per-step data of a step of size
        `dt`, `freeze(t, t + dt, y)`, where `first` (traced: the step's first
        stage, at its start) and `frozen` elsewhere; returns it and the per-step
        data used.

        A one-step solver calls this at every stage instead of `freeze` at the
        step start and `vector_field` at the stages, when the formulation sets
        `freezes_from_terms` and the model supplies its own
        [`cdiff.AbstractModel.terms`][] (one evaluation at the first stage then
        serves both). Default: both, computed on their own."""
        frozen = first_stage_freeze(first, self.freeze(t, t + dt, y, context), frozen)
        return self.vector_field(t, y, context, frozen), frozen

    def dynamics_and_freeze(self, t, y, context: Context, frozen: PyTree, dt,
                            first, terms: Terms | None = None
                            ) -> tuple[Dynamics, PyTree]:
        """As `vector_field_and_freeze`, the whole [`cdiff.Dynamics`][] (an event
        solver reads the multipliers of the held rows at a step's first stage, or
        at a state it checks). A formulation that sets `freezes_from_terms`
        computes both from one evaluation of the model's terms, `terms` where the
        caller has them (`context.model.terms(t, q, v)`, which an impact there
        reads too). Default: both, computed on their own."""
        del terms
        frozen = first_stage_freeze(first, self.freeze(t, t + dt, y, context), frozen)
        return self.dynamics(t, y, context, frozen), frozen

    def bind(self, model: AbstractModel, t0, q0, v0) -> "AbstractFormulation":
        """Settle static choices from the initial state, before tracing (called by
        `simulate` outside `jit`, where `q0` may be concrete). Default: `self`."""
        del model, t0, q0, v0
        return self

    # A formulation whose state is not (q, v) overrides the three methods below.

    def prepare(self, model: AbstractModel, t0, q0, v0) -> PyTree:
        """Constants of a solve computed once from the initial state (`context.aux`)."""
        del model, t0, q0, v0
        return None

    def init_state(self, t0, q0, v0, context: Context) -> PyTree:
        """The initial state `y0` from the user's `(q0, v0)`. Default `(q0, v0)`."""
        del t0, context
        return q0, v0

    def coordinates(self, t, y, context: Context):
        """`(q, v)` from a state `y`. Default: `y` itself."""
        del t, context
        return y

    def project(self, t, y, context: Context, projection) -> PyTree:
        """Map the state onto the constraints with a post-step `projection` (see
        [`cdiff.Projected`][]). Default: `(q, v) = projection(model, t, q, v)`."""
        q, v = y
        return projection(context.model, t, q, v, throw=context.throw)

    def end_step(self, t, y, context: Context) -> PyTree:
        """Map the state at the end of every step (e.g. re-orthonormalise a carried
        basis) without changing `(q, v)`. Default: `y`."""
        del t, context
        return y

    def restart(self, t, q, v, context: Context) -> PyTree:
        """The state at `(q, v)` after an event changed the velocity or the rows the
        model holds (an impact; a unilateral row taken or released). Default:
        `(q, v)`."""
        del t, context
        return q, v


def applied_forces(context: Context, t, q, v, terms: Terms | None = None
                   ) -> Float[Array, " nv"]:
    """$Q(t, q, v) + E(t, q)u$, with `u = control(t, q, v)` when a controller is set.
    `terms`: the model's terms at `(t, q, v)`, when already at hand."""
    model = context.model
    if terms is None:
        terms = model.terms(t, q, v)
    f = terms.forces
    if context.control is not None:
        u = jnp.asarray(context.control(t, q, v), q.dtype)
        E = terms.input_matrix
        f = f + (u if E is None else jnp.asarray(E, q.dtype) @ u)
    return f


def first_stage_freeze(first, own: PyTree, frozen: PyTree) -> PyTree:
    """The per-step data a stage uses: `own` (its state's) at the step's first
    stage, `frozen` (the carried one) at the others."""
    if first is True:  # (known before tracing: `frozen` may be None)
        return own
    return jax.tree.map(lambda a, b: jnp.where(first, a, b), own, frozen)


def free_motion(context: Context, t, q, v, terms: Terms | None = None):
    """What every acceleration-level formulation starts from at `(t, q, v)`: the
    Cholesky factor of $M$ (checked), the unconstrained acceleration
    $a = M^{-1}(Q + Eu)$ and the constraint kinematics, all from the model's terms
    at the state (one evaluation, [`cdiff.AbstractModel.terms`][]; `terms`, when
    given, are those at the state already at hand).

    **Returns:** `(mass_factor, a, kinematics)`."""
    if terms is None:
        terms = context.model.terms(t, q, v)
    _, mf = checked_mass(context.model, t, q, terms, throw=context.throw)
    a = mf.solve(applied_forces(context, t, q, v, terms))
    return mf, a, terms.kinematics


def constrained_acceleration(
    mf: MassFactor, A_v, r_v, rtol=None, pinv: PseudoInverse | None = None
) -> tuple[Float[Array, " nv"], Float[Array, " k"], PseudoInverse]:
    r"""The mass-weighted minimum-norm correction $R^{-1}C^+ r$ of the unconstrained
    acceleration, with $C = A_v R^{-1}$ (Braun-Goldfarb eq. 13; for full-rank
    $A_v$ the same as the Schur-complement solution of the KKT system).

    `pinv`, when given, is the factorised pseudoinverse of $C$ already at hand.

    **Returns:** the weighted correction $y = C^+ r = C^T\lambda$ (so that
    $\dot v = a + R^{-1}y$ and the constraint force is $R^Ty = A_v^T\lambda$), the
    multipliers $\lambda$, and the factorised pseudoinverse, reused by callers.
    """
    if pinv is None:
        pinv = PseudoInverse(mf.weight(A_v), rtol)
    lam = pinv.multipliers(r_v)
    return matvec(pinv.C.T, lam), lam, pinv
