"""The compare rule: the variants of a sweep compared per dataset by PSIS-LOO (arviz-stats).

For each dataset every variant fitted, `arviz_stats.loo` of each variant's fit and `arviz_stats.compare`
across them (stacking weights) give one row per variant in ``results_dir/comparison.csv``. Datasets are
read one at a time (each variant's fit of it, then closed), so memory does not grow with the sweep.
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
from batchfit.outputs.table_page import write_table_and_page
from batchfit.variants import variant_configs

log = logging.getLogger("batchfit")

PARETO_K = 0.7  # above it, PSIS-LOO's estimate for an observation is unreliable (Vehtari et al. 2024)
K_COLUMN = f"n_pareto_k_gt_{PARETO_K}"  # observations of the dataset whose Pareto k exceeds PARETO_K
COLUMNS = ["dataset", "variant", "elpd_loo", "se", "p_loo", "n_obs", K_COLUMN, "rank", "elpd_diff", "dse", "weight"]
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


def compare_dataset(fits: Mapping[str, Path]) -> pd.DataFrame:
    """One dataset's rows of comparison.csv: `arviz_stats.loo` of each variant's fit, `arviz_stats.compare`
    across them (stacking weights), in the order of ``fits``."""
    import arviz_stats
    import xarray as xr

    elpds = {}
    for variant, path in fits.items():
        with xr.open_datatree(path) as tree:
            elpds[variant] = arviz_stats.loo(tree, pointwise=True)
    table = arviz_stats.compare(elpds, method="stacking", round_to="none")
    rows = []
    for variant, elpd in elpds.items():
        k = np.asarray(elpd.pareto_k)
        rows.append({"variant": variant, "elpd_loo": elpd.elpd, "se": elpd.se, "p_loo": elpd.p,
                     "n_obs": elpd.n_data_points, K_COLUMN: int(np.sum(k > PARETO_K)),
                     **{column: table.loc[variant, column] for column in ("rank", "elpd_diff", "dse", "weight")}})
    return pd.DataFrame(rows)


def comparisons(config: Config) -> Iterator[pd.DataFrame]:
    """Every dataset's rows, a dataset at a time: those at least two variants fitted, in the sweep's order."""
    configs = compared_variants(config)
    listed = {variant: fitted_datasets(c) for variant, c in configs.items()}
    fitted = {variant: set(ids) for variant, ids in listed.items()}
    for dataset_id in dict.fromkeys(d for ids in listed.values() for d in ids):
        fits = {variant: c.layout.fit(dataset_id) for variant, c in configs.items() if dataset_id in fitted[variant]}
        if len(fits) < 2:
            log.warning("compare: dataset %s left out, fitted by %d variant(s) only", dataset_id, len(fits))
            continue
        rows = compare_dataset(fits)
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
    """The report page of comparison.csv: wins per variant, the datasets whose comparison Pareto k makes
    unreliable, and the table itself."""
    from batchfit.outputs.report import page, table

    unreliable = comparison[comparison[K_COLUMN] > 0][["dataset", "variant", "n_obs", K_COLUMN, "elpd_diff", "dse"]]
    n_unreliable = unreliable["dataset"].nunique()
    return page("Variants compared per dataset (PSIS-LOO)", "\n".join([
        f"<p>{comparison['dataset'].nunique()} dataset(s), {comparison['variant'].nunique()} variant(s): each "
        "dataset's variants compared by arviz_stats.compare (rank 0 is the best; elpd_diff is the difference "
        "to it, dse its standard error; weight: stacking).</p>",
        "<h2>Wins per variant</h2>",
        table(wins(comparison)),
        f"<h2>Unreliable comparisons ({n_unreliable} dataset(s))</h2>",
        f"<p>Datasets where some observation's Pareto k exceeds {PARETO_K} in a variant's fit: PSIS-LOO's "
        "estimate is unreliable there (refit without the observation, K-fold cross-validation, or moment "
        "matching).</p>",
        table(unreliable, source="comparison.csv") if len(unreliable) else "<p>None.</p>",
        "<h2>comparison.csv</h2>",
        table(comparison, source="comparison.csv"),
    ]))
