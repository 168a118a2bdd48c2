"""The refits a comparison of variants needs (``compare.method``), and the batches that run them.

For each dataset at least two variants fitted, every variant's PSIS-LOO (`batchfit.outputs.exact_elpd.fit_loo`)
says which observations PSIS cannot estimate (Pareto k above 0.7). The dataset's method, the same
for all its variants, follows ``compare``:

* ``psis``: none; ``reloo``: a refit without each flagged observation of each fit (other fits keep
  PSIS-LOO, which is reliable for them); ``kfold``: k refits of every variant, the same folds for
  each (drawn as ``arviz_stats.loo_kfold`` draws them: `batchfit.compat.arviz_stats.kfold_folds`),
  for a dataset with a flagged observation or, with ``kfold.datasets: all``, every dataset;
  ``auto``: reloo when no fit of the dataset flags more than ``max_reloo`` observations, else kfold.
* A dataset whose fits cannot be refitted by rows (their log-likelihood is not one value per row)
  keeps PSIS-LOO, and the plan says why (comparison.csv's ``note``).

The refits without a result for their fit and rows (`batchfit.fitting.refits.refit_done`) are cut
into batches of one variant each, as `batchfit.sweep.plan` cuts datasets: chunks of all of a
variant's refits, so that finishing one batch never changes another, named after their members
and the fits' digests, so a refitted dataset gives new batches.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from batchfit.compat.arviz_stats import kfold_folds
from batchfit.config import Config
from batchfit.data.reader import DatasetReader
from batchfit.errors import ConfigError, DatasetError
from batchfit.fitting.fitter import sweep_reader
from batchfit.fitting.refit_records import KFOLD, PSIS, RELOO, Refit, RefitPlan, refit_done
from batchfit.outputs.compare import compared_datasets, compared_variants
from batchfit.sweep.plan import batch_size

log = logging.getLogger("batchfit")


def refit_plan(config: Config, *, cores: int | None = 1) -> RefitPlan:
    """Every compared dataset's method and refits, and the pending refits in batches (``cores``: as for
    `batchfit.sweep.plan.batch_size`)."""
    from batchfit.outputs.exact_elpd import fit_loo  # arviz_stats: only where the fits are read

    configs = compared_variants(config)
    settings = config.compare
    methods, notes, refits = {}, {}, []
    reader = sweep_reader(config, record=False) if settings.kfold.stratify_by else None
    for dataset_id, fits in compared_datasets(configs):
        if settings.method == PSIS:
            methods[dataset_id] = PSIS
            continue
        loos = {variant: fit_loo(path) for variant, path in fits.items()}
        method = _method(settings.method, settings.max_reloo, settings.kfold.datasets,
                         [len(loo.flagged) for loo in loos.values()])
        problems = [f"variant {variant}: {loo.problem}" for variant, loo in loos.items() if loo.problem]
        if method != PSIS and problems:
            notes[dataset_id] = f"{method} not possible, PSIS-LOO kept ({'; '.join(problems)})"
            method = PSIS
        methods[dataset_id] = method
        if method == RELOO:
            refits += [Refit(variant, dataset_id, RELOO, f"reloo-{row}", (row,), loo.digest, loo.structure)
                       for variant, loo in loos.items() for row in loo.flagged]
        elif method == KFOLD:
            n_rows = next(iter(loos.values())).elpd.n_data_points
            strata = _strata(config, dataset_id, reader, n_rows)
            k = min(settings.kfold.k, n_rows)
            folds = kfold_folds(n_rows, k, settings.kfold.seed, strata)
            refits += [Refit(variant, dataset_id, KFOLD, f"kfold-{fold}-of-{k}",
                             tuple(int(r) for r in np.flatnonzero(folds == fold)), loo.digest, loo.structure)
                       for variant, loo in loos.items() for fold in range(1, k + 1)]
    return RefitPlan(methods, notes, refits, _batches(configs, refits, cores))


def write_refit_plan(config: Config, *, cores: int | None = 1) -> RefitPlan:
    """The checkpoint ``refit_plan``: `refit_plan`, written to ``results_dir/refits/plan.json``."""
    plan = refit_plan(config, cores=cores)
    plan.write(config.layout.refit_plan)
    n_pending = sum(map(len, plan.batches.values()))
    log.info("refit plan: %s; %d refit(s), %d pending in %d batch(es)",
             ", ".join(f"{sum(m == method for m in plan.methods.values())} {method}"
                       for method in (PSIS, RELOO, KFOLD)), len(plan.refits), n_pending, len(plan.batches))
    return plan


def _method(asked: str, max_reloo: int, kfold_datasets: str, flagged: Sequence[int]) -> str:
    """A dataset's method from ``compare.method`` and how many observations each of its fits flags."""
    unreliable = any(flagged)
    if asked == KFOLD:
        return KFOLD if unreliable or kfold_datasets == "all" else PSIS
    if not unreliable:
        return PSIS
    if asked == RELOO or max(flagged) <= max_reloo:
        return RELOO
    return KFOLD


def _strata(config: Config, dataset_id: str, reader: DatasetReader | None, n_rows: int) -> np.ndarray | None:
    """The dataset's ``compare.kfold.stratify_by`` column (None without one), one value per row of its fits."""
    column = config.compare.kfold.stratify_by
    if column is None or reader is None:
        return None
    dataset = reader.load(dataset_id)  # as its fits' jobs loaded it (row rules and all)
    if column not in dataset:
        raise ConfigError(f"dataset '{dataset_id}' has no column {column!r} to stratify its folds by (its columns: "
                          f"{', '.join(dataset.keys())})", key="compare.kfold.stratify_by", source=config.source)
    values = np.asarray(dataset[column])
    if values.shape != (n_rows,):
        raise DatasetError(f"column {column!r} (compare.kfold.stratify_by) has shape {values.shape}, not one "
                           f"value per row ({n_rows})", dataset=dataset_id, path=dataset.path, column=column)
    return values


def _batches(configs: Mapping[str, Config], refits: Sequence[Refit], cores: int | None) -> dict[str, list[Refit]]:
    """The pending refits in batches of one variant each: chunks of all its refits, the pending ones of each."""
    batches = {}
    for variant, config in configs.items():
        own = [r for r in refits if r.variant == variant]
        size = batch_size(config, len(own), cores)
        for chunk in (own[i:i + size] for i in range(0, len(own), size)):
            pending = [r for r in chunk if not refit_done(config, r)]
            if pending:
                batches[_untried_batch_id(config, pending)] = pending
    return batches


def _untried_batch_id(config: Config, refits: Sequence[Refit]) -> str:
    """A batch's name from its refits and their fits' digests; as `batchfit.sweep.plan.untried_batch_id`, a
    batch that ran (its manifest exists) and left refits pending is tried again under a new name."""
    lines = [f"{r.dataset} {r.id} {r.rows} {r.fit_digest}" for r in refits]
    retry = 0
    while True:
        digest = hashlib.sha256("\n".join([*lines, f"retry {retry}"]).encode()).hexdigest()[:12]
        if not config.layout.refit_manifest(name := f"refit-{digest}").exists():
            return name
        retry += 1
