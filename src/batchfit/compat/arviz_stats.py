"""arviz_stats: the folds of K-fold cross-validation, drawn before any refit runs.

``arviz_stats.loo_kfold`` assigns a dataset's observations to folds itself (random, or stratified
by a column), then refits one fold after another through its ``SamplingWrapper``. batchfit plans
every refit of a sweep before any runs, to run them in batches as fit jobs run datasets
(`batchfit.sweep.refit_plan`), so it needs the folds up front; it draws them with loo_kfold's own
splitters, as ``_prepare_kfold_inputs`` calls them for ``k``, ``stratify_by`` and ``seed``, and
hands them to ``loo_kfold(folds=...)``: a user's own ``loo_kfold`` with that seed holds out the
same rows. Written against arviz-stats 1.3 (``arviz_stats/loo/loo_kfold_helper.py``:
``_kfold_split_random``, ``_kfold_split_stratified``).
"""

from __future__ import annotations

import numpy as np


def kfold_folds(n: int, k: int, seed: int, strata: np.ndarray | None = None) -> np.ndarray:
    """The fold (1 to ``k``) of each of ``n`` observations, as ``arviz_stats.loo_kfold(k=k, seed=seed,
    stratify_by=strata)`` assigns them."""
    from arviz_stats.loo import loo_kfold_helper

    rng = np.random.default_rng(seed)
    if strata is not None:
        return np.asarray(loo_kfold_helper._kfold_split_stratified(k=k, x=np.asarray(strata), rng=rng))
    return np.asarray(loo_kfold_helper._kfold_split_random(k=k, n=n, rng=rng))
