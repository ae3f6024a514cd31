"""Models loaded from MuJoCo (MJCF, URDF, `mujoco.MjSpec`): MJX's rigid-body
dynamics with MuJoCo's equality constraints as exact holonomic constraints.

The modules, each importing only those listed before it:

- `_common`: the import of mujoco and MJX, MuJoCo's enum values, the static
  records of joints and equalities, and `_warn`;
- `_quaternion`: quaternion maths (products, exponential, rotation angles);
- `_terms`: the terms at one state from one MJX pass: MJX's stages, the
  equality constraints' residuals (one batched function for every connect and
  weld, used by the model's `holonomic` and by the terms' rows) and `_MJXTerms`,
  their Jacobians and velocity-product terms as MuJoCo builds `efc_J`;
- `_model`: [`cdiff.models.MuJoCoModel`][] and its API;
- `_load`: [`cdiff.models.from_mujoco`][]: reading MJCF, URDF and `MjSpec`,
  refusing what cdiff cannot represent, warning about what it does not simulate.
"""

from ._load import from_mujoco as from_mujoco
from ._model import MuJoCoModel as MuJoCoModel

# (Read by tests/models/test_mujoco_terms.py.)
from ._terms import _mjx_stages as _mjx_stages
from ._terms import _MJXTerms as _MJXTerms
