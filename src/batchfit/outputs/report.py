"""HTML pages of a sweep for Snakemake's report: health overview, diagnostics and failures tables, provenance.

The `report_pages` rule writes them under ``results_dir/report/``; Snakemake's report
(``snakemake --report report.html``) shows each one as a page. They are standalone HTML
files, so they open in a browser without the report too.
"""

from __future__ import annotations

import datetime
import html
import platform
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
import yaml

from batchfit import __version__
from batchfit.common.atomic import atomic_path
from batchfit.common.hashing import file_sha256
from batchfit.compile.fingerprint import LIBRARIES
from batchfit.config import Config, config_to_dict
from batchfit.outputs.combined import dataset_text
from batchfit.outputs.plots import SUMMARY_ROWS_AT_ONCE, SweepHealth, read_health, summary_parts

# Rows of a table page past which only the first rows are shown (the file has them all): a
# 1,000-dataset sweep's summary.csv has ~10,000 rows, which a browser shows but nobody reads.
MAX_TABLE_ROWS = 2000
# The fits' recorded attributes the provenance page counts, each group of them as one table.
COUNTED = (("versions",), ("model_hash",), ("compile_key", "structure", "sampler_path"))
REPORT_LIBRARIES = (*LIBRARIES, "arviz-base", "arviz-stats", "arviz-plots", "xarray", "pandas", "snakemake")
_STATUS_ORDER = {"failed": 0, "warning": 1, "ok": 2}
_CSS = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1em; color: rgb(34, 34, 34); }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; position: sticky; top: 0; }
tr.warning td { background: #fdf0dc; } tr.failed td { background: #f6dcdc; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; }
"""


def page(title: str, body: str) -> str:
    """A standalone HTML page (no scripts, no external resources)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head>\n<body><h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def table(frame: pd.DataFrame, *, max_rows: int = MAX_TABLE_ROWS, source: str = "", total: int | None = None) -> str:
    """An HTML table of `frame` (escaped), rows coloured by a `status` column, cut after `max_rows` rows.

    ``total``: the rows of the whole table when `frame` holds only its first rows.
    """
    shown = frame.head(max_rows)
    total = len(frame) if total is None else total
    note = (f"<p>Showing the first {max_rows} of {total} rows; {html.escape(source)} has them all.</p>"
            if total > max_rows else "")
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for record in shown.itertuples(index=False):
        values = dict(zip(shown.columns, record, strict=True))
        status = f' class="{html.escape(str(values["status"]))}"' if "status" in values else ""
        cells = "".join(f"<td>{html.escape(_cell(v))}</td>" for v in record)
        rows.append(f"<tr{status}>{cells}</tr>")
    return f"{note}<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _cell(value: object) -> str:
    """A table cell: empty for missing values, numbers with 4 significant digits."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _key_values(items: Mapping[str, object]) -> str:
    return table(pd.DataFrame({"": list(items), "value": [str(v) for v in items.values()]}))


def health_page(health: SweepHealth, failures: pd.DataFrame, config: Config) -> str:
    """Datasets ok / warning / failed, the thresholds, and every warning (up to the table's rows) and
    failure with its reason."""
    h = config.health
    checked = "the free parameters" if h.var_names is None else ", ".join(h.var_names)
    warnings = health.warnings.drop(columns=["status"])
    parts = [
        table(pd.DataFrame([health.counts | {"total": health.n_datasets}])),
        f"<p>A fit is a <b>warning</b> when any of its r_hat &gt; {h.max_r_hat}, any ess_bulk &lt; "
        f"{h.min_ess_bulk} or any ess_tail &lt; {h.min_ess_tail} (checked on {html.escape(checked)}), it has "
        f"more than {h.max_divergences} divergent transitions, more than a share of {h.max_treedepth_fraction} "
        f"of its draws stopped at the maximum tree depth (max_treedepth_fraction), a chain's E-BFMI is "
        f"below {h.min_bfmi} (min_bfmi)" + (f" or its dataset has fewer than {h.min_rows} rows" if h.min_rows else "")
        + ": CmdStan's <code>diagnose</code> checks (config key <code>health</code>).</p>",
        "<h2>Warnings by threshold crossed</h2>",
        table(pd.DataFrame([health.reasons])),
        f"<h2>Warnings ({health.n_warnings})</h2>",
        table(warnings, source="datasets.csv", total=health.n_warnings) if health.n_warnings else "<p>No warnings.</p>",
        f"<h2>Failures ({len(failures)})</h2>",
        table(failures, source="failures.csv") if len(failures) else "<p>No dataset failed.</p>",
    ]
    return page("Health of the sweep", "\n".join(parts))


def summary_page(datasets_path: Path, summary_path: Path, *, max_rows: int = MAX_TABLE_ROWS,
                 rows_at_once: int = SUMMARY_ROWS_AT_ONCE) -> str:
    """datasets.csv as a table, failed and warning datasets first, then summary.csv (the first ``max_rows``
    rows of each)."""
    first, total = first_rows_by_status(datasets_path, max_rows, rows_at_once)
    statistics, n_statistics = first_rows(summary_path, max_rows, rows_at_once)
    return page("Datasets and diagnostics", "\n".join([
        "<h2>Datasets (datasets.csv), failed and warning ones first</h2>",
        table(first, max_rows=max_rows, source="datasets.csv", total=total),
        "<h2>Diagnostics per parameter (summary.csv)</h2>",
        table(statistics, max_rows=max_rows, source="summary.csv", total=n_statistics)]))


def first_rows(path: Path, max_rows: int, rows_at_once: int) -> tuple[pd.DataFrame, int]:
    """The first ``max_rows`` rows of a CSV file and its row count, read ``rows_at_once`` rows at a time."""
    kept, total = [], 0
    for part in summary_parts(path, rows_at_once):
        kept.append(part.head(max(0, max_rows - total)))
        total += len(part)
    return (pd.concat(kept, ignore_index=True) if kept else pd.read_csv(path, nrows=0)), total


def first_rows_by_status(datasets_path: Path, max_rows: int, rows_at_once: int) -> tuple[pd.DataFrame, int]:
    """The first ``max_rows`` rows of datasets.csv sorted (stably) by status, failed first, and its row count.

    Read ``rows_at_once`` rows at a time, keeping at most ``max_rows`` of each status: memory
    does not grow with the sweep.
    """
    kept: dict[int, list[pd.DataFrame]] = {}
    counts: Counter[int] = Counter()
    total = 0
    for part in summary_parts(datasets_path, rows_at_once):
        total += len(part)
        order = part["status"].map(_STATUS_ORDER).fillna(len(_STATUS_ORDER)).astype(int)  # unknown ones last
        for rank, rows in part.groupby(order, sort=True):
            wanted = max_rows - counts[rank]
            if wanted > 0:
                kept.setdefault(rank, []).append(rows.head(wanted))
                counts[rank] += min(wanted, len(rows))
    parts = [frame for rank in sorted(kept) for frame in kept[rank]]
    if not parts:  # a datasets.csv of its header only
        return pd.read_csv(datasets_path, nrows=0), total
    return pd.concat(parts, ignore_index=True).head(max_rows), total


def failures_page(failures: pd.DataFrame) -> str:
    body = table(failures, source="failures.csv") if len(failures) else "<p>No dataset failed.</p>"
    return page("Failures (failures.csv)", body)


@dataclass(frozen=True)
class FitRecords:
    """What the provenance page shows of the fits' recorded attributes (the `datasets` group of posteriors.nc)."""

    first_sampled: str
    last_sampled: str
    counts: dict[tuple[str, ...], Counter[tuple[str, ...]]]  # datasets per value of each group of COUNTED


def fit_records(posteriors_path: Path, block: int = 1024) -> FitRecords:
    """The fits' sampling dates and value counts, read ``block`` datasets at a time (see `combined.dataset_text`)."""
    counts: dict[tuple[str, ...], Counter[tuple[str, ...]]] = {keys: Counter() for keys in COUNTED}
    ends: list[str] = []  # each block's earliest and latest date
    for part in dataset_text(posteriors_path, ["created_at", *(key for keys in COUNTED for key in keys)], block):
        for keys, counter in counts.items():
            counter.update(zip(*(map(str, part[key]) for key in keys), strict=True))
        stamps = [str(s) for s in part["created_at"] if s]
        ends += [min(stamps), max(stamps)] if stamps else []
    return FitRecords(min(ends, default=""), max(ends, default=""), counts)


def provenance_page(config: Config, posteriors_path: Path, now: datetime.datetime | None = None) -> str:
    """Versions, model file, config, cache keys and dates of a sweep."""
    records = fit_records(posteriors_path)
    now = now or datetime.datetime.now(datetime.UTC)
    model = Path(config.model)
    current = {"batchfit": __version__, "python": platform.python_version(),
               **{name: _version(name) for name in REPORT_LIBRARIES}}
    versions, model_hash, cache_keys = (_counts(records.counts[keys], keys) for keys in COUNTED)
    parts = [
        "<h2>Dates</h2>",
        _key_values({"report written (UTC)": now.isoformat(timespec="seconds"),
                     "first fit sampled": records.first_sampled,
                     "last fit sampled": records.last_sampled}),
        "<h2>Versions</h2><p>Of the environment that wrote this report:</p>",
        _key_values(current),
        "<p>Recorded by the fits (datasets per set of versions):</p>",
        versions,
        "<h2>Model file</h2>",
        _key_values({"path": model, "sha256 now": file_sha256(model)}),
        "<p>Recorded by the fits (datasets per model_hash):</p>",
        model_hash,
        f"<pre>{html.escape(model.read_text())}</pre>",
        "<h2>Compiled-function cache</h2>",
        _key_values({"cache_dir": config.cache_dir}),
        "<p>Datasets per cache key (compile_key), structure and sampler path:</p>",
        cache_keys,
        "<h2>Config</h2>",
        _key_values({"config file(s)": config.source}),
        f"<pre>{html.escape(yaml.safe_dump(config_to_dict(config), sort_keys=False))}</pre>",
    ]
    return page("Provenance", "\n".join(parts))


def _counts(counted: Counter[tuple[str, ...]], keys: tuple[str, ...]) -> str:
    """A table of the distinct values of `keys` over the fits, with how many datasets have each."""
    rows = [[*values, n] for values, n in counted.most_common()]
    return table(pd.DataFrame(rows, columns=[*keys, "datasets"]))


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def write_report_pages(config: Config) -> list[Path]:
    """The `report_pages` rule: health.html, summary.html, failures.html and provenance.html."""
    failures = pd.read_csv(config.layout.failures_csv)
    pages = {
        "health.html": health_page(read_health(config.layout.datasets_csv, MAX_TABLE_ROWS), failures, config),
        "summary.html": summary_page(config.layout.datasets_csv, config.layout.summary),
        "failures.html": failures_page(failures),
        "provenance.html": provenance_page(config, config.layout.posteriors),
    }
    out = config.layout.report_pages
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        with atomic_path(out / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return [out / name for name in pages]

