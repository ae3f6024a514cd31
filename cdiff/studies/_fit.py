"""Gradient-based tuning and identification through `cdiff.simulate`, with optax."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._compiler import compiler_options, tracing_for
from .._export import cached_jit


class Fit(eqx.Module):
    """The result of [`cdiff.studies.tune`][] and [`cdiff.studies.identify`][].

    - `params`: the tuned pytree (the same structure as the one passed in; for
      `identify`, the model with the fitted fields).
    - `history`: the loss before each optimiser step and after the last one,
      shape `(steps + 1,)` (NumPy).
    - `best`: the lowest loss of `history`; `params` are those of the last step.
    """

    params: Any
    history: np.ndarray

    @property
    def best(self) -> float:
        return float(np.nanmin(self.history))


def tune(
    loss: Callable[[Any], jax.Array],
    params,
    optimizer: optax.GradientTransformation | None = None,
    *,
    steps: int = 100,
    trainable: Callable[[Any], Any] | Any = eqx.is_inexact_array,
    progress: bool = True,
) -> Fit:
    """Minimise `loss(params)` by gradient descent with an optax optimiser.

    `params` is any pytree, typically a controller (an `equinox.Module`) whose gains
    are fields; `loss` runs [`cdiff.simulate`][] with it and returns a scalar (for
    example a tracking error). The gradient is taken through the whole simulation
    (reverse mode; see `simulate`'s `adjoint`). One optimiser step is compiled once
    and reused; with [`cdiff.use_compilation_cache`][] on, a later process with the
    same loss, structure of `params` and optimiser loads it instead of tracing and
    compiling it again ([`cdiff.cached_jit`][]; a loss whose program has host
    callbacks, such as `simulate`'s default `throw=True`, is traced and compiled
    by each process).

    **Arguments:**

    - `loss`: `params -> scalar`.
    - `params`: the starting point.
    - `optimizer`: an optax transformation, default `optax.adam(1e-2)`.
    - `steps`: number of optimiser steps.
    - `trainable`: which leaves are optimised, as `equinox.partition`'s
      `filter_spec`: a function of a leaf (`equinox.is_inexact_array` by default:
      every floating-point array) or a pytree of booleans with the structure of
      `params` (or a prefix of it); the other leaves are kept fixed. A controller
      holds its model, whose parameters are floating-point arrays too: to tune
      only some gains, e.g. the PI gains of a
      [`cdiff.control.HybridForceMotion`][] through a closed-loop run on a plant
      that is not its model,

        ```python
        spec = jax.tree.map(lambda _: False, ctrl)
        spec = eqx.tree_at(lambda c: (c.gf, c.gi), spec, (True, True))
        fit = cdiff.studies.tune(loss, ctrl, trainable=spec)
        ```

    - `progress`: show a progress bar with the current loss (tqdm).

    **Returns:** a [`cdiff.studies.Fit`][] with the final `params` and the loss
    history.

    **Raises:** `ValueError` if `params` has no trainable leaves or `steps < 1`;
    `FloatingPointError` if the loss or its gradient becomes non-finite (with the
    step at which it happened).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"cdiff.studies.tune: steps must be a positive int, got {steps!r}")
    params = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, float) else x, params)
    free, fixed = eqx.partition(params, trainable)
    if not jax.tree.leaves(free):
        raise ValueError(
            "cdiff.studies.tune: params has no trainable leaves (floating-point "
            "arrays); pass floats or arrays as the fields to tune"
        )
    # Strongly typed from the start: the optimiser's updates are, and a weakly
    # typed start (a Python float) would compile the step a second time.
    free = jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), free)
    optimizer = optax.adam(1e-2) if optimizer is None else optimizer
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(free)

    # Compiled once; with `cdiff.use_compilation_cache` on, a later process with
    # the same loss, parameters' structure and optimiser loads it (cached_jit).
    def step(free, state):
        value, grads = eqx.filter_value_and_grad(
            lambda f: loss(eqx.combine(f, fixed))
        )(free)
        # optax mixes Python and int32 scalars (e.g. adam's bias correction), which
        # `jax_numpy_dtype_promotion="strict"` would refuse.
        with jax.numpy_dtype_promotion("standard"):
            updates, state = optimizer.update(grads, state, free)
        finite = jnp.isfinite(value) & jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
        )
        return eqx.apply_updates(free, updates), state, value, finite

    step = cached_jit(step, compiler_options=compiler_options())
    history = []
    bar = _progress(steps, progress, "tune")
    try:
        for i in range(steps):
            new_free, new_state, value, finite = step(free, state)
            history.append(float(value))
            if not bool(finite):
                raise FloatingPointError(
                    f"cdiff.studies.tune: the loss or its gradient is not finite at "
                    f"step {i} (loss {float(value)}); lower the learning rate or "
                    "bound the parameters"
                )
            free, state = new_free, new_state
            if bar is not None:
                bar.set_postfix(loss=f"{float(value):.3e}")
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    # The loss at the final parameters, from the compiled step (its update
    # discarded): a closed-loop run would otherwise compile once more for it.
    history.append(float(step(free, state)[2]))
    return Fit(eqx.combine(free, fixed), np.asarray(history))


def identify(
    simulate_observation: Callable[[Any], jax.Array],
    model,
    fields: Sequence[str],
    data,
    optimizer: optax.GradientTransformation | None = None,
    *,
    steps: int = 200,
    progress: bool = True,
) -> Fit:
    r"""Recover fields of `model` (masses, lengths, inertias) from observed data.

    The named `fields` are fitted in log space (so they stay positive, and
    parameters of different scales take steps of the same relative size), the others
    are held fixed. The loss is the mean squared difference between
    `simulate_observation(model)` (the user's simulation, returning what was
    measured, e.g. `model.observable(sol.q)` at the measurement times) and `data`,
    normalised by the data's variance.

    **Arguments:**

    - `simulate_observation`: `model -> array` of the shape of `data`.
    - `model`: the starting guess (a [`cdiff.AbstractModel`][]).
    - `fields`: names of the positive scalar fields to fit.
    - `data`: the measurements.
    - `optimizer`: default `optax.adam(2e-2)` (on the log-parameters).
    - `steps`, `progress`: as in [`cdiff.studies.tune`][].

    **Returns:** a [`cdiff.studies.Fit`][] whose `params` is the fitted model.

    **Raises:** `ValueError` for an unknown or non-positive field, or an observation
    whose shape differs from `data`'s.
    """
    data = jnp.asarray(data)
    for name in fields:
        if not hasattr(model, name):
            raise ValueError(
                f"cdiff.studies.identify: {type(model).__name__} has no field {name!r}"
            )
        value = np.asarray(getattr(model, name))
        if not (value.shape == () and np.isfinite(value) and value > 0):
            raise ValueError(
                f"cdiff.studies.identify: field {name!r} must be a positive scalar to "
                f"be fitted in log space, got {value}"
            )
    with tracing_for(compiler_options()):  # (`step` is compiled with them)
        shape = jax.eval_shape(simulate_observation, model).shape
    if shape != data.shape:
        raise ValueError(
            f"cdiff.studies.identify: simulate_observation(model) has shape {shape}, "
            f"data has shape {data.shape}"
        )

    def with_fields(log_values):
        return eqx.tree_at(
            lambda m: [getattr(m, name) for name in fields],
            model,
            [jnp.exp(x) for x in log_values],
            is_leaf=lambda x: x is None,
        )

    scale = jnp.var(data) + jnp.finfo(data.dtype).tiny

    def loss(log_values):
        residual = simulate_observation(with_fields(log_values)) - data
        return jnp.mean(residual**2) / scale

    start = [jnp.log(jnp.asarray(getattr(model, name), data.dtype)) for name in fields]
    fit = tune(loss, start, optax.adam(2e-2) if optimizer is None else optimizer,
               steps=steps, progress=progress)
    return Fit(with_fields(fit.params), fit.history)


def _progress(total: int, show: bool, what: str):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"cdiff.studies.{what}", leave=False)
