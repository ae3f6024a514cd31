"""`compute_once`: a function's program re-scheduled so that each distinct
transcendental function in it is evaluated once (XLA's CPU backend recomputes them
in every consumer)."""

from __future__ import annotations

import functools
from typing import no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend import core as jcore
from jax.extend.core import primitives


# Transcendental functions evaluated once per program point. (The tracing machinery
# below is marked no_type_check: it runs hundreds of thousands of times per traced
# program, and a runtime type checker, e.g. jaxtyping's import hook in the tests,
# would wrap every call for nothing: none of it is annotated.)
#
# XLA fuses every consumer of an elementwise operation with the operation itself
# and, for the cheap ones, which for XLA include sin, cos and exp, recomputes it in
# each consumer's loop. A model's sin(theta) enters its constraint residual, the
# Jacobian, the second derivative and, by the chain rule, the derivative rules'
# own cos(theta): in the slider-crank's UdwadiaKalaba vector field 42
# transcendental evaluations at 4 distinct arguments, each a few nanoseconds on
# CPU where a product is a fraction of one. `jax.lax.optimization_barrier` does not
# stop it (XLA's CPU pipeline removes barriers before fusing). A matrix product
# does: XLA leaves it out of fusions, so its operands and result are computed once
# into memory. `compute_once` evaluates a function with its distinct
# transcendentals computed together and passed through an exact product.

_TRANSCENDENTAL = frozenset(
    getattr(primitives, name)
    for name in (
        "sin_p", "cos_p", "tan_p", "asin_p", "acos_p", "atan_p", "atan2_p",
        "sinh_p", "cosh_p", "tanh_p", "asinh_p", "acosh_p", "atanh_p", "exp_p",
        "exp2_p", "expm1_p", "log_p", "log1p_p", "pow_p", "logistic_p", "erf_p",
        "erfc_p", "cbrt_p",
    )
    if hasattr(primitives, name)
)


@no_type_check
def compute_once(fn):
    """`fn` (a function of pytrees of arrays returning arrays) evaluated, on the CPU
    backend, with every distinct transcendental function of its program computed
    once: the same results (they pass through a product by one, exact), fewer
    operations. Elsewhere `fn` itself (on GPUs, recomputing inside one fused kernel
    usually costs less than another kernel and its memory traffic). Composes with `jax.jit`, `jax.vmap`, `jax.jvp` and `jax.grad` (the
    function is traced to a jaxpr and re-evaluated with the transformations'
    tracers)."""

    @functools.wraps(fn)
    def wrapped(*args):
        if jax.default_backend() != "cpu":
            return fn(*args)
        dynamic, static = eqx.partition(args, eqx.is_array)

        def call(dynamic):
            return fn(*eqx.combine(dynamic, static))

        closed, out_shape = jax.make_jaxpr(call, return_shape=True)(dynamic)
        out = _Schedule(closed.jaxpr, closed.consts).run(jax.tree.leaves(dynamic))
        return jax.tree.unflatten(jax.tree.structure(out_shape), out)

    return wrapped


@no_type_check
def _contains_transcendental(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive in _TRANSCENDENTAL:
            return True
        sub = _inlined(eqn)
        if sub is not None and _contains_transcendental(sub.jaxpr):
            return True
    return False


#: Nested `jit`s of more equations than this stay one call (see `_inlined`).
_INLINE_AT_MOST = 1000


@no_type_check
def _inlined(eqn):
    """The closed jaxpr of a nested `jit` to evaluate in line, else None. A large
    one (a loaded model's MJX pass) stays one call: JAX traced it once and reuses
    that trace in every program, while re-evaluating it equation by equation here
    would cost seconds of tracing per vector field and give XLA a copy to compile
    that no other program shares."""
    if (eqn.primitive is primitives.jit_p
            and len(eqn.params["jaxpr"].jaxpr.eqns) <= _INLINE_AT_MOST):
        return eqn.params["jaxpr"]
    return None


@no_type_check
class _Node:
    """One equation with its inputs and outputs resolved to global references."""

    __slots__ = ("eqn", "inputs", "outputs")

    def __init__(self, eqn, inputs, outputs):
        self.eqn, self.inputs, self.outputs = eqn, inputs, outputs


@no_type_check
class _Schedule:
    """A jaxpr flattened (nested `jit`s with transcendentals inlined) and evaluated
    in waves: every equation that can be evaluated is, except the transcendentals,
    which are held back until nothing else can proceed, then evaluated together
    (each distinct one once) and materialised. Common subexpressions are shared."""

    def __init__(self, jaxpr, consts):
        self.nodes: list[_Node] = []
        self.constants: dict = {}
        self.inputs = [("in", i) for i in range(len(jaxpr.invars))]
        bindings = dict(zip(jaxpr.invars, self.inputs))
        self.outputs = self._flatten(jaxpr, consts, bindings)

    def _ref(self, bindings, v):
        if isinstance(v, jcore.Literal):
            return ("literal", v.val)
        return bindings[v]

    def _flatten(self, jaxpr, consts, bindings):
        for v, c in zip(jaxpr.constvars, consts):
            ref = ("const", len(self.constants))
            self.constants[ref] = c
            bindings[v] = ref
        for eqn in jaxpr.eqns:
            inputs = [self._ref(bindings, v) for v in eqn.invars]
            sub = _inlined(eqn)
            if sub is not None and _contains_transcendental(sub.jaxpr):
                inner = dict(zip(sub.jaxpr.invars, inputs))
                results = self._flatten(sub.jaxpr, sub.consts, inner)
                for v, r in zip(eqn.outvars, results):
                    bindings[v] = r
                continue
            outputs = []
            for v in eqn.outvars:
                ref = ("node", len(self.nodes), len(outputs))
                outputs.append(ref)
                bindings[v] = ref
            self.nodes.append(_Node(eqn, inputs, outputs))
        return [self._ref(bindings, v) for v in jaxpr.outvars]

    def run(self, args):
        env = dict(self.constants)
        env.update(zip(self.inputs, args))
        memo: dict = {}

        def read(ref):
            return ref[1] if ref[0] == "literal" else env[ref]

        def key(node, values):
            """The equation's identity for sharing, or None (effects, or parameters
            that cannot be hashed and compared)."""
            if node.eqn.effects:
                return None
            ids = tuple(
                ("literal", repr(r[1])) if r[0] == "literal" else id(x)
                for r, x in zip(node.inputs, values)
            )
            k = (node.eqn.primitive, _hashable(node.eqn.params), ids)
            try:
                k in memo  # noqa: B015 (hashing and comparing may raise)
            except (TypeError, ValueError):
                return None
            return k

        waiting = self.nodes
        while waiting:
            held, later = [], []
            for node in waiting:
                if not all(r[0] == "literal" or r in env for r in node.inputs):
                    later.append(node)
                    continue
                values = [read(r) for r in node.inputs]
                k = key(node, values)
                if k in memo:
                    outs = memo[k]
                elif node.eqn.primitive in _TRANSCENDENTAL and k is not None:
                    held.append((node, values, k))
                    continue
                else:
                    outs = _bind(node.eqn, values)
                    if k is not None:
                        memo[k] = outs
                env.update(zip(node.outputs, outs))
            if not held and len(later) == len(waiting):
                raise RuntimeError("cdiff: compute_once could not order the program")
            distinct = {}
            for node, values, k in held:
                if k not in distinct:
                    distinct[k] = _bind(node.eqn, values)[0]
            for k, value in zip(distinct, _materialise(list(distinct.values()))):
                memo[k] = [value]
            for node, _, k in held:
                env[node.outputs[0]] = memo[k][0]
            waiting = later
        return [read(r) for r in self.outputs]


@no_type_check
def _hashable(x):
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(v) for v in x)
    return x


@no_type_check
def _bind(eqn, values):
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*values, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


@no_type_check
def _materialise(values):
    r"""`values`, each computed once into memory: the floating-point ones of equal
    shape stacked and passed through one batched product, row `i` with a zero row
    appended times $[1, 0]^T$: $x\cdot 1 + 0\cdot 0 = x$ exactly, and no row meets
    another's entries (an inf or NaN stays where it is)."""
    out = list(values)
    groups: dict = {}
    for i, x in enumerate(values):
        if jnp.issubdtype(x.dtype, jnp.floating):
            groups.setdefault((x.shape, x.dtype), []).append(i)
    for (shape, dtype), members in groups.items():
        rows = jnp.stack([jnp.ravel(values[i]) for i in members])  # (k, n)
        padded = jnp.stack([rows, jnp.zeros_like(rows)], axis=1)  # (k, 2, n)
        weights = jnp.broadcast_to(jnp.array([[1, 0]], dtype), (len(members), 1, 2))
        product = jax.lax.dot_general(
            weights, padded, (((2,), (1,)), ((0,), (0,))),
            precision=jax.lax.Precision.HIGHEST,
        )  # (k, 1, n)
        for j, i in enumerate(members):
            out[i] = product[j, 0].reshape(shape)
    return out
