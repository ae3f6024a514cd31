"""Quaternion maths on JAX arrays (w, x, y, z, as MuJoCo): products, conjugates,
the exponential, rotation angles and vectors, each smooth where MuJoCo's joints
need it (at the identity) so that gradients are finite there too."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _quat_mul(u, v):
    """The quaternion product `u * v` (w, x, y, z; leading axes broadcast)."""
    u0, u1, u2, u3 = _components(u)
    v0, v1, v2, v3 = _components(v)
    return jnp.stack([
        u0 * v0 - u1 * v1 - u2 * v2 - u3 * v3,
        u0 * v1 + u1 * v0 + u2 * v3 - u3 * v2,
        u0 * v2 - u1 * v3 + u2 * v0 + u3 * v1,
        u0 * v3 + u1 * v2 - u2 * v1 + u3 * v0,
    ], axis=-1)


def _components(u):
    """The four components of quaternions `u` along its last axis (static slices,
    which trace far faster than indexing)."""
    return [jax.lax.index_in_dim(u, i, axis=-1, keepdims=False) for i in range(4)]


def _quat_conj(u):
    return u * jnp.array([1.0, -1.0, -1.0, -1.0], dtype=u.dtype)


def _quat_exp(omega):
    r"""$(\cos\tfrac\theta2, \tfrac{\sin(\theta/2)}{\theta}\,\omega)$ with
    $\theta = |\omega|$, smooth at $\omega = 0$ (Taylor branch with a safe square
    root, so that its gradient is finite there too)."""
    theta2 = omega @ omega
    small = theta2 < 1e-4
    theta = jnp.sqrt(jnp.where(small, 1.0, theta2))
    # Series to theta^4: the first neglected terms are below 1e-17 for theta^2 < 1e-4.
    c = jnp.where(small, 1 - theta2 / 8 + theta2**2 / 384, jnp.cos(theta / 2))
    s = jnp.where(small, 0.5 - theta2 / 48 + theta2**2 / 3840,
                  jnp.sin(theta / 2) / theta)
    return jnp.concatenate([c[None], s * omega])


def _rotation_angle_squared(quat):
    r"""$\theta^2$ of the rotation `quat` (unit, either sign), the squared norm of
    MuJoCo's `mju_quat2Vel`, smooth at the identity."""
    s2 = quat[1:] @ quat[1:]
    nonzero = s2 > 0
    s = jnp.sqrt(jnp.where(nonzero, s2, 1.0))
    theta = 2 * jnp.arctan2(s, jnp.abs(quat[0]))
    return jnp.where(nonzero, theta**2, 0.0)


def _vee(omega_hat):
    """The vector of the skew-symmetric part of a 3x3 matrix."""
    a = 0.5 * (omega_hat - omega_hat.T)
    return jnp.stack([a[2, 1], a[0, 2], a[1, 0]])


def _rotation_angle(quat):
    r"""The angle $\theta = 2\,\mathrm{atan2}(\|x\|, |w|) \in [0, \pi]$ of the
    rotations `quat` ($w, x$; any norm; leading axes), as MuJoCo's ball-joint limit
    (`mju_quat2Vel`). Its derivative at $\theta = 0$ (a cone's tip) is taken as
    zero."""
    xyz = quat[..., 1:]
    ss = jnp.sum(xyz * xyz, axis=-1)
    positive = ss > 0
    s = jnp.where(positive, jnp.sqrt(jnp.where(positive, ss, 1.0)), 0.0)
    return 2 * jnp.arctan2(s, jnp.abs(quat[..., 0]))



def _quat_sandwich(a, b):
    r"""The 3x3 matrix $K$ with $K\omega = \operatorname{vec}(a\otimes(0,\omega)
    \otimes b)$."""
    eye = jnp.eye(3, dtype=a.dtype)
    return jax.vmap(lambda w: _quat_mul(_quat_mul(a, jnp.concatenate(
        [jnp.zeros((1,), a.dtype), w])), b)[1:], out_axes=1)(eye)


def _pure(w):
    """The quaternion $(0, w)$."""
    return jnp.concatenate([jnp.zeros((1,), w.dtype), w])


def _rotation_vector(quat):
    r"""The rotation vector $\theta\,u$ of the unit quaternion `quat` (either sign:
    the shorter rotation), as MuJoCo's `mju_quat2Vel` with `dt = 1`; the gradient
    of $\tfrac12\theta^2$ (`_rotation_angle_squared`) with respect to a rotation
    in the quaternion's own frame."""
    quat = quat * jnp.where(quat[0] < 0, -1.0, 1.0)
    s2 = quat[1:] @ quat[1:]
    nonzero = s2 > 0
    s = jnp.sqrt(jnp.where(nonzero, s2, 1.0))
    # theta / sin(theta / 2), and its limit 2 / cos(theta / 2) at theta = 0.
    ratio = jnp.where(nonzero, 2 * jnp.arctan2(s, quat[0]) / s, 2 / quat[0])
    return ratio * quat[1:]
