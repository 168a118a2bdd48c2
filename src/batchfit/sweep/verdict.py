"""The run's verdict: which datasets failed, grouped by reason, printed as a run's last lines.

The status rule writes it (`write_verdict`) and the workflow's onsuccess prints it (`end_of_run`).
Both run at the end of every sweep, so this module imports only what reading the failure records
needs, not the fit and compile stages of `batchfit.sweep.stages`, whose imports would add to every
sweep's end (`benchmarks/sweep.py` prints the status rule's time; the figures are in
benchmarks/HISTORY.md).
"""

from __future__ import annotations

import csv
import json
from collections import Counter

from batchfit.common.atomic import atomic_path
from batchfit.common.grouping import grouped_lines
from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.fitting.outcome import failure_reason


def failure_report(config: Config) -> str | None:
    """What a run with failed datasets ends with, None when every dataset was fitted: the count, one line
    per distinct reason (`batchfit.common.grouping`) and where to look."""
    datasets = discover_datasets(config)
    reasons = {}
    for path in sorted(config.layout.failures.glob("*.json")):
        if path.stem in datasets:
            try:
                reasons[path.stem] = failure_reason(json.loads(path.read_text()))
            except (OSError, ValueError, AttributeError) as exc:
                reasons[path.stem] = f"unreadable failure record {path}: {exc}"
    if not reasons:
        return None
    groups = grouped_lines(reasons)
    return "\n".join([
        f"batchfit: {len(reasons)} of {len(datasets)} dataset(s) failed{_fitted_counts(config)}, for "
        f"{len(groups)} reason(s):",
        *(f"  {line}" for line in groups),
        f"batchfit: each failure, with the model's lines where its code failed: {config.layout.failures_csv}; "
        f"one dataset: batchfit status --config {config.source} --dataset {next(iter(reasons))}",
    ])


def _fitted_counts(config: Config) -> str:
    """`` (18 fitted: 15 ok, 3 warning)`` from datasets.csv, '' without one (before collect)."""
    try:
        with open(config.layout.datasets_csv, newline="") as file:
            statuses = Counter(row["status"] for row in csv.DictReader(file))
    except (OSError, KeyError, csv.Error):
        return ""
    fitted = statuses["ok"] + statuses["warning"]
    return f" ({fitted} fitted: {statuses['ok']} ok, {statuses['warning']} warning)" if fitted else ""


_OK = "ok: "  # how a verdict without failures starts


def write_verdict(config: Config) -> str | None:
    """The status rule: write the run's verdict (`failure_report`, or that every dataset was fitted) for
    `end_of_run`; return the failure report, None when nothing failed."""
    report = failure_report(config)
    text = report if report else f"{_OK}batchfit: every dataset was fitted ({config.layout.datasets_csv})"
    with atomic_path(config.layout.status_verdict) as tmp:
        tmp.write_text(text + "\n")
    return report


def prediction_failure_report(config: Config) -> str | None:
    """The failed predictions of prediction_failures.csv, one line per distinct reason; None when none failed."""
    try:
        with open(config.layout.prediction_failures_csv, newline="") as file:
            reasons = {row["dataset"]: failure_reason(row) for row in csv.DictReader(file)}
    except (OSError, KeyError, csv.Error):
        return None
    if not reasons:
        return None
    return "\n".join([f"batchfit: {len(reasons)} prediction(s) failed:",
                      *(f"  {line}" for line in grouped_lines(reasons)),
                      f"batchfit: each failed prediction: {config.layout.prediction_failures_csv}"])


def write_prediction_verdict(config: Config) -> str | None:
    """collect_predictions' share of the verdict (`prediction_failure_report`), for `end_of_run`."""
    report = prediction_failure_report(config)
    with atomic_path(config.layout.prediction_verdict) as tmp:
        tmp.write_text((report or f"{_OK}batchfit: every prediction was made") + "\n")
    return report


def end_of_run(config: Config) -> tuple[int, str]:
    """The exit status and last lines of a Snakemake run (its ``onsuccess``): 1 and the failure report when
    the status rule found failed datasets (or collect_predictions failed predictions), else 0 and nothing.

    The status rule itself never fails: a failed rule's traceback made a finished sweep look like a
    crash. Its verdict is removed once reported, so that the next run checks again rather than report
    an old verdict (and a run of another target, such as ``snakemake sbc``, finds none).
    """
    reports = []
    for path in (config.layout.status_verdict, config.layout.prediction_verdict):
        try:
            text = path.read_text()
        except OSError:
            continue
        if not text.startswith(_OK):
            path.unlink(missing_ok=True)
            reports.append(text.rstrip("\n"))
    return (1, "\n".join(reports)) if reports else (0, "")
