"""Sketch: the drawing of one configuration of a planar mechanism (for `animate`)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


class Sketch(eqx.Module):
    r"""A planar mechanism at one configuration, as points joined by links.

    A planar model draws itself with a method `sketch(q) -> cdiff.Sketch` (`q` one
    configuration, shape `(nq,)`), written with `jax.numpy` so that
    `jax.vmap(model.sketch)(qs)` draws a whole trajectory at once (the result then
    has `points` of shape `(T, P, 2)`). Optionally, it also has a method
    `scenery() -> list[numpy.ndarray]`: the fixed parts, drawn once (ground pivots,
    a slider's track, a curve a link end must follow), as polylines of shape
    `(K, 2)`; a polyline of one point (`K = 1`) is drawn as a ground pivot.
    [`cdiff.animate`][] draws models that have a `sketch`; the reference models of
    `cdiff.models` all do, except the three-dimensional `RollingSphere`.

    **Attributes:**

    - `points`: the positions of the mechanism's points (joints, link ends, a
      particle), shape `(P, 2)`.
    - `links`: the pairs `(i, j)` of point indices joined by a straight link
      (static). A link drawn from its own body's coordinates has the body's
      length by construction; where two bodies should meet at a joint, each has
      its own end point, so a violated constraint shows as a gap.
    """

    points: Float[Array, "*batch P 2"]
    links: tuple[tuple[int, int], ...] = eqx.field(static=True)

    def __check_init__(self):
        n = self.points.shape[-2]
        for link in self.links:
            if len(link) != 2 or not all(0 <= i < n for i in link):
                raise ValueError(
                    f"Sketch: link {link} is not a pair of indices of the {n} points"
                )


def stack_points(*xy) -> Float[Array, "P 2"]:
    """`(P, 2)` points from `P` pairs of scalars `(x, y)`."""
    return jnp.stack([jnp.stack([x, y]) for x, y in xy])


def pivot(x, y) -> np.ndarray:
    """A ground pivot at `(x, y)` as scenery: a polyline of one point."""
    return np.array([[float(x), float(y)]])


def segment(start, end) -> np.ndarray:
    """The straight polyline from `start` to `end` (pairs of numbers)."""
    return np.array([[float(start[0]), float(start[1])],
                     [float(end[0]), float(end[1])]])


def circle(centre, radius, n: int = 181) -> np.ndarray:
    """A closed polyline of `n` points round a circle."""
    angle = np.linspace(0.0, 2 * np.pi, n)
    return np.stack([float(centre[0]) + float(radius) * np.cos(angle),
                     float(centre[1]) + float(radius) * np.sin(angle)], axis=-1)
