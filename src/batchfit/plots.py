"""Plots of a sweep: its health, and forest plots of parameters across datasets.

The `plots` rule writes them under ``results_dir/plots/`` and Snakemake's report shows them
(``snakemake --report report.html``). They are drawn from collect's outputs only
(summary.csv, posteriors.nc), never from the per-dataset fits.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure

from batchfit import intervals
from batchfit.atomic import atomic_path
from batchfit.combined import DATASET_DIM, DATASETS, POSTERIOR, dataset_posterior
from batchfit.compat import lazy_jax_hidden
from batchfit.config import Config, ReportSettings, SummarySettings
from batchfit.errors import ConfigError
from batchfit.variables import FREE, ROLE_ATTR, select_vars, stack_elements

STATUSES = ("ok", "warning", "failed")
# The health thresholds, as named in summary.csv's `message` (see batchfit.collect._health).
REASONS = ("r_hat", "ess_bulk", "divergences")
DATASET_COLUMNS = ["dataset", "status", "message", "divergences", "max_r_hat", "min_ess_bulk", "structure",
                   "sampler_path"]
_STATUS_COLOURS = {"ok": "#4c956c", "warning": "#e09f3e", "failed": "#9e2a2b"}
_INNER_PROB = 0.5  # the thick line of a forest plot, as arviz-plots draws it


def plots_dir(config: Config) -> Path:
    return config.results_dir / "plots"


def dataset_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per dataset of summary.csv (its dataset-level columns), in summary.csv's order."""
    return summary.drop_duplicates("dataset")[DATASET_COLUMNS].reset_index(drop=True)


def status_counts(datasets: pd.DataFrame) -> dict[str, int]:
    """Datasets per status, every status present (0 when none)."""
    counts = datasets["status"].value_counts()
    return {status: int(counts.get(status, 0)) for status in STATUSES}


def reason_counts(datasets: pd.DataFrame) -> dict[str, int]:
    """Warning datasets per health threshold crossed (a dataset may cross several)."""
    # astype(str): read from a summary.csv without one message, the column holds floats (all NaN)
    messages = datasets.loc[datasets["status"] == "warning", "message"].fillna("").astype(str)
    return {reason: int(messages.str.contains(reason, regex=False).sum()) for reason in REASONS}


def plot_health(summary: pd.DataFrame, path: Path) -> None:
    """Bar charts: datasets per status, and warnings per threshold crossed."""
    datasets = dataset_table(summary)
    counts, reasons = status_counts(datasets), reason_counts(datasets)
    fig = Figure(figsize=(9, 3), layout="constrained")
    left, right = fig.subplots(1, 2)
    bars = left.barh(list(counts), list(counts.values()), color=[_STATUS_COLOURS[s] for s in counts])
    left.bar_label(bars)
    left.set_title(f"{len(datasets)} datasets")
    left.invert_yaxis()
    bars = right.barh(list(reasons), list(reasons.values()), color=_STATUS_COLOURS["warning"])
    right.bar_label(bars)
    right.set_title("warnings by threshold crossed")
    right.invert_yaxis()
    for ax in (left, right):
        ax.set_xlabel("datasets")
        ax.set_xlim(0, max(1, *counts.values()) * 1.15)
    _save(fig, path)


def forest_variables(posterior: xr.Dataset, settings: ReportSettings) -> list[str]:
    """The variables `report.var_names` selects, or by default the scalar free parameters (of posteriors.nc)."""
    if settings.var_names is None:
        return [str(name) for name, var in posterior.data_vars.items()
                if var.attrs.get(ROLE_ATTR, FREE) == FREE and set(var.dims) <= {DATASET_DIM, "chain", "draw"}]
    try:
        return select_vars([str(name) for name in posterior.data_vars], settings.var_names, settings.filter_vars)
    except ValueError as exc:
        raise ConfigError(f"{exc}, in posteriors.nc (which holds the variables summary.var_names selects)",
                          key="report.var_names") from None


def forest_draws(posteriors_path: Path, settings: ReportSettings) -> dict[str, xr.DataArray]:
    """Per forest variable, every dataset's draws along one dimension `dataset`, shaped (chain, draw, dataset).

    A scalar's row is its dataset (``store_007``); a vector's rows are its elements in each
    dataset (``store_007 a[g01]``), since datasets may have different coordinates. Only the
    forest variables are read from posteriors.nc, and only the elements each dataset has.
    """
    with xr.open_datatree(posteriors_path) as tree:
        stacked = tree[POSTERIOR].to_dataset()
        names = forest_variables(stacked, settings)
        stacked = stacked[names].load()
        info = tree[DATASETS].to_dataset().load()
    labels: dict[str, list[str]] = {n: [] for n in names}
    blocks: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for dataset_id in map(str, stacked[DATASET_DIM].values):
        posterior = dataset_posterior(stacked, info, dataset_id)
        for name in names:
            if name not in posterior.data_vars:
                continue
            element_labels, _, draws = stack_elements(posterior[[name]])
            scalar = element_labels == [name]
            labels[name] += [dataset_id if scalar else f"{dataset_id} {label}" for label in element_labels]
            blocks[name].append(draws)
    return {name: xr.DataArray(np.moveaxis(np.concatenate(blocks[name]), 0, -1), dims=("chain", "draw", "dataset"),
                               coords={"dataset": labels[name]}, name=name) for name in names if blocks[name]}


def forest_figure(draws: xr.DataArray, *, max_rows: int, summary: SummarySettings) -> Figure:
    """A forest plot of one variable across datasets: a row each, in order from the top, labelled;
    past `max_rows` rows a summary view, sorted by mean with a label on a few rows only.

    Each row shows its mean, its `summary.ci_kind` interval at `summary.ci_prob` (as
    summary.csv's) and at 50% (thicker), as arviz-stats defines them (`batchfit.intervals`): what
    arviz-plots' ``plot_forest(combined=True)`` shows, drawn in three matplotlib calls for all
    rows at once (arviz-plots draws each row with calls of its own: 97 s for 1,000 rows, and
    most of the plots rule's time at 20).
    """
    n_rows = draws.sizes["dataset"]
    flat = draws.transpose("dataset", ...).values.reshape(n_rows, -1)
    interval = intervals.eti if summary.ci_kind == "eti" else intervals.hdi
    outer = interval(flat, summary.interval_prob)
    inner = interval(flat, _INNER_PROB)
    mean = flat.mean(axis=-1)
    labels = [str(label) for label in draws["dataset"].values]
    sorted_view = n_rows > max_rows
    # order[row]: the dataset drawn at height `row` (row 0 at the bottom)
    order = np.argsort(mean, kind="stable") if sorted_view else np.arange(n_rows)[::-1]
    rows = np.arange(n_rows)
    fig = Figure(figsize=(7, 6) if sorted_view else (7, 1.2 + 0.25 * n_rows), layout="constrained")
    ax = fig.subplots()
    ax.hlines(rows, outer[order, 0], outer[order, 1], lw=0.6 if sorted_view else 1.0, color="C0",
              alpha=0.5 if sorted_view else 1.0, label=f"{int(summary.interval_prob * 100)}% {summary.ci_kind}")
    ax.hlines(rows, inner[order, 0], inner[order, 1], lw=1.5 if sorted_view else 3.0, color="C0",
              label=f"50% {summary.ci_kind}")
    ax.plot(mean[order], rows, ".", ms=2 if sorted_view else 6, color="k", label="mean")
    ticks = np.unique(np.linspace(0, n_rows - 1, 11).round().astype(int)) if sorted_view else rows
    ax.set_yticks(ticks, [labels[order[i]] for i in ticks], fontsize=8)
    ax.set_ylim(-1, n_rows)
    ax.set_title(f"{draws.name}: {n_rows} rows sorted by posterior mean" if sorted_view else str(draws.name))
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)  # below, over no row
    return fig


def plot_file_name(name: str) -> str:
    """A file name for a variable's plot (a variable name may hold characters a path may not)."""
    return re.sub(r"[^\w.+-]", "_", name) + ".png"


def write_plots(config: Config) -> list[Path]:
    """The `plots` rule: ``plots/health.png`` and ``plots/forest/{variable}.png``; returns the files written."""
    out = plots_dir(config)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "health.png"]
    with lazy_jax_hidden():
        plot_health(pd.read_csv(config.summary_path), written[0])
        forest_dir = out / "forest"
        shutil.rmtree(forest_dir, ignore_errors=True)  # no plot of a variable no longer selected
        forest_dir.mkdir()
        for name, draws in forest_draws(config.posteriors_path, config.report).items():
            written.append(forest_dir / plot_file_name(name))
            _save(forest_figure(draws, max_rows=config.report.max_rows, summary=config.summary), written[-1])
    return written


def copy_sbc_plots(sources: Sequence[str | Path], sbc_dir: str | Path, out: str | Path) -> None:
    """Copy the SBC run's PNG plots (under `sbc_dir`) to `out`, keeping their relative paths, for the report."""
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    for source in map(Path, sources):
        target = out / source.relative_to(sbc_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    out.mkdir(parents=True, exist_ok=True)


def _save(fig: Figure, path: Path) -> None:
    """Write a figure atomically, as every output of a sweep (a `Figure` without pyplot: nothing to close)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
