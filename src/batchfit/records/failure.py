"""A dataset's failure record: why its fit (``failures/{id}.json``) or its prediction
(``predictions/failed/{id}.json``) failed.

Written by the fit and predict jobs (`batchfit.fitting.outcome`, `batchfit.predictions.records`); read into
failures.csv and prediction_failures.csv by collect, and by the run's verdict, `batchfit status` and SBC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from batchfit.errors import RecordError
from batchfit.records.json_record import JsonRecord
from batchfit.records.manifest import Outcome

# failures.csv's columns, in order; datasets.csv also shows a failure's `rows`, `groups` and dropped rows.
FAILURE_COLUMNS = ["dataset", "path", "stage", "error_type", "message", "reason", "traceback"]


def failure_reason(fields: Mapping[str, object]) -> str:
    """A failure's reason (its message without the dataset), else its message: of a record or failures.csv's row."""
    return str(fields.get("reason") or fields.get("message") or "")


@dataclass(frozen=True)
class FailureRecord(JsonRecord):
    """The dataset, its file, the stage that failed, the error's type, message, reason and traceback, and what
    was known of the dataset by then (rows, text columns' labels, rows the row rules dropped)."""

    KIND = "failure record"
    VERSION = 1
    REMEDY = "delete it, and its dataset is tried again by the next run"

    dataset: str
    path: str
    stage: str | None
    error_type: str | None
    message: str | None
    reason: str
    traceback: str
    rows: int | None
    groups: str
    dropped_where: int | None
    dropped_missing: int | None

    @classmethod
    def of(cls, outcome: Outcome, path: Path | None) -> Self:
        """The record of a failed dataset's ``outcome``; ``path`` its file (None when it was not found)."""
        return cls(outcome.dataset, str(path) if path else "", outcome.stage, outcome.error_type, outcome.message,
                   outcome.reason, outcome.traceback, outcome.rows, outcome.groups, outcome.dropped_where,
                   outcome.dropped_missing)

    @classmethod
    def read_of(cls, dataset_id: str, path: str | Path) -> Self:
        """The record at ``path``, which must be ``dataset_id``'s."""
        record = cls.read(path)
        if record.dataset != dataset_id:
            raise RecordError(f"the failure record of dataset '{record.dataset}', not of '{dataset_id}'; "
                              f"{cls.REMEDY}", path=path)
        return record

    @property
    def why(self) -> str:
        return failure_reason({"reason": self.reason, "message": self.message})

    def row(self) -> dict[str, str]:
        """The record as failures.csv's row (`FAILURE_COLUMNS`) and datasets.csv's cells: text, '' for none."""
        cells = {**self.to_fields(), "reason": self.why}
        return {key: "" if value is None else str(value) for key, value in cells.items()}
