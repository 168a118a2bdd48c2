"""A fit's health as collect scores it, and datasets.csv's rows.

The thresholds are those of CmdStan's ``diagnose`` (https://mc-stan.org/docs/cmdstan-guide/diagnose_utility.html):
divergent transitions, draws at the maximum tree depth, E-BFMI per chain, R-hat and ESS (bulk and
tail), worded by `batchfit.fitting.sampler_health.threshold_reasons` (as the fit log words the part
a fit job scores). What a fit's sampler recorded (divergences, tree depth, energy) is read by
`batchfit.fitting.sampler_health.sampler_diagnostics`, R-hat and ESS are its summary's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from batchfit.fitting.sampler_health import HealthThresholds, threshold_reasons
from batchfit.records import fit_attributes

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


def score_health(
    r_hat: np.ndarray, ess_bulk: np.ndarray, ess_tail: np.ndarray, sampler: Mapping[str, float],
    thresholds: HealthThresholds, rows: int | None = None,
) -> dict[str, Any]:
    """Dataset-level health from the r_hat, ess_bulk and ess_tail of its scored elements, what its
    sampler recorded (``sampler``: `batchfit.fitting.sampler_health.sampler_diagnostics`: divergences,
    max_treedepth_fraction, min_bfmi) and its number of rows (`health.min_rows`; None: unknown, not
    checked); the reasons are `threshold_reasons`', the words of the fit log's sampler warnings. A NaN
    diagnostic (a constant variable; no tree depth or energy, as of pm.sample's step methods without
    NUTS) crosses no threshold."""
    values = {"divergences": int(sampler["divergences"]), "max_r_hat": _nan_reduce(np.nanmax, r_hat),
              "min_ess_bulk": _nan_reduce(np.nanmin, ess_bulk), "min_ess_tail": _nan_reduce(np.nanmin, ess_tail),
              "max_treedepth_fraction": float(sampler["max_treedepth_fraction"]),
              "min_bfmi": float(sampler["min_bfmi"])}
    reasons = threshold_reasons(values, thresholds, rows)
    return {**values, "status": "warning" if reasons else "ok", "reasons": reasons}


def recorded_rows(attrs: Mapping[str, Any]) -> int | None:
    """The dataset's rows a fit recorded (None in a fit written before they were)."""
    try:
        return int(attrs[fit_attributes.ROWS])
    except (KeyError, TypeError, ValueError):
        return None


def fitted_row(dataset_id: str, attrs: Mapping[str, Any], health: Mapping[str, Any]) -> dict[str, Any]:
    """datasets.csv's row of a fitted dataset, from its fit's attributes and its `score_health`."""
    return {
        "dataset": dataset_id, "path": attrs.get(fit_attributes.SOURCE, ""), "rows": attrs.get(fit_attributes.ROWS, ""),
        **{name: attrs.get(name, "") for name in DROPPED}, "groups": attrs.get("groups", ""),
        "status": health["status"], "message": "; ".join(health["reasons"]),
        "stage": "", "structure": str(attrs.get(fit_attributes.STRUCTURE, ""))[:12],
        "sampler_path": attrs.get("sampler_path", ""),
        "fallback": attrs.get(fit_attributes.FALLBACK, ""), "seed": attrs.get("seed", ""),
        **{name: health[name] for name in DIAGNOSTICS}, "wall_seconds": attrs.get("wall_seconds", ""),
    }


def failed_row(record: Mapping[str, str]) -> dict[str, Any]:
    """datasets.csv's row of a failed dataset, from its failure record (`FailureRecord.row`)."""
    return {"dataset": record["dataset"], "path": record.get("path", ""), "rows": record.get("rows", ""),
            **{name: record.get(name, "") for name in DROPPED}, "groups": record.get("groups", ""),
            "status": "failed", "message": record.get("message", ""), "stage": record.get("stage", "")}


def _nan_reduce(reduce: Callable[[np.ndarray], Any], values: np.ndarray) -> float:
    """`reduce` over the non-NaN values, NaN if there are none (comparisons then pass)."""
    finite = values[~np.isnan(values)]
    return float(reduce(finite)) if finite.size else math.nan
