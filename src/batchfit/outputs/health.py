"""A fit's health: the thresholds it must meet (r_hat, ESS, divergences) and, if it misses, why in words."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("batchfit")


# datasets.csv: one row per dataset. The one list of its columns: a new dataset-level diagnostic is a
# column here, a key of `score_health`'s result (in `HEALTH_STATISTICS` if it is a number scored
# there) and, if it comes from the fit's attributes, a line of `fitted_row`.
DATASET_COLUMNS = ["dataset", "path", "rows", "groups", "status", "message", "stage", "structure", "sampler_path",
                   "fallback", "seed", "divergences", "max_r_hat", "min_ess_bulk", "wall_seconds"]
HEALTH_STATISTICS = ("divergences", "max_r_hat", "min_ess_bulk")  # `score_health`'s, by name


class HealthThresholds(Protocol):
    """What makes a fit a warning, checked on which variables; `Config.health` (HealthSettings) satisfies this."""

    max_r_hat: float
    min_ess_bulk: float
    max_divergences: int
    var_names: tuple[str, ...] | None
    filter_vars: str | None
    min_rows: int | None


def score_health(
    r_hat: np.ndarray, ess_bulk: np.ndarray, divergences: int, thresholds: HealthThresholds,
    rows: int | None = None,
) -> dict[str, Any]:
    """Dataset-level health from the r_hat and ess_bulk of its scored elements, its divergence count and its
    number of rows (`health.min_rows`; None: unknown, not checked)."""
    max_r_hat = _nan_reduce(np.nanmax, r_hat)
    min_ess_bulk = _nan_reduce(np.nanmin, ess_bulk)
    reasons = []
    min_rows = getattr(thresholds, "min_rows", None)
    if min_rows is not None and rows is not None and rows < min_rows:
        reasons.append(f"{rows} rows < {min_rows} (health.min_rows)")
    if divergences > thresholds.max_divergences:
        reasons.append(f"{divergences} divergences > {number_text(thresholds.max_divergences)}")
    if max_r_hat > thresholds.max_r_hat:
        reasons.append(f"max r_hat {shown_against(max_r_hat, thresholds.max_r_hat, 3)} > "
                       f"{number_text(thresholds.max_r_hat)}")
    if min_ess_bulk < thresholds.min_ess_bulk:
        reasons.append(f"min ess_bulk {shown_against(min_ess_bulk, thresholds.min_ess_bulk)} < "
                       f"{number_text(thresholds.min_ess_bulk)}")
    return {
        "divergences": divergences,
        "max_r_hat": max_r_hat,
        "min_ess_bulk": min_ess_bulk,
        "status": "warning" if reasons else "ok",
        "reasons": reasons,
    }


def recorded_rows(attrs: Mapping[str, Any]) -> int | None:
    """The dataset's rows a fit recorded (None in a fit written before they were)."""
    try:
        return int(attrs["rows"])
    except (KeyError, TypeError, ValueError):
        return None


def fitted_row(dataset_id: str, attrs: Mapping[str, Any], health: Mapping[str, Any]) -> dict[str, Any]:
    """datasets.csv's row of a fitted dataset, from its fit's attributes and its `score_health`."""
    return {
        "dataset": dataset_id, "path": attrs.get("source", ""), "rows": attrs.get("rows", ""),
        "groups": attrs.get("groups", ""), "status": health["status"], "message": "; ".join(health["reasons"]),
        "stage": "", "structure": str(attrs.get("structure", ""))[:12], "sampler_path": attrs.get("sampler_path", ""),
        "fallback": attrs.get("fallback", ""), "seed": attrs.get("seed", ""),
        **{name: health[name] for name in HEALTH_STATISTICS}, "wall_seconds": attrs.get("wall_seconds", ""),
    }


def failed_row(record: Mapping[str, str]) -> dict[str, Any]:
    """datasets.csv's row of a failed dataset, from its failure record (`batchfit.fitting.outcome.read_failure`)."""
    return {"dataset": record["dataset"], "path": record.get("path", ""), "rows": record.get("rows", ""),
            "groups": record.get("groups", ""), "status": "failed", "message": record.get("message", ""),
            "stage": record.get("stage", "")}


def number_text(value: float) -> str:
    """A threshold as a health reason prints it: the shortest text that reads back as the same
    number, without a trailing ``.0`` (``1.01``, ``400``)."""
    text = repr(float(value))
    return text.removesuffix(".0")


def shown_against(value: float, threshold: float, decimals: int = 0) -> str:
    """``value`` with at least ``decimals`` decimals and as many more as it takes to read on its own
    side of ``threshold`` as `number_text` prints it: an r_hat of 1.0104 against 1.01 prints
    ``1.0104``, not ``1.010``, and an ess_bulk of 399.6 against 400 prints ``399.6``, not ``400``."""
    shown_threshold = float(number_text(threshold))
    if value == shown_threshold or not math.isfinite(value) or abs(value) >= 1e16:
        return number_text(value)  # no side to show, or fixed decimals would show digits it has not
    for places in range(decimals, 18):
        text = f"{value:.{places}f}"
        if (float(text) > shown_threshold) == (value > shown_threshold) and float(text) != shown_threshold:
            return text
    return number_text(value)  # a hair from the threshold: the text that reads back as the value itself


def _nan_reduce(reduce: Callable[[np.ndarray], Any], values: np.ndarray) -> float:
    """`reduce` over the non-NaN values, NaN if there are none (comparisons then pass)."""
    finite = values[~np.isnan(values)]
    return float(reduce(finite)) if finite.size else math.nan
