"""A fit's health: the thresholds it must meet and, if it misses, why in words.

The thresholds are those of CmdStan's ``diagnose`` (https://mc-stan.org/docs/cmdstan-guide/diagnose_utility.html):
divergent transitions, draws at the maximum tree depth, E-BFMI per chain, R-hat and ESS (bulk and
tail). What a fit's sampler recorded (divergences, tree depth, energy) is read by
`batchfit.outputs.fit_reader.sampler_diagnostics`, R-hat and ESS are its summary's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("batchfit")


# The dataset-level diagnostics `score_health` returns (CmdStan's `diagnose` checks), by name.
DIAGNOSTICS = ("divergences", "max_r_hat", "min_ess_bulk", "min_ess_tail", "max_treedepth_fraction", "min_bfmi")
# datasets.csv: one row per dataset. The one list of its columns: a new dataset-level diagnostic is a
# column here and a key of `score_health`'s result (in `DIAGNOSTICS`); one from the fit's attributes
# is a line of `fitted_row`.
DATASET_COLUMNS = ["dataset", "path", "rows", "dropped_where", "dropped_missing", "groups", "status", "message",
                   "stage", "structure", "sampler_path", "fallback", "seed", *DIAGNOSTICS, "wall_seconds"]
# How many of the dataset's rows each row rule dropped (`batchfit.data.rows`): rows.where, rows.drop_missing.
DROPPED = ("dropped_where", "dropped_missing")


class HealthThresholds(Protocol):
    """What makes a fit a warning, checked on which variables; `Config.health` (HealthSettings) satisfies this."""

    max_r_hat: float
    min_ess_bulk: float
    min_ess_tail: float
    max_divergences: int
    max_treedepth_fraction: float
    min_bfmi: float
    var_names: tuple[str, ...] | None
    filter_vars: str | None
    min_rows: int | None


def score_health(
    r_hat: np.ndarray, ess_bulk: np.ndarray, ess_tail: np.ndarray, sampler: Mapping[str, float],
    thresholds: HealthThresholds, rows: int | None = None,
) -> dict[str, Any]:
    """Dataset-level health from the r_hat, ess_bulk and ess_tail of its scored elements, what its
    sampler recorded (``sampler``: `batchfit.outputs.fit_reader.sampler_diagnostics`: divergences,
    max_treedepth_fraction, min_bfmi) and its number of rows (`health.min_rows`; None: unknown, not
    checked). A NaN diagnostic (a constant variable; no tree depth or energy, as of pm.sample's step
    methods without NUTS) crosses no threshold."""
    divergences = int(sampler["divergences"])
    values = {"divergences": divergences, "max_r_hat": _nan_reduce(np.nanmax, r_hat),
              "min_ess_bulk": _nan_reduce(np.nanmin, ess_bulk), "min_ess_tail": _nan_reduce(np.nanmin, ess_tail),
              "max_treedepth_fraction": float(sampler["max_treedepth_fraction"]),
              "min_bfmi": float(sampler["min_bfmi"])}
    reasons = []
    min_rows = thresholds.min_rows
    if min_rows is not None and rows is not None and rows < min_rows:
        reasons.append(f"{rows} rows < {min_rows} (health.min_rows)")
    if divergences > thresholds.max_divergences:
        reasons.append(f"{divergences} divergences > {number_text(thresholds.max_divergences)}")
    for name, decimals, crossed in _SCORED:
        value, threshold = values[name], getattr(thresholds, name)
        if crossed(value, threshold):
            sign = ">" if name.startswith("max") else "<"
            reasons.append(f"{_REASON_NAMES.get(name, name)} {shown_against(value, threshold, decimals)} {sign} "
                           f"{number_text(threshold)}")
    return {**values, "status": "warning" if reasons else "ok", "reasons": reasons}


# The thresholds after divergences: name (the diagnostic's and its threshold's), decimals shown, crossed.
_SCORED = (
    ("max_r_hat", 3, lambda value, threshold: value > threshold),
    ("min_ess_bulk", 0, lambda value, threshold: value < threshold),
    ("min_ess_tail", 0, lambda value, threshold: value < threshold),
    ("max_treedepth_fraction", 3, lambda value, threshold: value > threshold),
    ("min_bfmi", 2, lambda value, threshold: value < threshold),
)
# How a reason names a diagnostic, where not by its own name (the summary's column it is the extreme of).
_REASON_NAMES = {"max_r_hat": "max r_hat", "min_ess_bulk": "min ess_bulk", "min_ess_tail": "min ess_tail"}


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
        **{name: attrs.get(name, "") for name in DROPPED}, "groups": attrs.get("groups", ""),
        "status": health["status"], "message": "; ".join(health["reasons"]),
        "stage": "", "structure": str(attrs.get("structure", ""))[:12], "sampler_path": attrs.get("sampler_path", ""),
        "fallback": attrs.get("fallback", ""), "seed": attrs.get("seed", ""),
        **{name: health[name] for name in DIAGNOSTICS}, "wall_seconds": attrs.get("wall_seconds", ""),
    }


def failed_row(record: Mapping[str, str]) -> dict[str, Any]:
    """datasets.csv's row of a failed dataset, from its failure record (`batchfit.fitting.outcome.read_failure`)."""
    return {"dataset": record["dataset"], "path": record.get("path", ""), "rows": record.get("rows", ""),
            **{name: record.get(name, "") for name in DROPPED}, "groups": record.get("groups", ""),
            "status": "failed", "message": record.get("message", ""), "stage": record.get("stage", "")}


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
