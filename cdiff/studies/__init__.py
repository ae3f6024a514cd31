"""Studies built on `cdiff.simulate`: batched accuracy studies over step sizes and
stabilisation gains (one `jax.vmap`ped call each), sweeps larger than memory
(`map_batches`: chunked, sharded over the local devices, resumable),
gradient-based tuning of controllers and identification of model parameters
(optax)."""

from ._acceptance import acceptance as acceptance
from ._chunked import map_batches as map_batches
from ._fit import Fit as Fit
from ._fit import identify as identify
from ._fit import tune as tune
from ._gain_sweep import GainSweep as GainSweep
from ._gain_sweep import gain_sweep as gain_sweep
from ._runner import Minimal as Minimal
from ._step_size_study import StepSizeStudy as StepSizeStudy
from ._step_size_study import step_size_study as step_size_study
from ._table import Table as Table
