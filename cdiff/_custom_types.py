"""Array shape aliases used across cdiff (checked at run time in the tests).

`nq` is the number of generalized coordinates, `m` the number of holonomic
constraints, `p` the number of nonholonomic constraints, `k` a generic number of
constraint rows (holonomic, their velocity form and nonholonomic stacked).
"""

from jaxtyping import Array, ArrayLike, Float, Shaped

Scalar = Float[Array, ""]
ScalarLike = Float[ArrayLike, ""] | float | int
Coords = Float[Array, " nq"]
Velocities = Float[Array, " nq"]
MassMatrix = Float[Array, "nq nq"]
Force = Float[Array, " nq"]
HolonomicResidual = Float[Array, " m"]
NonholonomicResidual = Float[Array, " p"]
Rows = Float[Array, " k"]
RowsJac = Float[Array, "k nq"]
Batch = Shaped[Array, "..."]

__all__ = [
    "Array",
    "ArrayLike",
    "Batch",
    "Coords",
    "Force",
    "HolonomicResidual",
    "MassMatrix",
    "NonholonomicResidual",
    "Rows",
    "RowsJac",
    "Scalar",
    "ScalarLike",
    "Velocities",
]
