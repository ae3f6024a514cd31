"""Functions and models for tests/simulate/test_export_cache.py, in a module of their own
so that a fresh process imports the same code under the same name (`main`: what
the second process of test_a_second_process_loads_the_program_and_traces_nothing
does).

Each function counts its traces in an attribute of its own (`fn.traces`): a
global counter would be read by the cache's key (a function's globals are part
of it, by value) and change it at every trace.
"""

from __future__ import annotations

import functools
import json

import equinox as eqx
import jax
import jax.numpy as jnp

import cdiff


class Spring(eqx.Module):
    """A tiny model: an array field and a static one."""

    k: jax.Array
    power: int = eqx.field(static=True)

    def energy(self, x):
        return 0.5 * self.k.astype(x.dtype) * jnp.sum(x**self.power)


def energy(spring, x, *, scale=1.0):
    """An energy and a static output leaf (the size), traced in milliseconds."""
    energy.traces += 1
    return {"energy": spring.energy(x) * scale + OFFSET, "n": x.shape[0]}


energy.traces = 0

#: A global the function reads: part of the key, by value.
OFFSET = 0.0


def checked(x):
    """A program with a host callback (`eqx.error_if` raises from inside it)."""
    checked.traces += 1
    return eqx.error_if(x * 2.0, jnp.any(x < 0), "negative")


checked.traces = 0


def quadratic_loss(params):
    """A loss for `cdiff.studies.tune`."""
    quadratic_loss.traces += 1
    return jnp.sum((params["x"] - 1.0) ** 2)


quadratic_loss.traces = 0


class Pendulum(cdiff.AbstractModel):
    """A particle of mass m on a circle of radius r, under gravity along -y."""

    m: float = 1.0
    r: float = 1.0
    g: float = 9.81

    def mass_matrix(self, t, q):
        return self.m * jnp.eye(2, dtype=q.dtype)

    def forces(self, t, q, v):
        return jnp.array([0.0, -self.m * self.g], dtype=q.dtype)

    def holonomic(self, t, q):
        return jnp.stack([q @ q - self.r**2])

    def energy(self, t, q, v):
        return 0.5 * self.m * v @ v + self.m * self.g * q[1]


def final_state(model, q0, v0, *, t1, dt):
    """The final state and result code of a short solve (the documented recipe:
    `throw=False`, no host callbacks)."""
    final_state.traces += 1
    sol = cdiff.simulate(model, cdiff.UdwadiaKalaba(), q0, v0, t1=t1, dt=dt,
                         saveat=cdiff.SaveAt(t1=True), throw=False)
    return sol.q[-1], sol.v[-1], sol.result


final_state.traces = 0

SOLVE = functools.partial(final_state, t1=0.2, dt=0.01)


def pendulum_arguments():
    return (Pendulum(m=jnp.asarray(1.5)), jnp.array([1.0, 0.0]),
            jnp.array([0.0, 0.0]))


def configure() -> None:
    """The test suite's JAX settings (tests/conftest.py), which are part of the
    key."""
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")


def main(cache: str, source_hash: str) -> None:
    """Call `final_state` through `cdiff.cached_jit` with the cache in `cache`
    (and cdiff's source hash fixed, as the tests fix it); print, as JSON, how
    often it was traced, where its program came from, how many compilations JAX's
    persistent cache answered, and the result."""
    # private on purpose: fixes an internal part of the key, cdiff's source hash
    from cdiff import _export

    _export._process.cdiff_source_hash = lambda: source_hash
    configure()
    cdiff.use_compilation_cache(cache)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event)
        if event == "/jax/compilation_cache/cache_hits" else None)
    compiled = cdiff.cached_jit(SOLVE).compile(*pendulum_arguments())
    q, v, result = compiled(*pendulum_arguments())
    print(json.dumps({"traces": final_state.traces, "source": compiled.source,
                      "hits": len(hits), "q": q.tolist(), "v": v.tolist(),
                      "successful": bool(result == cdiff.RESULTS.successful)}))
