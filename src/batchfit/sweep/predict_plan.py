"""Which datasets' predictions are pending, and the predict jobs' batches.

Every dataset with new inputs is predicted (with ``predict.data``, those with a new-data file; otherwise
all), cut into chunks of the sweep's batch size in id order; a chunk's pending datasets (no prediction,
or one of another provenance: `batchfit.predictions.provenance`) are one predict job. A batch is named by
its members and their expected digests, so a refit or changed new inputs give a new job for exactly
those datasets. Like the fit plan, the main process records it for the jobs (`write_predict_plan`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.fitting.provenance import expected_digests
from batchfit.predictions.inputs import Expected
from batchfit.predictions.new_data import new_data_files
from batchfit.predictions.provenance import expected_prediction_digests, recorded_prediction
from batchfit.records.json_record import JsonRecord
from batchfit.sweep.plan import batch_size


@dataclass(frozen=True)
class PredictPlan(JsonRecord):
    """The datasets predicted, in order, and the batches of those whose predictions are pending; recorded
    as ``predict_plan.json`` (`write_predict_plan`)."""

    KIND = "prediction plan"
    VERSION = 1
    REMEDY = "delete it and run the sweep again"

    predicted: list[str]
    batches: dict[str, dict[str, Expected]]
    expected: dict[str, Expected] = field(default_factory=dict)  # every predicted dataset's (not recorded)

    def to_fields(self) -> dict[str, Any]:
        return {"predicted": self.predicted, "batches": {
            b: {d: [e.prediction, e.fit] for d, e in members.items()} for b, members in self.batches.items()}}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        return cls(list(fields["predicted"]), {b: {d: Expected(*pair) for d, pair in members.items()}
                                               for b, members in fields["batches"].items()})


def predict_plan(config: Config, cores: int | None = 1, *, record: bool = True) -> PredictPlan:
    """The prediction plan of ``config`` (no predictions without its ``predict`` key). ``cores``: as for
    `batchfit.sweep.plan.batch_size`. Cheap enough for every parse: no model is built."""
    if not config.predict.enabled:
        return PredictPlan([], {})
    datasets = discover_datasets(config.data_sources)
    fits = expected_digests(config, datasets, record=record)
    new_files = new_data_files(config)
    predicted = list(new_files) if config.predict.source == "data" else list(datasets)
    digests = expected_prediction_digests(config, fits, new_files, predicted, record=record)
    expected = {d: Expected(digests[d], fits.get(d, "")) for d in predicted}
    size = batch_size(config, len(predicted), cores)
    batches = {}
    for chunk in (predicted[i:i + size] for i in range(0, len(predicted), size)):
        pending = still_pending_predictions(config, {d: expected[d] for d in chunk})
        if pending:
            batches[untried_predict_batch(config, pending)] = pending
    return PredictPlan(predicted, batches, expected)


def predict_batch_id(expected: Mapping[str, Expected], retry: int = 0) -> str:
    """A predict batch's name from its members and their expected digests (and the retry number)."""
    lines = [f"{d} {e.prediction}" for d, e in expected.items()] + ([f"retry {retry}"] if retry else [])
    return f"predict-{hashlib.sha256(chr(10).join(lines).encode()).hexdigest()[:12]}"


def untried_predict_batch(config: Config, expected: Mapping[str, Expected]) -> str:
    """The first name of these pending datasets whose batch has no manifest yet (a batch that ran and left
    them pending is tried again under a new name)."""
    retry = 0
    while config.layout.predict_manifest(name := predict_batch_id(expected, retry)).exists():
        retry += 1
    return name


def write_predict_plan(config: Config, plan: PredictPlan) -> None:
    """Record the plan the sweep's predict jobs read (its main process does, when the run starts)."""
    plan.write(config.layout.predict_plan)


def sweep_predict_plan(config: Config, *, job: bool, cores: int | None = 1) -> PredictPlan:
    """The prediction plan: computed by the sweep's main process, read back by its jobs (as `sweep_plan`)."""
    path = config.layout.predict_plan
    if not job or not path.exists():
        return predict_plan(config, cores)
    return PredictPlan.read(path)


def still_pending_predictions(config: Config, expected: Mapping[str, Expected]) -> dict[str, Expected]:
    """Those of ``expected`` without a prediction of the expected digest (a retried job predicts only these)."""
    return {d: e for d, e in expected.items() if recorded_prediction(config.layout, d) != e.prediction}

