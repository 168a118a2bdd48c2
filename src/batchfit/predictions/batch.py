"""Predict a batch of datasets in one process: one forward function per structure, then only swapping data.

Each dataset's fit must be the one the plan expects (its provenance digest): a prediction is never made
from an outdated fit. A dataset that fails (no fit, a bad new-data file, a model that cannot take the new
inputs) is recorded in ``predictions/failed/{id}.json`` and the batch goes on (``on_error: continue``);
the manifest lists every dataset's outcome.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from batchfit.common import collector
from batchfit.config import Config
from batchfit.data.discovery import source_of
from batchfit.errors import BatchfitError, DatasetError, is_expected, one_line, reason_of
from batchfit.fitting.fitter import prepare
from batchfit.model.model_file import load_model_file
from batchfit.predictions.fit_draws import read_fit_draws
from batchfit.predictions.inputs import OWN_FILES, Expected, PredictInputs
from batchfit.predictions.new_data import new_data_reader, new_inputs
from batchfit.predictions.predictor import Predictor
from batchfit.predictions.records import record_failed_prediction, write_predict_manifest, write_prediction
from batchfit.records.manifest import Outcome

log = logging.getLogger("batchfit")


def predict_batch(config: Config, expected: Mapping[str, Expected], *, batch_id: str,
                  inputs: PredictInputs = OWN_FILES) -> list[Outcome]:
    """Predict the datasets of ``expected`` (id -> what the plan expects of it); write predictions, failures
    and the batch's manifest. With ``on_error: stop`` the first failure is raised after the manifest."""
    log.info("%s holds %d dataset(s): %s", batch_id, len(expected), " ".join(expected))
    cache, reader, ref = prepare(config, inputs.job, wanted=list(expected))
    paths = reader.index
    predictor = Predictor(config, ref, cache, load_model_file(config.model))
    collector.resume()  # the imports and the reference model live to the end
    new_files = inputs.new_files(config)
    new_data = new_data_reader(config, new_files, reader.coding, expected)
    outcomes = []
    try:
        for dataset_id, wanted in expected.items():
            started, stage = time.perf_counter(), "load"
            file = source_of(new_files, dataset_id) or source_of(paths, dataset_id)
            try:
                if dataset_id not in paths:
                    raise DatasetError(f"has new inputs but no dataset of the sweep has its id "
                                       f"({', '.join(config.datasets)})", dataset=dataset_id, path=file)
                if not inputs.fit(config, dataset_id).exists():
                    raise DatasetError("has new inputs but no fit (its fit failed, or it was not fitted yet): it is "
                                       "predicted once it is fitted", dataset=dataset_id, path=file)
                fit = read_fit_draws(dataset_id, inputs.fit(config, dataset_id))
                if fit.provenance != wanted.fit:
                    raise DatasetError("its fit is outdated (the config, model or data changed since): it is predicted "
                                       "once it is fitted again", dataset=dataset_id, path=source_of(paths, dataset_id))
                data = reader.load(dataset_id)
                new = new_inputs(config, data, coding=reader.coding, module=predictor.module, new_data=new_data)
                stage = "predict"
                prediction = predictor.predict(fit, new)
                stage = "write"
                write_prediction(config, dataset_id, prediction, wanted.prediction)
            except Exception as exc:  # noqa: BLE001 - isolate the dataset; its record says what to fix
                outcomes.append(_failed(config, dataset_id, stage, exc, file, started, paths, new_files))
            else:
                fallback = "" if prediction.path == "cached" else "pm.sample_posterior_predictive"
                outcomes.append(Outcome(dataset_id, "ok", time.perf_counter() - started, fallback=fallback))
            last = outcomes[-1]
            log.info("%s: %s in %.3f s%s", dataset_id, last.status, last.seconds,
                     f" ({last.stage}: {last.message})" if last.message else "")
            if last.status == "failed" and config.on_error == "stop":
                raise BatchfitError(f"predicting dataset '{dataset_id}' failed at {last.stage}: {last.message}")
    finally:
        write_predict_manifest(config.layout, batch_id, predictor.lines, outcomes)
    return outcomes


def _failed(config: Config, dataset_id: str, stage: str, exc: Exception, file: Path | None, started: float,
            paths: Mapping[str, Path], new_files: Mapping[str, Path]) -> Outcome:
    """Record a dataset's failed prediction; an unexpected exception is batchfit's bug, logged with its traceback."""
    if isinstance(exc, DatasetError) and exc.path is not None:  # a staged copy's error names the sweep's file
        sweep_files = {str(files[dataset_id]): source_of(files, dataset_id) for files in (paths, new_files)
                       if dataset_id in files}
        exc = exc.naming(sweep_files.get(str(exc.path), exc.path))
    trace = ""
    if not is_expected(exc):
        trace = "".join(traceback.format_exception(exc))
        log.error("%s: batchfit failed at %s, a bug to report with this traceback:\n%s", dataset_id, stage, trace)
    message = one_line(exc) if isinstance(exc, BatchfitError) else (
        f"{stage} failed for dataset '{dataset_id}' (file {file}): {one_line(exc)}")
    outcome = Outcome(dataset_id, "failed", time.perf_counter() - started, stage, type(exc).__name__, message, trace,
                      reason=reason_of(exc, dataset_id, file))
    record_failed_prediction(config, outcome, file)
    return outcome
