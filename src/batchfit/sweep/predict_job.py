"""The predict stage: a predict rule's job (with a shared filesystem or without one), staging its inputs,
collecting the predictions, and the whole stage in one process (``batchfit predict``).

Like a fit job (`batchfit.sweep.fit_job`): with a shared filesystem a job reads the sweep's files and
writes into ``results_dir`` (a retried job predicts only what a killed attempt left); without one it reads
the directory `stage_predict_job` staged and writes a results directory of its own, which
collect_predictions adopts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchfit.common import collector
from batchfit.config import Config
from batchfit.errors import BatchfitError, ConfigError, DatasetError
from batchfit.predictions.batch import predict_batch
from batchfit.predictions.collect import collect_predictions
from batchfit.predictions.inputs import PredictInputs, stage_predict_inputs
from batchfit.records.compile_stamp import CompileStamp
from batchfit.records.manifest import Outcome
from batchfit.sweep.plan import sweep_plan
from batchfit.sweep.predict_plan import (
    predict_batch_id,
    predict_plan,
    still_pending_predictions,
    sweep_predict_plan,
)
from batchfit.sweep.verdict import write_prediction_verdict


def run_predict_job(config: Config, batch: str, *, bundle: Path, staged: Path | None = None,
                    outputs: Path | None = None) -> list[Outcome]:
    """Predict the batch ``batch`` of the recorded plan (its datasets still pending), or with ``staged`` inputs
    the staged ones, writing into ``outputs`` (the job's own results directory) instead of ``results_dir``."""
    if (staged is None) != (outputs is None):
        raise TypeError("run_predict_job takes staged inputs and an output directory together, or neither")
    if staged is None:
        plan = sweep_predict_plan(config, job=True)
        if batch not in plan.batches:
            raise BatchfitError(f"batch {batch} is not in the sweep's prediction plan ({config.layout.predict_plan})")
        return predict_batch(config, still_pending_predictions(config, plan.batches[batch]), batch_id=batch,
                             inputs=PredictInputs(bundle))
    inputs = PredictInputs(bundle, staged)
    own = dataclasses.replace(config, results_dir=Path(outputs))
    return predict_batch(own, inputs.expected(), batch_id=batch, inputs=inputs)


def stage_predict_job(config: Config, batch: str, stamp: Path, directory: Path) -> None:
    """Stage what the predict job of ``batch`` reads into ``directory`` (on the submitting machine)."""
    plan = sweep_predict_plan(config, job=True)
    if batch not in plan.batches:
        raise BatchfitError(f"batch {batch} is not in the sweep's prediction plan ({config.layout.predict_plan})")
    reference = CompileStamp.read(stamp).reference_dataset
    stage_predict_inputs(config, sweep_plan(config, job=True).datasets, plan.batches[batch], reference, directory)


def run_collect_predictions(config: Config, batch_outputs: Sequence[str | Path] = ()) -> str:
    """predictions.csv and prediction_failures.csv of the sweep (adopting the predict jobs' own outputs first),
    and the failed predictions for the run's verdict. The datasets are those of the plan the run recorded."""
    collector.resume()  # the job's imports are done: they live to the end
    line = collect_predictions(config, sweep_predict_plan(config, job=True).predicted, batch_outputs)
    write_prediction_verdict(config)
    return line


def run_prediction_plots(config: Config) -> list[Path]:
    """The report's predicted curves (`batchfit.predictions.plots`) of the datasets in the plan the run recorded."""
    # Imported here: matplotlib is half of this module's imports, which collect_predictions' and the predict jobs'
    # processes would pay for nothing.
    from batchfit.predictions.plots import write_prediction_plots

    collector.resume()  # matplotlib's imports are done: they live to the end
    return write_prediction_plots(config, sweep_predict_plan(config, job=True).predicted)


def run_predict(config: Config, dataset_ids: Sequence[str] | None = None) -> tuple[int, str]:
    """The predict stage in this process: every pending prediction (or those of ``dataset_ids``), then
    predictions.csv; returns the number of failed predictions and collect's line."""
    plan = predict_plan(config)
    batches = plan.batches
    if dataset_ids is not None:
        unknown = [d for d in dataset_ids if d not in plan.expected]
        if unknown:
            raise BatchfitError(f"no predictions are made for {', '.join(map(repr, unknown))}: not among the datasets "
                                f"with new inputs ({config.source}, key predict)")
        wanted = {d: plan.expected[d] for d in dataset_ids}
        batches = {predict_batch_id(wanted): wanted}
    failed = 0
    for batch, expected in batches.items():
        failed += sum(o.status == "failed" for o in predict_batch(config, expected, batch_id=batch))
    return failed, collect_predictions(config, plan.predicted)


def predict_one(config: Config, dataset_id: str, new_data: Any = None) -> Any:
    """One dataset's predictions on ``new_data`` (see `batchfit.notebook.predict`), written nowhere."""
    from batchfit.cache.store import open_cache
    from batchfit.data.discovery import discover_datasets
    from batchfit.fitting.fitter import reference_model, sweep_reader
    from batchfit.model.model_file import load_model_file
    from batchfit.predictions.fit_draws import read_fit_draws
    from batchfit.predictions.new_data import given_inputs, new_data_files, new_data_reader, new_inputs
    from batchfit.predictions.predictor import Predictor

    if not config.predict.enabled:  # new inputs given here: the default predictions
        if new_data is None:
            raise ConfigError("without a predict key in the config, give the new data", key="predict",
                              source=config.source)
        config = dataclasses.replace(config, predict=dataclasses.replace(config.predict, data=()))
    paths = discover_datasets(config.data_sources)
    if dataset_id not in paths:
        raise DatasetError(f"no dataset {dataset_id!r} among the config's datasets ({config.source})",
                           dataset=dataset_id)
    if not config.layout.fit(dataset_id).exists():
        raise DatasetError("has no fit to predict from: fit it first", dataset=dataset_id, path=paths[dataset_id])
    reader = sweep_reader(config, paths)
    module = load_model_file(config.model)
    cache = open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    predictor = Predictor(config, reference_model(config, reader), cache, module)
    data = reader.load(dataset_id)
    if new_data is None:
        new = new_inputs(config, data, coding=reader.coding, module=module,
                         new_data=new_data_reader(config, new_data_files(config), reader.coding, [dataset_id]))
    else:
        new = given_inputs(data, new_data, reader.coding, config)
    return predictor.predict(read_fit_draws(dataset_id, config.layout.fit(dataset_id)), new).tree
