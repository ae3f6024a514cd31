"""Fixtures shared by the event tests of this folder."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import wall_reference


@pytest.fixture(scope="session")
def wall_release():
    """`helpers.PendulumAgainstWall()` (l = 1, a = 0.4, e = 0.6) released at rest
    from theta0 = 0.6 rad: its start `q0`, and its first two impacts within 3 s by
    SciPy's event location on the angle ODE (`wall_reference`: rows of the time and
    the angular speed before)."""
    theta0 = 0.6
    q0 = jnp.array([np.sin(theta0), -np.cos(theta0)])
    return q0, wall_reference(theta0, 1.0, 0.4, 0.6, 3.0, 2)
