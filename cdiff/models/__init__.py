"""Reference mechanisms of the papers (REFERENCE.md), each with its paper's
parameters, `initial_state()`, an exact minimal-coordinate `reference(ts)` and an
`observable(q)` (the quantity its paper compares with the exact solution)."""

from ._reference import Reference as Reference
from ._slider_crank import SliderCrank as SliderCrank

#: Command-line names of the reference models.
MODELS = {
    "slider-crank": SliderCrank,
}
