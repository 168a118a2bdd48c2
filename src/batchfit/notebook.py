"""Notebook entry points: one dataset of a sweep, and its model, exactly as a fit job builds them.

    import batchfit, pymc as pm
    data = batchfit.load_dataset("config.yaml", "store_003")   # the file as a fit job reads it; builds no model
    model = batchfit.build_model("config.yaml", "store_003")   # the model the sweep fits
    idata = pm.sample(model=model, nuts_sampler="nutpie")
    preds = batchfit.predict("config.yaml", "store_003", {"x": [0.5, 1.0], "group": ["g01", "g01"]})

So a model can be debugged, or a fit compared with ``pm.sample``, without a stand-in for ``data``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchfit.config import Config, load_config
from batchfit.data.dataset import Dataset
from batchfit.data.discovery import discover_datasets
from batchfit.errors import BatchfitError, DatasetError
from batchfit.fitting import fitter
from batchfit.model import model_file
from batchfit.variants import one_variant

if TYPE_CHECKING:
    import pymc as pm
    import xarray as xr


def load_dataset(config_or_path: Config | str | Path, dataset_id: str, variant: str | None = None) -> Dataset:
    """Dataset ``dataset_id`` of a sweep as it is read in a fit job: its text columns coded as the sweep
    codes them (`batchfit.data.coding`). No model is built: bad data raises the error the fit would
    record, and a model that fails shows its error in `build_model` only. ``variant``: in a sweep of variants,
    which one's config (its ``columns`` may code the text columns otherwise).
    """
    config = _config(config_or_path, variant)
    paths = discover_datasets(config.data_sources)
    if dataset_id not in paths:
        sources = ", ".join(str(s) if isinstance(s, str) else f"table {s.table} by {', '.join(s.by)}"
                            for s in config.datasets)
        raise DatasetError(f"no dataset {dataset_id!r} among the config's datasets ({sources}, config "
                           f"{config.source}); a file's id is its name without the suffix, a table group's its key "
                           "values (batchfit check lists the ids that are neither as they are)", dataset=dataset_id)
    return fitter.sweep_reader(config, paths, wanted=[dataset_id]).load(dataset_id)


def build_model(config_or_path: Config | str | Path, dataset_id: str, variant: str | None = None) -> pm.Model:
    """The PyMC model a fit job builds for ``dataset_id``: ready for ``pm.sample``, to compare or debug.

    The dataset is checked against what the reference dataset's model needs and cast to its dtypes,
    as `batchfit.fitting.fitter.Fitter.build` does. An error of ``build_model`` is a
    `batchfit.errors.ModelCodeError` naming the model's line, caused by the model's own exception,
    whose traceback keeps the model's frames (`batchfit.model.user_traceback`). ``variant``: in a sweep of
    variants, which one's model and ``params``.
    """
    config = _config(config_or_path, variant)
    data = load_dataset(config, dataset_id)
    module = model_file.load_model_file(config.model)
    try:
        ref = fitter.reference_model(config, fitter.sweep_reader(config))
    except BatchfitError:  # no dataset builds: this one's own error says why
        return model_file.build_model(module, data, config.params)
    return model_file.build_model(module, fitter.model_input(data, ref), config.params)


def _config(config_or_path: Config | str | Path, variant: str | None) -> Config:
    """A Config as given, or loaded from a YAML file (relative paths in it: to the current directory); in a
    sweep of variants, ``variant``'s own."""
    return one_variant(config_or_path if isinstance(config_or_path, Config) else load_config(config_or_path), variant)


def predict(config_or_path: Config | str | Path, dataset_id: str, new_data: Any = None,
            variant: str | None = None) -> xr.DataTree:
    """Predictions of ``dataset_id``'s fit on ``new_data``, as a predict job makes them (the same cached forward
    function): the DataTree ``pm.sample_posterior_predictive(fit, model, predictions=True)`` returns, with
    groups ``predictions`` and ``predictions_constant_data``. Nothing is written.

    ``new_data``: a file, a mapping of column to values or a pandas DataFrame (text columns as labels), or a
    `Dataset`; None: what the config's ``predict`` key gives the dataset (its new-data file, the grid, or the
    model file's ``extend``). ``variant``: in a sweep of variants, which one's fit.
    """
    from batchfit.sweep.predict_job import predict_one

    return predict_one(_config(config_or_path, variant), dataset_id, new_data)
