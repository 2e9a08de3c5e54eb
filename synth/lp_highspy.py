"""The ratio LP solved by HiGHS through ``highspy`` directly, without ``scipy.optimize``.

``scipy.optimize`` runs the same HiGHS solver, but importing it loads all of scipy's optimisers
(about a second on a loaded 2-core machine, against a third of one for ``highspy``): too much
for ``hapc replan``, whose whole budget is a second. The answer is the same point:
:func:`synth.ratios.solve_shares` polishes whatever vertex a backend returns and rounds it to
12 significant digits, so every backend gives the same floats (tests cross-check them).

Used as the ``"highspy"`` backend of :func:`synth.ratios.solve_shares`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def available() -> bool:
    """Whether ``highspy`` (a dependency of cvxpy, usually present) can be used here."""
    try:
        _core()
    except (ImportError, AttributeError):
        return False
    return True


def preferred_backend() -> str:
    """The LP backend a command should use: ``"highspy"`` where it can be imported (the same
    shares as scipy's ``"highs"``, without importing ``scipy.optimize``), else ``"highs"``."""
    return "highspy" if available() else "highs"


def _core() -> Any:
    # The bare binding: ``highspy.Highs()`` prints a banner on stdout before any option can
    # silence it, and a command's stdout belongs to the command.
    from highspy import _core

    return _core


def solve(lp: Any) -> tuple[str, np.ndarray | None, np.ndarray | None]:
    """``lp`` is :data:`synth.ratios._LP` (minimise ``cost @ x`` subject to ``a_ub @ x <= b_ub``,
    ``a_eq @ x == b_eq``, ``lower <= x <= upper``); returns ``(status, x, |dual| of each
    <= row)`` with status ``"optimal"`` or ``"infeasible"``."""
    core = _core()
    a = np.vstack([np.asarray(lp.a_ub, dtype=float).reshape(-1, len(lp.cost)),
                   np.asarray(lp.a_eq, dtype=float).reshape(-1, len(lp.cost))])
    n_ub = len(lp.b_ub)
    inf = core.kHighsInf
    model = core.HighsLp()
    model.num_col_ = len(lp.cost)
    model.num_row_ = a.shape[0]
    model.col_cost_ = np.asarray(lp.cost, dtype=float)
    model.col_lower_ = np.where(np.isfinite(lp.lower), lp.lower, -inf).astype(float)
    model.col_upper_ = np.where(np.isfinite(lp.upper), lp.upper, inf).astype(float)
    model.row_lower_ = np.concatenate([np.full(n_ub, -inf), np.asarray(lp.b_eq, dtype=float)])
    model.row_upper_ = np.concatenate([np.asarray(lp.b_ub, dtype=float), np.asarray(lp.b_eq, dtype=float)])
    rows, cols = np.nonzero(a)
    model.a_matrix_.format_ = core.MatrixFormat.kRowwise
    model.a_matrix_.start_ = np.searchsorted(rows, np.arange(a.shape[0] + 1)).astype(np.int32)
    model.a_matrix_.index_ = cols.astype(np.int32)
    model.a_matrix_.value_ = a[rows, cols]
    highs = core._Highs()
    highs.setOptionValue("output_flag", False)
    if highs.passModel(model) == core.HighsStatus.kError:
        raise RuntimeError("HiGHS rejected the ratio LP")
    highs.run()
    status = highs.getModelStatus()
    if status in (core.HighsModelStatus.kInfeasible, core.HighsModelStatus.kUnboundedOrInfeasible):
        return "infeasible", None, None
    if status != core.HighsModelStatus.kOptimal:
        raise RuntimeError(f"HiGHS failed on the ratio LP: {highs.modelStatusToString(status)}")
    solution = highs.getSolution()
    return "optimal", np.asarray(solution.col_value), np.abs(np.asarray(solution.row_dual)[:n_ub])
