"""The run's verdict: how many datasets were fitted, how healthy, which failed, grouped by reason.

The status rule writes it (`write_verdict`) and the workflow's onsuccess and onerror print it as the
run's last lines (`end_of_run`): ``batchfit: 12 fitted: 8 ok, 4 warning (4 divergences > 0); ...``,
the health counts datasets.csv's (`fitted_text`), which ``batchfit status`` shows too. Both run at
the end of every sweep, so this module imports only what reading datasets.csv and the failure
records needs, not the fit and compile stages of `batchfit.sweep.stages`, whose imports would add to
every sweep's end.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Collection
from pathlib import Path

from batchfit.common.atomic import atomic_path
from batchfit.common.grouping import grouped_lines
from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.errors import RecordError
from batchfit.fitting.sampler_health import threshold_of
from batchfit.records.failure import FailureRecord, failure_reason

OK, WARNING = "ok", "warning"  # datasets.csv's statuses of a fitted dataset


def failure_report(config: Config) -> str | None:
    """What a run with failed datasets ends with, None when every dataset was fitted: the count, one line
    per distinct reason (`batchfit.common.grouping`) and where to look."""
    datasets = discover_datasets(config.data_sources)
    reasons = {}
    for path in sorted(config.layout.failures.glob("*.json")):
        if path.stem in datasets:
            try:
                reasons[path.stem] = FailureRecord.read(path).why
            except (OSError, RecordError) as exc:
                reasons[path.stem] = str(exc)
    if not reasons:
        return None
    groups = grouped_lines(reasons)
    fitted = fitted_text(config.layout.datasets_csv)
    return "\n".join([
        f"batchfit: {_variant(config)}{len(reasons)} of {len(datasets)} dataset(s) failed"
        f"{f' ({fitted})' if fitted else ''}, for {len(groups)} reason(s):",
        *(f"  {line}" for line in groups),
        f"batchfit: each failure, with the model's lines where its code failed: {config.layout.failures_csv}; "
        f"one dataset: batchfit status --config {config.source} --dataset {next(iter(reasons))}",
    ])


def fitted_text(datasets_csv: Path, ids: Collection[str] | None = None) -> str:
    """The fitted datasets of a datasets.csv (those of ``ids`` only, when given) by health, each warning
    counted under the thresholds it crossed: ``12 fitted: 8 ok, 4 warning (4 divergences > 0)``; '' without
    a datasets.csv (before collect) or a fitted dataset in it."""
    statuses: Counter[str] = Counter()
    crossed: Counter[str] = Counter()
    try:
        with open(datasets_csv, newline="") as file:
            for row in csv.DictReader(file):
                if ids is not None and row["dataset"] not in ids:
                    continue
                statuses[row["status"]] += 1
                if row["status"] == WARNING:
                    reasons = row["message"].split("; ")
                    crossed.update(list(dict.fromkeys(threshold_of(reason) for reason in reasons if reason)))
    except (OSError, KeyError, csv.Error):
        return ""
    fitted = statuses[OK] + statuses[WARNING]
    if not fitted:
        return ""
    thresholds = ", ".join(f"{n} {threshold}" for threshold, n in crossed.most_common())
    return (f"{fitted} fitted: {statuses[OK]} ok, {statuses[WARNING]} warning"
            + (f" ({thresholds})" if thresholds else ""))


def _variant(config: Config) -> str:
    return f"variant {config.variant}: " if config.variant else ""


_OK = "ok: "  # how a verdict without failures starts in status.txt (not printed)
# A verdict written up to this long before a run started counts as the run's: filesystems keep
# modification times to a second or two.
_CLOCK_SLACK_SECONDS = 2.0


def write_verdict(config: Config) -> str | None:
    """The status rule: write the run's verdict (`failure_report`, or how many datasets were fitted and how
    healthy) for `end_of_run`; return the failure report, None when nothing failed."""
    report = failure_report(config)
    fitted = fitted_text(config.layout.datasets_csv) or "0 fitted"
    text = report or f"{_OK}batchfit: {_variant(config)}{fitted}; each dataset's health: {config.layout.datasets_csv}"
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


def end_of_run(config: Config, *, since: float | None = None) -> tuple[int, str]:
    """The exit status and last lines of a Snakemake run (its ``onsuccess`` and ``onerror``): the verdicts the
    predictions' collect and the status rule wrote (the sweep's last), with 1 when either found failures, else
    0; 0 and nothing without a verdict, or with one written before ``since`` (the run's start, seconds since
    the epoch: an earlier run's, as when this run's target was ``snakemake sbc`` or a report).

    The status rule itself never fails: a failed rule's traceback made a finished sweep look like a
    crash. A failure verdict is removed once reported, so that the next run checks again rather than
    report an old verdict.
    """
    status, lines = 0, []
    for path in (config.layout.prediction_verdict, config.layout.status_verdict):
        try:
            written = path.stat().st_mtime
            text = path.read_text()
        except OSError:
            continue
        if since is not None and written < since - _CLOCK_SLACK_SECONDS:
            continue
        if text.startswith(_OK):
            lines.append(text.removeprefix(_OK).rstrip("\n"))
        else:
            path.unlink(missing_ok=True)
            status = 1
            lines.append(text.rstrip("\n"))
    return status, "\n".join(lines)
