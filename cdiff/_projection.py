r"""Projections of a state onto the constraint manifold. Two of them:

* [`cdiff.NewtonProjection`][]: Aghili's Newton-Raphson loop
  $q \leftarrow q - A^+\Phi(q)$ (eq. 37), then the velocity onto the velocity
  constraints, with the minimum-norm (or minimum kinetic energy) correction.
* [`cdiff.GradientProjection`][]: Terze's constraint gradient projective method:
  only the *dependent* coordinates are corrected, chosen by the projective
  criterion separately at position and velocity level (Terze §5).

Both take a fixed number of Newton iterations (no convergence test), so that they
`jax.vmap` and differentiate in reverse mode through `lax.fori_loop`.
"""

from __future__ import annotations

import abc
import inspect
import operator
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._kinematics import holonomic_jacobian, velocity_constraints
from ._linalg import MassFactor, PseudoInverse, default_rtol, solve_triangular
from ._mass import checked_mass, mass_factor
from ._model import AbstractModel


class AbstractProjection(eqx.Module):
    r"""Maps a state $(q, v)$ onto the constraints: first $q$ onto $\Phi_q = 0$ by
    `iterations` Newton steps, then $v$ onto $[\dot\Phi_q; \Phi_v] = 0$ at the
    projected $q$ by one step (exact for constraints affine in $v$: holonomic ones
    and Pfaffian nonholonomic ones).

    A subclass says how the linearised constraint $A\,\delta = r$ is solved
    ([`cdiff.AbstractProjection.corrector`][]).

    `throw` (in every method): whether the run-time checks of the model made on
    the way (the mass matrix of a mass-weighted correction) raise, or turn the
    result into NaN (see [`cdiff.Context`][]).
    """

    iterations: eqx.AbstractVar[int]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        corrector = cls.__dict__.get("corrector")
        if corrector is None or getattr(corrector, "__isabstractmethod__", False):
            return
        params = inspect.signature(corrector).parameters
        if "throw" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return
        warnings.warn(
            f"{cls.__name__}.corrector(self, model, t, q, A) takes no keyword "
            "`throw`; cdiff now passes it (whether run-time checks raise). Add "
            "`*, throw: bool = True` to its signature; until then it is called "
            "without.", DeprecationWarning, stacklevel=2)

        def with_throw(self, model, t, q, A, *, throw: bool = True):
            del throw
            return corrector(self, model, t, q, A)

        cls.corrector = with_throw

    @abc.abstractmethod
    def corrector(
        self, model: AbstractModel, t, q, A: Float[Array, "k n"], *, throw: bool = True
    ) -> Callable[[Float[Array, "k n"], Float[Array, " k"]], Float[Array, " n"]]:
        r"""The rule, chosen at `q` with constraint Jacobian `A`, that maps a
        Jacobian $A'$ and a right-hand side $r$ to the correction $\delta$ solving
        $A'\delta = r$ (least squares). It is chosen once per projection and used by
        every Newton iteration (for coordinate partitioning: the same partition)."""

    def position(self, model: AbstractModel, t, q, *, throw: bool = True):
        r"""`q` moved onto the holonomic constraints by `iterations` Newton steps.

        Each step solves $A_q\delta = -\Phi_q$ for a velocity-space correction
        $\delta$ ($A_q$ is the Jacobian with respect to the velocities) and moves
        `q` by `model.integrate_position(q, delta)` ($q + \delta$ unless the
        coordinates hold quaternions)."""
        phi, A = holonomic_jacobian(model, t, q)
        if phi.shape[0] == 0:
            return q
        solve = self.corrector(model, t, q, A, throw=throw)
        return gauss_newton(model, t, q, lambda q, A: solve, self.iterations,
                            first=(phi, A))

    def velocity(self, model: AbstractModel, t, q, v, *, throw: bool = True):
        """`v` moved onto the velocity constraints at `q` (one step)."""
        r, A_v = velocity_constraints(model, t, q, v)
        if r.shape[0] == 0:
            return v
        return v + self.corrector(model, t, q, A_v, throw=throw)(A_v, -r)

    def __call__(self, model: AbstractModel, t, q, v, *, throw: bool = True):
        """`(q, v)` projected: positions first, then velocities at the new `q`."""
        q = self.position(model, t, q, throw=throw)
        return q, self.velocity(model, t, q, v, throw=throw)


def gauss_newton(
    model: AbstractModel, t, q, corrector: Callable, iterations: int, *, tol=None,
    first=None,
):
    r"""`iterations` Gauss-Newton steps on the holonomic constraints: each solves
    $A_q\delta = -\Phi_q$ at the current `q` with `corrector(q, A_q)` (a rule as
    returned by [`cdiff.AbstractProjection.corrector`][]) and moves `q` by
    `model.integrate_position(q, delta)`. A fixed number of steps (`lax.fori_loop`),
    so that it composes with `jax.vmap` and reverse-mode `jax.grad`. With `tol`, a
    step is taken only where $\max|\Phi_q| >$ `tol`, so that a converged `q` stays
    unchanged. `first`: $(\Phi_q, A_q)$ at `q`, when already at hand. Both
    [`cdiff.AbstractProjection.position`][] and `cdiff.consistent_state` iterate
    with it."""

    def step(q, phi, A):
        moved = model.integrate_position(q, corrector(q, A)(A, -phi))
        if tol is None:
            return moved
        return jnp.where(jnp.max(jnp.abs(phi), initial=0.0) > tol, moved, q)

    phi, A = holonomic_jacobian(model, t, q) if first is None else first
    q = step(q, phi, A)
    return jax.lax.fori_loop(
        0, iterations - 1, lambda _, q: step(q, *holonomic_jacobian(model, t, q)), q)


def _check_iterations(iterations) -> None:
    if not (isinstance(iterations, int) and iterations >= 1):
        raise ValueError(f"iterations must be a positive int, got {iterations!r}")


class NewtonProjection(AbstractProjection):
    r"""Aghili's coordinate projection: `iterations` steps of
    $q \leftarrow q - A^+\Phi(q)$ (eq. 37), then $v \leftarrow v - A_v^+ r_v$ with
    $r_v = [\dot\Phi_q; \Phi_v]$ (the minimum-norm velocity correction).

    With `mass_weighted=True` both corrections minimise the kinetic metric instead:
    $\delta = M^{-1}A^T(AM^{-1}A^T)^+ r$, which makes the projection independent of
    the coordinates' units (the unweighted one is not, as Aghili notes for $P$).

    The pseudoinverse is cdiff's smooth one, so the projection stays finite, and
    differentiable, at kinematic singularities and with redundant constraints.

    **Arguments:**

    - `iterations`: number of Newton steps at position level (static, default 3;
      convergence is quadratic from the small drift of one step, Theorem 3).
    - `mass_weighted`: weight the corrections by the mass matrix (default `False`,
      the paper's $A^+$).
    - `rtol`: relative singular-value threshold of the pseudoinverse.
    - `fixed`: indices of velocity coordinates (entries of `v`, one per degree of
      freedom) that the corrections leave unchanged: the constraints are met by
      moving the others (the columns of $A$ of the fixed ones are dropped; with
      `mass_weighted`, the kinetic metric of the free ones). For a hinge or slide
      joint that holds its position too. Default none.

    ??? cite "References"

        F. Aghili, *A unified approach for inverse and direct dynamics of
        constrained multibody systems based on linear projection operator*, IEEE
        Trans. Robotics 21 (2005), §6, eq. 37.
    """

    iterations: int = eqx.field(static=True, default=3)
    mass_weighted: bool = eqx.field(static=True, default=False)
    rtol: float | None = eqx.field(static=True, default=None)
    fixed: tuple[int, ...] = eqx.field(static=True, default=(),
                                       converter=lambda x: _indices(x, "fixed"))

    def __check_init__(self):
        _check_iterations(self.iterations)
        if len(set(self.fixed)) != len(self.fixed) or any(i < 0 for i in self.fixed):
            raise ValueError(f"fixed must hold distinct indices >= 0, got {self.fixed}")

    def corrector(self, model, t, q, A, *, throw: bool = True):
        n = A.shape[1]
        if any(i >= n for i in self.fixed):
            raise ValueError(
                f"fixed = {self.fixed}: the model has {n} velocity coordinates")
        free = jnp.ones(n, A.dtype).at[jnp.asarray(self.fixed, int)].set(0.0)
        if not self.mass_weighted:
            return lambda A, r: PseudoInverse(A * free, self.rtol).solve(r)
        M, mf = checked_mass(model, t, q, throw=throw)
        if self.fixed:  # the metric of the free block: fixed rows and columns -> I
            mf = MassFactor(free[:, None] * M * free[None, :] + jnp.diag(1.0 - free))
        return lambda A, r: mf.unweight(
            PseudoInverse(mf.weight(A * free), self.rtol).solve(r))


def _indices(x, name: str) -> tuple[int, ...]:
    """`x` (an index or a sequence of them) as a tuple of ints, or a ValueError
    naming `name`."""
    try:
        return tuple(operator.index(i) for i in ([x] if np.ndim(x) == 0 else x))
    except TypeError:
        raise ValueError(f"{name} must be an index or a sequence of integer indices, "
                         f"got {x!r}") from None


class GradientProjection(AbstractProjection):
    r"""Terze's constraint gradient projective stabilisation: after each step the
    *dependent* coordinates alone are corrected so that the state returns to the
    constraint manifold, by Newton steps on $\Phi_q(q) = 0$ in $q^d$, then the
    dependent velocities on $A_v v = b_v$ (Terze §5).

    **The projective criterion.** Which coordinates are dependent decides how much
    error the correction moves *along* the manifold (Terze Fig. 1). The best ones
    are those whose direction vectors $\hat g_i$ have the largest relative
    projections on the constraint subspace spanned by the constraint gradients,

    $$d_i = \frac{\|\Pi\hat g_i\|^2}{\|\hat g_i\|^2},$$

    measured in the kinetic metric $M$ (the Riemannian metric of Terze §2,
    `metric="mass"`: $d_i = (A^T(AM^{-1}A^T)^{-1}A)_{ii}/M_{ii}$) or in the
    Euclidean one (`metric="euclidean"`: $d_i = (A^+A)_{ii}$). The dependent set must
    also be *valid* (its columns of $A$ nonsingular), so cdiff picks it greedily:
    the coordinate with the largest $d_i$ first, then, with the constraint
    directions it covers removed, the one with the largest remaining projection,
    and so on (column-pivoted Gram-Schmidt on the constraint subspace; the first
    pick is exactly the criterion above, and every set it returns is valid).
    Holonomic systems get one partition for both levels (the gradients of eqs. 23
    and 24 coincide); with nonholonomic constraints the partition is chosen
    separately from $A_q$ at position level and from $A_v = [A_q; B]$ at velocity
    level (eqs. 23, 26). The partition is re-chosen at every step, from the state
    the integrator produced.

    **Arguments:**

    - `partition`: `"optimal"` (default), or `"second"`: the next-best valid set,
      where the last dependent coordinate picked is the runner-up of the
      criterion (Terze's simulation S4, which uses the second-best independent
      velocity). If the runner-up would make the set invalid, the optimal set is
      used. On the snakeboard (R7) `"optimal"` reproduces Terze's S3 (the
      independent velocity alternates between x and y), but S4's claim does not
      reproduce: at dt = 0.01 `"second"` (which makes theta independent) is as
      accurate as `"optimal"` (max q error 1.7e-5 against 1.9e-5).
    - `metric`: `"mass"` (default) or `"euclidean"`, the metric of the criterion.
    - `iterations`: Newton steps at position level (static, default 3).
    - `rtol`: relative singular-value threshold of the pseudoinverses.

    !!! warning "Kinematic singularities"

        A partition corrects single coordinates; where the constraint Jacobian
        loses rank their columns vanish and the correction is poorly conditioned
        (each singular passage of the joint-coordinate slider-crank R3 leaves an
        energy jump of about 1e-8; over 24 s its error is 6.8e-4 against 1.0e-9
        with [`cdiff.NewtonProjection`][]). Prefer `NewtonProjection` through
        singularities.

    !!! note

        Constraint rows are assumed independent (the dependent set has one
        coordinate per row). With redundant rows the surplus picks carry no
        constraint direction and the dependent correction is the minimum-norm
        one on the chosen set, which still satisfies consistent constraints.

    ??? cite "References"

        Z. Terze, J. Naudet, D. Lefeber, *Constraint gradient projective method
        for stabilized dynamic simulation of constrained multibody systems*,
        ASME DETC 2003, §5, eqs. 21-27.
    """

    partition: str = eqx.field(static=True, default="optimal")  # Partition
    metric: str = eqx.field(static=True, default="mass")  # "mass" | "euclidean"
    iterations: int = eqx.field(static=True, default=3)
    rtol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        _check_iterations(self.iterations)
        if self.partition not in ("optimal", "second"):
            raise ValueError(
                "GradientProjection(partition=...) must be 'optimal' or 'second', got "
                f"{self.partition!r}"
            )
        if self.metric not in ("mass", "euclidean"):
            raise ValueError(
                "GradientProjection(metric=...) must be 'mass' or 'euclidean', got "
                f"{self.metric!r}"
            )

    def projections(self, model: AbstractModel, t, q, A, *, throw: bool = True
                    ) -> Float[Array, "n k"]:
        r"""Rows $y_i$ with $\|y_i\|^2 = d_i$, the relative projection of coordinate
        direction $i$ on the constraint subspace of `A` (in the chosen metric):
        $y_i$ are the components of $\hat g_i/\|\hat g_i\|$ in an orthonormal basis
        of that subspace."""
        if self.metric == "mass":
            mf = mass_factor(model, t, q, throw=throw)  # M = L L^T, so M_ii = |L_i|^2
            C, scale = mf.weight(A), jnp.linalg.norm(mf.L, axis=1)
        else:
            C, scale = A, jnp.ones(A.shape[1], A.dtype)
        # A^T L^{-T} with L L^T = C C^T (damped): orthonormal-basis components.
        chol = PseudoInverse(C, self.rtol).chol
        Y = solve_triangular(chol, A).T
        return Y / scale[:, None]

    def dependent(self, model: AbstractModel, t, q, A, *, throw: bool = True
                  ) -> Int[Array, " k"]:
        """The dependent coordinates for constraint Jacobian `A` at `q`, in the
        order picked (one per row of `A`)."""
        Y = jax.lax.stop_gradient(self.projections(model, t, q, A, throw=throw))
        return self._pick(Y, A.shape[0])

    def _pick(self, Y, k: int) -> Int[Array, " k"]:
        """`dependent` from the relative projections `Y` of `projections`."""
        tol = default_rtol(Y.dtype) if self.rtol is None else self.rtol
        picked = []
        free = jnp.ones(Y.shape[0], bool)
        first = None
        for j in range(k):
            d = jnp.where(free, jnp.sum(Y**2, axis=1), -1.0)
            i = jnp.argmax(d)
            first = d[i] if first is None else first
            if self.partition == "second" and j == k - 1:
                d2 = d.at[i].set(-1.0)
                i2 = jnp.argmax(d2)
                i = jnp.where(d2[i2] > tol * first, i2, i)
            picked.append(i)
            free = free.at[i].set(False)
            u = Y[i] / jnp.maximum(jnp.linalg.norm(Y[i]), jnp.finfo(Y.dtype).tiny)
            Y = Y - jnp.outer(Y @ u, u)
        return jnp.stack(picked)

    def corrector(self, model, t, q, A, *, throw: bool = True):
        Y = jax.lax.stop_gradient(self.projections(model, t, q, A, throw=throw))
        idx = self._pick(Y, A.shape[0])
        # A mass check that failed without `throw` left NaN in Y, which picks
        # *some* partition: the corrections carry the NaN on, so the failure shows.
        poison = jnp.where(jnp.all(jnp.isfinite(Y)), 0.0, jnp.nan).astype(A.dtype)

        def solve(A, r):
            delta = PseudoInverse(A[:, idx], self.rtol).solve(r)
            return jnp.zeros(A.shape[1], A.dtype).at[idx].set(delta) + poison

        return solve
