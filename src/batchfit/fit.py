"""Fit a batch of datasets with one compiled model: load, check, build, sample, write, per dataset.

One job compiles (or loads from the cache) once and then only swaps data: every dataset's model
is built by the user's ``build_model`` (cheap Python), checked to have the reference structure,
and sampled with the cached callbacks. A dataset that fails at any stage is recorded in
``failures/{id}.json`` and, with ``on_error: continue``, the batch goes on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchfit import __version__
from batchfit.atomic import atomic_path, remove_stale_temporaries
from batchfit.cache import CacheDir, open_cache
from batchfit.coding import Coding, sweep_coding
from batchfit.compat import wait_for_sampler_threads
from batchfit.compile import ModelSource
from batchfit.config import Config
from batchfit.data import Dataset, check_dataset, coerce_for_model, discover_datasets, load_dataset
from batchfit.errors import BatchfitError, ConfigError, ModelContractError, one_line
from batchfit.modelfile import (
    build_model,
    file_hash,
    load_model_file,
    observed_and_constant_data,
    requirements,
)
from batchfit.provenance import Provenance, dataset_provenance, file_sha256, record, sidecar_path, sweep_parts
from batchfit.structures import CACHED, NUTPIE, Structure, Structures
from batchfit.variables import ROLE_ATTR, select_vars, variable_roles

log = logging.getLogger("batchfit")


def dataset_seed(global_seed: int, dataset_id: str) -> int:
    """A dataset's seed: from the global seed and its id only, never its position in a batch."""
    digest = hashlib.sha256(f"{global_seed}:{dataset_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Reference:
    """The dataset whose model defines the structure, dtypes and compile for the whole sweep.

    `coding` is the sweep's coding of text columns, with which every dataset is loaded.
    """

    dataset: Dataset
    model: Any
    requirements: dict[str, Any]
    coding: Coding


def reference_model(config: Config, paths: dict[str, Path]) -> Reference:
    """Build the model for the first dataset (by id) that loads and builds.

    Every job uses the same reference and the same coding, so all datasets get the same dtypes
    and codes and share one cache entry however they are batched.
    """
    module = load_model_file(config.model)
    coding = sweep_coding(config, paths)
    errors = []
    for dataset_id, path in paths.items():
        try:
            dataset = load_dataset(dataset_id, path, coding)
            model = build_model(module, dataset)
            reqs = requirements(model)
            check_dataset(dataset, reqs)
            return Reference(dataset, model, reqs, coding)
        except BatchfitError as exc:
            errors.append(str(exc))
            if len(errors) >= 3:
                break
    raise ModelContractError("no dataset could be loaded and built into a model:\n  " + "\n  ".join(errors))


def prepare(config: Config) -> tuple[CacheDir, dict[str, Path], Reference]:
    """Open the cache, find datasets and build the reference model."""
    cache = open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    paths = discover_datasets(config)
    return cache, paths, reference_model(config, paths)


def model_input(dataset: Dataset, ref: Reference) -> Dataset:
    """``dataset`` as ``build_model`` receives it: checked and cast to the reference model's dtypes."""
    coerced = coerce_for_model(dataset, ref.requirements)
    return dataclasses.replace(dataset, arrays={**dataset.arrays, **coerced})


def model_source(config: Config, dataset: Dataset, coding: Coding) -> ModelSource:
    """How a compile worker rebuilds the model of ``dataset``."""
    return ModelSource(Path(config.model).resolve(), dataset.id, Path(dataset.path).resolve(),
                       coding.for_dataset(dataset.id), config.outputs)


@dataclass
class Outcome:
    """What happened to one dataset in a batch."""

    dataset: str
    status: str  # "ok" or "failed"
    seconds: float
    stage: str | None = None
    error_type: str | None = None
    message: str | None = None


@dataclass
class BatchReport:
    """The outcomes of one batch, written as the batch manifest."""

    batch: str
    compile: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def n_failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)


class Fitter:
    """Fits datasets of one model file: one compile per structure, then only sampling."""

    def __init__(self, config: Config, ref: Reference, cache: CacheDir):
        self.config = config
        self.ref = ref
        self.module = load_model_file(config.model)
        self.model_hash = file_hash(config.model)
        self.sweep_parts = sweep_parts(config, model_sha256=self.model_hash)
        self.structures = Structures(config, cache)
        self.roles = variable_roles(ref.model)  # the reference's: every structure is read alike
        self.kept = kept_variables(config, self.roles)
        self.reference = self.structures.for_model(ref.model, model_source(config, ref.dataset, ref.coding))

    @property
    def compile_line(self) -> str:
        """How the reference structure was obtained, for the job's log and manifest."""
        if self.reference.compiled is not None:
            return self.reference.compiled.report.line()
        return f"nutpie's own compile for structure {self.reference.id[:12]} ({self.reference.reason})"

    def build(self, dataset: Dataset) -> Any:
        """Cast ``dataset`` to the reference dtypes and build its model."""
        return build_model(self.module, model_input(dataset, self.ref))

    def structure(self, model: Any, dataset: Dataset) -> Structure:
        """The compiled structure for ``model`` (compiled now if this job has not met it)."""
        return self.structures.for_model(model, model_source(self.config, dataset, self.ref.coding))

    def provenance(self, dataset_id: str, data_path: Path) -> Provenance:
        """What a fit of this dataset records: hashed before the file is loaded, so a file
        changed meanwhile leaves a digest that no longer matches, and the dataset pending."""
        return dataset_provenance(self.sweep_parts, dataset_id, file_sha256(data_path),
                                  self.ref.coding.for_dataset(dataset_id))

    def sample(self, model: Any, dataset: Dataset, structure: Structure, *, threads: int,
               provenance: Provenance) -> Any:
        """Sample one dataset's posterior with its structure's compiled model; return its DataTree.

        If batchfit's cached path fails on the dataset, it is sampled again through nutpie's own
        compile, which is what ``pm.sample(nuts_sampler="nutpie")`` runs: a dataset only fails
        when pm.sample would fail on it too, and its error says so.
        """
        seed = dataset_seed(self.config.sampler.seed, dataset.id)
        path = structure.path
        try:
            tree = self._nutpie_sample(structure.sampler_model(model), seed, threads)
        except Exception as first:
            if path != CACHED:
                raise BatchfitError(f"sampling failed for dataset '{dataset.id}' ({dataset.path}) through nutpie's "
                                    "own compile, which is what pm.sample(nuts_sampler='nutpie') runs, so it fails "
                                    f"there too: {one_line(first)}{hint(one_line(first))}") from first
            log.warning("%s: batchfit's cached path failed (%s); sampling it through nutpie's own compile",
                        dataset.id, one_line(first))
            try:
                tree, path = self._nutpie_sample(structure.nutpie_model(model), seed, threads), NUTPIE
            except Exception as second:
                raise BatchfitError(
                    f"sampling failed for dataset '{dataset.id}' ({dataset.path}) on batchfit's cached path "
                    f"({one_line(first)}) and through nutpie's own compile, which is what "
                    f"pm.sample(nuts_sampler='nutpie') runs: {one_line(second)}{hint(one_line(second))}"
                ) from second
        return self.finish(tree, model, dataset, structure, seed, provenance, path)

    def _nutpie_sample(self, sampler_model: Any, seed: int, threads: int) -> Any:
        import nutpie

        s = self.config.sampler
        try:
            return nutpie.sample(sampler_model, draws=s.draws, tune=s.tune, chains=s.chains,
                                 cores=max(1, min(threads, s.chains)), seed=seed, target_accept=s.target_accept,
                                 progress_bar=False, save_warmup=False)
        except Exception:
            if not wait_for_sampler_threads():  # else the process may die at exit (see its docstring)
                log.warning("nutpie's chain threads did not end within a minute after a failed sample")
            raise

    def finish(self, tree: Any, model: Any, dataset: Dataset, structure: Structure, seed: int,
               provenance: Provenance, path: str) -> Any:
        """Add data groups, optional extras and provenance attributes to a sampled DataTree."""
        import xarray as xr

        observed, constant = observed_and_constant_data(model)
        groups = {"observed_data": _dataset(observed, model, dataset),
                  "constant_data": _dataset(constant, model, dataset)}
        groups.update(structure.extras.compute(model, tree, seed))  # before dropping: extras may read any variable
        groups["posterior"] = _kept_posterior(tree["posterior"].to_dataset(), self.kept, self.roles)
        for name, ds in groups.items():
            tree[name] = xr.DataTree(ds)
        tree.attrs.update({
            "batchfit_version": __version__,
            "dataset": dataset.id,
            "source": str(dataset.path),
            "model_file": str(self.config.model),
            "seed": seed,
            "compile_key": structure.key,
            "structure": structure.id,
            "sampler_path": path,
            **provenance.attributes(),  # the digest, and sampler, outputs, model_hash, data_sha256, ...
        })
        return tree


def kept_variables(config: Config, roles: Mapping[str, str]) -> list[str]:
    """The posterior variables each fit keeps (`outputs.var_names`); a name the model lacks is a ConfigError."""
    o = config.outputs
    try:
        return select_vars(list(roles), o.var_names, o.filter_vars)
    except ValueError as exc:
        raise ConfigError(f"{exc} in the model of {config.model}", key="outputs.var_names",
                          source=config.source) from None


def _kept_posterior(posterior: Any, kept: Sequence[str], roles: Mapping[str, str]) -> Any:
    """The kept variables of a sampled posterior, each with its role (`batchfit.variables`) as attribute."""
    wanted = set(kept)
    posterior = posterior[[name for name in posterior.data_vars if name in wanted]]
    for name, var in posterior.data_vars.items():
        var.attrs[ROLE_ATTR] = roles[name]
    return posterior


def _dataset(arrays: dict[str, tuple[tuple[str, ...] | None, np.ndarray]], model: Any, dataset: Dataset) -> Any:
    """An xarray Dataset from name -> (dims, array), with the model's coordinate labels.

    A label column's codes come with their labels: variable ``{name}_labels`` along dimension
    ``{name}_code`` holds the label of each code, so a fit can be read without the sweep's coding.
    """
    import xarray as xr

    variables = {}
    coords = {}
    for name, (dims, value) in arrays.items():
        dims = dims or tuple(f"{name}_dim_{i}" for i in range(value.ndim))
        variables[name] = (dims, value)
        for dim in dims:
            labels = model.coords.get(dim)
            if labels is not None:
                coords[dim] = list(labels)
    for name in list(variables):
        labels = dataset.coords.get(name) if name in dataset.arrays else None
        if labels is not None and f"{name}_labels" not in variables:
            variables[f"{name}_labels"] = (f"{name}_code", np.array(labels, dtype=object))
    return xr.Dataset(variables, coords=coords)


def write_fit(tree: Any, path: Path) -> None:
    """Write one dataset's DataTree atomically (never a half-written file under the final name).

    The netCDF C library writes a fit's ~30 small variables about 4x faster than h5netcdf;
    the file is the same NetCDF-4 either way.
    """
    with atomic_path(path) as tmp:
        tree.to_netcdf(tmp, engine="netcdf4")


def fit_batch(config: Config, dataset_ids: Sequence[str], *, batch_id: str, threads: int = 1) -> BatchReport:
    """Fit ``dataset_ids`` in this process with one compile; write fits, failures and the manifest.

    With ``on_error: stop`` the first failure is raised after the manifest is written; with
    ``continue`` it is recorded and the batch goes on. Already written fits are never removed.
    """
    # The datasets first, so that a dataset's log lines (each starts with its id) are found by
    # `batchfit status --dataset` and by grep.
    log.info("%s holds %d dataset(s): %s", batch_id, len(dataset_ids), " ".join(dataset_ids))
    cache, paths, ref = prepare(config)
    fitter = Fitter(config, ref, cache)
    log.info("compile: %s", fitter.compile_line)
    owned = (path for d in dataset_ids for path in (config.fit_path(d), config.failure_path(d)))
    stale = remove_stale_temporaries(owned)
    if stale:
        log.info("removed %d temporary file(s) left by a killed job, e.g. %s", len(stale), stale[0])
    report = BatchReport(batch_id, fitter.compile_line)
    try:
        for dataset_id in dataset_ids:
            outcome = fit_one(fitter, dataset_id, paths, threads=threads)
            report.outcomes.append(outcome)
            log.info("%s: %s in %.2f s%s", dataset_id, outcome.status, outcome.seconds,
                     f" ({outcome.stage}: {outcome.message})" if outcome.message else "")
            if outcome.status == "failed" and config.on_error == "stop":
                raise BatchfitError(f"dataset '{dataset_id}' failed at {outcome.stage}: {outcome.message}")
    finally:
        write_manifest(config, report)
    return report


def fit_one(fitter: Fitter, dataset_id: str, paths: dict[str, Path], *, threads: int) -> Outcome:
    """Fit one dataset, turning any failure into a recorded Outcome."""
    config = fitter.config
    start = time.perf_counter()
    stage = "load"
    try:
        if dataset_id not in paths:
            raise BatchfitError(f"dataset '{dataset_id}' is not among the config's datasets")
        provenance = fitter.provenance(dataset_id, paths[dataset_id])
        dataset = load_dataset(dataset_id, paths[dataset_id], fitter.ref.coding)
        stage = "build"
        model = fitter.build(dataset)
        stage = "compile"
        structure = fitter.structure(model, dataset)
        stage = "sample"
        tree = fitter.sample(model, dataset, structure, threads=threads, provenance=provenance)
        stage = "write"
        # The sidecar goes first and comes back last: a job killed in between leaves a fit
        # without one (the plan then reads the fit itself), never a sidecar of another fit.
        sidecar_path(config, dataset_id).unlink(missing_ok=True)
        write_fit(tree, config.fit_path(dataset_id))
        record(config, dataset_id, provenance)
    except Exception as exc:  # isolate the dataset; the failure record says what to fix
        message = one_line(exc)
        if not isinstance(exc, BatchfitError):  # e.g. nutpie's or h5py's own words: add whose and where
            message = (f"{stage} failed for dataset '{dataset_id}' (file {paths.get(dataset_id)}): "
                       f"{message}{hint(message)}")
        outcome = Outcome(dataset_id, "failed", time.perf_counter() - start, stage,
                          type(exc).__name__, message)
        record_failure(config, outcome, paths.get(dataset_id))
        config.fit_path(dataset_id).unlink(missing_ok=True)  # a fit from an older run is stale now
        sidecar_path(config, dataset_id).unlink(missing_ok=True)
        return outcome
    config.failure_path(dataset_id).unlink(missing_ok=True)
    return Outcome(dataset_id, "ok", time.perf_counter() - start)


def hint(message: str) -> str:
    """What to look at for the sampler errors that come from the data rather than from batchfit."""
    if "initialization points failed" in message:
        return (" (the log density is not finite at any starting point: look for extreme values in "
                "the dataset, e.g. 1e300, or for data the model's priors rule out)")
    return ""


def record_failure(config: Config, outcome: Outcome, path: Path | None) -> None:
    """Write a dataset's failure record atomically (read by collect into failures.csv)."""
    record = {"dataset": outcome.dataset, "path": str(path) if path else "", "stage": outcome.stage,
              "error_type": outcome.error_type, "message": outcome.message}
    with atomic_path(config.failure_path(outcome.dataset)) as tmp:
        tmp.write_text(json.dumps(record, indent=1))


def write_manifest(config: Config, report: BatchReport) -> None:
    """Write the batch manifest (the fit rule's declared output) atomically."""
    data = {"batch": report.batch, "compile": report.compile,
            "datasets": {o.dataset: dataclasses.asdict(o) for o in report.outcomes}}
    with atomic_path(config.batch_manifest_path(report.batch)) as tmp:
        tmp.write_text(json.dumps(data, indent=1))
