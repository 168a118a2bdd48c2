"""ArviZ's credible intervals (HDI and ETI) of many elements at once, without importing arviz_stats.

collect and the plots rule need only these two functions of arviz_stats, whose import
(``arviz_stats/__init__`` imports its LOO module, which imports ``scipy.stats`` through
xarray_einstats) is a noticeable part of each of those jobs, both on the sweep's critical path. The
definitions are arviz_stats 1.x's (``arviz_stats/base/core.py``: ``_hdi_linear_nearest_common`` for
``hdi(method="nearest")``, ``eti`` as NumPy's "linear" quantiles) applied to every row at once;
tests/unit/test_diagnostics.py compares both with ``arviz_stats.base.array_stats``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def hdi(rows: np.ndarray, prob: float) -> np.ndarray:
    """Highest density interval of each row's samples: the narrowest interval between two samples
    holding ``floor(prob * n)`` steps of the sorted samples (the first such interval on ties), shaped (row, 2)."""
    _check_prob(prob)
    rows = np.asarray(rows)
    n = rows.shape[-1]
    ordered = np.sort(rows, axis=-1)
    step = min(int(np.floor(prob * n)), n - 1)
    widths = np.subtract(ordered[:, step:], ordered[:, : n - step], dtype=np.float64)
    if widths.shape[-1] == 0:
        raise ValueError("Too few elements for interval calculation.")
    start = np.argmin(widths, axis=-1)[:, None]
    bounds = (np.take_along_axis(ordered, start, -1), np.take_along_axis(ordered, start + step, -1))
    return np.concatenate(bounds, axis=-1, dtype=np.float64)  # float for integer draws too, as arviz_stats


def eti(rows: np.ndarray, prob: float) -> np.ndarray:
    """Equal-tailed interval of each row's samples: its ``(1 - prob) / 2`` and ``(1 + prob) / 2`` quantiles,
    shaped (row, 2)."""
    _check_prob(prob)
    edge = (1 - prob) / 2
    return np.moveaxis(np.quantile(rows, [edge, 1 - edge], axis=-1), 0, -1)


def column_names(kind: str, prob: float) -> list[str]:
    """The columns of `mean_sd_interval`, named as ``arviz_stats.summary`` names them (``eti89_lb``)."""
    prefix = f"{kind}{int(prob * 100)}"  # ArviZ truncates: 0.945 -> 94
    return ["mean", "sd", f"{prefix}_lb", f"{prefix}_ub"]


def mean_sd_interval(rows: np.ndarray, kind: str, prob: float) -> list[np.ndarray]:
    """Each row's mean, sd (``ddof=1``, as ArviZ's) and the bounds of its interval of ``kind`` (`of_kind`)."""
    bounds = of_kind(kind)(rows, prob)
    return [rows.mean(axis=-1), rows.std(axis=-1, ddof=1), bounds[..., 0], bounds[..., 1]]


def of_kind(kind: str) -> Callable[[np.ndarray, float], np.ndarray]:
    """`hdi` or `eti`, as ``summary.ci_kind`` names them."""
    return eti if kind == "eti" else hdi


def _check_prob(prob: float) -> None:
    if not 1 >= prob > 0:
        raise ValueError("The value of `prob` must be in the (0, 1] interval.")
