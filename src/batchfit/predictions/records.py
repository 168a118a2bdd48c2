"""What a predict job writes per dataset: the predictions, their rows and sidecar, or the failure; the job's manifest.

A dataset's rows of predictions.csv are written first, then its predictions atomically
(``predictions/{id}.nc``, the file ``DataTree.to_netcdf(engine="netcdf4")`` writes, by
`batchfit.fitting.netcdf_writer.write_fit`), then the sidecar with its provenance digest: a job killed in
between leaves no prediction, or one without a sidecar, which the plan then reads itself. A failure removes the
dataset's older predictions (stale now) and records why in ``predictions/failed/{id}.json``, in the
format of a fit's failure record (`batchfit.records.failure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from batchfit.config import Config
from batchfit.fitting.netcdf_writer import write_fit
from batchfit.layout import ResultsLayout
from batchfit.predictions.predictor import Prediction
from batchfit.predictions.provenance import record_prediction
from batchfit.predictions.table import input_columns, prediction_rows, write_rows
from batchfit.records.failure import FailureRecord
from batchfit.records.fit_attributes import PROVENANCE
from batchfit.records.manifest import BatchManifest, Outcome


def write_prediction(config: Config, dataset_id: str, prediction: Prediction, digest: str) -> None:
    """Write one dataset's rows, predictions and sidecar (in that order), and drop its failure record.

    The old predictions go first: their rows are then rewritten in place (a torn rows file is never beside
    a complete prediction), and the predictions come atomically, the sidecar last."""
    layout = config.layout
    layout.prediction_sidecar(dataset_id).unlink(missing_ok=True)
    layout.prediction(dataset_id).unlink(missing_ok=True)
    inputs = prediction.inputs
    rows = prediction_rows(dataset_id, prediction.tree["predictions"].to_dataset(),
                           input_columns(inputs, prediction.read, prediction.filled), inputs.n_rows, config.summary)
    layout.predictions.mkdir(parents=True, exist_ok=True)
    write_rows(rows, layout.prediction_rows(dataset_id))
    prediction.tree.attrs[PROVENANCE] = digest
    write_fit(prediction.tree, layout.prediction(dataset_id))
    record_prediction(layout, dataset_id, digest)
    layout.prediction_failure(dataset_id).unlink(missing_ok=True)


def record_failed_prediction(config: Config, outcome: Outcome, path: Path | None) -> None:
    """Record why a dataset's prediction failed, and remove its older predictions."""
    layout = config.layout
    for stale in (layout.prediction_sidecar, layout.prediction, layout.prediction_rows):
        stale(outcome.dataset).unlink(missing_ok=True)
    FailureRecord.of(outcome, path).write(layout.prediction_failure(outcome.dataset))


def write_predict_manifest(layout: ResultsLayout, batch_id: str, lines: Sequence[str],
                           outcomes: Sequence[Outcome]) -> None:
    """A predict job's declared output: how its forward functions were obtained, and each dataset's outcome."""
    BatchManifest.of(batch_id, list(outcomes), forward=tuple(lines)).write(layout.predict_manifest(batch_id))
