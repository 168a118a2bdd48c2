"""A fit's expected log predictive density for the comparison of variants: PSIS-LOO, or exact from refits.

`fit_loo` is a fit's PSIS-LOO (``arviz_stats.loo``) with what the exact methods need to know of it:
the observations whose Pareto k exceeds `PARETO_K`, its digest and structure, and whether its
observations are the dataset's rows. `exact_elpd` hands refits already made (`batchfit.fitting.refits`,
run in batches by refit jobs) to ``arviz_stats.reloo`` or ``arviz_stats.loo_kfold`` through a
``SamplingWrapper`` that serves them instead of sampling (`StoredRefits`), so every estimate, its
standard error and effective number of parameters are arviz_stats' own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from arviz_stats.loo import SamplingWrapper

from batchfit.fitting.refit_records import HELD_OUT_DIM, KFOLD, RELOO
from batchfit.records import fit_attributes

PARETO_K = 0.7  # above it, PSIS-LOO's estimate for an observation is unreliable (Vehtari et al. 2024)


@dataclass(frozen=True)
class FitLoo:
    """One fit's PSIS-LOO and what the exact methods need of it."""

    elpd: Any  # arviz_stats' ELPDDataLOO, pointwise
    flagged: tuple[int, ...]  # observations whose Pareto k exceeds PARETO_K
    digest: str  # the fit's provenance digest
    structure: str  # its model structure
    problem: str  # why no exact method can use it ('' when one can)


def fit_loo(path: Path, tree: Any = None) -> FitLoo:
    """``arviz_stats.loo`` of the fit at ``path`` (or its open ``tree``), with its flagged observations.

    The exact methods hold out rows of the dataset, so they need one observed variable whose
    log-likelihood has one value per row (an observation per row, along one dimension).
    """
    import arviz_stats
    import xarray as xr

    if tree is None:
        with xr.open_datatree(path) as opened:
            return fit_loo(path, opened)
    elpd = arviz_stats.loo(tree, pointwise=True)
    k = np.asarray(elpd.pareto_k)
    flagged = tuple(int(i) for i in np.flatnonzero(k.reshape(-1) > PARETO_K))
    rows = tree.attrs.get(fit_attributes.ROWS)
    problem = ""
    if k.ndim != 1:
        problem = f"its log-likelihood has {k.ndim} observation dimensions; the exact methods hold out rows"
    elif rows is None or int(rows) != k.size:
        problem = (f"its log-likelihood has {k.size} values for the dataset's {rows} rows; the exact methods hold "
                   "out rows, so they need one observation per row")
    return FitLoo(elpd, flagged, str(tree.attrs.get(fit_attributes.PROVENANCE, "")),
                  str(tree.attrs.get(fit_attributes.STRUCTURE, "")), problem)


class StoredRefits(SamplingWrapper):
    """Refits already made, served to ``arviz_stats.reloo`` and ``loo_kfold`` as if they sampled them now:
    ``sel_observations`` names the held-out rows, ``sample`` and ``get_inference_data`` give their refit's
    result, ``log_likelihood__i`` its held-out rows' pointwise log-likelihood (chain, draw, row)."""

    def __init__(self, tree: Any, refits: Mapping[tuple[int, ...], Any]):
        super().__init__(model=None, idata_orig=tree)
        self.refits = refits

    def sel_observations(self, idx: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        rows = tuple(sorted(int(i) for i in np.atleast_1d(idx)))
        return rows, rows

    def sample(self, modified_observed_data: tuple[int, ...]) -> Any:
        return self.refits[modified_observed_data]

    def get_inference_data(self, fitted_model: Any) -> Any:
        return fitted_model

    def log_likelihood__i(self, excluded_obs: tuple[int, ...], idata__i: Any) -> Any:
        if tuple(int(r) for r in idata__i[HELD_OUT_DIM].values) != excluded_obs:
            raise ValueError(f"a refit's held-out rows {idata__i[HELD_OUT_DIM].values} are not {excluded_obs}")
        return idata__i


def exact_elpd(method: str, loo: FitLoo, tree: Any, refits: Mapping[tuple[int, ...], Any],
               folds: np.ndarray | None = None) -> Any:
    """The fit's elpd by ``method``: `RELOO` (``arviz_stats.reloo`` of its PSIS-LOO, refitting the
    observations above `PARETO_K`) or `KFOLD` (``arviz_stats.loo_kfold`` with ``folds``), from ``refits``
    by held-out rows."""
    import arviz_stats

    wrapper = StoredRefits(tree, refits)
    if method == RELOO:
        return arviz_stats.reloo(wrapper, loo_orig=loo.elpd, k_threshold=PARETO_K, pointwise=True)
    if method == KFOLD:
        return arviz_stats.loo_kfold(tree, wrapper, pointwise=True, folds=folds)
    raise ValueError(f"no exact method {method!r}")
