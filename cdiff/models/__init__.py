"""Reference mechanisms of the papers (R1-R8, `docs/reference-mechanisms.md`), each
with its paper's parameters, `initial_state()`, an independent tight-tolerance
`reference(ts)` and an `observable(q)` (the quantity its paper compares with the
reference); the shipped MJCF mechanisms (`MJCF_LIBRARY`, measured by
`cdiff.studies.acceptance`) and `from_mujoco` for MuJoCo models."""

from ._double_four_bar import DoubleFourBar as DoubleFourBar
from ._library import MJCF_DIR as MJCF_DIR
from ._library import MJCF_LIBRARY as MJCF_LIBRARY
from ._library import MJCFMechanism as MJCFMechanism
from ._library import mjcf_path as mjcf_path
from ._mujoco import MuJoCoModel as MuJoCoModel
from ._mujoco import from_mujoco as from_mujoco
from ._n_four_bar import NFourBar as NFourBar
from ._pendulum_chain import PendulumChain as PendulumChain
from ._particle_on_circle import ParticleOnCircle as ParticleOnCircle
from ._planar_arm_on_curve import PlanarArmOnCurve as PlanarArmOnCurve
from ._reference import MinimalODE as MinimalODE
from ._reference import Reference as Reference
from ._rolling_sphere import RollingSphere as RollingSphere
from ._slider_crank import SliderCrank as SliderCrank
from ._slider_crank_joint import SliderCrankJoint as SliderCrankJoint
from ._snakeboard import Snakeboard as Snakeboard
from ._two_link_on_circle import TwoLinkOnCircle as TwoLinkOnCircle

MODELS = {
    "particle-on-circle": ParticleOnCircle,
    "slider-crank": SliderCrank,
    "slider-crank-joint": SliderCrankJoint,
    "double-four-bar": DoubleFourBar,
    "two-link-on-circle": TwoLinkOnCircle,
    "rolling-sphere": RollingSphere,
    "snakeboard": Snakeboard,
    "planar-arm-on-curve": PlanarArmOnCurve,
}
"""Command-line names of the reference models (`cdiff run NAME`), mapped to their
classes."""

