"""Plots of a sweep: its health, and forest plots of parameters across datasets.

The `plots` rule writes them under ``results_dir/plots/`` and Snakemake's report shows them
(``snakemake --report report.html``). They are drawn from collect's outputs only
(summary.csv, posteriors.nc), never from the per-dataset fits.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import netCDF4
import numpy as np
import pandas as pd
import xarray as xr

from batchfit.common import collector
from batchfit.common.atomic import atomic_path
from batchfit.config import Config
from batchfit.errors import ConfigError
from batchfit.model.variables import DETERMINISTIC, FREE, ROLE_ATTR, select_vars, stack_elements
from batchfit.outputs import intervals
from batchfit.outputs.combined import DATASET_DIM, POSTERIOR, dataset_posterior, no_chunk_cache, open_presence
from batchfit.settings import ReportSettings, SummarySettings

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: the report pages read this module's tables
    from matplotlib.figure import Figure

log = logging.getLogger("batchfit")

STATUSES = ("ok", "warning", "failed")
# The health thresholds, as named in datasets.csv's `message` (see batchfit.outputs.health.score_health).
REASONS = ("r_hat", "ess_bulk", "ess_tail", "divergences", "max_treedepth_fraction", "min_bfmi", "rows")
# datasets.csv's text columns, typed when it is read in parts: a part whose datasets have no message
# would read its message column as float.
_TEXT_COLUMNS = ("dataset", "parameter", "path", "groups", "status", "message", "stage", "structure",
                 "sampler_path", "fallback")
# Rows of summary.csv or datasets.csv read at a time: what a reader holds at once must not grow with the
# sweep, and parsing a part costs memory in proportion to its rows.
SUMMARY_ROWS_AT_ONCE = 5_000
_STATUS_COLOURS = {"ok": "#4c956c", "warning": "#e09f3e", "failed": "#9e2a2b"}
_INNER_PROB = 0.5  # the thick line of a forest plot, as arviz-plots draws it
# Datasets read from posteriors.nc at once for the forest plots: a block of tiny fits' draws is
# small, and reading in blocks keeps the rule's memory flat in N.
# Fewer for a vector variable, as many elements of each variable at once as datasets of a scalar.
FOREST_BLOCK = 256


@dataclass(frozen=True)
class SweepHealth:
    """The datasets of datasets.csv by status and by health threshold crossed, and its first warnings."""

    n_datasets: int
    counts: dict[str, int]  # datasets per status, every status present
    reasons: dict[str, int]  # warning datasets per threshold crossed (a dataset may cross several)
    warnings: pd.DataFrame  # the first warning datasets (datasets.csv rows), at most the max_rows asked for
    n_warnings: int


def summary_parts(summary_path: Path, rows_at_once: int = SUMMARY_ROWS_AT_ONCE,
                  columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
    """summary.csv or datasets.csv (``columns`` of it, default all) ``rows_at_once`` rows at a time, its text
    columns as text.

    The text columns are read as Python strings (``object``), not pandas 3's ``str``: that dtype
    keeps its strings in pyarrow's memory pool, whose memory grew with the parts read (the report
    pages' summary table grew with N; as ``object`` it stays flat).
    """
    header = pd.read_csv(summary_path, nrows=0).columns
    text = {column: object for column in _TEXT_COLUMNS
            if column in header and (columns is None or column in columns)}
    return pd.read_csv(summary_path, usecols=columns, dtype=text, chunksize=rows_at_once)


def read_health(datasets_path: Path, max_rows: int, rows_at_once: int = SUMMARY_ROWS_AT_ONCE) -> SweepHealth:
    """The `SweepHealth` of a datasets.csv (a row per dataset), read a part at a time and kept as counts:
    a row per dataset would make the memory of the plots and report rules grow with the sweep."""
    n, counts, reasons, first, n_warnings = 0, dict.fromkeys(STATUSES, 0), dict.fromkeys(REASONS, 0), [], 0
    for datasets in summary_parts(datasets_path, rows_at_once):
        n += len(datasets)
        for totals, part_counts in ((counts, status_counts(datasets)), (reasons, reason_counts(datasets))):
            for key, count in part_counts.items():
                totals[key] += count
        warned = datasets[datasets["status"] == "warning"]
        first.append(warned.head(max(0, max_rows - n_warnings)))
        n_warnings += len(warned)
    table = (pd.concat(first, ignore_index=True) if first
             else pd.DataFrame(columns=pd.read_csv(datasets_path, nrows=0).columns))
    return SweepHealth(n, counts, reasons, table, n_warnings)


def status_counts(datasets: pd.DataFrame) -> dict[str, int]:
    """Datasets per status, every status present (0 when none)."""
    counts = datasets["status"].value_counts()
    return {status: int(counts.get(status, 0)) for status in STATUSES}


def reason_counts(datasets: pd.DataFrame) -> dict[str, int]:
    """Warning datasets per health threshold crossed (a dataset may cross several)."""
    # astype(str): read from a summary.csv without one message, the column holds floats (all NaN)
    messages = datasets.loc[datasets["status"] == "warning", "message"].fillna("").astype(str)
    return {reason: int(messages.str.contains(reason, regex=False).sum()) for reason in REASONS}


def plot_health(health: SweepHealth, path: Path) -> None:
    """Write `health_figure` to `path`."""
    save_figure(health_figure(health), path)


def health_figure(health: SweepHealth) -> Figure:
    """Bar charts: datasets per status, and warnings per threshold crossed."""
    from matplotlib.figure import Figure

    counts, reasons = health.counts, health.reasons
    fig = Figure(figsize=(9, 3), layout="constrained")
    left, right = fig.subplots(1, 2)
    bars = left.barh(list(counts), list(counts.values()), color=[_STATUS_COLOURS[s] for s in counts])
    left.bar_label(bars)
    left.set_title(f"{health.n_datasets} datasets")
    left.invert_yaxis()
    bars = right.barh(list(reasons), list(reasons.values()), color=_STATUS_COLOURS["warning"])
    right.bar_label(bars)
    right.set_title("warnings by threshold crossed")
    right.invert_yaxis()
    for ax in (left, right):
        ax.set_xlabel("datasets")
        ax.set_xlim(0, max(1, *counts.values()) * 1.15)
    return fig


def forest_variables(posterior: xr.Dataset, settings: ReportSettings, excluded: Sequence[str] = ()) -> list[str]:
    """The variables of posteriors.nc that `report.var_names` selects, or by default `default_forest_variables`.

    ``excluded``: the variables collect left out of posteriors.nc (their dims differ between
    datasets); `report.var_names` may name them, but they have no rows to draw, which the
    plots log says. Of a posteriors.nc without a dataset nothing is selected: it holds no
    variable to check the names against.
    """
    available = [str(name) for name in posterior.data_vars]
    if not posterior.sizes.get(DATASET_DIM, 0):
        return []
    if settings.var_names is None:
        return default_forest_variables(posterior)
    try:
        chosen = select_vars([*available, *excluded], settings.var_names, settings.filter_vars)
    except ValueError as exc:
        raise ConfigError(f"{exc}, in posteriors.nc (which holds the variables summary.var_names selects)",
                          key="report.var_names") from None
    left_out = [name for name in chosen if name not in available]
    if left_out:
        log.warning("plots: no forest plot of %s: collect left it out of posteriors.nc, as its dims differ "
                    "between datasets (read it from fits/{id}.nc)", ", ".join(left_out))
    return [name for name in chosen if name in available]


def default_forest_variables(posterior: xr.Dataset) -> list[str]:
    """The forest plots drawn without `report.var_names`: the model's scalar deterministics in posteriors.nc
    when it has some, else its scalar free parameters.

    Named deterministics (``pm.Deterministic("t_half", ...)``) are the quantities a user defined to read,
    so they come first. A model without either scalar kind gets its vector and matrix free parameters (a
    row per dataset and element), and one of which posteriors.nc holds no free parameter
    (``outputs.var_names`` or ``summary.var_names`` kept only deterministics) its vector deterministics:
    every sweep with something to draw gets forest plots.
    """
    roles = {str(name): var.attrs.get(ROLE_ATTR, FREE) for name, var in posterior.data_vars.items()}

    def scalars(pool: list[str]) -> list[str]:
        return [name for name in pool if set(posterior[name].dims) <= {DATASET_DIM, "chain", "draw"}]

    named = scalars([name for name, role in roles.items() if role == DETERMINISTIC])
    if named:
        return named
    free = [name for name, role in roles.items() if role == FREE]
    for pool in (free, [name for name in roles if name not in free]):
        if pool:
            return scalars(pool) or pool
    return []


@dataclass(frozen=True)
class ForestRows:
    """One forest variable's rows, top to bottom in the sweep's order: a label, the mean and two intervals each."""

    name: str
    labels: list[str]
    mean: np.ndarray  # (row,)
    outer: np.ndarray  # (row, 2): summary.ci_kind at summary.interval_prob, as summary.csv's
    inner: np.ndarray  # (row, 2): summary.ci_kind at 50%


def forest_rows(posteriors_path: Path, settings: ReportSettings, summary: SummarySettings,
                block: int = FOREST_BLOCK) -> dict[str, ForestRows]:
    """Per forest variable, a row per dataset: ``store_007`` for a scalar, ``store_007 a[g01]`` per element
    of a vector (datasets may have different coordinates); the intervals as arviz-stats defines them
    (`batchfit.outputs.intervals`).

    posteriors.nc is read `block` datasets at a time (a vector of n elements: ``block // n``),
    only the forest variables and only the elements each dataset has: the rule's memory is a
    block's draws, not the sweep's.
    """
    interval = intervals.of_kind(summary.interval_kind)
    parts: dict[str, list[tuple[list[str], np.ndarray, np.ndarray, np.ndarray]]] = {}
    info = open_presence(posteriors_path)
    # Each block is read once: netCDF's chunk cache (up to 64 MiB a variable) would only grow with N.
    with no_chunk_cache():
        with _posterior_group(posteriors_path) as stacked:
            names = forest_variables(stacked, settings, excluded_variables(posteriors_path))
            ids = [str(d) for d in stacked[DATASET_DIM].values]
            widest = max((stacked[name][{DATASET_DIM: 0, "chain": 0, "draw": 0}].size for name in names), default=1)
        if not names:
            return {}  # and nothing to read: no variable is no block of datasets
        block = max(1, block // widest)
        for start in range(0, len(ids), block):
            # The file is opened again for each block: HDF5's metadata cache and free lists of an
            # open file grow with the blocks read from it, so one open file's memory grows with N.
            with _posterior_group(posteriors_path) as stacked:
                loaded = stacked[names].isel({DATASET_DIM: slice(start, start + block)}).load()
            labels: dict[str, list[str]] = {n: [] for n in names}
            rows: dict[str, list[np.ndarray]] = {n: [] for n in names}
            for dataset_id in ids[start:start + block]:
                posterior = dataset_posterior(loaded, info, dataset_id)
                for name in (n for n in names if n in posterior.data_vars):
                    element_labels, _, draws = stack_elements(posterior[[name]])
                    scalar = element_labels == [name]
                    labels[name] += [dataset_id if scalar else f"{dataset_id} {label}" for label in element_labels]
                    rows[name].append(draws.reshape(len(element_labels), -1))
            for name in (n for n in names if rows[n]):
                flat = np.concatenate(rows[name])
                parts.setdefault(name, []).append((labels[name], flat.mean(axis=-1),
                                                   interval(flat, summary.interval_prob), interval(flat, _INNER_PROB)))
    return {name: ForestRows(name, [label for part in parts[name] for label in part[0]],
                             *(np.concatenate([part[i] for part in parts[name]]) for i in (1, 2, 3)))
            for name in names if name in parts}  # in posteriors.nc's order


def excluded_variables(posteriors_path: Path) -> list[str]:
    """The variables collect left out of posteriors.nc because their dims differ between datasets."""
    with netCDF4.Dataset(posteriors_path) as nc:
        return list(json.loads(nc.__dict__.get("excluded_variables", "{}")))


def _posterior_group(posteriors_path: Path) -> xr.Dataset:
    """posteriors.nc's stacked posteriors, opened lazily (nothing read until a block is loaded)."""
    return xr.open_dataset(posteriors_path, group=POSTERIOR, engine="netcdf4")


def forest_figure(rows: ForestRows, *, max_rows: int, summary: SummarySettings) -> Figure:
    """A forest plot of one variable across datasets: a row each, in order from the top, labelled;
    past `max_rows` rows a summary view, sorted by mean with a label on a few rows only.

    Each row shows its mean, its `summary.ci_kind` interval at `summary.ci_prob` (as
    summary.csv's) and at 50% (thicker): what arviz-plots' ``plot_forest(combined=True)`` shows,
    drawn in three matplotlib calls for all rows at once (arviz-plots draws each row with calls
    of its own, most of the plots rule's time even for a small sweep).
    """
    from matplotlib.figure import Figure

    n_rows = len(rows.labels)
    sorted_view = n_rows > max_rows
    # order[row]: the dataset drawn at height `row` (row 0 at the bottom)
    order = np.argsort(rows.mean, kind="stable") if sorted_view else np.arange(n_rows)[::-1]
    heights = np.arange(n_rows)
    fig = Figure(figsize=(7, 6) if sorted_view else (7, 1.2 + 0.25 * n_rows), layout="constrained")
    ax = fig.subplots()
    ax.hlines(heights, rows.outer[order, 0], rows.outer[order, 1], lw=0.6 if sorted_view else 1.0, color="C0",
              alpha=0.5 if sorted_view else 1.0, label=f"{int(summary.interval_prob * 100)}% {summary.interval_kind}")
    ax.hlines(heights, rows.inner[order, 0], rows.inner[order, 1], lw=1.5 if sorted_view else 3.0, color="C0",
              label=f"50% {summary.interval_kind}")
    ax.plot(rows.mean[order], heights, ".", ms=2 if sorted_view else 6, color="k", label="mean")
    ticks = np.unique(np.linspace(0, n_rows - 1, 11).round().astype(int)) if sorted_view else heights
    ax.set_yticks(ticks, [rows.labels[order[i]] for i in ticks], fontsize=8)
    ax.set_ylim(-1, n_rows)
    ax.set_title(f"{rows.name}: {n_rows} rows sorted by posterior mean" if sorted_view else rows.name)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)  # below, over no row
    return fig


def plot_file_name(name: str) -> str:
    """A file name for a variable's plot (a variable name may hold characters a path may not)."""
    return re.sub(r"[^\w.+-]", "_", name) + ".png"


def write_plots(config: Config) -> list[Path]:
    """The `plots` rule: ``plots/health.png`` and ``plots/forest/{variable}.png``; returns the files written."""
    out = config.layout.plots
    out.mkdir(parents=True, exist_ok=True)
    written = [config.layout.health_plot]
    plot_health(read_health(config.layout.datasets_csv, max_rows=0), written[0])
    collector.resume()  # matplotlib's imports and fonts, loaded for the first figure, live to the end
    forest_dir = config.layout.forest_plots
    shutil.rmtree(forest_dir, ignore_errors=True)  # no plot of a variable no longer selected
    forest_dir.mkdir()
    forests = forest_rows(config.layout.posteriors, config.report, config.summary)
    for name, rows in forests.items():
        written.append(forest_dir / plot_file_name(name))
        save_figure(forest_figure(rows, max_rows=config.report.max_rows, summary=config.summary), written[-1])
    if not forests:
        log.warning("plots: no forest plot: %s", nothing_to_draw(config.layout.posteriors))
    return written


def nothing_to_draw(posteriors_path: Path) -> str:
    """Why posteriors.nc gives no forest plot (when `forest_rows` finds none), in words for the plots log."""
    with netCDF4.Dataset(posteriors_path) as nc:
        n_datasets = len(nc[POSTERIOR].dimensions[DATASET_DIM])
        n_variables = len([name for name in nc[POSTERIOR].variables if name not in nc[POSTERIOR].dimensions])
    if not n_datasets:
        return "no dataset was fitted (posteriors.nc holds none; failures.csv says why)"
    if not n_variables:
        return ("posteriors.nc holds no variable: the fits keep only observation-sized deterministics, which "
                "posteriors.nc and summary.csv leave out unless summary.var_names names them")
    return "report.var_names selects no variable that posteriors.nc holds"


def copy_sbc_plots(sources: Sequence[str | Path], sbc_dir: str | Path, out: str | Path) -> None:
    """Copy the SBC run's PNG plots (under `sbc_dir`) to `out`, keeping their relative paths, for the report."""
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    for source in map(Path, sources):
        target = out / source.relative_to(sbc_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    out.mkdir(parents=True, exist_ok=True)


def save_figure(fig: Figure, path: Path) -> None:
    """Write a figure atomically, as every output of a sweep (a `Figure` without pyplot: nothing to close)."""
    with atomic_path(path) as tmp:
        # Not bbox_inches="tight": the constrained layout already fits the figure to its
        # contents, and "tight" draws every figure twice.
        fig.savefig(tmp, dpi=100)
