"""The classic fourth-order Runge-Kutta method as a diffrax solver."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import diffrax
import numpy as np
from diffrax._local_interpolation import ThirdOrderHermitePolynomialInterpolation

_rk4_tableau = diffrax.ButcherTableau(
    a_lower=(
        np.array([1 / 2]),
        np.array([0.0, 1 / 2]),
        np.array([0.0, 0.0, 1.0]),
    ),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # Embedded midpoint method (second order): only a rough error estimate.
    b_error=np.array([1 / 6, 1 / 3 - 1, 1 / 3, 1 / 6]),
    c=np.array([1 / 2, 1 / 2, 1.0]),
)


class RK4(diffrax.AbstractERK):
    r"""The classic fourth-order Runge-Kutta method (Kutta, 1901).

    Four stages, not FSAL; the method the papers reproduced by cdiff use with a
    fixed step (diffrax ships none). Use it with a constant step size (the default
    of [`cdiff.simulate`][]). It carries an embedded midpoint method so that
    adaptive controllers accept it, but that error estimate is only second order;
    prefer `diffrax.Tsit5` or `diffrax.Dopri5` for adaptive stepping. Dense output
    is cubic Hermite from the first and last stage, a fourth-order-accurate
    interpolant only at the step ends.
    """

    tableau: ClassVar[diffrax.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[
        Callable[..., ThirdOrderHermitePolynomialInterpolation]
    ] = ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        del terms
        return 4


RK4.__init__.__doc__ = """**Arguments:** None"""
