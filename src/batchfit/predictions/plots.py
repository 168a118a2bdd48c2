"""The report's predicted curves: for the first datasets (``report.first_datasets``) and those named in
``report.datasets``, each predicted variable that runs along the new rows drawn against one input column
(``predict.x``: by default the grid's first column, else the first numeric input), its mean as a line and
its interval (``summary.ci_kind`` at ``summary.ci_prob``) as a band, over the dataset's observed data.

Drawn from each dataset's rows of predictions.csv and its fit's observed and constant data; rows that
differ in another input (a grid over x and group) are drawn as separate curves.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from batchfit.config import Config
from batchfit.errors import ConfigError
from batchfit.outputs.plots import plot_file_name, save_figure
from batchfit.predictions.drawn import drawn_datasets
from batchfit.predictions.table import KEY_COLUMNS, stat_columns

log = logging.getLogger("batchfit")

MAX_PANELS = 4  # predicted variables drawn per dataset
MAX_CURVES = 12  # curves per panel (combinations of the other inputs)


def write_prediction_plots(config: Config, predicted: Sequence[str]) -> list[Path]:
    """``plots/predictions/{dataset}.png`` for each dataset drawn that has predictions; returns the files."""
    unknown = [d for d in config.report.datasets if d not in predicted]
    if unknown:
        raise ConfigError(f"report.datasets names {', '.join(map(repr, unknown))}, which the sweep does not predict",
                          key="report.datasets", source=config.source)
    out = config.layout.prediction_plots
    shutil.rmtree(out, ignore_errors=True)  # no plot of a dataset no longer drawn
    out.mkdir(parents=True)
    written = []
    for dataset_id in drawn_datasets(config.report, predicted):
        rows = config.layout.prediction_rows(dataset_id)
        if not rows.exists():
            log.warning("plots: %s has no predictions to draw", dataset_id)
            continue
        written.append(out / plot_file_name(dataset_id))
        save_figure(curve_figure(config, dataset_id, pd.read_csv(rows, keep_default_na=False, na_values=[""])),
                    written[-1])
    return written


def x_column(config: Config, rows: pd.DataFrame) -> str | None:
    """The input column on the x axis (``predict.x``, the grid's first column, or the first numeric input)."""
    stats = stat_columns(config.summary)
    inputs = [c for c in rows.columns if c not in KEY_COLUMNS and c not in stats]
    numeric = [c for c in inputs if pd.api.types.is_numeric_dtype(rows[c]) and rows[c].nunique() > 1]
    predict = config.predict
    if predict.x:
        if predict.x not in numeric:
            raise ConfigError(f"predict.x names column {predict.x!r}, which is not among the new inputs' numeric "
                              f"columns ({', '.join(numeric) or 'none'})", key="predict.x", source=config.source)
        return predict.x
    first = [c for c in (predict.grid or {}) if c in numeric]
    return (first or numeric or [None])[0]


def curve_figure(config: Config, dataset_id: str, rows: pd.DataFrame) -> Figure:
    """One dataset's figure: a panel per predicted variable along the rows (at most `MAX_PANELS`)."""
    x = x_column(config, rows)
    per_row = rows[rows["row"].notna() & rows["element"].isna()]  # one value per row (an empty element)
    names = list(dict.fromkeys(per_row["variable"]))[:MAX_PANELS]
    fig = Figure(figsize=(6.5, 2.8 * max(1, len(names))), layout="constrained")
    axes = fig.subplots(max(1, len(names)), 1, squeeze=False)[:, 0]
    mean, _, low, high = stat_columns(config.summary)
    for ax, name in zip(axes, names, strict=False):
        part = per_row[per_row["variable"] == name]
        xs = part[x].to_numpy(float) if x is not None else part["row"].to_numpy(float)
        others = [c for c in part.columns if c not in (*KEY_COLUMNS, x, mean, "sd", low, high)
                  and part[c].nunique() > 1]
        groups = part.groupby(others, sort=False).indices if others else {"": np.arange(len(part))}
        colours = {}
        for label, index in list(groups.items())[:MAX_CURVES]:
            order = index[np.argsort(xs[index], kind="stable")]
            text = ", ".join(map(str, np.atleast_1d(label)))
            line = ax.plot(xs[order], part[mean].to_numpy(float)[order], lw=1.5, label=text or None)[0]
            colours[text] = line.get_color()
            ax.fill_between(xs[order], part[low].to_numpy(float)[order], part[high].to_numpy(float)[order],
                            color=line.get_color(), alpha=0.25, lw=0)
        observed = _observed(config, dataset_id, x, others[0] if len(others) == 1 else None).get(name)
        if observed is not None:
            xs_seen, ys_seen, labels = observed
            ax.scatter(xs_seen, ys_seen, s=10, zorder=3, label="observed",
                       c=[colours.get(str(label), "black") for label in labels])
        ax.set_title(f"{dataset_id}: {name} ({int(config.summary.interval_prob * 100)}% "
                     f"{config.summary.interval_kind} band)", fontsize=10)
        ax.set_xlabel(x or "new row")
        if len(groups) > 1 or observed is not None:
            ax.legend(fontsize=7)
    return fig


def _observed(config: Config, dataset_id: str, x: str | None, by: str | None
              ) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """Each observed variable of the dataset's fit against its ``x`` column (its constant data), where both
    are one value per row, with each row's label of the text column ``by`` (to colour it as its curve)."""
    import netCDF4

    fit = config.layout.fit(dataset_id)
    if x is None or not fit.exists():
        return {}
    with netCDF4.Dataset(fit) as nc:
        groups = nc.groups
        if "observed_data" not in groups or "constant_data" not in groups or x not in groups["constant_data"].variables:
            return {}
        constant = groups["constant_data"]
        xs = np.asarray(constant[x][:], dtype=float)
        labels = [""] * xs.shape[0]
        if by is not None and by in constant.variables and f"{by}_labels" in constant.variables:
            names = [str(v) for v in constant[f"{by}_labels"][:]]
            labels = [names[c] if 0 <= c < len(names) else "" for c in np.asarray(constant[by][:], dtype=int)]
        return {name: (xs, np.asarray(var[:], dtype=float), labels)
                for name, var in groups["observed_data"].variables.items()
                if var.ndim == 1 and var.shape[0] == xs.shape[0] and name not in groups["observed_data"].dimensions}
