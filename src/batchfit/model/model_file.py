"""Load a user's model file and build its PyMC model for a dataset, checking batchfit's contract.

The contract (docs/model.md, "The contract"): the file defines ``build_model(data) -> pm.Model``;
every array that differs between datasets enters the model as ``pm.Data(name, data[name])``
under its column's name, and dimension labels come from ``data.coords``. Then one compiled
model serves every dataset, because datasets differ only in the values of those containers.
A model that bakes a dataset's values in as constants is still fitted, by a compile of its
own (`baked_values` names what is baked in and how to pass it through ``pm.Data``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from batchfit.common.hashing import file_sha256
from batchfit.data.dataset import DataRequirement, Dataset
from batchfit.errors import BatchfitError, ModelContractError
from batchfit.model.imports import FolderModules, model_folder, scan, use
from batchfit.model.python_mode import python_mode
from batchfit.model.user_traceback import model_code_error

# Loaded model files by path and digest of their content and of the user modules they import.
_MODULES: dict[tuple[Path, str], ModuleType] = {}
_FOLDERS: dict[ModuleType, FolderModules] = {}  # each loaded model file's modules from its folder


def load_model_file(path: Path) -> ModuleType:
    """Import the model file (once per content of it and of the user modules it imports) and check
    that it defines ``build_model``.

    Its folder is importable while it runs and whenever batchfit calls into it
    (`batchfit.model.imports.use`), after the installed modules: ``from helpers import simulate``
    finds ``helpers.py`` beside it. A file there that an import cannot reach (``numpy.py``) is an
    error if the model imports that name.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelContractError(f"model file {path} does not exist")
    digest = file_sha256(path)
    imports = scan(path)
    key = (path, hashlib.sha256(json.dumps([digest, imports.modules]).encode()).hexdigest())
    if key in _MODULES:
        return _MODULES[key]
    if imports.shadowed:
        raise ModelContractError(f"model file {path} cannot import a module beside it: {imports.shadow_error(path)}")
    name = f"batchfit_model_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelContractError(f"model file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    folder = FolderModules(model_folder(path))
    sys.modules[name] = module
    use(folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        hint = (f" (a model file imports installed modules and the modules and packages in its own folder, "
                f"{folder.folder})" if isinstance(exc, ModuleNotFoundError) else "")
        raise ModelContractError(
            f"importing model file {path} failed: {type(exc).__name__}: {exc}{hint}") from exc
    if not callable(getattr(module, "build_model", None)):
        raise ModelContractError(
            f"model file {path} defines no function build_model(data); batchfit calls it with each "
            "dataset and expects a pm.Model back (see batchfit's docs/model.md)"
        )
    _MODULES[key] = module
    _FOLDERS[module] = folder
    return module


def use_model_folder(module: ModuleType) -> None:
    """Make the folder of a model file loaded by `load_model_file` importable, with the modules it
    imported from there, before calling into it (cheap when it is already the one in use)."""
    folder = _FOLDERS.get(module)
    if folder is not None:
        use(folder)


def build_model(module: ModuleType, dataset: Dataset, params: Mapping[str, Any] | None = None) -> Any:
    """Call the user's ``build_model`` for one dataset, with the config's ``params`` as keyword arguments
    (a variant's own, see docs/variants.md), and check what comes back."""
    import pymc as pm

    use_model_folder(module)
    try:
        model = module.build_model(dataset, **(params or {}))
    except BatchfitError:
        raise
    except Exception as exc:
        # the model's own frames and line: `batchfit.model.user_traceback`
        raise model_code_error(exc, Path(module.__file__),
                               f"build_model failed for dataset '{dataset.id}' ({dataset.path})") from exc
    if not isinstance(model, pm.Model):
        raise ModelContractError(
            f"build_model returned {type(model).__name__} for dataset '{dataset.id}'; it must return a pm.Model"
        )
    check_containers(model, dataset)
    return model


def data_containers(model: Any) -> dict[str, Any]:
    """The model's ``pm.Data`` containers by name."""
    from pytensor.compile.sharedvalue import SharedVariable

    return {name: var for name, var in model.named_vars.items() if isinstance(var, SharedVariable)}


def swappable_inputs(model: Any) -> list[Any]:
    """Every value batchfit swaps between datasets: ``pm.Data`` containers and shared dimension lengths."""
    from pytensor.compile.sharedvalue import SharedVariable

    lengths = [v for v in model.dim_lengths.values() if isinstance(v, SharedVariable)]
    return list(dict.fromkeys([*data_containers(model).values(), *lengths]))


def requirements(model: Any) -> dict[str, DataRequirement]:
    """Rank and dtype of every column the model reads: later datasets must match them."""
    return {name: DataRequirement(ndim=var.type.ndim, dtype=np.dtype(var.type.dtype))
            for name, var in data_containers(model).items()}


def check_containers(model: Any, dataset: Dataset) -> None:
    """Every ``pm.Data`` must be a column: batchfit swaps each container for its column's values."""
    missing = [name for name in data_containers(model) if name not in dataset]
    if missing:
        raise ModelContractError(
            f"pm.Data container(s) {', '.join(repr(m) for m in missing)} have no column in dataset "
            f"'{dataset.id}' ({dataset.path}); columns are: {', '.join(sorted(dataset.keys()))}. "
            "Name each pm.Data after the column it holds: pm.Data('x', data['x'])."
        )


def baked_values(model: Any, dataset: Dataset) -> str:
    """What of ``dataset`` is baked into ``model`` as constants instead of entering through pm.Data
    ('' if nothing is), each value with the model variable using it and a fix that works as written.

    Such a model is still fitted, but by its own compile (`batchfit.compile.structures`): a compiled
    model serving other datasets would silently reuse this dataset's values.
    """
    listing = [f"column '{col}' (used by model variable '{var}'): {data_fix(model, col)}"
               for col, var in baked_in_columns(model, dataset)]
    listing += [f"an array of shape {shape} with one entry per row, computed from the data (used by model "
                f"variable '{var}'): put the columns it is computed from in pm.Data and compute it in the "
                "model, e.g. age = pm.Data('age', data['age']); (age - 60) / 10"
                for shape, var in derived_arrays(model, dataset)]
    if not listing:
        return ""
    return (f"{len(listing)} value(s) of dataset '{dataset.id}' are baked into the model as constants instead of "
            "entering through pm.Data: " + "; ".join(listing))


def data_fix(model: Any, column: str) -> str:
    """How to pass ``column`` through pm.Data, renaming a dimension of the same name if there is one."""
    fix = f"in build_model write pm.Data('{column}', data['{column}']) and use that"
    if column in model.coords:
        fix += (f", and rename the dimension '{column}' (e.g. coords={{'{column}_levels': ...}} and "
                f"dims='{column}_levels'): a pm.Data may not share a dimension's name")
    return fix


def _constants_by_variable(model: Any) -> Iterator[tuple[str, np.ndarray]]:
    """Every non-scalar constant of the model's graphs, with the variable (or observed value) it feeds."""
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import graph_inputs

    outputs = [(out.name, out) for out in [*model.free_RVs, *model.observed_RVs, *model.deterministics,
                                            *model.potentials]]
    outputs += [(rv.name, model.rvs_to_values[rv]) for rv in model.observed_RVs]
    for label, out in outputs:
        for var in graph_inputs([out]):
            if isinstance(var, Constant) and np.ndim(var.data) > 0:
                yield label, np.asarray(var.data)


def derived_arrays(model: Any, dataset: Dataset) -> list[tuple[tuple[int, ...], str]]:
    """Constant arrays with one entry per row of the dataset that are no column: computed from the data."""
    rows = dataset.n_rows
    columns = [np.asarray(a) for a in dataset.arrays.values()]
    found: dict[str, tuple[int, ...]] = {}
    for label, data in _constants_by_variable(model):
        if label in found or rows <= 1 or data.shape[0] != rows:
            continue
        if not any(data.shape == col.shape and np.array_equal(data, col) for col in columns):
            found[label] = data.shape
    return [(shape, label) for label, shape in found.items()]


def baked_in_columns(model: Any, dataset: Dataset) -> list[tuple[str, str]]:
    """Columns whose values appear as constants in the model graph, with a variable using them.

    Observed values count too: ``observed=data['y']`` bakes the column in like any constant.
    """
    containers = data_containers(model)
    columns = {name: np.asarray(arr) for name, arr in dataset.arrays.items()
               if name not in containers and np.ndim(arr) >= 1 and np.size(arr) > 1}
    found: dict[str, str] = {}
    for label, data in _constants_by_variable(model) if columns else ():
        for name, col in columns.items():
            if name not in found and data.shape == col.shape and np.array_equal(data, col):
                found[name] = label
    return list(found.items())


def observed_and_constant_data(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Arrays for the ``observed_data`` and ``constant_data`` groups, with their dims."""
    observed_values = {model.rvs_to_values[rv] for rv in model.observed_RVs}
    observed, constant = {}, {}
    for rv in model.observed_RVs:
        observed[rv.name] = (_dims(model, rv.name), _observed_value(model.rvs_to_values[rv]))
    for name, var in data_containers(model).items():
        if var not in observed_values:
            constant[name] = (_dims(model, name), np.asarray(var.get_value()))
    return observed, constant


def _observed_value(value: Any) -> np.ndarray:
    """The observed array: a ``pm.Data`` container, a constant, or an expression of them.

    PyMC casts integer data to the likelihood's float dtype, so an integer ``pm.Data`` column
    arrives as a cast, read here without compiling anything. Any other expression is
    evaluated with the Python linker (a PyTensor function per dataset, but no numba code).
    """
    from pytensor.graph.basic import Constant
    from pytensor.scalar import Cast
    from pytensor.tensor.elemwise import Elemwise

    if hasattr(value, "get_value"):
        return np.asarray(value.get_value())
    if isinstance(value, Constant):
        return np.asarray(value.data)
    op = value.owner.op if value.owner else None
    if isinstance(op, Elemwise) and isinstance(op.scalar_op, Cast) and hasattr(value.owner.inputs[0], "get_value"):
        return np.asarray(value.owner.inputs[0].get_value(), dtype=value.dtype)
    with python_mode():
        return np.asarray(value.eval())


def _dims(model: Any, name: str) -> tuple[str, ...] | None:
    dims = model.named_vars_to_dims.get(name)
    return tuple(dims) if dims else None
