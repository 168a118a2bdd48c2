"""HTML pages of a sweep for Snakemake's report: health overview, diagnostics and failures tables, provenance.

The `report_pages` rule writes them under ``results_dir/report/``; Snakemake's report
(``snakemake --report report.html``) shows each one as a page. They are standalone HTML
files, so they open in a browser without the report too.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import platform
from collections import Counter
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
import xarray as xr
import yaml

from batchfit import __version__
from batchfit.atomic import atomic_path
from batchfit.combined import DATASET_DIM, DATASETS
from batchfit.config import Config, config_to_dict
from batchfit.fingerprint import LIBRARIES
from batchfit.plots import dataset_table, reason_counts, status_counts

# Rows of a table page past which only the first rows are shown (the file has them all): a
# 1,000-dataset sweep's summary.csv has ~10,000 rows, which a browser shows but nobody reads.
MAX_TABLE_ROWS = 2000
REPORT_LIBRARIES = (*LIBRARIES, "arviz-base", "arviz-stats", "arviz-plots", "xarray", "pandas", "snakemake")
_STATUS_ORDER = {"failed": 0, "warning": 1, "ok": 2}
_CSS = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1em; color: #222; }
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


def table(frame: pd.DataFrame, *, max_rows: int = MAX_TABLE_ROWS, source: str = "") -> str:
    """An HTML table of `frame` (escaped), rows coloured by a `status` column, cut after `max_rows` rows."""
    shown = frame.head(max_rows)
    note = (f"<p>Showing the first {max_rows} of {len(frame)} rows; {html.escape(source)} has them all.</p>"
            if len(frame) > max_rows else "")
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


def health_page(summary: pd.DataFrame, failures: pd.DataFrame, config: Config) -> str:
    """Datasets ok / warning / failed, the thresholds, and every warning and failure with its reason."""
    datasets = dataset_table(summary)
    h = config.health
    checked = "the free parameters" if h.var_names is None else ", ".join(h.var_names)
    warnings = datasets[datasets["status"] == "warning"].drop(columns=["status"])
    parts = [
        table(pd.DataFrame([status_counts(datasets) | {"total": len(datasets)}])),
        f"<p>A fit is a <b>warning</b> when any of its r_hat &gt; {h.max_r_hat}, any ess_bulk &lt; "
        f"{h.min_ess_bulk} (checked on {html.escape(checked)}) or it has more than {h.max_divergences} "
        "divergent transitions (config key <code>health</code>).</p>",
        "<h2>Warnings by threshold crossed</h2>",
        table(pd.DataFrame([reason_counts(datasets)])),
        f"<h2>Warnings ({len(warnings)})</h2>",
        table(warnings, source="summary.csv") if len(warnings) else "<p>No warnings.</p>",
        f"<h2>Failures ({len(failures)})</h2>",
        table(failures, source="failures.csv") if len(failures) else "<p>No dataset failed.</p>",
    ]
    return page("Health of the sweep", "\n".join(parts))


def summary_page(summary: pd.DataFrame) -> str:
    """summary.csv as a table, failed and warning datasets first."""
    ordered = summary.sort_values("status", key=lambda s: s.map(_STATUS_ORDER), kind="stable")
    return page("Diagnostics (summary.csv)", table(ordered, source="summary.csv"))


def failures_page(failures: pd.DataFrame) -> str:
    body = table(failures, source="failures.csv") if len(failures) else "<p>No dataset failed.</p>"
    return page("Failures (failures.csv)", body)


def fit_attributes(posteriors_path: Path) -> dict[str, dict[str, str]]:
    """Each fitted dataset's recorded attributes (its row of /datasets in posteriors.nc): keys, versions, dates."""
    with xr.open_datatree(posteriors_path) as tree:
        info = tree[DATASETS].to_dataset()
        text = [name for name, var in info.data_vars.items() if var.dtype.kind in "OUS"]
        table = info[text].load()
    return {str(dataset_id): {str(key): str(table[key].values[i]) for key in text}
            for i, dataset_id in enumerate(table[DATASET_DIM].values)}


def provenance_page(config: Config, posteriors_path: Path, now: datetime.datetime | None = None) -> str:
    """Versions, model file, config, cache keys and dates of a sweep."""
    attrs = fit_attributes(posteriors_path)
    now = now or datetime.datetime.now(datetime.UTC)
    created = sorted(a["created_at"] for a in attrs.values() if "created_at" in a)
    model = Path(config.model)
    current = {"batchfit": __version__, "python": platform.python_version(),
               **{name: _version(name) for name in REPORT_LIBRARIES}}
    parts = [
        "<h2>Dates</h2>",
        _key_values({"report written (UTC)": now.isoformat(timespec="seconds"),
                     "first fit sampled": created[0] if created else "",
                     "last fit sampled": created[-1] if created else ""}),
        "<h2>Versions</h2><p>Of the environment that wrote this report:</p>",
        _key_values(current),
        "<p>Recorded by the fits (datasets per set of versions):</p>",
        _counts(attrs, "versions"),
        "<h2>Model file</h2>",
        _key_values({"path": model, "sha256 now": hashlib.sha256(model.read_bytes()).hexdigest()}),
        "<p>Recorded by the fits (datasets per model_hash):</p>",
        _counts(attrs, "model_hash"),
        f"<pre>{html.escape(model.read_text())}</pre>",
        "<h2>Compiled-function cache</h2>",
        _key_values({"cache_dir": config.cache_dir}),
        "<p>Datasets per cache key (compile_key), structure and sampler path:</p>",
        _counts(attrs, "compile_key", "structure", "sampler_path"),
        "<h2>Config</h2>",
        _key_values({"config file(s)": config.source}),
        f"<pre>{html.escape(yaml.safe_dump(config_to_dict(config), sort_keys=False))}</pre>",
    ]
    return page("Provenance", "\n".join(parts))


def _counts(attrs: Mapping[str, Mapping[str, str]], *keys: str) -> str:
    """A table of the distinct values of `keys` over the fits, with how many datasets have each."""
    counted = Counter(tuple(a.get(key, "") for key in keys) for a in attrs.values())
    rows = [[*values, n] for values, n in counted.most_common()]
    return table(pd.DataFrame(rows, columns=[*keys, "datasets"]))


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def report_dir(config: Config) -> Path:
    return config.results_dir / "report"


def write_report_pages(config: Config) -> list[Path]:
    """The `report_pages` rule: health.html, summary.html, failures.html and provenance.html."""
    summary = pd.read_csv(config.summary_path)
    failures = pd.read_csv(config.failures_csv_path)
    pages = {
        "health.html": health_page(summary, failures, config),
        "summary.html": summary_page(summary),
        "failures.html": failures_page(failures),
        "provenance.html": provenance_page(config, config.posteriors_path),
    }
    out = report_dir(config)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        with atomic_path(out / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return [out / name for name in pages]

