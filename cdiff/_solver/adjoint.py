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

`adjoint_loop` is the same for a loop whose length is known only at run time
(the changes an event step recorded): the backward pass runs the same count of
steps in reverse.

Forward mode (`jax.jvp`, `jax.jacfwd`) is not available through them: the routes
keep a plain `scan` or `fori_loop` for `adjoint=diffrax.ForwardMode()`.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp


def adjoint_scan(step, init, xs, *, apply=None, choose=None, args=None):
    """`jax.lax.scan(step, init, xs)`, differentiated in reverse mode by the
    discrete adjoint (see the module's docstring). `xs` must have a leading axis
    (no `length=`).

    With `apply`, a step is searched once and differentiated as it is applied:
    `step(c, x)` returns `(c', y, saved)`, and is not differentiated;
    `apply(c, x, saved)` returns the same `(c', y)` (to round-off) by
    differentiable operations. The forward pass keeps `saved` with each step's
    input, and the backward pass takes the VJPs of `apply`: a search (the loop
    that locates an event, say) runs once, and only in the forward pass.

    `apply` may be a tuple of such functions, with `choose(c, x, saved)` the
    index of the one that applies a step (unbatched: under `vmap`, one for the
    whole batch). The backward pass then chooses between their whole VJPs
    (`lax.switch`), rather than differentiating one function that chooses: a
    `lax.cond` inside a differentiated function passes the residuals of every
    branch out of it, zeros for those not taken, at every step.

    Without `args`, the functions are closure-converted (traced ahead of the
    scan, their closed-over arrays hoisted) and those arrays are what the
    backward pass differentiates. With `args` (and `apply`), the functions take
    it first (`step(args, c, x)`, `apply(args, c, x, saved)`, `choose(args, c,
    x, saved)`) and nothing is closure-converted: `args` holds every array they
    differentiate, and they must close over no other traced value (which would
    get no derivative). A scan that is not differentiated then traces `step`
    once and `apply` not at all."""
    if args is None:
        # (Closure-converted: the closed-over arrays become the functions' own
        # arrays, passed as `args`.)
        x0 = jax.tree.map(lambda x: x[0], xs)
        closed = eqx.filter_closure_convert(step, init, x0)
        if apply is None:  # (the step is its own application, nothing saved)
            args = closed
            step, apply = _own_step, _own_apply
        else:
            saved = jax.eval_shape(closed, init, x0)[2]
            branches = apply if isinstance(apply, tuple) else (apply,)
            args = (closed, tuple(eqx.filter_closure_convert(a, init, x0, saved)
                                  for a in branches),
                    (eqx.filter_closure_convert(choose, init, x0, saved)
                     if len(branches) > 1 else None))
            step, choose = _closed_step, _closed_choose
            apply = tuple(functools.partial(_closed_apply, k)
                          for k in range(len(branches)))
    branches = apply if isinstance(apply, tuple) else (apply,)
    out = _applied((step, branches, choose, args, init, xs))
    # (Integer and boolean outputs carry no tangent: without this, the custom
    # rule's tangents reach primitives that have no differentiation rule.)
    return jax.tree.map(lambda x: x if _inexact(x) else jax.lax.stop_gradient(x),
                        out)


def _own_step(step, c, x):
    return (*step(c, x), None)


def _own_apply(step, c, x, saved):
    del saved
    return step(c, x)


def _closed_step(fns, c, x):
    return fns[0](c, x)


def _closed_apply(k, fns, c, x, saved):
    return fns[1][k](c, x, saved)


def _closed_choose(fns, c, x, saved):
    return fns[2](c, x, saved)


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


@eqx.filter_custom_vjp
def _applied(operands):
    step, _, _, args, init, xs = operands
    return jax.lax.scan(lambda c, x: step(args, c, x)[:2], init, xs)


@_applied.def_fwd
def _applied_fwd(perturbed, operands):
    del perturbed
    step, _, _, args, init, xs = operands

    def body(c, x):
        c1, y, saved = step(args, c, x)
        return c1, (y, (c, saved))

    final, (ys, inputs) = jax.lax.scan(body, init, xs)
    return (final, ys), inputs


@_applied.def_bwd
def _applied_bwd(inputs, grad_obj, perturbed, operands):
    del perturbed
    _, apply, choose, args, init, xs = operands
    ct_final, ct_ys = grad_obj
    ct_final = fill_cotangent(init, ct_final)

    def vjp_of(fn):
        def vjp_k(ct_c, ct_y, c, saved, x):
            out, vjp = eqx.filter_vjp(lambda a, c, x: fn(a, c, x, saved), args, c, x)
            d_args, d_c, d_x = vjp((ct_c, fill_cotangent(out[1], ct_y)))
            return (fill_cotangent(args, d_args), fill_cotangent(init, d_c),
                    fill_cotangent(x, d_x))
        return vjp_k

    def back(carry, slices):
        ct_c, ct_args = carry
        (c, saved), x, ct_y = slices
        at = (ct_c, ct_y, c, saved, x)
        if len(apply) == 1:
            d_args, d_c, d_x = vjp_of(apply[0])(*at)
        else:
            d_args, d_c, d_x = jax.lax.switch(choose(args, c, x, saved),
                                              [vjp_of(fn) for fn in apply], *at)
        return (d_c, _add(ct_args, d_args)), d_x

    (ct_init, ct_args), ct_xs = jax.lax.scan(
        back, (ct_final, fill_cotangent(args, None)), (inputs, xs, ct_ys),
        reverse=True)
    return (fill_cotangent(operands[0], None), fill_cotangent(apply, None),
            fill_cotangent(choose, None), ct_args, ct_init, ct_xs)


def adjoint_loop(step, init, xs, count):
    """The carry after `step(c, x)` is applied to the first `count` slices of `xs`
    (`count` traced, at most their number): `jax.lax.fori_loop` over them,
    differentiated in reverse mode by the discrete adjoint (a reverse loop over
    the same `count` of VJPs, each at its kept input). `xs` carry no derivative."""
    x0 = jax.tree.map(lambda x: x[0], xs)
    closed = eqx.filter_closure_convert(step, init, x0)
    out = _loop((closed, init, xs, count))
    return jax.tree.map(lambda x: x if _inexact(x) else jax.lax.stop_gradient(x),
                        out)


def _index(xs, i):
    return jax.tree.map(lambda x: x[i], xs)


@eqx.filter_custom_vjp
def _loop(operands):
    step, init, xs, count = operands
    return jax.lax.fori_loop(0, count, lambda i, c: step(c, _index(xs, i)), init)


@_loop.def_fwd
def _loop_fwd(perturbed, operands):
    del perturbed
    step, init, xs, count = operands
    n = jax.tree.leaves(xs)[0].shape[0]
    inputs = jax.tree.map(lambda c: jnp.zeros((n,) + jnp.shape(c), jnp.result_type(c)),
                          init)

    def body(i, carry):
        c, inputs = carry
        inputs = jax.tree.map(lambda buf, x: buf.at[i].set(x), inputs, c)
        return step(c, _index(xs, i)), inputs

    # The loop keeps the inputs of the `count` steps; the last step's output is
    # taken after it, so that a caller that reads only the VJP (the discrete
    # adjoint's backward pass, `adjoint_scan(..., apply=)`) does not run that step
    # twice: XLA drops the unread output, not a loop iteration.
    last = jnp.maximum(count - 1, 0)
    c, inputs = jax.lax.fori_loop(0, last, body, (init, inputs))
    inputs = jax.tree.map(lambda buf, x: buf.at[last].set(x), inputs, c)
    final = step(c, _index(xs, last))
    final = jax.tree.map(lambda a, b: jnp.where(count > 0, a, b), final, c)
    return final, inputs


@_loop.def_bwd
def _loop_bwd(inputs, ct_final, perturbed, operands):
    del perturbed
    step, init, xs, count = operands
    ct_final = fill_cotangent(init, ct_final)

    def back(j, carry):
        ct_c, ct_fn = carry
        i = count - 1 - j
        _, vjp = eqx.filter_vjp(lambda fn, c: fn(c, _index(xs, i)), step,
                                _index(inputs, i))
        d_fn, d_c = vjp(ct_c)
        return fill_cotangent(init, d_c), _add(ct_fn, fill_cotangent(step, d_fn))

    ct_init, ct_fn = jax.lax.fori_loop(0, count, back,
                                       (ct_final, fill_cotangent(step, None)))
    return ct_fn, ct_init, fill_cotangent(xs, None), None
