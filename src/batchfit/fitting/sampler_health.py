"""A fit's health thresholds, and the part of them its sampler's own statistics decide.

A fit's health holds to CmdStan's ``diagnose`` thresholds
(https://mc-stan.org/docs/cmdstan-guide/diagnose_utility.html): divergent transitions, draws at the
maximum tree depth, E-BFMI per chain, R-hat and ESS (bulk and tail), and the dataset's rows
(``health.min_rows``). The sampler's statistics decide the first three as soon as a dataset is
sampled, so a fit job scores them for its log (`sampler_reasons`); R-hat and ESS need a summary of
the posterior, which collect computes once per fit (`batchfit.outputs.health.score_health`). Both
word a crossed threshold with `threshold_reasons`, so the fit log and datasets.csv say the same, and
`threshold_of` takes a reason back to the threshold it crossed, for the counts of a sweep's verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

# The stat that says a draw's trajectory stopped at the maximum tree depth: nutpie's, PyMC's NUTS's.
MAXDEPTH_STATS = ("maxdepth_reached", "reached_max_treedepth")


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


def bfmi(energy: np.ndarray) -> np.ndarray:
    """E-BFMI of each chain of the sampler's ``energy`` shaped (chain, draw), as arviz_stats' ``bfmi``: the
    mean squared change of the energy from one draw to the next over the energy's variance (Betancourt
    2016, https://arxiv.org/abs/1604.00695). NaN for a chain of fewer than two draws or constant energy."""
    energy = np.atleast_2d(np.asarray(energy, dtype=float))
    if energy.shape[1] < 2:
        return np.full(energy.shape[0], np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.square(np.diff(energy, axis=1)).mean(axis=1) / np.var(energy, axis=1, ddof=1)


def sampler_diagnostics(stats: Any) -> dict[str, float]:
    """What a fit's ``sample_stats`` (a netCDF4 group of a written fit, or the xarray Dataset of one just
    sampled) say of its sampling, over its kept draws:

    * ``divergences``: divergent transitions, all chains together;
    * ``max_treedepth_fraction``: the share of draws whose trajectory stopped at the maximum tree
      depth (`MAXDEPTH_STATS`); NaN without one (pm.sample's step methods without NUTS);
    * ``min_bfmi``: the smallest E-BFMI of a chain (`bfmi` of ``energy``); NaN without ``energy``, or
      when no chain has one.
    """
    divergences = int(np.asarray(stats["diverging"][:]).sum())
    depth = next((stats[name] for name in MAXDEPTH_STATS if name in stats.variables), None)
    fraction = float(np.asarray(depth[:], dtype=float).mean()) if depth is not None and depth.size else np.nan
    per_chain = bfmi(np.asarray(stats["energy"][:], dtype=float)) if "energy" in stats.variables else np.array([])
    per_chain = per_chain[np.isfinite(per_chain)]
    return {"divergences": divergences, "max_treedepth_fraction": fraction,
            "min_bfmi": float(per_chain.min()) if per_chain.size else np.nan}


def threshold_reasons(values: Mapping[str, float], thresholds: HealthThresholds, rows: int | None = None) -> list[str]:
    """The thresholds ``values`` cross, in words (``1 divergences > 0``, ``max r_hat 1.0104 > 1.01``), among the
    diagnostics ``values`` holds (`sampler_diagnostics`' and the summary's ``max_r_hat``, ``min_ess_bulk``,
    ``min_ess_tail``), in one order whichever it holds; ``rows``: the dataset's (None: unknown, not
    checked). A NaN diagnostic (a constant variable; no tree depth or energy) crosses no threshold."""
    reasons = []
    min_rows = thresholds.min_rows
    if min_rows is not None and rows is not None and rows < min_rows:
        reasons.append(f"{rows} rows < {min_rows} (health.min_rows)")
    if "divergences" in values and values["divergences"] > thresholds.max_divergences:
        reasons.append(f"{int(values['divergences'])} divergences > {number_text(thresholds.max_divergences)}")
    for name, decimals, crossed in _SCORED:
        if name not in values:
            continue
        value, threshold = values[name], getattr(thresholds, name)
        if crossed(value, threshold):
            sign = ">" if name.startswith("max") else "<"
            reasons.append(f"{_REASON_NAMES.get(name, name)} {shown_against(value, threshold, decimals)} {sign} "
                           f"{number_text(threshold)}")
    return reasons


def sampler_reasons(stats: Any, thresholds: HealthThresholds, rows: int | None) -> list[str]:
    """The thresholds a fit crosses that its sampler's statistics decide (divergences, tree depth, E-BFMI)
    and its rows: what a fit job knows of its health before collect scores R-hat and ESS."""
    return threshold_reasons(sampler_diagnostics(stats), thresholds, rows)


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
# A reason of `threshold_reasons` and the threshold it crossed: the value first (rows, divergences) or last.
_VALUE_FIRST = re.compile(r"^\S+ (?P<name>rows|divergences) (?P<bound>[<>] \S+)")
_VALUE_LAST = re.compile(r"^(?P<name>.+) \S+ (?P<bound>[<>] \S+)$")


def threshold_of(reason: str) -> str:
    """The threshold a reason of `threshold_reasons` crossed, without the dataset's value: ``divergences > 0``
    for ``1 divergences > 0``, ``max r_hat > 1.01`` for ``max r_hat 1.0104 > 1.01`` (the reason itself if it
    is none of theirs)."""
    match = _VALUE_FIRST.match(reason) or _VALUE_LAST.match(reason)
    return f"{match['name']} {match['bound']}" if match else reason


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
