"""One job's predictor: a dataset's fit and new inputs in, its predictions (an ArviZ DataTree) out.

Per dataset: the fit's draws, ``constant_data`` and coordinates are read; the model is built on the
new inputs (cast to the sweep's dtypes as a fit job casts a dataset); `plan_forward` takes PyMC's
decision of what to draw anew; the forward function of that plan is loaded from the shared cache
(compiled once for the structure, `batchfit.predictions.forward`) and draws every output for all of the
fit's draws at once. The result is what ``pm.sample_posterior_predictive(fit, model, var_names=...,
predictions=True, random_seed=seed)`` returns: groups ``predictions`` and ``predictions_constant_data``.

A model the cached forward function cannot take (an operation numba runs in object mode, a shared
variable that is no ``pm.Data``) is predicted by ``pm.sample_posterior_predictive`` itself, which is
slower (it compiles per dataset) but the same prediction.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from batchfit import __version__
from batchfit.cache.store import CacheDir
from batchfit.config import Config
from batchfit.data.dataset import Dataset, MissingColumnError
from batchfit.errors import CachedPathUnsupported, ConfigError, DatasetError, one_line
from batchfit.fitting.fitter import Reference, dataset_seed, model_input
from batchfit.model.model_file import build_model, data_containers
from batchfit.model.variables import select_vars
from batchfit.predictions.fit_draws import FitDraws
from batchfit.predictions.forward import ForwardFunction, forward_function, forward_key
from batchfit.predictions.forward_plan import ForwardPlan, default_var_names, plan_forward, predictable_names

log = logging.getLogger("batchfit")

CACHED = "cached"  # the forward function from the shared cache
PYMC = "pymc"  # pm.sample_posterior_predictive itself


@dataclass
class Prediction:
    """One dataset's predictions, and what a record of them needs."""

    tree: Any  # groups predictions and predictions_constant_data
    inputs: Dataset  # the new inputs, as the model was built on them (observed placeholders included)
    read: tuple[str, ...]  # the columns the model reads (its pm.Data)
    filled: tuple[str, ...]  # observed columns the new inputs left out, filled with placeholders
    path: str  # CACHED or PYMC


class Predictor:
    """Predicts datasets of one model file with one job's forward functions (one per structure and plan)."""

    def __init__(self, config: Config, ref: Reference, cache: CacheDir, module: ModuleType):
        if not config.predict.enabled:
            raise ConfigError("predict gives no new inputs (none of data, grid, horizon)", key="predict",
                              source=config.source)
        self.config, self.ref, self.cache, self.module = config, ref, cache, module
        self.settings = config.predict
        self.observed = observed_columns(ref.model)
        self.functions: dict[str, ForwardFunction] = {}
        self.unsupported: dict[str, str] = {}  # plan key -> why the cached path cannot take it
        self.lines: list[str] = []  # how the forward functions were obtained, for the job's log
        self._warned: set[str] = set()
        self.var_names = self._var_names()

    def _var_names(self) -> list[str]:
        """The predicted variables (`predict.var_names`) of the reference model."""
        if self.settings.var_names is None:
            return default_var_names(self.ref.model)
        try:
            return select_vars(predictable_names(self.ref.model), self.settings.var_names, self.settings.filter_vars)
        except ValueError as exc:
            raise ConfigError(f"{exc} in the model of {self.config.model}", key="predict.var_names",
                              source=self.config.source) from None

    def model_for(self, new: Dataset) -> tuple[Any, Dataset, tuple[str, ...]]:
        """The model built on ``new`` (its observed columns filled in when left out, cast to the sweep's
        dtypes), the inputs it was built on, and the filled columns. A missing column names the form of
        the new inputs to fix."""
        import pytensor

        filled = tuple(name for name in self.observed if name not in new.arrays)
        inputs = with_placeholders(new, filled, self.ref)
        missing = [name for name in self.ref.requirements if name not in inputs.arrays]
        if missing:
            raise DatasetError(f"the new inputs have no column {missing[0]!r}, which the model reads (columns: "
                               f"{', '.join(map(repr, new.arrays))}); {_where_columns_come_from(self.settings.source)}",
                               dataset=new.id, path=new.path, column=missing[0])
        try:
            with pytensor.config.change_flags(traceback__limit=0):
                return build_model(self.module, model_input(inputs, self.ref), self.config.params), inputs, filled
        except MissingColumnError as exc:
            raise DatasetError(f"the new inputs have no column {exc.column!r}, which the model reads; "
                               f"{_where_columns_come_from(self.settings.source)}", dataset=new.id, path=new.path,
                               column=exc.column) from None

    def plan(self, fit: FitDraws, model: Any, new: Dataset) -> ForwardPlan:
        """PyMC's decision for predicting ``fit`` with ``model`` (built on ``new``); its warnings logged once."""
        plan = plan_forward(model, list(fit.posterior), fit.constant_data, fit.coordinates, self.var_names)
        if fit.structure and plan.structure != fit.structure:
            self._own_structure_once(new)
        self._log_warnings(plan)
        check_resizable(plan, fit, new)
        return plan

    def predict(self, fit: FitDraws, new: Dataset) -> Prediction:
        """``fit``'s predictions on the new inputs ``new`` (see module docstring)."""
        model, inputs, filled = self.model_for(new)
        plan = self.plan(fit, model, new)
        seed = dataset_seed(self.settings.seed, new.id)
        function = self.function(plan)
        if function is None:
            tree, path = self._pymc(plan, fit, seed), PYMC
        else:
            try:
                computed = function.draw(model, fit.stacked(), fit.n_samples, seed)
            except (ValueError, AssertionError, IndexError) as exc:  # the graph's own checks (shapes, parameters)
                raise DatasetError(f"the forward function failed on the new inputs: {type(exc).__name__}: "
                                   f"{one_line(exc)}", dataset=new.id, path=new.path) from exc
            tree, path = predictions_tree(plan, computed, fit), CACHED
        tree.attrs = {**self._attrs(plan, fit, new, seed, path, function), **tree.attrs}
        return Prediction(tree, inputs, tuple(self.ref.requirements), filled, path)

    def _own_structure_once(self, new: Dataset) -> None:
        """Warn once per job of a model whose structure changes with the new inputs."""
        if "structure" not in self._warned:
            self._warned.add("structure")
            log.warning("%s: the model built on the new inputs has another structure than its fit (values of the "
                        "dataset baked into the model as constants, or a size taken from the data as a Python "
                        "int): such a prediction gets a forward function of its own, compiled for it", new.id)

    def function(self, plan: ForwardPlan) -> ForwardFunction | None:
        """The plan's forward function (loaded once per job), or None when only PyMC's route takes it."""
        key = forward_key(plan)
        if plan.unsupported:
            self._unsupported_once(key, plan.unsupported)
        if key in self.unsupported:
            return None
        found = self.functions.get(key)
        if found is not None:
            return found
        try:
            fetched = forward_function(plan, self.cache, lock_timeout=self.config.cache.lock_timeout)
        except CachedPathUnsupported as exc:
            self._unsupported_once(key, one_line(exc))
            return None
        self.functions[key] = fetched.value
        line = (f"forward function {key[:12]}: " + ("cache hit" + (" (installed from the compiled bundle)"
                if fetched.installed else "") if fetched.hit else f"compiled in {fetched.compile_seconds:.1f} s")
                + f", sampling {', '.join(plan.sampled) or 'nothing'}")
        log.info("%s", line)
        self.lines.append(line)
        return fetched.value

    def _unsupported_once(self, key: str, reason: str) -> None:
        if key not in self.unsupported:
            self.unsupported[key] = reason
            log.warning("predictions of this structure go through pm.sample_posterior_predictive itself, which "
                        "compiles for every dataset, because batchfit's cached forward function cannot take it: %s",
                        reason)

    def _pymc(self, plan: ForwardPlan, fit: FitDraws, seed: int) -> Any:
        """PyMC's own route: ``pm.sample_posterior_predictive`` on the fit, with the plan's variables and ``seed``."""
        import pymc as pm

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyMC's own warnings were logged from the plan
            return pm.sample_posterior_predictive(fit.tree(), model=plan.model, predictions=True, random_seed=seed,
                                                  var_names=[v.name for v in plan.outputs], progressbar=False)

    def _log_warnings(self, plan: ForwardPlan) -> None:
        """PyMC's warnings for this prediction, and its note on Potentials, each once per job."""
        messages = [str(w.message) for w in plan.warnings]
        if plan.model.potentials:
            messages.append("the model's Potentials are ignored when predicting, as pm.sample_posterior_predictive "
                            "ignores them: predictions of a model whose Potentials constrain it may be biased")
        for message in messages:
            if message not in self._warned:
                self._warned.add(message)
                log.warning("%s", message)

    def _attrs(self, plan: ForwardPlan, fit: FitDraws, new: Dataset, seed: int, path: str,
               function: ForwardFunction | None) -> dict[str, Any]:
        return {"batchfit_version": __version__,
                "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "dataset": new.id, "source": str(new.path), "seed": seed, "prediction_path": path,
                "forward_key": function.key if function is not None and path == CACHED else "",
                "sampled": ", ".join(plan.sampled), "copied": ", ".join(plan.copied),
                "fit_provenance": fit.provenance, "structure": plan.structure}


def observed_columns(model: Any) -> tuple[str, ...]:
    """The ``pm.Data`` containers that only hold observations (not read by the generative graph): what new
    inputs may leave out (``pymc.backends.arviz.find_constants`` leaves them out of the constant data too)."""
    from pymc.backends.arviz import find_constants

    constants = set(find_constants(model))
    return tuple(name for name in data_containers(model) if name not in constants)


def with_placeholders(new: Dataset, columns: tuple[str, ...], ref: Reference) -> Dataset:
    """``new`` with each observed column it lacks as a placeholder of its rows (zeros: the forward function
    draws the observed variables and never reads their values), shaped as the reference dataset's column is,
    with ``new``'s number of rows."""
    if not columns:
        return new
    rows = new.n_rows
    arrays = dict(new.arrays)
    for name in columns:
        like = np.asarray(ref.dataset.arrays[name])
        shape = (rows, *like.shape[1:]) if like.ndim else ()
        arrays[name] = np.zeros(shape, like.dtype)
    return dataclasses.replace(new, arrays=arrays)


def check_resizable(plan: ForwardPlan, fit: FitDraws, new: Dataset) -> None:
    """A variable taken from the fit's draws whose dimension the new inputs resize cannot be predicted
    (a latent value per row, say): say which, instead of the forward function's shape error."""
    model = plan.model
    resized = {name.removeprefix("dim:") for name in plan.changed if name.startswith("dim:")}
    for var in plan.frozen:
        for axis, dim in enumerate(model.named_vars_to_dims.get(var.name) or ()):
            if dim not in resized or var.name not in fit.posterior:
                continue
            length, drawn = int(model.dim_lengths[dim].get_value()), fit.posterior[var.name].shape[2 + axis]
            if length != drawn:
                raise DatasetError(
                    f"variable {var.name!r} is taken from the fit's draws with dimension {dim!r} of length {drawn}, "
                    f"but the new inputs give it length {length}: a variable sized by the data cannot be "
                    "predicted on other rows (the model cannot be resized by its pm.Data)", dataset=new.id,
                    path=new.path)


def _where_columns_come_from(source: str) -> str:
    return {"data": "add it to the new-data file (only the observed columns may be left out)",
            "grid": "add it to predict.grid (only columns holding one value in the dataset are carried over)",
            "horizon": "have the model file's extend(data, horizon) return it"}[source]


def predictions_tree(plan: ForwardPlan, computed: Mapping[str, np.ndarray], fit: FitDraws) -> Any:
    """The DataTree ``pm.sample_posterior_predictive(..., predictions=True)`` returns: the predicted variables
    (computed, or copied from the draws) along chain and draw, and the new inputs' constant data."""
    import xarray as xr
    from pymc.backends.arviz import find_constants

    model = plan.model
    n_chain, n_draw = fit.n_chains, fit.n_draws
    labelled = {dim: list(labels) for dim, labels in model.coords.items() if labels is not None}
    variables = {}
    copied = set(plan.copied)  # after the computed ones, as PyMC fills its trace: each draw's computed values first
    for var in [*(v for v in plan.outputs if v.name not in copied), *(v for v in plan.outputs if v.name in copied)]:
        if var.name in computed:  # (draw, ...), chain after chain
            value = computed[var.name].reshape(n_chain, n_draw, *computed[var.name].shape[1:])
        else:
            value = fit.posterior[var.name]
        variables[var.name] = (("chain", "draw", *_dims(model, var.name, value.ndim - 2)), value)
    coords = {"chain": fit.coordinates["chain"], "draw": fit.coordinates["draw"]}
    predictions = xr.Dataset(variables, coords={**coords, **_used(labelled, variables)})
    constants = {name: (_dims(model, name, np.ndim(value)), np.asarray(value))
                 for name, value in find_constants(model).items()}
    constant = xr.Dataset(constants, coords=_used(labelled, constants))
    return xr.DataTree.from_dict({"predictions": predictions, "predictions_constant_data": constant})


def _dims(model: Any, name: str, ndim: int) -> tuple[str, ...]:
    dims = model.named_vars_to_dims.get(name)
    return tuple(dims) if dims and len(dims) == ndim else tuple(f"{name}_dim_{i}" for i in range(ndim))


def _used(labelled: Mapping[str, list], variables: Mapping[str, tuple]) -> dict[str, Any]:
    """The coordinates of the dimensions ``variables`` use: their labels, or as ArviZ gives a dimension
    without labels, its positions."""
    sizes = {dim: size for dims, value in variables.values() for dim, size in zip(dims, np.shape(value), strict=True)}
    return {dim: labelled[dim] if dim in labelled else np.arange(size) for dim, size in sizes.items()
            if dim not in ("chain", "draw")}

