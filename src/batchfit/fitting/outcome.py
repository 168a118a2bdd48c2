"""A batch's report of its datasets' outcomes, written as its failure records and its manifest (`batchfit.records`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from batchfit.config import Config
from batchfit.records.failure import FailureRecord
from batchfit.records.manifest import BatchManifest, Outcome

log = logging.getLogger("batchfit")


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
    """Write a dataset's failure record (read by collect into failures.csv)."""
    FailureRecord.of(outcome, path).write(config.layout.failure(outcome.dataset))


def write_manifest(config: Config, report: BatchReport) -> None:
    """Write the batch manifest (the fit rule's declared output)."""
    BatchManifest.of(report.batch, report.outcomes, compile=report.compile).write(
        config.layout.batch_manifest(report.batch))


def format_groups(groups: dict[str, int]) -> str:
    """A dataset's distinct labels per text column as datasets.csv shows them: ``group=12; region=3``."""
    return "; ".join(f"{name}={count}" for name, count in sorted(groups.items()))
