r"""The discrete adjoint of cdiff's own loops: `adjoint_scan` is `jax.lax.scan`
whose reverse mode is a reverse scan of the step's VJPs.

JAX differentiates a `scan` by linearizing its body inside a fixpoint over which
carries have tangents; a body that holds a loop of its own (RK4's stage loop,
the event loop of a step with unilateral rows) is then linearized several times
over (issue 34: the RK4 stage 2x2 times), and the reverse program grows with
it. The discrete adjoint linearizes a step once: the forward pass keeps each
step's input $c_k$; the backward pass runs the steps in reverse,

$$\bar c_k = \left(\frac{\partial s}{\partial c}\right)^T\!(c_k, x_k)\,
[\bar c_{k+1}, \bar y_k], \qquad
\bar\theta \mathrel{+}= \left(\frac{\partial s}{\partial \theta}\right)^T\!(c_k,
x_k)\,[\bar c_{k+1}, \bar y_k],$$

each product one `jax.vjp` of the step $s(\theta, c, x) = (c', y)$ at the kept
input (the step recomputed once, as with one checkpoint per step). $\theta$ is
everything the step closes over (the model's and formulation's arrays), hoisted
by `equinox.filter_closure_convert`. The gradients are those of the scan itself
to round-off (the same operations, in another order of summation).

Forward mode (`jax.jvp`, `jax.jacfwd`) is not available through it: the routes
keep the plain `scan` for `adjoint=diffrax.ForwardMode()`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp


def adjoint_scan(step, init, xs):
    """`jax.lax.scan(step, init, xs)`, differentiated in reverse mode by the
    discrete adjoint (see the module's docstring). `xs` must have a leading axis
    (no `length=`)."""
    x0 = jax.tree.map(lambda x: x[0], xs)
    closed = eqx.filter_closure_convert(step, init, x0)
    out = _scan((closed, init, xs))
    # (Integer and boolean outputs carry no tangent: without this, the custom
    # rule's tangents reach primitives that have no differentiation rule.)
    return jax.tree.map(lambda x: x if _inexact(x) else jax.lax.stop_gradient(x),
                        out)


@eqx.filter_custom_vjp
def _scan(operands):
    step, init, xs = operands
    return jax.lax.scan(lambda c, x: step(c, x), init, xs)


@_scan.def_fwd
def _scan_fwd(perturbed, operands):
    del perturbed
    step, init, xs = operands

    def body(c, x):
        c1, y = step(c, x)
        return c1, (y, c)

    final, (ys, inputs) = jax.lax.scan(body, init, xs)
    return (final, ys), inputs


def _inexact(x) -> bool:
    """An inexact array, or its shape and dtype."""
    return (isinstance(x, (jax.Array, jax.ShapeDtypeStruct))
            and jnp.issubdtype(x.dtype, jnp.inexact))


def fill_cotangent(tree, ct):
    """The cotangent `ct` (None where nothing was differentiated, or None as a
    whole) on the inexact arrays of `tree`, zeros where it is None; None on the
    other leaves."""
    leaves, treedef = jax.tree.flatten(tree)
    cts = [None] * len(leaves) if ct is None else treedef.flatten_up_to(ct)
    return jax.tree.unflatten(treedef, [
        (jnp.zeros(x.shape, x.dtype) if g is None else g) if _inexact(x) else None
        for x, g in zip(leaves, cts)])


def _add(a, b):
    return jax.tree.map(lambda a, b: a + b, a, b)


@_scan.def_bwd
def _scan_bwd(inputs, grad_obj, perturbed, operands):
    del perturbed
    step, init, xs = operands
    ct_final, ct_ys = grad_obj
    ys_shape = jax.eval_shape(lambda: _scan.fn(operands)[1])
    ct_final = fill_cotangent(init, ct_final)
    ct_ys = fill_cotangent(ys_shape, ct_ys)
    # (The shapes of the cotangents a step's VJP returns for the closed-over
    # arrays: one accumulator for all steps.)
    ct_step0 = fill_cotangent(step, None)

    def back(carry, slices):
        ct_c, ct_step = carry
        c, x, ct_y = slices
        _, vjp = eqx.filter_vjp(lambda step, c, x: step(c, x), step, c, x)
        d_step, d_c, d_x = vjp((ct_c, ct_y))
        return (fill_cotangent(init, d_c), _add(ct_step, fill_cotangent(step, d_step))), fill_cotangent(x, d_x)

    (ct_init, ct_step), ct_xs = jax.lax.scan(
        back, (ct_final, ct_step0), (inputs, xs, ct_ys), reverse=True)
    return ct_step, ct_init, ct_xs


def replayed(locate, replay, *args):
    """`locate(*args)`, a `_Carry`-like NamedTuple with a `tape` field, whose
    fields `t, y, e0, events` are differentiated in reverse mode as
    `replay(*args, tape)` is (the other fields carry no derivative).

    `locate` is a loop that searches (an event's location: trials, brackets)
    and records on its tape the changes it made to the state; `replay` applies
    those changes again, differentiably. A program that only runs forward
    holds the search alone; the replay is traced only by the backward pass,
    where it is recomputed from `args` and its VJP taken."""
    locate = eqx.filter_closure_convert(locate, *args)
    tape = jax.eval_shape(lambda: locate(*args).tape)
    replay = eqx.filter_closure_convert(replay, *args, tape)
    out = _replayed((locate, replay, args))
    return jax.tree.map(lambda x: x if _inexact(x) else jax.lax.stop_gradient(x),
                        out)


_REPLAYED = ("t", "y", "e0", "events")


@eqx.filter_custom_vjp
def _replayed(operands):
    locate, _, args = operands
    return locate(*args)


@_replayed.def_fwd
def _replayed_fwd(perturbed, operands):
    del perturbed
    out = _replayed.fn(operands)
    return out, out.tape


@_replayed.def_bwd
def _replayed_bwd(tape, grad_obj, perturbed, operands):
    del perturbed
    locate, replay, args = operands
    out_shape = jax.eval_shape(lambda: _replayed.fn(operands))
    ct = fill_cotangent(out_shape, grad_obj)
    ct = tuple(getattr(ct, name) for name in _REPLAYED)
    _, vjp = eqx.filter_vjp(lambda replay, args: replay(*args, tape), replay, args)
    d_replay, d_args = vjp(ct)
    return fill_cotangent(locate, None), fill_cotangent(replay, d_replay), \
        fill_cotangent(args, d_args)
