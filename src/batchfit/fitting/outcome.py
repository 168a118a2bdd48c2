"""What happened to each dataset of a batch: its outcome, failure record and the batch manifest."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from batchfit.common.atomic import atomic_path
from batchfit.config import Config
from batchfit.errors import DatasetError

log = logging.getLogger("batchfit")


@dataclass
class Outcome:
    """What happened to one dataset in a batch."""

    dataset: str
    status: str  # "ok" or "failed"
    seconds: float
    stage: str | None = None
    error_type: str | None = None
    message: str | None = None
    traceback: str = ""  # batchfit's bug's whole one (`errors.is_expected`), or the model's own frames
    fallback: str = ""  # a fitted dataset's: why it was not sampled on batchfit's cached path
    reason: str = ""  # a failure's message without the dataset: alike for datasets that fail alike
    rows: int | None = None  # the dataset's rows, once it was loaded
    groups: str = ""  # its distinct labels per text column (`format_groups`), once it was loaded
    dropped_where: int | None = None  # the rows the row rules dropped, once it was loaded (`batchfit.data.rows`)
    dropped_missing: int | None = None
    # a fitted dataset's health thresholds crossed that its sampler's statistics decide (divergences, tree
    # depth, E-BFMI) and its rows (`batchfit.fitting.sampler_health.sampler_reasons`); R-hat and ESS: collect's
    warnings: list[str] = field(default_factory=list)


@dataclass
class BatchReport:
    """The outcomes of one batch, written as the batch manifest."""

    batch: str
    compile: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def n_failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)


def record_failed(config: Config, outcome: Outcome, path: Path | None) -> None:
    """Write a failed dataset's record and drop its fit from an older run, which is stale now."""
    record_failure(config, outcome, path)
    config.layout.fit(outcome.dataset).unlink(missing_ok=True)
    config.layout.sidecar(outcome.dataset).unlink(missing_ok=True)


def hint(message: str) -> str:
    """What to look at for the sampler errors that come from the data rather than from batchfit."""
    if "initialization points failed" in message:
        return (" (the log density is not finite at any starting point: look for extreme values in "
                "the dataset, e.g. 1e300, or for data the model's priors rule out)")
    return ""


def record_failure(config: Config, outcome: Outcome, path: Path | None) -> None:
    """Write a dataset's failure record atomically (read by collect into failures.csv)."""
    record = {"dataset": outcome.dataset, "path": str(path) if path else "", "stage": outcome.stage,
              "error_type": outcome.error_type, "message": outcome.message, "reason": outcome.reason,
              "traceback": outcome.traceback, "rows": outcome.rows, "groups": outcome.groups,
              "dropped_where": outcome.dropped_where, "dropped_missing": outcome.dropped_missing}
    with atomic_path(config.layout.failure(outcome.dataset)) as tmp:
        tmp.write_text(json.dumps(record, indent=1))


def write_manifest(config: Config, report: BatchReport) -> None:
    """Write the batch manifest (the fit rule's declared output) atomically."""
    data = {"batch": report.batch, "compile": report.compile,
            "datasets": {o.dataset: dataclasses.asdict(o) for o in report.outcomes}}
    with atomic_path(config.layout.batch_manifest(report.batch)) as tmp:
        tmp.write_text(json.dumps(data, indent=1))


FAILURE_COLUMNS = ["dataset", "path", "stage", "error_type", "message", "reason", "traceback"]


# Not in records written by older batchfit versions, which are still read.
_OPTIONAL_FAILURE_COLUMNS = ("traceback", "reason")


def format_groups(groups: dict[str, int]) -> str:
    """A dataset's distinct labels per text column as datasets.csv shows them: ``group=12; region=3``."""
    return "; ".join(f"{name}={count}" for name, count in sorted(groups.items()))


def failure_reason(record: dict[str, object]) -> str:
    """A failure record's reason (its message without the dataset); the message for older records."""
    return str(record.get("reason") or record.get("message") or "")


def read_failure(dataset_id: str, path: Path) -> dict[str, str]:
    """Read one failure record, checking it has the fields failures.csv needs."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read failure record: {exc}", dataset=dataset_id, path=path) from exc
    if not isinstance(record, dict):
        raise DatasetError("failure record is not a JSON object", dataset=dataset_id, path=path)
    missing = [key for key in FAILURE_COLUMNS if key not in record and key not in _OPTIONAL_FAILURE_COLUMNS]
    if missing:
        raise DatasetError(f"failure record lacks {', '.join(missing)}", dataset=dataset_id, path=path)
    if record["dataset"] != dataset_id:
        raise DatasetError(
            f"failure record is for dataset '{record['dataset']}'", dataset=dataset_id, path=path
        )
    read = {key: "" if record.get(key) is None else str(record[key])
            for key in [*FAILURE_COLUMNS, "rows", "groups", "dropped_where", "dropped_missing"]}
    return read | {"reason": failure_reason(record)}
