"""SUNDIALS IDA as an independent reference solver for DAEs in the test suite.

`ida_solve` integrates a fully implicit system F(t, y, y') = 0 with IDA (the
variable-order, variable-step BDF code from SUNDIALS) through the
`scikit-sundae` bindings (import name `sksundae`).  It is used to check cdiff's
own BDF DAE solver against code that shares nothing with it, e.g. on the
index-1 (acceleration-level) form of a constrained mechanical system.

`HAVE_IDA` says whether `sksundae` imports.  The `test` extra installs it, so it
is present in CI; tests that need it should still skip cleanly without it::

    pytest.importorskip("sksundae")        # or
    pytestmark = pytest.mark.skipif(not HAVE_IDA, reason="needs scikit-sundae")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

try:
    from sksundae.ida import IDA as _IDA
except ImportError:  # pragma: no cover - exercised only without the test extra
    _IDA = None

HAVE_IDA: bool = _IDA is not None

__all__ = ["HAVE_IDA", "ida_solve"]


def ida_solve(
    residual: Callable[[float, np.ndarray, np.ndarray], np.ndarray],
    t_eval: Sequence[float] | np.ndarray,
    y0: Sequence[float] | np.ndarray,
    yp0: Sequence[float] | np.ndarray,
    *,
    algebraic: Sequence[int],
    rtol: float = 1e-10,
    atol: float | Sequence[float] | np.ndarray = 1e-10,
    calc_initcond: str | None = None,
    max_step: float | None = None,
    max_num_steps: int = 100_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Solve ``residual(t, y, yp) = 0`` with SUNDIALS IDA and sample it at `t_eval`.

    Arguments:
        residual: ``residual(t, y, yp) -> array of shape (n,)``, a plain NumPy
            function (wrap a jitted JAX function with ``np.asarray``).  It gets
            private float64 copies of ``y`` and ``yp``, so it may keep them.
        t_eval: strictly monotone output times; ``t_eval[0]`` is the initial
            time.  Backward integration (decreasing times) works too.
        y0, yp0: state and its time derivative at ``t_eval[0]``, shape (n,).
            Must be consistent (``residual(t0, y0, yp0) == 0``) unless
            `calc_initcond` is given.
        algebraic: indices of the purely algebraic components of ``y`` (those
            whose derivative does not appear in the residual).  Passed to IDA as
            its id vector (``IDASetId``: 0 algebraic, 1 differential).
        rtol: relative tolerance (scalar).  IDA advises 1e-15 <= rtol <= 1e-3.
        atol: absolute tolerance, a scalar or one value per component.
        calc_initcond: ``None`` (default) uses ``y0``/``yp0`` as given;
            ``"yp0"`` makes IDA compute the algebraic components of ``y0`` and
            the derivatives of the differential components from the given
            differential ``y0`` (``IDACalcIC`` with ``IDA_YA_YDP_INIT``; the
            ``yp0`` of algebraic components is left as given); ``"y0"`` computes
            all of ``y0`` from the given ``yp0`` (``IDA_Y_INIT``).
        max_step: largest internal step (``None``: unbounded).
        max_num_steps: most internal steps between two output times (IDA's own
            default of 500 is too small at tight tolerances).

    Returns:
        ``(ts, ys)`` with ``ts`` of shape (len(t_eval),) (equal to `t_eval`) and
        ``ys`` of shape (len(t_eval), n); ``ys[0]`` is the (possibly corrected)
        initial state.

    Raises:
        ImportError: scikit-sundae is not installed.
        ValueError: malformed arguments.
        RuntimeError: IDA failed (its message and status code are included).
            Exceptions raised inside `residual` propagate unchanged.

    Notes:
        Options fixed here: dense direct linear solver with IDA's internal
        finite-difference Jacobian, BDF orders up to 5, output by interpolation
        at each requested time with ``tstop = t_eval[-1]`` so IDA never steps
        past the last output.  scikit-sundae exposes no ``IDASetSuppressAlg``,
        so algebraic components take part in the local error test (SUNDIALS's
        default); that is right for index-1 systems, but index-2/3 forms (e.g.
        position-level constraints with multipliers) are not supported reliably.
    """
    if _IDA is None:
        raise ImportError(
            "ida_solve needs scikit-sundae (pip install scikit-sundae); "
            "it is part of cdiff's `test` extra"
        )

    t_eval = np.asarray(t_eval, dtype=np.float64)
    if t_eval.ndim != 1 or t_eval.size < 1:
        raise ValueError(f"t_eval must be a non-empty 1-D array, got {t_eval.shape}")
    if not np.all(np.isfinite(t_eval)):
        raise ValueError("t_eval must be finite")
    dts = np.diff(t_eval)
    if dts.size and not (np.all(dts > 0) or np.all(dts < 0)):
        raise ValueError("t_eval must be strictly increasing or strictly decreasing")

    y0 = np.array(y0, dtype=np.float64).reshape(-1)
    yp0 = np.array(yp0, dtype=np.float64).reshape(-1)
    n = y0.size
    if n == 0 or yp0.shape != (n,):
        raise ValueError(f"y0, yp0 must have equal length > 0, got {n}, {yp0.size}")

    alg = sorted({int(i) for i in algebraic})
    if any(not 0 <= i < n for i in alg):
        raise ValueError(f"algebraic indices must lie in [0, {n}), got {alg}")

    if calc_initcond not in (None, "y0", "yp0"):
        raise ValueError(
            f"calc_initcond must be None, 'y0' or 'yp0', not {calc_initcond!r}"
        )

    if np.ndim(atol) == 0:
        atol_opt: float | list[float] = float(atol)
    else:
        atol_arr = np.asarray(atol, dtype=np.float64).reshape(-1)
        if atol_arr.shape != (n,):
            raise ValueError(f"atol must be a scalar or have length {n}")
        atol_opt = [float(a) for a in atol_arr]

    def resfn(t, y, yp, res):
        # y, yp share memory with SUNDIALS and are read-only: hand out copies.
        r = np.asarray(residual(t, np.array(y), np.array(yp)), dtype=np.float64)
        if r.shape != (n,):
            raise ValueError(f"residual returned shape {r.shape}, expected ({n},)")
        res[:] = r

    options: dict = {
        "rtol": float(rtol),
        "atol": atol_opt,
        "algebraic_idx": alg,
        "linsolver": "dense",
        "max_num_steps": int(max_num_steps),
    }
    if max_step is not None:
        options["max_step"] = float(max_step)
    if calc_initcond is not None:
        options["calc_initcond"] = calc_initcond
        # IDACalcIC only uses t0 + calc_init_dt for the direction and time scale.
        options["calc_init_dt"] = float(dts[0]) if dts.size else 0.01

    solver = _IDA(resfn, **options)
    init = solver.init_step(float(t_eval[0]), y0, yp0)  # raises if IDACalcIC fails
    if not init.success:
        raise RuntimeError(
            f"IDA initialisation failed: {init.message} (status {init.status})"
        )

    ts = np.empty_like(t_eval)
    ys = np.empty((t_eval.size, n))
    ts[0], ys[0] = t_eval[0], init.y
    tstop = float(t_eval[-1])
    for k in range(1, t_eval.size):
        sol = solver.step(float(t_eval[k]), method="normal", tstop=tstop)
        if not sol.success:
            raise RuntimeError(
                f"IDA failed at t={float(np.ravel(sol.t)[0])} on its way to "
                f"t={t_eval[k]}: {sol.message} (status {sol.status})"
            )
        ts[k], ys[k] = np.ravel(sol.t)[0], sol.y
    return ts, ys
