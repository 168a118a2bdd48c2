"""Drawing SBC's simulations: true parameters and data from the prior predictive on the template."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.common.atomic import atomic_path
from batchfit.common.hashing import file_sha256
from batchfit.config import Config
from batchfit.data.dataset import Dataset
from batchfit.data.discovery import table_kind
from batchfit.errors import ConfigError, ModelContractError, RecordError
from batchfit.fitting.fitter import dataset_seed
from batchfit.fitting.provenance import versions
from batchfit.model.imports import user_imports
from batchfit.model.model_file import build_model, load_model_file
from batchfit.model.python_mode import python_mode
from batchfit.records.simulation_truth import SimulationTruth
from batchfit.sweep.sbc.sweep import (
    VALUES_KEY,
    data_paths,
    record_levels,
    simulation_ids,
    template,
    template_levels,
    template_reader,
)

log = logging.getLogger("batchfit")


@dataclass(frozen=True)
class SimulationReport:
    """How many simulated datasets were written now and how many were already up to date."""

    written: int
    kept: int

    def one_line(self) -> str:
        return f"sbc simulate: {self.written} simulated dataset(s) written, {self.kept} already up to date"


class Simulator:
    """Draws (true parameters, observed data) from a model built on the template dataset.

    The template comes loaded as the sweep codes it (`template_levels`). The forward-sampling
    function is compiled once; each simulation reseeds its random generators from
    ``(sbc.seed, simulation id)`` (as `batchfit.fitting.fitter.dataset_seed` does for fits), so a
    simulation never depends on which others were drawn before it.
    """

    def __init__(self, config: Config, dataset: Dataset):
        from pymc.sampling.forward import compile_forward_sampling_function
        from pytensor.tensor.random.type import RandomGeneratorType


        self.config = config
        self.dataset = dataset
        model = build_model(load_model_file(generator_file(config)), self.dataset, config.params)
        self.parameters = [v.name for v in (*model.free_RVs, *model.deterministics)]
        self.coords = {name: _named_coords(model, name) for name in self.parameters}
        self.columns = observed_columns(model, generator_file(config))
        outputs = [*model.free_RVs, *model.deterministics, *model.observed_RVs]
        self.names = [v.name for v in outputs]
        # The Python backend: the function runs once per simulation, so compiling it with numba
        # (seconds to minutes) or g++ would cost far more than it saves.
        with python_mode():
            self.function, _ = compile_forward_sampling_function(
                outputs, vars_in_trace=[], basic_rvs=model.basic_RVs, model=model,
                allow_input_downcast=True, accept_inplace=True)
        self.rngs = [v for v in self.function.get_shared() if isinstance(v.type, RandomGeneratorType)]

    def draw(self, sim_id: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The true parameter values and the observed columns of one simulation."""
        from pymc.pytensorf import reseed_rngs


        reseed_rngs(self.rngs, dataset_seed(self.config.sbc.seed, sim_id))
        values = dict(zip(self.names, (np.asarray(v) for v in self.function()), strict=True))
        truth = {name: values[name] for name in self.parameters}
        observed = {column: values[rv] for rv, column in self.columns.items()}
        return truth, observed


def _named_coords(model: Any, name: str) -> dict[str, list[Any]]:
    """The labels of each named dimension of variable ``name`` that has them (JSON-able)."""
    coords = {}
    for dim in model.named_vars_to_dims.get(name, ()):
        labels = model.coords.get(dim) if dim is not None else None
        if labels is not None:
            coords[dim] = [v.item() if isinstance(v, np.generic) else v for v in labels]
    return coords


def generator_file(config: Config) -> Path:
    """The model file whose prior predictive generates the data: ``sbc.simulator`` or the model."""
    return config.sbc.simulator or config.model


def simulation_digests(config: Config, levels: Mapping[str, list[str]] | None = None) -> dict[str, str]:
    """Each simulation's digest of what determines it: the generator file, the user modules it
    imports and the template file (by content), the labels of the template's text columns in
    code order (``levels``, default `template_levels`), the seed, its id and the library
    versions. Cheap: reads the template, builds nothing.

    The labels, not the coding's settings: a change that leaves the template's codes and
    labels as they are (another dataset's new label of a ``scope: dataset`` column) changes
    no simulation."""

    template_id, _ = template(config)
    if not generator_file(config).is_file():
        raise ConfigError(f"simulator file '{generator_file(config)}' does not exist", key="sbc.simulator",
                          source=config.source)
    levels = template_levels(config)[1] if levels is None else levels
    inputs = {"generator_sha256": file_sha256(generator_file(config)),
              "generator_imports": user_imports(generator_file(config)), "template": template_id,
              "template_sha256": template_reader(config).digest(template_id), "seed": config.sbc.seed,
              "versions": versions(),
              "coding": dict(levels)}
    return {sim: hashlib.sha256(json.dumps({**inputs, "simulation": sim}, sort_keys=True).encode()).hexdigest()
            for sim in simulation_ids(config.sbc.n_simulations)}


def observed_columns(model: Any, model_file: Path) -> dict[str, str]:
    """Observed variable -> the ``pm.Data`` column that holds its data (replaced by simulated values)."""
    from pytensor.scalar import Cast
    from pytensor.tensor.elemwise import Elemwise

    columns = {}
    for rv in model.observed_RVs:
        value = model.rvs_to_values[rv]
        owner = value.owner
        if owner is not None and isinstance(owner.op, Elemwise) and isinstance(owner.op.scalar_op, Cast):
            value = owner.inputs[0]  # PyMC casts integer data to the likelihood's dtype
        if not hasattr(value, "get_value") or value.name is None:
            raise ModelContractError(
                f"SBC needs the observed data of {rv.name!r} in {model_file} as a pm.Data column "
                f"(observed=pm.Data('y', data['y'])), so simulated datasets can replace it")
        columns[rv.name] = value.name
    if not columns:
        raise ModelContractError(f"the model of {model_file} has no observed variable to simulate")
    return columns


def simulate(config: Config) -> SimulationReport:
    """Write every missing or outdated simulated dataset and its truth file; keep the others as they are.

    Records the levels the template is coded with for `sbc_config` first: a simulation drawn
    with other levels has another digest, so a run killed after the record is rewritten draws
    it again. The simulator (a model build and a compile) is only made when something is to be
    written.
    """

    paths = data_paths(config)
    dataset, levels = template_levels(config)
    digests = simulation_digests(config, levels)
    record_levels(config, dataset.id, levels)
    todo = [sim for sim, path in paths.items() if not _up_to_date(config, sim, path, digests[sim])]
    if not todo:
        return SimulationReport(0, len(paths))
    simulator = Simulator(config, dataset)
    write_simulated_values(config, dataset, list(paths))
    for sim in todo:
        truth, observed = simulator.draw(sim)
        write_simulated(simulator.dataset, observed, paths[sim], exclude=set(config.params) | set(_side_names(config)))
        record = SimulationTruth(sim, digests[sim], file_sha256(paths[sim]), str(generator_file(config)),
                                 simulator.dataset.id, {name: value.tolist() for name, value in truth.items()},
                                 simulator.coords)
        record.write(config.layout.sbc.truth(sim))  # last: a killed run leaves the simulation to redo
    return SimulationReport(len(todo), len(paths) - len(todo))


def _up_to_date(config: Config, sim_id: str, data: Path, digest: str) -> bool:
    """Whether the simulation's truth file records ``digest`` and the data file it wrote."""

    try:
        record = SimulationTruth.read(config.layout.sbc.truth(sim_id))
        return record.digest == digest and record.data_sha256 == file_sha256(data)
    except (OSError, RecordError):  # none yet, or an older or damaged one: drawn again
        return False


def write_simulated_values(config: Config, template: Dataset, simulations: list[str]) -> None:
    """The template's per-dataset values (its side-table row) as the simulated sweep's side table, a row per
    simulation, so that every simulated dataset gets them as the template did."""
    if not config.values:
        return
    import pandas as pd

    names = _side_names(config)
    frame = pd.DataFrame({VALUES_KEY: simulations, **{name: [template.arrays[name].item()] * len(simulations)
                                                      for name in names if name in template.arrays}})
    path = config.layout.sbc.simulated_values
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def _side_names(config: Config) -> list[str]:
    """The value columns of the config's side tables."""
    if not config.values:
        return []
    from batchfit.data.values import read_side_values

    return [name for table in read_side_values(config.values, config.source).tables for name in table.columns]


def write_simulated(template: Dataset, observed: Mapping[str, np.ndarray], path: Path, *,
                    exclude: set[str] = frozenset()) -> None:
    """The template's rows with its observed columns replaced: a table as CSV, NetCDF as NetCDF.

    A table's rows are those the model saw (the row rules applied), written from the template's
    arrays with full precision, so the files are deterministic; a text column (codes) is written as
    its labels (labels such as '01' keep their form), which the simulated sweep codes back to the same
    codes. ``exclude``: the template's values that are no columns (``params``, side-table values).
    """
    kind = table_kind(template.path)
    with atomic_path(path) as tmp:
        if kind is None and template.row_index is None:
            import xarray as xr

            with xr.open_dataset(template.path, engine="h5netcdf") as ds:
                ds = ds.load()
            for column, values in observed.items():
                ds[column] = (ds[column].dims, _shaped(values, ds[column].shape, column, template))
            ds.to_netcdf(tmp, engine="h5netcdf")
            return
        import pandas as pd

        columns = {name: array for name, array in template.arrays.items() if name not in exclude and array.ndim == 1}
        frame = pd.DataFrame({name: _template_labels(array, name, template) if name in template.coords else array
                              for name, array in columns.items()})
        for column, values in observed.items():
            values = _shaped(values, (len(frame),), column, template)
            frame[column] = _labelled(values, column, template) if column in template.coords else values
        frame.to_csv(tmp, index=False, float_format="%.17g")


def _shaped(values: np.ndarray, shape: tuple[int, ...], column: str, template: Dataset) -> np.ndarray:
    if values.shape != tuple(shape):
        raise ModelContractError(
            f"the simulated {column!r} has shape {values.shape}, but column {column!r} of the template "
            f"dataset '{template.id}' ({template.path}) has shape {tuple(shape)}")
    return values


def _template_labels(codes: np.ndarray, column: str, template: Dataset) -> np.ndarray:
    """The template's codes of text column ``column`` as its labels (a missing label, code -1, as missing)."""
    labels = np.asarray([*template.coords[column], None], dtype=object)
    return labels[np.where(codes >= 0, codes, len(labels) - 1)]


def _labelled(codes: np.ndarray, column: str, template: Dataset) -> np.ndarray:
    """Simulated codes of text column ``column`` as the template's labels of those codes."""
    labels = np.asarray(template.coords[column], dtype=object)
    valid = np.issubdtype(codes.dtype, np.integer) & (codes >= 0) & (codes < len(labels))
    if not np.all(valid):
        raise ModelContractError(
            f"the simulated {column!r} holds {codes[~valid].ravel()[0].item()!r}, which is no code "
            f"0..{len(labels) - 1} of the labels of text column {column!r} of the template dataset "
            f"'{template.id}' ({template.path})")
    return labels[codes]
