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

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr
from arviz_stats.base import array_stats

from batchfit.atomic import atomic_path
from batchfit.collect import _ci_prob, _stack_elements
from batchfit.combined import DATASET_DIM, DATASETS, POSTERIOR, dataset_posterior
from batchfit.compat import lazy_jax_hidden
from batchfit.config import Config, ReportSettings, SummarySettings
from batchfit.errors import ConfigError
from batchfit.variables import FREE, ROLE_ATTR, select_vars

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
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3), layout="constrained")
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
            element_labels, _, draws = _stack_elements(posterior[[name]])
            scalar = element_labels == [name]
            labels[name] += [dataset_id if scalar else f"{dataset_id} {label}" for label in element_labels]
            blocks[name].append(draws)
    return {name: xr.DataArray(np.moveaxis(np.concatenate(blocks[name]), 0, -1), dims=("chain", "draw", "dataset"),
                               coords={"dataset": labels[name]}, name=name) for name in names if blocks[name]}


def forest_figure(draws: xr.DataArray, *, max_rows: int, summary: SummarySettings) -> plt.Figure:
    """A forest plot of one variable across datasets (arviz-plots), or a summary view past `max_rows` rows.

    Intervals are `summary.ci_kind` at `summary.ci_prob` (as summary.csv's) and at 50%.
    """
    n_rows = draws.sizes["dataset"]
    if n_rows > max_rows:
        return _sorted_intervals_figure(draws, summary)
    import arviz_plots as azp

    tree = xr.DataTree.from_dict({"posterior": draws.to_dataset()})
    pc = azp.plot_forest(tree, combined=True, backend="matplotlib", ci_kind=summary.ci_kind,
                         ci_probs=(_INNER_PROB, _ci_prob(summary)),
                         figure_kwargs={"figsize": (7, 1.2 + 0.25 * n_rows)})
    return pc.viz["figure"].item()


def _sorted_intervals_figure(draws: xr.DataArray, summary: SummarySettings) -> plt.Figure:
    """Summary view for many rows: every row's intervals, sorted by mean, a label on a few rows only.

    arviz-plots' forest draws each row with separate calls (97 s for 1,000 rows), so this view
    draws all intervals at once with matplotlib, from arviz-stats' interval functions.
    """
    flat = draws.transpose("dataset", ...).values.reshape(draws.sizes["dataset"], -1)
    interval = array_stats.eti if summary.ci_kind == "eti" else array_stats.hdi
    outer = interval(flat, _ci_prob(summary), axis=-1)
    inner = interval(flat, _INNER_PROB, axis=-1)
    mean = flat.mean(axis=-1)
    order = np.argsort(mean, kind="stable")
    rows = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(7, 6), layout="constrained")
    ax.hlines(rows, outer[order, 0], outer[order, 1], lw=0.6, color="C0", alpha=0.5,
              label=f"{int(_ci_prob(summary) * 100)}% {summary.ci_kind}")
    ax.hlines(rows, inner[order, 0], inner[order, 1], lw=1.5, color="C0", label=f"50% {summary.ci_kind}")
    ax.plot(mean[order], rows, ".", ms=2, color="k", label="mean")
    ticks = np.unique(np.linspace(0, len(order) - 1, 11).round().astype(int))
    ax.set_yticks(ticks, [str(draws["dataset"].values[order[i]]) for i in ticks], fontsize=8)
    ax.set_ylim(-1, len(order))
    ax.set_title(f"{draws.name}: {len(order)} rows sorted by posterior mean")
    ax.legend(loc="lower right", fontsize=8)
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


def _save(fig: plt.Figure, path: Path) -> None:
    """Write a figure atomically, as every output of a sweep, and free it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
    plt.close(fig)
