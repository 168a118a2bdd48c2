"""The sensitivity rule: power-scaling prior and likelihood sensitivity of every fit (`outputs.sensitivity`).

`arviz_stats.psense_summary` of each fitted dataset (its fit keeps the ``log_prior`` and ``log_likelihood``
groups it needs), a dataset at a time, into ``results_dir/sensitivity.csv``; and a report page counting,
per parameter, the datasets where it is prior-sensitive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from batchfit.config import Config
from batchfit.errors import ConfigError
from batchfit.outputs.compare import fitted_datasets
from batchfit.outputs.table_page import write_table_and_page

THRESHOLD = 0.05  # psense_summary's: above it a parameter is sensitive to the prior (or likelihood) power-scaled
COLUMNS = ["dataset", "parameter", "prior", "likelihood", "diagnosis"]
# psense_summary always rounds (DataFrame.round takes no "none"): to 16 decimals, below float64's precision for
# sensitivities (small positive numbers), so sensitivity.csv keeps what psense computed.
_DECIMALS = 16


def dataset_sensitivity(fit: Path) -> pd.DataFrame:
    """One fit's rows: `arviz_stats.psense_summary` of it, a row per parameter (element)."""
    import arviz_stats
    import xarray as xr

    with xr.open_datatree(fit) as tree:
        table = arviz_stats.psense_summary(tree, threshold=THRESHOLD, round_to=_DECIMALS)
    return table.rename_axis("parameter").reset_index()


def sensitivities(config: Config) -> Iterator[pd.DataFrame]:
    """Every fitted dataset's rows, a dataset at a time."""
    if not config.outputs.sensitivity:
        raise ConfigError("the sensitivity rule needs each fit's log prior: set outputs.sensitivity: true",
                          key="outputs.sensitivity", source=config.source)
    for dataset_id in fitted_datasets(config):
        rows = dataset_sensitivity(config.layout.fit(dataset_id))
        rows.insert(0, "dataset", dataset_id)
        yield rows[COLUMNS]


def write_sensitivity(config: Config) -> list[Path]:
    """The sensitivity rule: sensitivity.csv, written a dataset at a time, and its report page."""
    return write_table_and_page(config.layout.sensitivity, COLUMNS, sensitivities(config),
                                config.layout.report_pages / "sensitivity.html", sensitivity_page,
                                keep_default_na=False)


def sensitive_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per parameter: the datasets, those where it is prior-sensitive (prior > `THRESHOLD`), and each of
    psense_summary's diagnoses counted."""
    counts = table.assign(prior_sensitive=table["prior"] > THRESHOLD).groupby("parameter", sort=False).agg(
        datasets=("dataset", "size"), prior_sensitive=("prior_sensitive", "sum"),
        median_prior=("prior", "median"), median_likelihood=("likelihood", "median"))
    diagnoses = pd.crosstab(table["parameter"], table["diagnosis"]).reindex(counts.index)
    return counts.join(diagnoses).reset_index().sort_values("prior_sensitive", ascending=False, kind="stable")


def sensitivity_page(table: pd.DataFrame) -> str:
    """The report page of sensitivity.csv: which parameters are prior-sensitive in how many datasets."""
    from batchfit.outputs.report import page
    from batchfit.outputs.report import table as html_table

    return page("Prior and likelihood sensitivity (power-scaling)", "\n".join([
        f"<p>{table['dataset'].nunique()} fitted dataset(s): arviz_stats.psense_summary of each fit. A parameter "
        f"is prior-sensitive where its prior sensitivity exceeds {THRESHOLD} (an informative prior, or a "
        "prior-data conflict when the likelihood sensitivity does too).</p>",
        "<h2>Parameters by datasets where they are prior-sensitive</h2>",
        html_table(sensitive_counts(table)),
        "<h2>sensitivity.csv</h2>",
        html_table(table, source="sensitivity.csv"),
    ]))
