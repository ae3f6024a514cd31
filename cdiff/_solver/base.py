"""A diffrax solver wrapper that forwards everything but `step` to the solver it
wraps, and how `simulate` reads what a solver declares it can do."""

from __future__ import annotations

import abc

import diffrax
import equinox as eqx


class AbstractForwardingSolver(diffrax.AbstractWrappedSolver):
    """Wraps `solver` transparently (as diffrax's `HalfSolver` does): its terms,
    interpolation, orders, `init` and `func` are the wrapped solver's; subclasses
    change what a step does. `isinstance` checks see through it (diffrax's
    `AbstractWrappedSolver`)."""

    solver: eqx.AbstractVar[diffrax.AbstractSolver]

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    @property
    def scan_kind(self):
        # diffrax's adjoints look this up on Runge-Kutta solvers (isinstance checks
        # see through the wrapper); `simulate` sets it on the innermost solver.
        return getattr(self.solver, "scan_kind", "lax") or "lax"

    @property
    def root_finder(self):
        # diffrax reads (and, with an adaptive controller, sets through `tree_at`)
        # the root finder's tolerances on any solver that passes its implicit-solver
        # `isinstance` check, which sees through the wrapper.
        return self.solver.root_finder

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    @abc.abstractmethod
    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        """One step of the wrapped solver, changed as the subclass says."""

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


def declares(solver, capability: str) -> bool:
    """Whether `solver`'s class declares `capability` (a class attribute set to
    `True`). cdiff's solvers declare what `simulate` may do with them:

    - `own_loop` ([`cdiff.RK4`][]): the classic RK4 step, which `simulate` may run
      in cdiff's own constant-step loop instead of `diffrax.diffeqsolve`;
    - `integrates_dae` ([`cdiff.BDF`][]): not a diffrax solver; it integrates DAE
      formulations (and ODE ones without per-step data) by its own route, and
      chooses its own steps;
    - `projects_steps` ([`cdiff.Projected`][]): a wrapper whose `projection` maps
      the state after every step of the solver it wraps, which cdiff's event loop
      applies itself.

    A solver from elsewhere (diffrax's) declares none of them."""
    return getattr(type(solver), capability, False) is True


def innermost(solver: diffrax.AbstractSolver) -> diffrax.AbstractSolver:
    """The solver at the bottom of a stack of cdiff/diffrax wrappers."""
    while issubclass(type(solver), diffrax.AbstractWrappedSolver):
        solver = solver.solver
    return solver


def replace_innermost(solver, new):
    """`solver` with the solver at the bottom of its stack of wrappers replaced."""
    if issubclass(type(solver), diffrax.AbstractWrappedSolver):
        return eqx.tree_at(lambda s: s.solver, solver, replace_innermost(solver.solver,
                                                                         new))
    return new
