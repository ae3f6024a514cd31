r"""The DAE approach (Costa-Castello, Grino & Basanez 1998, §3.2): the equations of
motion and the constraints posed together as a semi-explicit DAE
$F(t, x, \dot x) = 0$ and integrated by [`cdiff.BDF`][].

The state $x$ is one flat vector: the coordinates $q$ (`nq`) and velocities $v$
(`nv`; $\dot q = T(q)v$ with the model's `position_rate`) (the *differential*
variables) followed by the formulation's *algebraic* variables
(multipliers, accelerations). cdiff's sign convention holds: the constraint force is
$Q_c = A_v^T\lambda$ with $A_v = [G; \partial\Phi_v/\partial v]$, $G$ the
holonomic Jacobian (the paper's $G = \partial g/\partial y$).
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from .._impact import WithUnilateral, free_rows, unilateral_indices
from .._kinematics import velocity_constraints
from .._linalg import default_rtol
from .._model import AbstractModel
from .._projection import NewtonProjection
from .._results import is_concrete
from .base import (
    AbstractFormulation,
    Context,
    Dynamics,
    applied_forces,

)
from .._mass import checked_mass
from .lagrange import Lagrange


def _independent_rows(model, t0, q0, v0, m: int, name: str):
    """`(kept velocity rows, kept holonomic rows)` of an independent set of rows of
    $A_v$ at the initial state, or None when all rows are independent."""
    _, A = velocity_constraints(model, t0, q0, v0)
    A = np.asarray(A)
    sv = np.linalg.svd(A, compute_uv=False)
    k = A.shape[0]
    rank = int(np.sum(sv > default_rtol(A.dtype) * sv.max(initial=0.0)))
    if rank == k:
        return None
    _, _, pivots = scipy.linalg.qr(A.T, mode="economic", pivoting=True)
    kept = tuple(sorted(int(i) for i in pivots[:rank]))
    dropped = sorted(set(range(k)) - set(kept))
    zero = [i for i in dropped if not np.any(np.abs(A[i]) > 0)]
    warnings.warn(
        f"cdiff.{name}: constraint rows {dropped} (of {k}; rows below {m} are "
        f"holonomic) depend on the others at the initial state (rank {rank})"
        + (f", rows {zero} with a zero gradient" if zero else "")
        + ": redundant constraints, or a start at a kinematic singularity. The DAE "
        "keeps an independent set of rows; Solution.holonomic_residual still "
        "reports every row.",
        stacklevel=2,
    )
    return kept, tuple(i for i in kept if i < m)


def _with_unilateral_rows(model: WithUnilateral, t0, q0, v0, name: str):
    """`_independent_rows` of the model's own rows, with every unilateral row kept,
    in the numbering of the `WithUnilateral`'s rows."""
    m = jax.eval_shape(model.model.holonomic, t0, q0).shape[0]
    rows = _independent_rows(model.model, t0, q0, v0, m, name)
    if rows is None:
        return None
    to_wrapped, unilateral = unilateral_indices(model, t0, q0, v0)
    return (tuple(sorted([to_wrapped[i] for i in rows[0]] + unilateral)),
            tuple(sorted(list(rows[1]) + unilateral)))


class AbstractDAEFormulation(AbstractFormulation):
    r"""A formulation written as a DAE $F(t, x, \dot x) = 0$ for [`cdiff.BDF`][].

    Subclasses name their algebraic variables (`algebraic_sizes`) and implement
    `residual` (splitting the state with `blocks`, and passing constraint rows
    through `kept`), `algebraic_values` and `multipliers`. The rest is shared: the state layout $x = [q, v, z_1, z_2, \dots]$,
    consistent initialisation, the constraint force and multipliers, and the
    singularity monitor.

    **Singular configurations.** Where the reduction index matrix
    $\varphi = A_vM^{-1}A_v^T$ is singular (Costa-Castello Proposition 1: the
    constraint gradients lose rank, or a redundant constraint), the DAE has no
    index (Remark 4) and its multipliers have a pole. A BDF step can jump over such
    a point and continue on one branch, which the DAE does not decide; so
    [`cdiff.BDF`][] locates the minimum of $\sigma_{min}(\varphi^{1/2})$ inside
    every step and stops with `cdiff.RESULTS.singular_configuration`, naming the time and the
    configuration, where it falls below `singular_rtol` times its largest value at
    the initial state (keyword-only argument `singular_rtol`, default 1e-6, i.e.
    a condition number of $\varphi$ above 1e12). Use [`cdiff.Regularized`][] to
    integrate through.
    """

    singular_rtol: float = eqx.field(static=True, default=1e-6, kw_only=True)
    sizes: tuple[int, int, int] | None = eqx.field(
        static=True, default=None, kw_only=True, repr=False
    )
    coordinate_size: int | None = eqx.field(
        static=True, default=None, kw_only=True, repr=False
    )
    # The independent constraint rows kept (velocity-level rows, holonomic rows),
    # or None for all of them; see `bind`.
    rows: tuple[tuple[int, ...], tuple[int, ...]] | None = eqx.field(
        static=True, default=None, kw_only=True, repr=False
    )

    @abc.abstractmethod
    def algebraic_sizes(self, nv: int, m: int, k: int) -> tuple[int, ...]:
        """Sizes of the algebraic blocks after `(q, v)`, from the numbers of
        velocities `nv`, holonomic rows `m` and velocity-level rows `k`."""

    @abc.abstractmethod
    def residual(self, t, x, xdot, context: Context):
        r"""$F(t, x, \dot x)$, shape `(n,)`."""

    @abc.abstractmethod
    def algebraic_values(self, t, q, v, a, lam, context: Context) -> tuple:
        """The algebraic blocks at a consistent state with acceleration `a` and
        multipliers `lam` (for the initialisation)."""

    # -- layout ---------------------------------------------------------------

    def bind(self, model: AbstractModel, t0, q0, v0) -> AbstractDAEFormulation:
        """Size the state from the model, and keep an independent set of constraint
        rows.

        Redundant constraint rows (an overconstrained mechanism, or the
        identically-zero out-of-plane rows of a planar loop written in 3D) leave
        the multipliers undetermined and the DAE's Newton matrix singular. Where
        the initial state is concrete, the rows of $A_v$ that depend on the others
        there (pivoted QR, rank threshold as the pseudoinverse's) are dropped
        from the DAE, with a warning naming them; `Solution.holonomic_residual`
        still reports every row. A rank deficiency that is not redundancy but a
        start at a kinematic singularity is dropped the same way (and named).
        Unilateral rows are always kept (a joint's two limits have parallel
        gradients, but only one holds at a time): while a row is not held, the
        DAE sets its multipliers to zero instead of its zero row."""
        t0 = jnp.asarray(t0, q0.dtype)
        m = jax.eval_shape(model.holonomic, t0, q0).shape[0]
        p = jax.eval_shape(model.nonholonomic, t0, q0, v0).shape[0]
        rows = self.rows
        if rows is None and m + p and is_concrete(model, t0, q0, v0):
            if isinstance(model, WithUnilateral):
                rows = _with_unilateral_rows(model, t0, q0, v0, type(self).__name__)
            else:
                rows = _independent_rows(model, t0, q0, v0, m, type(self).__name__)
        k_kept = m + p if rows is None else len(rows[0])
        m_kept = m if rows is None else len(rows[1])
        return dataclasses.replace(
            self, sizes=(v0.shape[0], m_kept, k_kept), coordinate_size=q0.shape[0],
            rows=rows,
        )

    def kept(self, x, holonomic: bool = False):
        r"""The kept rows of a vector or matrix of constraint rows: all of them, or
        the independent ones `bind` chose when the constraints are redundant
        (`holonomic=True` for rows of $\Phi_q$, else rows of $A_v$). A subclass's
        `residual` passes its constraint rows through it."""
        if self.rows is None:
            return x
        return x[np.asarray(self.rows[1 if holonomic else 0], dtype=int)]

    def free(self, t, q, v, context: Context):
        """`(holonomic, velocity)` masks of the kept rows that are unilateral rows
        not held (zero rows, whose multipliers the DAE sets to zero), or None
        without unilateral rows. A subclass's `residual` replaces those rows'
        equations by their multipliers."""
        masks = free_rows(context.model, t, q, v)
        if masks is None:
            return None
        return self.kept(masks[0], holonomic=True), self.kept(masks[1])

    def blocks(self, x):
        r"""`x` (or $\dot x$) split into `[q, v, z_1, z_2, ...]`, the blocks of
        `algebraic_sizes` after the coordinates and velocities."""
        if self.sizes is None:
            raise ValueError(
                f"{type(self).__name__}: use it through cdiff.simulate(..., "
                "solver=cdiff.BDF()), which sizes its state from the model."
            )
        nq, nv = self.coordinate_size, self.sizes[0]
        sizes = (nq, nv) + self.algebraic_sizes(*self.sizes)
        return jnp.split(x, np.cumsum(sizes)[:-1])

    @property
    def algebraic(self) -> np.ndarray:
        """Static mask of the algebraic components of the state."""
        n_diff = self.coordinate_size + self.sizes[0]
        n_alg = sum(self.algebraic_sizes(*self.sizes))
        return np.concatenate([np.zeros(n_diff, bool), np.ones(n_alg, bool)])

    def coordinates(self, t, y, context: Context):
        q, v, *_ = self.blocks(y)
        return q, v

    # -- initialisation -------------------------------------------------------

    def init_state(self, t0, q0, v0, context: Context):
        return self.consistent(t0, jnp.concatenate(
            [q0, v0, jnp.zeros(sum(self.algebraic_sizes(*self.sizes)), q0.dtype)]
        ), context)[0]

    def consistent(self, t, x, context: Context):
        r"""A consistent state and its derivative from the $(q, v)$ part of `x`:
        $q$ onto $\Phi_q = 0$ and $v$ onto the velocity constraints (mass-weighted
        Newton projection, so a consistent $(q, v)$ is kept as it is), then the
        acceleration and multipliers of the index-1 system (the KKT solve of
        [`cdiff.Lagrange`][]). The algebraic variables' derivatives are set to zero
        (they do not enter the DAE)."""
        q, v = self.coordinates(t, x, context)
        q, v = NewtonProjection(iterations=4, mass_weighted=True)(context.model, t, q, v)
        dyn = Lagrange().dynamics(t, (q, v), context, None)
        a = dyn.rate[1]
        lam = dyn.multipliers
        if self.rows is not None:  # the same force on the kept (independent) rows
            _, A_v = velocity_constraints(context.model, t, q, v)
            A = self.kept(A_v)
            free = self.free(t, q, v, context)
            # (Rows not held are zero rows: their multipliers zero.)
            fill = 0.0 if free is None else jnp.diag(free[1].astype(A.dtype))
            lam = jnp.linalg.solve(A @ A.T + fill, A @ dyn.force)
        blocks = self.algebraic_values(t, q, v, a, lam, context)
        x = jnp.concatenate((q, v) + tuple(blocks))
        zeros = jnp.zeros(x.shape[0] - q.shape[0] - v.shape[0], x.dtype)
        qdot = context.model.position_rate(t, q, v)
        return x, jnp.concatenate([qdot, a, zeros])

    def restart(self, t, q, v, context: Context):
        """The consistent state at `(q, v)` after an event (with the rows held
        from there): [`consistent`][cdiff.AbstractDAEFormulation.consistent]."""
        n = sum(self.algebraic_sizes(*self.sizes))
        return self.consistent(t, jnp.concatenate([q, v, jnp.zeros(n, q.dtype)]),
                               context)[0]

    # -- singular configurations -------------------------------------------------

    def _sigma_min_max(self, t, q, v, context: Context, fill=None):
        """Extreme singular values of the mass-weighted constraint matrix
        $C = A_vR^{-1}$ ($CC^T = A_vM^{-1}A_v^T$, the reduction index matrix), of
        its held rows: unilateral rows not held count as `fill`."""
        terms = context.model.terms(t, q, v)
        _, A_v = terms.velocity_constraints
        C = checked_mass(context.model, t, q, terms,
                         throw=context.throw)[1].weight(self.kept(A_v))
        CC = C @ C.T
        free = self.free(t, q, v, context)
        if free is not None and fill is not None:
            CC = CC + jnp.diag(jnp.where(free[1], fill**2, 0.0))
        ev = jnp.linalg.eigvalsh(CC)
        return jnp.sqrt(jnp.maximum(ev[0], 0.0)), jnp.sqrt(jnp.maximum(ev[-1], 0.0))

    def prepare(self, model: AbstractModel, t0, q0, v0):
        """The scale of the reduction index matrix at the initial state: its largest
        singular value, the reference of `monitor`."""
        if self.sizes[2] == 0:
            return None
        if isinstance(model, WithUnilateral):  # the scale with every row held
            model = eqx.tree_at(lambda m: m.active, model, jnp.ones_like(model.active))
        context = Context(model, None, jnp.asarray(jnp.nan, q0.dtype))
        return self._sigma_min_max(t0, q0, v0, context)[1]

    def monitor(self, t, x, context: Context):
        r"""$\sigma_{min}(C)/(	ext{singular\_rtol}\cdot\sigma_{max}(C_0))$: below 1
        where the reduction index matrix $A_vM^{-1}A_v^T$ is singular to
        `singular_rtol` (in singular values of $C$, so its condition number is
        above `singular_rtol`$^{-2}$), relative to its scale at the initial state.
        [`cdiff.BDF`][] stops there with `cdiff.RESULTS.singular_configuration`."""
        q, v = self.coordinates(t, x, context)
        smin, _ = self._sigma_min_max(t, q, v, context, fill=context.aux)
        return smin / (self.singular_rtol * context.aux)

    # -- what the solution reports ---------------------------------------------

    @abc.abstractmethod
    def multipliers(self, x):
        r"""The multipliers $\lambda$ of the velocity-level rows in state `x`."""

    def dynamics(self, t, y, context: Context, frozen) -> Dynamics:
        """Constraint force $A_v^T\\lambda$ and multipliers at state `y` (the DAE has
        no explicit rate: `rate` is `None`)."""
        del frozen
        q, v = self.coordinates(t, y, context)
        _, A_v = velocity_constraints(context.model, t, q, v)
        lam = self.multipliers(y)
        if self.rows is not None:  # dropped rows get no multiplier
            kept = np.asarray(self.rows[0])
            lam = jnp.zeros(A_v.shape[0], lam.dtype).at[kept].set(lam)
        return Dynamics(None, A_v.T @ lam, lam)

    def vector_field(self, t, y, context, frozen):
        raise ValueError(
            f"{type(self).__name__} is a DAE: integrate it with cdiff.BDF "
            "(cdiff.simulate(..., solver=cdiff.BDF()))."
        )


class GGL(AbstractDAEFormulation):
    r"""The Gear-Gupta-Leimkuhler stabilised index-2 formulation (Costa-Castello
    §3.2): the velocity constraints are enforced by the multipliers $\lambda$ of
    the constraint force and the position constraints are reintroduced with a second
    multiplier $\mu$ that projects $\dot q$, so neither drifts.

    - `variant="mass"` (eqs. 15-18), $x = [q, v, \lambda, \mu]$:

        $$\begin{gathered}
        \dot q = T(q)(v + G^T\mu),\quad \dot v = M^{-1}(Q + Eu + A_v^T\lambda),\\
        0 = \Phi_q(t, q),\quad 0 = [\dot\Phi_q; \Phi_v](t, q, v).
        \end{gathered}$$

    - `variant="no_inverse"` (eqs. 19-23), $x = [q, v, w, \lambda, \mu]$: the
      acceleration $w$ becomes an algebraic variable, $\dot v = w$ with
      $0 = -Mw + Q + Eu + A_v^T\lambda$, so $M$ is never inverted (cheaper when $M$
      is large, robust when it is nearly singular).

    Eq. 18 is printed as $0 = G\dot y$; with $\dot y = z + G^T\mu$ that is the usual
    GGL velocity constraint $0 = Gz$ (here $0 = \dot\Phi_q = Gv + \partial_t\Phi_q$),
    which cdiff uses; nonholonomic rows $\Phi_v = 0$ join it. On the exact solution
    $\mu = 0$. The DAE has index 2 where $A_vM^{-1}A_v^T$ is nonsingular; the
    multipliers are algebraic variables, left out of [`cdiff.BDF`][]'s error test.

    ??? cite "References"

        C. W. Gear, B. Leimkuhler, G. K. Gupta, *Automatic integration of
        Euler-Lagrange equations with constraints*, J. Comput. Appl. Math. 12
        (1985). R. Costa-Castello, R. Grino, L. Basanez, *DAE methods in
        constrained robotics system simulation* (1998), eqs. 15-23.
    """

    supports_unilateral: ClassVar[bool] = True

    variant: str = eqx.field(static=True, default="mass")

    def __check_init__(self):
        if self.variant not in ("mass", "no_inverse"):
            raise ValueError(
                f"GGL: variant must be 'mass' (eqs. 15-18) or 'no_inverse' "
                f"(eqs. 19-23), got {self.variant!r}"
            )

    def algebraic_sizes(self, nv, m, k):
        if self.variant == "mass":
            return (k, m)  # lambda, mu
        return (nv, k, m)  # w, lambda, mu

    def algebraic_values(self, t, q, v, a, lam, context):
        m = self.sizes[1]
        mu = jnp.zeros(m, q.dtype)
        return (lam, mu) if self.variant == "mass" else (a, lam, mu)

    def multipliers(self, x):
        return self.blocks(x)[2 if self.variant == "mass" else 3]

    def residual(self, t, x, xdot, context: Context):
        model = context.model
        if self.variant == "mass":
            q, v, lam, mu = self.blocks(x)
        else:
            q, v, w, lam, mu = self.blocks(x)
        qdot, vdot, *_ = self.blocks(xdot)
        # One evaluation of the model's terms; one Jacobian pass: the holonomic
        # rows of A_v are G (= dPhi_q/dq).
        terms = model.terms(t, q, v)
        r_v, A_v = terms.velocity_constraints
        r_v, A_v = self.kept(r_v), self.kept(A_v)
        m = self.sizes[1]
        phi = jnp.asarray(terms.holonomic, q.dtype)
        phi = self.kept(phi, holonomic=True)
        G = A_v[:m]
        free = self.free(t, q, v, context)
        if free is not None:
            phi, r_v = jnp.where(free[0], mu, phi), jnp.where(free[1], lam, r_v)
        f = applied_forces(context, t, q, v, terms) + A_v.T @ lam
        kinematic = qdot - model.position_rate(t, q, v + G.T @ mu)
        if self.variant == "mass":
            mf = checked_mass(model, t, q, terms, throw=context.throw)[1]
            dynamic = [vdot - mf.solve(f)]
        else:
            dynamic = [vdot - w, terms.mass_matrix @ w - f]
        return jnp.concatenate([kinematic, *dynamic, r_v, phi])


class IndexOne(AbstractDAEFormulation):
    r"""The index-1 DAE of the Lagrange formulation: the constraints differentiated
    to acceleration level and kept as algebraic equations (Costa-Castello eqs. 8-12
    before the substitution of eq. 12), $x = [q, v, w, \lambda]$:

    $$\dot q = v,\quad \dot v = w,\quad 0 = Mw - Q - Eu - A_v^T\lambda,\quad
      0 = A_v w - b_v,$$

    with $A_v\ddot q = b_v$ the acceleration-level constraints. It is what SUNDIALS
    IDA solves (index 1); the position and velocity constraints are only kept by
    the initial condition and drift with the integration error (use [`cdiff.GGL`][]
    to keep them).
    """

    supports_unilateral: ClassVar[bool] = True

    def algebraic_sizes(self, nv, m, k):
        return (nv, k)  # w, lambda

    def algebraic_values(self, t, q, v, a, lam, context):
        return (a, lam)

    def multipliers(self, x):
        return self.blocks(x)[3]

    def residual(self, t, x, xdot, context: Context):
        model = context.model
        q, v, w, lam = self.blocks(x)
        qdot, vdot, *_ = self.blocks(xdot)
        terms = model.terms(t, q, v)
        kin = terms.kinematics
        A_v, b_v = self.kept(kin.A_v), self.kept(kin.b_v)
        f = applied_forces(context, t, q, v, terms) + A_v.T @ lam
        acceleration = A_v @ w - b_v
        free = self.free(t, q, v, context)
        if free is not None:
            acceleration = jnp.where(free[1], lam, acceleration)
        return jnp.concatenate([
            qdot - model.position_rate(t, q, v),
            vdot - w,
            terms.mass_matrix @ w - f,
            acceleration,
        ])
