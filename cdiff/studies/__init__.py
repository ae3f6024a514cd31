"""Studies built on `cdiff.simulate`: gradient-based tuning of controllers and
identification of model parameters (optax)."""

from ._fit import Fit as Fit
from ._fit import identify as identify
from ._fit import tune as tune
