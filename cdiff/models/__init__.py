"""Reference mechanisms of the papers (REFERENCE.md), each with its paper's
parameters, `initial_state()`, an exact minimal-coordinate `reference(ts)` and an
`observable(q)` (the quantity its paper compares with the exact solution)."""

from ._double_four_bar import DoubleFourBar as DoubleFourBar
from ._particle_on_circle import ParticleOnCircle as ParticleOnCircle
from ._reference import Reference as Reference
from ._slider_crank import SliderCrank as SliderCrank

#: Command-line names of the reference models.
MODELS = {
    "particle-on-circle": ParticleOnCircle,
    "slider-crank": SliderCrank,
    "double-four-bar": DoubleFourBar,
}
