"""The compare rule: the variants of a sweep compared per dataset, by PSIS-LOO or where it fails exactly.

For each dataset every variant fitted, each variant's expected log predictive density comes from
PSIS-LOO (``arviz_stats.loo``) or, where the refit plan (`batchfit.sweep.refit_plan`, ``compare:``)
gave the dataset an exact method, from refits already made (`batchfit.outputs.exact_elpd`:
``arviz_stats.reloo`` or ``loo_kfold``); ``arviz_stats.compare`` across them (stacking weights) gives
one row per variant in ``results_dir/comparison.csv``, whose ``method`` names where its elpd comes
from. Datasets are read one at a time (each variant's fit of it, then closed), so memory does not
grow with the sweep.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from batchfit.config import Config
from batchfit.errors import ConfigError
from batchfit.fitting.refit_records import KFOLD, PSIS, RELOO, Refit, RefitManifest, RefitPlan, read_refit, refit_done
from batchfit.outputs.exact_elpd import PARETO_K, exact_elpd, fit_loo
from batchfit.outputs.table_page import write_table_and_page
from batchfit.variants import variant_configs

log = logging.getLogger("batchfit")

K_COLUMN = f"n_pareto_k_gt_{PARETO_K}"  # observations of the dataset whose PSIS Pareto k exceeds PARETO_K
COLUMNS = ["dataset", "variant", "elpd_loo", "se", "p_loo", "n_obs", K_COLUMN, "rank", "elpd_diff", "dse", "weight",
           "method", "n_refits", "note"]
_FITTED = ("ok", "warning")


def compared_variants(config: Config) -> dict[str, Config]:
    """The variants the compare rule compares; a clear error when they cannot be compared."""
    configs = variant_configs(config)
    if len(configs) < 2:
        raise ConfigError(f"the compare rule compares variants, and this config has {len(configs)}: list two or "
                          "more under variants (or a grid)", key="variants", source=config.source)
    off = [variant for variant, c in configs.items() if not c.outputs.log_likelihood]
    if off:
        raise ConfigError(f"PSIS-LOO needs each fit's pointwise log-likelihood, which variant(s) {', '.join(off)} "
                          "do not store: remove 'outputs: {log_likelihood: false}' (a sweep of variants stores "
                          "it by default)", key="outputs.log_likelihood", source=config.source)
    return configs


def fitted_datasets(config: Config) -> list[str]:
    """The datasets a variant fitted (ok or warning), from its datasets.csv, in the sweep's order."""
    with open(config.layout.datasets_csv, newline="") as file:
        return [row["dataset"] for row in csv.DictReader(file) if row["status"] in _FITTED]


def compared_datasets(configs: Mapping[str, Config]) -> Iterator[tuple[str, dict[str, Path]]]:
    """Each dataset at least two of ``configs`` fitted, in the sweep's order, with each variant's fit."""
    listed = {variant: fitted_datasets(c) for variant, c in configs.items()}
    fitted = {variant: set(ids) for variant, ids in listed.items()}
    for dataset_id in dict.fromkeys(d for ids in listed.values() for d in ids):
        fits = {variant: c.layout.fit(dataset_id) for variant, c in configs.items() if dataset_id in fitted[variant]}
        if len(fits) < 2:
            log.warning("compare: dataset %s left out, fitted by %d variant(s) only", dataset_id, len(fits))
            continue
        yield dataset_id, fits


def compare_dataset(dataset_id: str, fits: Mapping[str, Path], configs: Mapping[str, Config],
                    plan: RefitPlan | None) -> pd.DataFrame:
    """One dataset's rows of comparison.csv: each variant's elpd (PSIS-LOO, or the plan's exact method from
    its refits), `arviz_stats.compare` across them (stacking weights), in the order of ``fits``.

    A variant some of whose refits failed keeps PSIS-LOO, and with K-fold so do the others (K-fold is
    compared with K-fold only); the note says why.
    """
    import arviz_stats
    import xarray as xr

    method = plan.methods.get(dataset_id, PSIS) if plan is not None else PSIS
    note = plan.notes.get(dataset_id, "") if plan is not None else ""
    planned = [r for r in plan.refits if r.dataset == dataset_id] if plan is not None else []
    failed = _failed_refits(configs, planned)
    if method == KFOLD and failed:
        note = "K-fold not possible, PSIS-LOO kept: " + "; ".join(f"variant {v}: {why}" for v, why in failed.items())
        method = PSIS
    elpds, rows = {}, {}
    for variant, path in fits.items():
        own = [r for r in planned if r.variant == variant] if method != PSIS and variant not in failed else []
        with xr.open_datatree(path) as tree:
            loo = fit_loo(path, tree)
            elpds[variant] = loo.elpd
            if own:
                refits = {r.rows: read_refit(configs[variant], r) for r in own}
                elpds[variant] = exact_elpd(method, loo, tree, refits, plan.folds(dataset_id) if method == KFOLD
                                            else None)
        why_not = f"reloo not possible, PSIS-LOO kept: {failed[variant]}" if method == RELOO and variant in failed \
            else ""
        rows[variant] = {"variant": variant, "elpd_loo": elpds[variant].elpd, "se": elpds[variant].se,
                         "p_loo": elpds[variant].p, "n_obs": loo.elpd.n_data_points,
                         K_COLUMN: int(np.sum(np.asarray(loo.elpd.pareto_k) > PARETO_K)),
                         "method": method if own else PSIS, "n_refits": len(own),
                         "note": "; ".join(filter(None, [note, why_not]))}
    table = arviz_stats.compare(elpds, method="stacking", round_to="none")
    return pd.DataFrame([{**row, **{column: table.loc[variant, column]
                                    for column in ("rank", "elpd_diff", "dse", "weight")}}
                         for variant, row in rows.items()])


def _failed_refits(configs: Mapping[str, Config], planned: list[Refit]) -> dict[str, str]:
    """Per variant, the first of its planned refits without a result, and why (its batch's manifest says)."""
    failed: dict[str, str] = {}
    for refit in planned:
        if refit.variant not in failed and not refit_done(configs[refit.variant], refit):
            failed[refit.variant] = f"refit {refit.id} failed: {_failure(configs[refit.variant], refit)}"
    return failed


def _failure(config: Config, refit: Refit) -> str:
    """What a refit's batch manifest recorded of its failure ('no result' without one)."""
    key = f"{refit.dataset}/{refit.id}"
    for manifest in sorted(config.layout.refits.glob("batches/*.json")):
        outcome = RefitManifest.read(manifest).refits.get(key)
        if outcome and outcome.status == "failed":
            return outcome.message
    return "no result"


def comparisons(config: Config) -> Iterator[pd.DataFrame]:
    """Every dataset's rows, a dataset at a time: those at least two variants fitted, in the sweep's order,
    each by the method the refit plan gave it (PSIS-LOO without a plan)."""
    configs = compared_variants(config)
    plan = RefitPlan.read(config.layout.refit_plan) if config.layout.refit_plan.exists() else None
    for dataset_id, fits in compared_datasets(configs):
        rows = compare_dataset(dataset_id, fits, configs, plan)
        rows.insert(0, "dataset", dataset_id)
        yield rows[COLUMNS]


def write_comparison(config: Config) -> list[Path]:
    """The compare rule: results_dir/comparison.csv, written a dataset at a time, and its report page."""
    return write_table_and_page(config.layout.comparison, COLUMNS, comparisons(config),
                                config.layout.report_pages / "comparison.html", comparison_page)


def wins(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the datasets it was compared on, those it wins (rank 0), those it wins clearly (by more
    than 4 and than twice the difference's se, where PSIS-LOO's normal approximation holds), the median
    margin over the runner-up where it wins, and its mean stacking weight."""
    runner_up = comparison[comparison["rank"] == 1].set_index("dataset")
    best = comparison[comparison["rank"] == 0].set_index("dataset")
    margin = -runner_up["elpd_diff"].reindex(best.index)
    clear = (margin > 4) & (margin > 2 * runner_up["dse"].reindex(best.index))
    rows = []
    for variant, rows_of in comparison.groupby("variant", sort=False):
        won = best.index[best["variant"] == variant]
        rows.append({"variant": variant, "datasets compared": len(rows_of), "wins": len(won),
                     "clear wins": int(clear[won].sum()),
                     "median elpd margin where it wins": float(margin[won].median()) if len(won) else np.nan,
                     "mean stacking weight": float(rows_of["weight"].mean())})
    return pd.DataFrame(rows)


def comparison_page(comparison: pd.DataFrame) -> str:
    """The report page of comparison.csv: wins per variant, each elpd's method, the comparisons PSIS-LOO
    leaves unreliable, and the table itself."""
    from batchfit.outputs.report import page, table

    psis = comparison["method"] == PSIS
    unreliable = comparison[psis & (comparison[K_COLUMN] > 0)][
        ["dataset", "variant", "n_obs", K_COLUMN, "elpd_diff", "dse", "note"]]
    n_unreliable = unreliable["dataset"].nunique()
    methods = comparison.groupby("method", sort=False).agg(**{"fits": ("variant", "size"),
                                                              "datasets": ("dataset", "nunique"),
                                                              "refits": ("n_refits", "sum")}).reset_index()
    return page("Variants compared per dataset", "\n".join([
        f"<p>{comparison['dataset'].nunique()} dataset(s), {comparison['variant'].nunique()} variant(s): each "
        "dataset's variants compared by arviz_stats.compare (rank 0 is the best; elpd_diff is the difference "
        "to it, dse its standard error; weight: stacking).</p>",
        "<h2>Wins per variant</h2>",
        table(wins(comparison)),
        "<h2>Where each elpd comes from</h2>",
        f"<p>psis: PSIS-LOO (arviz_stats.loo); reloo: PSIS-LOO with a refit without each observation whose Pareto "
        f"k exceeds {PARETO_K} (arviz_stats.reloo); kfold: K-fold cross-validation (arviz_stats.loo_kfold). "
        "Every refit sampled the dataset without its held-out rows on the fits' compiled model (compare: in "
        "the config).</p>",
        table(methods),
        f"<h2>Unreliable comparisons ({n_unreliable} dataset(s))</h2>",
        f"<p>Datasets compared by PSIS-LOO alone although some observation's Pareto k exceeds {PARETO_K} in a "
        "variant's fit: its estimate is unreliable there (compare.method psis, or the note says why no exact "
        "method could run).</p>",
        table(unreliable, source="comparison.csv") if len(unreliable) else "<p>None.</p>",
        "<h2>comparison.csv</h2>",
        table(comparison, source="comparison.csv"),
    ]))
