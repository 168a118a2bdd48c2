"""predictions.csv and prediction_failures.csv for the whole sweep, from every dataset's prediction.

Without a shared filesystem each predict job wrote a results directory of its own, adopted first
(`adopt_predict_outputs`), as collect adopts the fit jobs'. A dataset's rows written with its
predictions are reused unless the interval settings (``summary.ci_prob``, ``summary.ci_kind``) changed
since: then they are computed again from its predictions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from batchfit.common.atomic import atomic_path
from batchfit.config import Config
from batchfit.layout import ResultsLayout
from batchfit.outputs.adopt import copy_file, job_output
from batchfit.predictions.provenance import record_prediction
from batchfit.predictions.table import collect_table, prediction_rows, read_rows, rows_header, stat_columns, write_rows
from batchfit.records.failure import FAILURE_COLUMNS, FailureRecord
from batchfit.records.provenance_sidecar import ProvenanceSidecar

log = logging.getLogger("batchfit")


def collect_predictions(config: Config, predicted: Sequence[str], batch_outputs: Iterable[str | Path] = ()) -> str:
    """Write predictions.csv (every predicted dataset's rows, in order) and prediction_failures.csv; one line."""
    layout = config.layout
    adopt_predict_outputs(layout, batch_outputs)
    stats = stat_columns(config.summary)
    parts, failed = [], []
    for dataset_id in predicted:
        if layout.prediction(dataset_id).exists():
            rows = layout.prediction_rows(dataset_id)
            if not rows.exists() or rows_header(rows)[-len(stats):] != stats:
                _rows_again(config, dataset_id)
            parts.append(rows)
        elif layout.prediction_failure(dataset_id).exists():
            failed.append(FailureRecord.read_of(dataset_id, layout.prediction_failure(dataset_id)).row())
    n_rows = collect_table(parts, layout.predictions_csv, config.summary)
    with atomic_path(layout.prediction_failures_csv) as tmp:
        pd.DataFrame(failed, columns=FAILURE_COLUMNS).to_csv(tmp, index=False)
    missing = len(predicted) - len(parts) - len(failed)
    return (f"collect_predictions: {len(parts)} dataset(s) predicted ({n_rows} rows in {layout.predictions_csv.name}), "
            f"{len(failed)} failed" + (f", {missing} not predicted yet" if missing else "")
            + (f" (see {layout.prediction_failures_csv})" if failed else ""))


def _rows_again(config: Config, dataset_id: str) -> None:
    """A dataset's rows with their statistics computed again from its predictions (its inputs kept)."""
    import xarray as xr

    rows = config.layout.prediction_rows(dataset_id)
    with xr.open_datatree(config.layout.prediction(dataset_id)) as tree:
        predictions = tree["predictions"].to_dataset().load()
    old = read_rows(rows) if rows.exists() else None
    numbers = [int(row) for row in old["row"] if row] if old is not None else []
    fresh = prediction_rows(dataset_id, predictions, {}, max(numbers) + 1 if numbers else 0, config.summary)
    if old is not None and len(old["dataset"]) == len(fresh["dataset"]):  # the same rows in order: keep their inputs
        stats = stat_columns(config.summary)
        kept = list(old.items())[:-len(stats)]  # the statistics are the last columns (named after the old ci_prob)
        fresh = dict(kept) | {column: fresh[column] for column in stats}
    with atomic_path(rows) as tmp:
        write_rows(fresh, tmp)


def adopt_predict_outputs(layout: ResultsLayout, directories: Iterable[str | Path]) -> int:
    """Copy each predict job's predictions, rows, failure records and manifest from its own results directory
    into ``layout`` (the sidecar last, with the copy's size and time); the number of predictions."""
    adopted = 0
    for directory in directories:
        job, manifest, dataset_ids = job_output(directory, lambda job: job.predict_manifests, "predict")
        for dataset_id in dataset_ids:
            if job.prediction(dataset_id).exists():
                digest = ProvenanceSidecar.read(job.prediction_sidecar(dataset_id)).provenance
                layout.prediction_sidecar(dataset_id).unlink(missing_ok=True)
                copy_file(job.prediction(dataset_id), layout.prediction(dataset_id))
                copy_file(job.prediction_rows(dataset_id), layout.prediction_rows(dataset_id))
                record_prediction(layout, dataset_id, digest)
                layout.prediction_failure(dataset_id).unlink(missing_ok=True)
                adopted += 1
            elif job.prediction_failure(dataset_id).exists():
                for stale in (layout.prediction_sidecar, layout.prediction, layout.prediction_rows):
                    stale(dataset_id).unlink(missing_ok=True)
                copy_file(job.prediction_failure(dataset_id), layout.prediction_failure(dataset_id))
        copy_file(manifest, layout.predict_manifest(manifest.stem))
    if adopted:
        log.info("adopted %d prediction(s) from the predict jobs' own output directories", adopted)
    return adopted

