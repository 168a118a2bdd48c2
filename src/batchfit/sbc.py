"""Simulation-based calibration (SBC) as a sweep: simulate, fit like any dataset, rank, test.

Talts et al. (2018): if parameters are drawn from the prior and data from the model given them,
the rank of each true value among the posterior draws of a fit to that data is uniform, for a
correct model and a correct sampler. batchfit makes each simulated dataset an ordinary dataset
file, so the fits go through the same compile cache, batches, provenance and cluster rules as a
sweep of real data:

* `simulate` draws N parameter sets and observed data from the prior predictive of the model
  (or of a separate simulator model file) built on a template dataset, with one compiled
  forward-sampling function; simulation i depends only on ``sbc.seed`` and i. Each becomes
  ``{results}/sbc/data/sim-NNNNN.{csv|nc}`` (the template with its observed columns replaced)
  and ``{results}/sbc/truth/sim-NNNNN.json`` (the true values). A simulation whose truth file
  records the current inputs' digest and its data file's sha256 is never rewritten, so raising
  ``n_simulations`` leaves the existing files, hence their fits, untouched.
* The template is coded as the sweep codes it (`template_levels`): a sweep-wide text column has
  every label of the sweep, those the template lacks included. Those levels are recorded in
  ``{results}/sbc/template_coding.json``, and the simulated sweep codes every simulated file by
  exactly them, in every process: left to find its own levels in the simulated files, it would
  see only the template's labels, and build another model than the simulator's.
* `sbc_config` is the user's config with those files as ``datasets``, ``{results}/sbc`` as
  ``results_dir`` and the recorded levels as ``columns``: `batchfit.pipeline.plan` and
  `batchfit.fit.fit_batch` fit only what is pending, so a killed run resumes and more
  simulations fit only the new ones.
* `rank_simulations` ranks each true value among the thinned posterior draws for every scalar
  element of every free parameter and deterministic, tests uniformity with ArviZ's simultaneous
  ECDF bands (Säilynoja, Bürkner & Vehtari 2022) and writes ``ranks.csv``, ``ranks.nc``,
  ``uniformity.csv``, ``verdict.txt`` and one PNG per parameter. Simulations whose fit failed
  are counted in the verdict, never silently dropped: leaving them out biases SBC.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.atomic import atomic_path
from batchfit.config import ColumnSettings, Config
from batchfit.data import Dataset, discover_datasets, load_dataset, table_kind
from batchfit.errors import BatchfitError, ConfigError, ModelContractError
from batchfit.python_mode import python_mode

log = logging.getLogger("batchfit")

SIM_PREFIX = "sim-"
RANKS_GROUP = "prior_sbc"  # the group simuk writes and arviz_plots.plot_ecdf_pit reads
TEMPLATE_CODING_NAME = "template_coding.json"


def sbc_root(config: Config) -> Path:
    """Everything SBC writes lives here; it is the results_dir of the simulated sweep."""
    return config.results_dir / "sbc"


def simulation_ids(n: int) -> list[str]:
    """Ids of the first ``n`` simulations; zero-padded so that id order is index order."""
    return [f"{SIM_PREFIX}{i:05d}" for i in range(n)]


def truth_path(config: Config, sim_id: str) -> Path:
    """The true parameter values of one simulation (JSON)."""
    return sbc_root(config) / "truth" / f"{sim_id}.json"


def template(config: Config) -> tuple[str, Path]:
    """The template dataset's id and file: ``sbc.template``, or the first dataset by id."""
    datasets = discover_datasets(config)
    wanted = config.sbc.template or next(iter(datasets))
    if wanted not in datasets:
        raise ConfigError(f"dataset {wanted!r} is not among the config's datasets "
                          f"(e.g. {', '.join(list(datasets)[:5])})", key="sbc.template", source=config.source)
    return wanted, datasets[wanted]


def _data_suffix(template_path: Path) -> str:
    """Simulated tables are CSV (read back exactly); NetCDF templates stay NetCDF."""
    return ".csv" if table_kind(template_path) else ".nc"


def data_paths(config: Config) -> dict[str, Path]:
    """The simulated data file of each of the first ``sbc.n_simulations`` simulations."""
    suffix = _data_suffix(template(config)[1])
    root = sbc_root(config) / "data"
    return {sim: root / f"{sim}{suffix}" for sim in simulation_ids(config.sbc.n_simulations)}


def sbc_config(config: Config) -> Config:
    """The sweep of the simulated datasets: same model, sampler, cache and outputs; its own results.

    Its ``columns`` list, for each text column of the template, the levels the simulator coded
    it with (recorded by `simulate`), so every job of it, in any process, gives each simulated
    file the template's codes and ``data.coords``. The simulated files must exist (see
    `simulate`): `discover_datasets` checks them. ``on_error`` is always ``continue``: a failed
    fit is an SBC result to count, not a reason to stop.
    """
    # A column without any label in the template (empty) has no list to give: coded within each
    # simulated file, it is as empty there, so it gets no levels either, as in the template.
    columns = {name: ColumnSettings(levels=tuple(labels), order="listed") if labels else ColumnSettings(scope="dataset")
               for name, labels in recorded_levels(config).items()}
    return dataclasses.replace(
        config, datasets=tuple(str(p) for p in data_paths(config).values()),
        results_dir=sbc_root(config), on_error="continue", columns=columns)


def template_levels(config: Config) -> tuple[Dataset, dict[str, list[str]]]:
    """The template loaded as the sweep codes it, and the labels of each of its text columns in code order.

    A column coded for the whole sweep (the default) has every label of the sweep, those the
    template lacks included; one with ``scope: dataset`` has the template's own labels.
    """
    from batchfit.coding import sweep_coding

    template_id, template_path = template(config)
    coding = sweep_coding(config, discover_datasets(config))
    dataset = load_dataset(template_id, template_path, coding)
    return dataset, {name: list(dataset.coords[name]) for name in coding.for_dataset(template_id)}


def template_sweep_coding(config: Config) -> dict[str, Any]:
    """How the sweep codes the template's text columns (`batchfit.coding.Coding.for_dataset`).

    Read from the label registry without loading the template: it changes whenever the
    template's levels (`template_levels`) may, so Snakemake's simulation checkpoint watches it.
    """
    from batchfit.coding import sweep_coding

    template_id, _ = template(config)
    return sweep_coding(config, discover_datasets(config)).for_dataset(template_id)


def template_coding_path(config: Config) -> Path:
    """Where `simulate` records the levels the simulated datasets are coded with."""
    return sbc_root(config) / TEMPLATE_CODING_NAME


def recorded_levels(config: Config) -> dict[str, list[str]]:
    """The levels of each text column of the template the simulations were drawn with (see `simulate`)."""
    path = template_coding_path(config)
    try:
        return json.loads(path.read_text())["columns"]
    except FileNotFoundError:
        raise BatchfitError(f"sbc: {path} does not exist; simulate first (batchfit sbc or snakemake sbc)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BatchfitError(f"sbc: cannot read {path} ({exc}); delete it and simulate again") from None


def _record_levels(config: Config, template_id: str, levels: Mapping[str, list[str]]) -> None:
    """Record the template's levels for `sbc_config`, unless the record already says so."""
    path = template_coding_path(config)
    record = {"template": template_id, "columns": dict(levels)}
    try:
        if json.loads(path.read_text()) == record:
            return
    except (OSError, ValueError):
        pass  # none yet, or damaged: written now
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=1))


# ---------------------------------------------------------------------------------------------
# Simulation


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
    ``(sbc.seed, simulation id)`` (as `batchfit.fit.dataset_seed` does for fits), so a
    simulation never depends on which others were drawn before it.
    """

    def __init__(self, config: Config, dataset: Dataset):
        from pymc.sampling.forward import compile_forward_sampling_function
        from pytensor.tensor.random.type import RandomGeneratorType

        from batchfit.modelfile import build_model, load_model_file

        self.config = config
        self.dataset = dataset
        model = build_model(load_model_file(generator_file(config)), self.dataset)
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

        from batchfit.fit import dataset_seed

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
    from batchfit.model_imports import user_imports
    from batchfit.provenance import file_sha256, versions

    template_id, template_path = template(config)
    if not generator_file(config).is_file():
        raise ConfigError(f"simulator file '{generator_file(config)}' does not exist", key="sbc.simulator",
                          source=config.source)
    levels = template_levels(config)[1] if levels is None else levels
    inputs = {"generator_sha256": file_sha256(generator_file(config)),
              "generator_imports": user_imports(generator_file(config)), "template": template_id,
              "template_sha256": file_sha256(template_path), "seed": config.sbc.seed, "versions": versions(),
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
    from batchfit.provenance import file_sha256

    paths = data_paths(config)
    dataset, levels = template_levels(config)
    digests = simulation_digests(config, levels)
    _record_levels(config, dataset.id, levels)
    todo = [sim for sim, path in paths.items() if not _up_to_date(config, sim, path, digests[sim])]
    if not todo:
        return SimulationReport(0, len(paths))
    simulator = Simulator(config, dataset)
    for sim in todo:
        truth, observed = simulator.draw(sim)
        write_simulated(simulator.dataset, observed, paths[sim])
        record = {"simulation": sim, "digest": digests[sim], "data_sha256": file_sha256(paths[sim]),
                  "generator": str(generator_file(config)), "template": simulator.dataset.id,
                  "truth": {name: value.tolist() for name, value in truth.items()},
                  "coords": simulator.coords}
        with atomic_path(truth_path(config, sim)) as tmp:  # last: a killed run leaves the simulation to redo
            tmp.write_text(json.dumps(record))
    return SimulationReport(len(todo), len(paths) - len(todo))


def _up_to_date(config: Config, sim_id: str, data: Path, digest: str) -> bool:
    """Whether the simulation's truth file records ``digest`` and the data file it wrote."""
    from batchfit.provenance import file_sha256

    try:
        record = json.loads(truth_path(config, sim_id).read_text())
        return record["digest"] == digest and record["data_sha256"] == file_sha256(data)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_simulated(template: Dataset, observed: Mapping[str, np.ndarray], path: Path) -> None:
    """The template's file with its observed columns replaced: a table as CSV, NetCDF as NetCDF.

    Table columns are read as text and written back unchanged (labels such as '01' keep their
    form); simulated values are written with full precision, so the files are deterministic.
    A simulated text column (codes) is written as its labels, which the simulated sweep codes
    back to the same codes.
    """
    kind = table_kind(template.path)
    with atomic_path(path) as tmp:
        if kind is None:
            import xarray as xr

            with xr.open_dataset(template.path, engine="h5netcdf") as ds:
                ds = ds.load()
            for column, values in observed.items():
                ds[column] = (ds[column].dims, _shaped(values, ds[column].shape, column, template))
            ds.to_netcdf(tmp, engine="h5netcdf")
            return
        import pandas as pd

        frame = (pd.read_csv(template.path, dtype=str, keep_default_na=False) if kind == "CSV"
                 else pd.read_parquet(template.path))
        for column, values in observed.items():
            values = _shaped(values, (len(frame),), column, template)
            frame[column] = _labelled(values, column, template) if column in template.coords else values
        frame.to_csv(tmp, index=False)


def _shaped(values: np.ndarray, shape: tuple[int, ...], column: str, template: Dataset) -> np.ndarray:
    if values.shape != tuple(shape):
        raise ModelContractError(
            f"the simulated {column!r} has shape {values.shape}, but column {column!r} of the template "
            f"dataset '{template.id}' ({template.path}) has shape {tuple(shape)}")
    return values


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


# ---------------------------------------------------------------------------------------------
# Ranks and the uniformity test


@dataclass
class SBCResult:
    """Ranks of the fitted simulations, the uniformity test per parameter element, and the counts."""

    n_simulations: int
    fitted: list[str]
    failed: dict[str, str]
    n_draws: int
    table: Any  # uniformity.csv: parameter, n, outside_band, max_abs_ecdf_diff, pot_c_p_value
    envelope_prob: float

    @property
    def passed(self) -> bool:
        return not self.failed and not bool(self.table["outside_band"].any())

    def verdict(self) -> str:
        """One line: PASS, or FAIL with the parameters outside their band and the failed fits."""
        n_elements = len(self.table)
        outside = self.table.loc[self.table["outside_band"], "parameter"].tolist()
        parts = []
        if outside:
            parts.append(f"{len(outside)} of {n_elements} parameter element(s) have non-uniform ranks: "
                         f"{', '.join(outside[:8])}{', ...' if len(outside) > 8 else ''}")
        if self.failed:
            ids = sorted(self.failed)
            parts.append(f"{len(ids)} of {self.n_simulations} simulated fit(s) failed ({', '.join(ids[:5])}"
                         f"{', ...' if len(ids) > 5 else ''}; a failing fit biases SBC, see "
                         "sbc/failures/)")
        head = (f"SBC {'PASS' if not parts else 'FAIL'}: {len(self.fitted)} of {self.n_simulations} "
                f"simulations fitted, ranks among {self.n_draws} draws, {n_elements} parameter element(s), "
                f"{self.envelope_prob:.0%} simultaneous ECDF bands")
        return head + ("" if not parts else "; " + "; ".join(parts))


def rank_simulations(config: Config, *, plots: bool = True) -> SBCResult:
    """Rank, test and write SBC's outputs for the first ``sbc.n_simulations`` simulations.

    Every simulation must have a current fit or a failure record (run the fit stage first);
    a fit made from other data or settings than the current ones is an error, as in collect.
    """
    import pandas as pd

    from batchfit.collect import read_failure
    from batchfit.provenance import expected_digests, recorded_digest

    sweep = sbc_config(config)
    datasets = discover_datasets(sweep)
    expected = expected_digests(sweep, datasets)
    fitted, failed, missing = [], {}, []
    for sim in datasets:
        if sweep.failure_path(sim).exists():
            failed[sim] = read_failure(sim, sweep.failure_path(sim)).get("message", "")
        elif recorded_digest(sweep, sim) == expected[sim]:
            fitted.append(sim)
        else:
            missing.append(sim)
    if missing:
        raise BatchfitError(
            f"sbc: {len(missing)} simulation(s) have no current fit or failure record ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); run the fit stage first (batchfit sbc or snakemake sbc)")
    if not fitted:
        raise BatchfitError(f"sbc: every one of the {len(datasets)} simulated fits failed; see "
                            f"{sweep.results_dir / 'failures'}")
    ranks, n_draws = _ranks(config, fitted)
    root = sbc_root(config)
    table = uniformity(ranks, n_draws, config.sbc.envelope_prob)
    long = _long_table(ranks, fitted, n_draws)
    with atomic_path(root / "ranks.csv") as tmp:
        long.to_csv(tmp, index=False)
    with atomic_path(root / "uniformity.csv") as tmp:
        table.to_csv(tmp, index=False)
    tree = ranks_tree(ranks, fitted, n_draws, config)
    with atomic_path(root / "ranks.nc") as tmp:
        tree.to_netcdf(tmp, engine="h5netcdf")
    result = SBCResult(len(datasets), fitted, failed, n_draws, table, config.sbc.envelope_prob)
    with atomic_path(root / "verdict.txt") as tmp:
        tmp.write_text(result.verdict() + "\n")
    with atomic_path(root / "failed_simulations.csv") as tmp:
        pd.DataFrame({"simulation": list(failed), "message": list(failed.values())}).to_csv(tmp, index=False)
    if plots:
        plot_ranks(ranks, n_draws, config.sbc.envelope_prob, len(table), root / "plots")
    return result


def _ranks(config: Config, fitted: Sequence[str]) -> tuple[dict[str, np.ndarray], int]:
    """Per parameter, the ranks of the fitted simulations stacked as (simulation, *parameter shape)."""
    import netCDF4

    from batchfit.collect import group_dataset
    from batchfit.fit import dataset_seed
    from batchfit.variables import OBSERVATION_SIZED, ROLE_ATTR

    sweep = sbc_config(config)
    ranks: dict[str, list[np.ndarray]] = {}
    coords: dict[str, dict[str, Any]] = {}
    dims: dict[str, tuple[str, ...]] = {}
    n_draws = 0
    for sim in fitted:
        record = json.loads(truth_path(config, sim).read_text())
        truth = record["truth"]
        truth_coords = record.get("coords", {})  # none in truth files written before they were recorded
        with netCDF4.Dataset(sweep.fit_path(sim)) as nc:
            nc.set_auto_mask(False)
            posterior = group_dataset(nc["posterior"]).isel(draw=slice(None, None, config.sbc.thin))
        rng = np.random.default_rng(dataset_seed(config.sbc.seed, f"ties:{sim}"))
        for name, var in posterior.data_vars.items():
            if var.attrs.get(ROLE_ATTR) == OBSERVATION_SIZED:
                continue  # per observation, not a parameter (its truth is not a draw from a prior)
            if name not in truth:
                raise ModelContractError(
                    f"the simulator ({generator_file(config)}) defines no variable {name!r}, "
                    f"which the fitted model has; truth file {truth_path(config, sim)}")
            # (chain, draw, ...) -> (sample, ...), chain-major as xarray's stack; NumPy, since a
            # stack per variable and simulation took a third of this step
            values = var.transpose("chain", "draw", ...).values
            draws = values.reshape(-1, *values.shape[2:])
            true = np.asarray(truth[name], dtype=float)
            if true.shape != draws.shape[1:]:
                raise ModelContractError(
                    f"variable {name!r} has shape {true.shape} in the simulator but {draws.shape[1:]} in the "
                    f"fit of {sim} ({sweep.fit_path(sim)})")
            dims[str(name)] = tuple(d for d in var.dims if d not in ("chain", "draw"))
            coords[str(name)] = {d: posterior[d].values for d in dims[str(name)] if d in posterior.coords}
            _check_labels(str(name), truth_coords.get(name, {}), coords[str(name)],
                          f"the simulator ({generator_file(config)})", f"the fit of {sim} ({sweep.fit_path(sim)})")
            less = (draws < true).sum(axis=0)
            ties = (draws == true).sum(axis=0)  # discrete parameters: spread ties uniformly
            ranks.setdefault(str(name), []).append(less + rng.integers(0, ties + 1))
            n_draws = draws.shape[0]
    return {name: Ranked(np.stack(r), dims[name], coords[name]) for name, r in ranks.items()}, n_draws


def _check_labels(name: str, simulated: Mapping[str, Sequence[Any]], fitted: Mapping[str, Any],
                  simulator: str, fit: str) -> None:
    """A dimension of ``name`` that both the simulator and the fit label must have the same labels in
    the same order: otherwise a true value would be ranked among another element's draws."""
    for dim, labels in simulated.items():
        if dim not in fitted:
            continue
        drawn, fitted_labels = [str(v) for v in labels], [str(v) for v in fitted[dim]]
        if drawn != fitted_labels:
            raise ModelContractError(
                f"dimension {dim!r} of variable {name!r} has the labels {_some(drawn)} in {simulator} but "
                f"{_some(fitted_labels)} in {fit}: a true value would be ranked among another element's "
                f"draws; give both models the same coordinates")


def _some(labels: Sequence[str]) -> str:
    return "[" + ", ".join(labels[:6]) + (", ...]" if len(labels) > 6 else "]")


@dataclass(frozen=True)
class Ranked:
    """One parameter's ranks, shaped (simulation, *parameter shape), with its dims and coordinate labels."""

    values: np.ndarray
    dims: tuple[str, ...]
    coords: Mapping[str, Any]


def element_ranks(name: str, ranked: Ranked) -> list[tuple[str, np.ndarray]]:
    """(label, ranks over simulations) for every scalar element: 'sigma', 'a[g01]'."""
    shape = ranked.values.shape[1:]
    if not shape:
        return [(name, ranked.values)]
    labels = [ranked.coords.get(d, range(n)) for d, n in zip(ranked.dims, shape, strict=True)]
    return [(f"{name}[{', '.join(map(str, combo))}]", ranked.values[(slice(None), *idx)])
            for idx, combo in zip(np.ndindex(*shape), itertools.product(*labels), strict=True)]


def pit_values(ranks: np.ndarray, n_draws: int) -> np.ndarray:
    """Ranks 0..L as values in (0, 1), the centre of each rank's bin: what the ECDF test reads."""
    return (np.asarray(ranks, dtype=float) + 0.5) / (n_draws + 1)


def uniformity(ranks: Mapping[str, Ranked], n_draws: int, envelope_prob: float) -> Any:
    """The uniformity test of every parameter element.

    ``outside_band``: the ECDF of the element's ranks leaves ArviZ's simultaneous band
    (`simultaneous_band`) at probability ``1 - (1 - envelope_prob) / K`` for K elements
    (Bonferroni), so a calibrated model passes all K together with probability at least
    ``envelope_prob``. ``pot_c_p_value`` is ArviZ's recommended pointwise-order test
    (`uniformity_test`, method pot_c), reported for reading, not used for the verdict.
    """
    import pandas as pd
    import xarray as xr
    from arviz_stats.ecdf_utils import compute_ecdf

    elements = [e for name, ranked in ranks.items() for e in element_ranks(name, ranked)]
    n_sims = len(elements[0][1])
    x, lower, upper = simultaneous_band(n_sims, _element_prob(envelope_prob, len(elements)))
    rows = []
    for label, values in elements:
        pit = pit_values(values, n_draws)
        ecdf = np.concatenate(([0.0], compute_ecdf(pit, x[1:-1]), [1.0]))
        p_value, _, _ = xr.DataArray(pit, dims=["simulation"]).azstats.uniformity_test(dim="simulation")
        rows.append({"parameter": label, "n": len(values),
                     "outside_band": bool(np.any((ecdf < lower) | (ecdf > upper))),
                     "max_abs_ecdf_diff": float(np.max(np.abs(ecdf - x))),
                     "pot_c_p_value": float(p_value)})
    return pd.DataFrame(rows)


@functools.cache
def simultaneous_band(n: int, prob: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evaluation points and the simultaneous ``prob`` band of the ECDF of ``n`` uniform values.

    ArviZ's `ecdf_pit` (Säilynoja et al. 2022); the band depends only on ``n`` and ``prob``, so
    it is computed once for every element (the values passed are not used for the band). Its
    simulation count grows with ``prob`` so the extreme quantile is estimated from ~20 draws
    beyond it; its generator has a fixed seed, so the band is reproducible.
    """
    from arviz_stats.ecdf_utils import ecdf_pit

    n_simulations = int(min(20000, max(1000, np.ceil(20 / (1 - prob)))))
    x, _, lower, upper = ecdf_pit(np.linspace(0, 1, n), prob, n_simulations=n_simulations)
    return x, lower, upper


def _element_prob(envelope_prob: float, n_elements: int) -> float:
    return 1 - (1 - envelope_prob) / max(1, n_elements)


def _long_table(ranks: Mapping[str, Ranked], fitted: Sequence[str], n_draws: int) -> Any:
    """ranks.csv: one row per simulation and parameter element."""
    import pandas as pd

    parts = [pd.DataFrame({"simulation": list(fitted), "parameter": label, "rank": values.astype(int),
                           "n_draws": n_draws})
             for name, ranked in ranks.items() for label, values in element_ranks(name, ranked)]
    return pd.concat(parts, ignore_index=True)


def ranks_tree(ranks: Mapping[str, Ranked], fitted: Sequence[str], n_draws: int, config: Config) -> Any:
    """ranks.nc: group ``prior_sbc`` with dims (chain=1, draw=simulation, *parameter dims), as simuk
    writes it, so ``arviz_plots.plot_ecdf_pit(xr.open_datatree('ranks.nc'))`` reads it directly."""
    import xarray as xr

    variables = {name: (("chain", "draw", *r.dims), r.values[None]) for name, r in ranks.items()}
    coords = {"chain": [0], "draw": list(fitted),
              **{d: v for r in ranks.values() for d, v in r.coords.items()}}
    group = xr.Dataset(variables, coords=coords)
    root = xr.Dataset(attrs={"n_draws": n_draws, "thin": config.sbc.thin, "seed": config.sbc.seed,
                             "n_simulations": config.sbc.n_simulations})
    return xr.DataTree.from_dict({"/": root, RANKS_GROUP: group})


def plot_ranks(ranks: Mapping[str, Ranked], n_draws: int, envelope_prob: float, n_elements: int,
               out_dir: Path) -> list[Path]:
    """One PNG per parameter (a panel per element): arviz_plots' ECDF-difference plot of the ranks,
    with the simultaneous band the verdict uses drawn over it.

    arviz_plots draws a band itself only with its ``method="envelope"``, which fails in
    arviz-plots 1.3 (``np.linspace`` given a DataArray); its default ``pot_c`` plot marks the
    ranks that depart most from uniformity and prints the test's p-value. The band depends only
    on the number of simulations and the probability, so it is the same in every panel.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window in a job
    import matplotlib.pyplot as plt
    import xarray as xr
    from arviz_plots import plot_ecdf_pit

    paths = []
    prob = _element_prob(envelope_prob, n_elements)
    for name, ranked in ranks.items():
        pit = pit_values(ranked.values, n_draws)
        x, lower, upper = simultaneous_band(len(pit), prob)
        ds = xr.Dataset({name: (("chain", "draw", *ranked.dims), pit[None])}, coords=dict(ranked.coords))
        pc = plot_ecdf_pit(xr.DataTree.from_dict({RANKS_GROUP: ds}), group=RANKS_GROUP, backend="matplotlib")
        figure = pc.get_viz("figure")
        for ax in figure.axes:
            if ax.lines:
                ax.fill_between(x, lower - x, upper - x, step="post", alpha=0.2, color="grey",
                                label=f"{prob:.3g} simultaneous band")
        figure.suptitle(f"{name}: ECDF of ranks minus uniform, {len(pit)} simulations", y=1.02)
        path = out_dir / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
        plt.close(figure)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# The whole run without Snakemake


def run_sbc(config: Config, *, threads: int = 1) -> SBCResult:
    """Simulate what is missing, fit what is pending (one compile, cached), rank and test."""
    from batchfit.pipeline import run_compile, run_fit

    log.info(simulate(config).one_line())
    sweep = sbc_config(config)
    run_compile(sweep, workers=threads)
    failed = run_fit(sweep, threads=threads)
    if failed:
        log.warning("sbc: %d simulated fit(s) failed in this run", failed)
    return rank_simulations(config)
