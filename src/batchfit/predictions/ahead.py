"""The compile stage's share of the predictions: the reference dataset's forward function, compiled ahead.

The compile stage fits the reference dataset once (to measure a fit); from that fit and the reference's
new inputs it compiles the forward function the predict jobs will ask for into the shared cache, and so
into the compiled bundle that jobs without a shared filesystem install from. A dataset whose plan differs
(its new inputs equal its data in some column, say) compiles its own in the job that meets it, once.
"""

from __future__ import annotations

import logging
from typing import Any

from batchfit.cache.store import CacheDir
from batchfit.config import Config
from batchfit.errors import BatchfitError, one_line
from batchfit.fitting.fitter import Reference
from batchfit.model.model_file import load_model_file
from batchfit.predictions.fit_draws import FitDraws
from batchfit.predictions.new_data import new_data_files, new_data_reader, new_inputs
from batchfit.predictions.predictor import Predictor

log = logging.getLogger("batchfit")


def compile_forward_ahead(config: Config, ref: Reference, cache: CacheDir, tree: Any) -> str | None:
    """The key of the forward function predicting the reference dataset from its fit ``tree`` (compiled into
    the cache if no process did before), or None when there is none to compile here (no ``predict``, no new
    inputs for the reference dataset, or a model only PyMC's own route predicts)."""
    if not config.predict.enabled:
        return None
    data = ref.dataset
    fit = FitDraws.of_tree(data.id, data.path, tree)
    try:
        files = new_data_files(config)
        if config.predict.source == "data" and data.id not in files:
            log.info("predict: the reference dataset %s has no new data; the first predict job compiles the "
                     "forward function", data.id)
            return None
        module = load_model_file(config.model)
        predictor = Predictor(config, ref, cache, module)
        new = new_inputs(config, data, coding=ref.coding, module=module,
                         new_data=new_data_reader(config, files, ref.coding, [data.id]))
        model, _, _ = predictor.model_for(new)
        function = predictor.function(predictor.plan(fit, model, new))
    except BatchfitError as exc:  # the reference's own predict job records it
        log.warning("predict: not compiling the forward function ahead: %s", one_line(exc))
        return None
    return None if function is None else function.key
