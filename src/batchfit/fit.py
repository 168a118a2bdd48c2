"""Fit a batch of datasets with one compiled model: load, check, build, sample, write, per dataset.

One job compiles (or loads from the cache) once and then only swaps data: every dataset's model
is built by the user's ``build_model`` (cheap Python), checked to have the reference structure,
and sampled with the cached callbacks. A dataset that fails at any stage is recorded in
``failures/{id}.json`` and, with ``on_error: continue``, the batch goes on.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchfit import __version__
from batchfit.atomic import atomic_path, remove_stale_temporaries
from batchfit.cache import CacheDir, open_cache
from batchfit.coding import Coding, sweep_coding
from batchfit.compat import import_nutpie, nutpie_trace, wait_for_sampler_threads
from batchfit.compile import ModelSource
from batchfit.config import Config
from batchfit.data import Dataset, check_dataset, coerce_for_model, discover_datasets, load_dataset
from batchfit.errors import (
    BatchfitError,
    CachedPathUnsupported,
    ConfigError,
    ModelContractError,
    SamplerFailure,
    is_expected,
    one_line,
)
from batchfit.fingerprint import structure_of
from batchfit.lanes import LANE_STAGE, lanes
from batchfit.modelfile import (
    baked_values,
    build_model,
    file_hash,
    load_model_file,
    observed_and_constant_data,
    requirements,
)
from batchfit.netcdf_writer import write_datatree
from batchfit.provenance import Provenance, dataset_provenance, file_sha256, record, sidecar_path, sweep_parts
from batchfit.standby import Standby
from batchfit.structures import CACHED, FAILED, NUTPIE, PYMC, Structure, Structures
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


def reference_model(config: Config, paths: Mapping[str, Path]) -> Reference:
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


def prepare(config: Config) -> tuple[CacheDir, Mapping[str, Path], Reference]:
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
    traceback: str = ""  # an unexpected error's (`errors.is_expected`): batchfit's bug, to report
    fallback: str = ""  # a fitted dataset's: why it was not sampled on batchfit's cached path


@dataclass
class BatchReport:
    """The outcomes of one batch, written as the batch manifest."""

    batch: str
    compile: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def n_failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)


@dataclass
class Sampling:
    """One dataset's sample: its seed, nutpie sampler model and, once started, nutpie's background sampler."""

    seed: int
    model: Any = None
    sampler: Any = None
    error: Exception | None = None  # what stopped the sampler model being built or started

    @property
    def finished(self) -> bool:
        """Whether `Fitter.result` would return without waiting for the chains."""
        if self.sampler is None:
            return True
        try:
            return self.sampler.is_finished
        except TimeoutError:  # nutpie 0.16 raises this, instead of returning False, while chains run
            return False
        except Exception as exc:  # noqa: BLE001 - it raises the sample's own error (e.g. no initial point) here
            self.error = SamplerFailure(one_line(exc))  # for `Fitter.result`, which then tries nutpie's own compile
            self.error.__cause__ = exc
            return True

    def cancel(self) -> None:
        """Stop the chains of a sample whose result is no longer wanted."""
        if not self.finished:
            self.sampler.cancel()


class Fitter:
    """Fits datasets of one model file: one compile per structure, then only sampling.

    ``compile_workers``: the processes a compile may run at once (the job's cores), or a
    `batchfit.standby.Standby` of compile workers already starting.
    """

    def __init__(self, config: Config, ref: Reference, cache: CacheDir, *, compile_workers: int | Standby = 1):
        self.config = config
        self.ref = ref
        self.module = load_model_file(config.model)
        self.model_hash = file_hash(config.model)
        self.sweep_parts = sweep_parts(config, model_sha256=self.model_hash)
        self.structures = Structures(config, cache, compile_workers=compile_workers)
        self.roles = variable_roles(ref.model)  # the reference's: every structure is read alike
        self.kept = kept_variables(config, self.roles)
        self.reference = self._structure(ref.model, ref.dataset)

    @property
    def compile_line(self) -> str:
        """How the reference structure was obtained, for the job's log and manifest."""
        if self.reference.compiled is not None:
            return self.reference.compiled.report.line()
        if self.reference.path == FAILED:
            return f"compiling structure {self.reference.id[:12]} failed ({one_line(self.reference.error)})"
        if self.reference.path == PYMC:
            return f"pm.sample's own step methods for structure {self.reference.id[:12]} ({self.reference.reason})"
        return f"nutpie's own compile for structure {self.reference.id[:12]} ({self.reference.reason})"

    def build(self, dataset: Dataset) -> Any:
        """Cast ``dataset`` to the reference dtypes and build its model.

        When the reference structure samples through cached callbacks, datasets are built without
        PyTensor's creation tracebacks (``traceback__limit=0``): PyTensor walks the Python stack for
        every node it creates (``add_tag_trace``), about 40% of building the example model, on the
        main thread while both cores sample (`benchmarks/throughput.py`: 0.062-0.064 -> 0.058-0.061 s a
        dataset). Those tracebacks only explain errors of a graph PyTensor compiles or runs, and
        on that path a dataset's graph never is: its data are read into the cached callbacks (a
        new structure compiles in worker processes that build their own model; only a dataset
        falling back to nutpie's own compile compiles the graph built here). A sweep whose
        reference is on nutpie's or pm.sample's own compile keeps them.
        """
        import pytensor

        limit = 0 if self.reference.path == CACHED else pytensor.config.traceback__limit
        with pytensor.config.change_flags(traceback__limit=limit):
            return build_model(self.module, model_input(dataset, self.ref))

    def structure(self, model: Any, dataset: Dataset) -> Structure:
        """The compiled structure for ``model`` (compiled now if this job has not met it)."""
        if dataset.id == self.ref.dataset.id and structure_of(model) == self.reference.id:
            return self.reference  # not built twice when it has a compile of its own (values baked in)
        return self._structure(model, dataset)

    def _structure(self, model: Any, dataset: Dataset) -> Structure:
        return self.structures.for_model(model, model_source(self.config, dataset, self.ref.coding),
                                         baked=baked_values(model, dataset))

    def provenance(self, dataset_id: str, data_path: Path) -> Provenance:
        """What a fit of this dataset records: hashed before the file is loaded, so a file
        changed meanwhile leaves a digest that no longer matches, and the dataset pending."""
        return dataset_provenance(self.sweep_parts, dataset_id, file_sha256(data_path),
                                  self.ref.coding.for_dataset(dataset_id))

    def sampling(self, model: Any, dataset: Dataset, structure: Structure) -> Sampling:
        """Everything a dataset's sample needs but the threads: its seed and nutpie sampler model.

        A dataset the cached path cannot take is kept for `result`, which tries nutpie's own compile.
        """
        sampling = Sampling(dataset_seed(self.config.sampler.seed, dataset.id))
        if structure.path == PYMC:  # pm.sample builds its own sampler, in `result`
            return sampling
        try:
            sampling.model = structure.sampler_model(model)
        except (CachedPathUnsupported, SamplerFailure) as exc:
            sampling.error = exc
        return sampling

    def start(self, sampling: Sampling, *, threads: int) -> None:
        """Start sampling in nutpie's own threads (outside the GIL) and return at once."""
        if sampling.error is not None or sampling.model is None:  # nothing to start (PyMC's path samples in `result`)
            return
        sampling.sampler = self._nutpie_sample(sampling.model, sampling.seed, threads, blocking=False)

    def result(self, sampling: Sampling, model: Any, dataset: Dataset, structure: Structure, *, threads: int,
               provenance: Provenance) -> Any:
        """Wait for a started sample and return the dataset's DataTree.

        If the cached path cannot take the dataset (`CachedPathUnsupported`) or nutpie's sampler
        fails on it there (`SamplerFailure`), it is sampled again through nutpie's own compile,
        which is what ``pm.sample(nuts_sampler="nutpie")`` runs: a dataset only fails when pm.sample
        would fail on it too, and its error says so; the fit records why it fell back. Any other
        exception is batchfit's bug, and fails the dataset with its traceback.
        """
        seed, path, fallback = sampling.seed, structure.path, structure.reason or ""
        if path == PYMC:
            return self.finish(self._pymc_sample(model, dataset, seed), model, dataset, structure, seed,
                               provenance, path, fallback)
        try:
            if sampling.error is not None:
                raise sampling.error
            tree = sampled_trace(sampling.sampler, sampling.model)
        except (CachedPathUnsupported, SamplerFailure) as first:
            if path != CACHED:
                raise BatchfitError(f"sampling failed for dataset '{dataset.id}' ({dataset.path}) through nutpie's "
                                    "own compile, which is what pm.sample(nuts_sampler='nutpie') runs, so it fails "
                                    f"there too: {one_line(first)}{hint(one_line(first))}") from first
            fallback = one_line(first)
            log.warning("%s: batchfit's cached path failed (%s); sampling it through nutpie's own compile",
                        dataset.id, fallback)
            try:
                tree, path = self._nutpie_sample(structure.nutpie_model(model), seed, threads), NUTPIE
            except SamplerFailure as second:
                raise BatchfitError(
                    f"sampling failed for dataset '{dataset.id}' ({dataset.path}) on batchfit's cached path "
                    f"({fallback}) and through nutpie's own compile, which is what "
                    f"pm.sample(nuts_sampler='nutpie') runs: {one_line(second)}{hint(one_line(second))}"
                ) from second
        return self.finish(tree, model, dataset, structure, seed, provenance, path, fallback)

    def sample(self, model: Any, dataset: Dataset, structure: Structure, *, threads: int,
               provenance: Provenance) -> Any:
        """Sample one dataset's posterior and wait for it (`sampling`, `start`, `result`); return its DataTree."""
        sampling = self.sampling(model, dataset, structure)
        self.start(sampling, threads=threads)
        return self.result(sampling, model, dataset, structure, threads=threads, provenance=provenance)

    def _nutpie_sample(self, sampler_model: Any, seed: int, threads: int, *, blocking: bool = True) -> Any:
        """nutpie's sample as a DataTree, or with ``blocking=False`` its background sampler
        (`compat.nutpie_trace` waits for it and gives the DataTree).

        A failed sample's chain threads may outlive it: whoever ends the samples of a process
        waits for them (`after_sampling`), not this call, since other datasets' samplers may
        still be running and their threads end only once this thread has taken their results.
        """
        s = self.config.sampler
        sampler = import_nutpie().sample(sampler_model, draws=s.draws, tune=s.tune, chains=s.chains,
                                cores=max(1, min(threads, s.chains)), seed=seed, target_accept=s.target_accept,
                                progress_bar=False, save_warmup=False, blocking=False, return_raw_trace=True)
        if not blocking:
            return sampler
        try:
            return sampled_trace(sampler, sampler_model)
        except Exception:  # as nutpie.sample(blocking=True) does
            sampler.cancel()
            raise

    def _pymc_sample(self, model: Any, dataset: Dataset, seed: int) -> Any:
        """``pm.sample`` with PyMC's own step methods (for discrete free variables), the sweep's settings.

        One chain after another (``cores=1``): PyMC runs parallel chains in forked processes, and
        this process may have nutpie's chain threads running for other datasets of the batch.
        """
        import pymc as pm
        from pymc.vartypes import continuous_types

        s = self.config.sampler
        # target_accept is NUTS's; pm.sample refuses settings for a step method it does not use
        nuts = {"nuts": {"target_accept": s.target_accept}} if any(
            rv.dtype in continuous_types for rv in model.free_RVs) else {}
        try:
            return pm.sample(draws=s.draws, tune=s.tune, chains=s.chains, cores=1, random_seed=seed,
                             nuts_sampler="pymc", progressbar=False, compute_convergence_checks=False,
                             model=model, **nuts)
        except Exception as exc:
            raise BatchfitError(f"sampling failed for dataset '{dataset.id}' ({dataset.path}) in pm.sample with "
                                f"PyMC's own step methods, so pm.sample fails on it too: {one_line(exc)}") from exc

    def finish(self, tree: Any, model: Any, dataset: Dataset, structure: Structure, seed: int,
               provenance: Provenance, path: str, fallback: str) -> Any:
        """Add data groups, optional extras and provenance attributes to a sampled DataTree."""
        import xarray as xr

        observed, constant = observed_and_constant_data(model)
        groups = {"observed_data": _dataset(observed, model, dataset),
                  "constant_data": _dataset(constant, model, dataset)}
        with structure.loaded(model):  # the extras read the template; other datasets are sampling meanwhile
            groups.update(structure.extras.compute(model, tree, seed))  # before dropping: they may read any variable
        groups["posterior"] = _kept_posterior(tree["posterior"].to_dataset(), self.kept, self.roles)
        if "diverging" not in tree["sample_stats"].data_vars:  # PyMC's path with no NUTS step: none can diverge
            sizes = groups["posterior"].sizes
            groups["sample_stats"] = tree["sample_stats"].to_dataset().assign(
                diverging=(("chain", "draw"), np.zeros((sizes["chain"], sizes["draw"]), dtype=bool)))
        for name, ds in groups.items():
            tree[name] = xr.DataTree(ds)
        tree.attrs.update({
            "batchfit_version": __version__,
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),  # sampled just now
            "dataset": dataset.id,
            "source": str(dataset.path),
            "model_file": str(self.config.model),
            "seed": seed,
            "compile_key": structure.key,
            "structure": structure.id,
            "sampler_path": path,
            "fallback": fallback,  # why not batchfit's cached path ('' when it was)
            **provenance.attributes(),  # the digest, and sampler, outputs, model_hash, data_sha256, ...
        })
        return tree


def sampled_trace(sampler: Any, model: Any) -> Any:
    """The DataTree of a started nutpie sampler; what its chains raise is a `SamplerFailure`."""
    try:
        raw = sampler.wait()
    except Exception as exc:
        raise SamplerFailure(one_line(exc)) from exc
    return nutpie_trace(sampler, raw, model)


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

    The netCDF C library writes a fit's ~30 small variables about 4x faster than h5netcdf, and
    `batchfit.netcdf_writer` calls it without xarray's store around each call; the file is
    the one ``tree.to_netcdf(engine="netcdf4")`` writes.
    """
    with atomic_path(path) as tmp:
        write_datatree(tree, tmp)


def fit_batch(config: Config, dataset_ids: Sequence[str], *, batch_id: str, threads: int = 1) -> BatchReport:
    """Fit ``dataset_ids`` with one compile; write fits, failures and the manifest.

    With more threads than the sampler's chains, helper processes fit datasets of the batch
    beside this one (`batchfit.lanes`). With ``on_error: stop`` the first failure (in the batch's
    order) is raised after the manifest is written; with ``continue`` it is recorded and the batch
    goes on. Already written fits are never removed.
    """
    # The datasets first, so that a dataset's log lines (each starts with its id) are found by
    # `batchfit status --dataset` and by grep.
    log.info("%s holds %d dataset(s): %s", batch_id, len(dataset_ids), " ".join(dataset_ids))
    owned = (path for d in dataset_ids for path in (config.fit_path(d), config.failure_path(d)))
    stale = remove_stale_temporaries(owned)  # before any lane starts writing its own
    if stale:
        log.info("removed %d temporary file(s) left by a killed job, e.g. %s", len(stale), stale[0])
    with lanes(config, dataset_ids, threads=threads) as job_lanes:  # helpers start first: their start overlaps ours
        cache, paths, ref = prepare(config)
        fitter = Fitter(config, ref, cache, compile_workers=threads)
        log.info("compile: %s", fitter.compile_line)
        report = BatchReport(batch_id, fitter.compile_line)
        progress = Progress(len(dataset_ids))
        own = fit_datasets(fitter, job_lanes.claims, paths, threads=job_lanes.threads_each)
        try:
            for outcome in in_batch_order(job_lanes.outcomes(own)):
                if outcome.stage == LANE_STAGE:  # its lane died with it: nobody else records it
                    record_failed(config, outcome, paths.get(outcome.dataset))
                report.outcomes.append(outcome)
                log.info("%s: %s in %.2f s%s", outcome.dataset, outcome.status, outcome.seconds,
                         f" ({outcome.stage}: {outcome.message})" if outcome.message else "")
                progress.done_one()
                if outcome.status == "failed" and config.on_error == "stop":
                    raise BatchfitError(f"dataset '{outcome.dataset}' failed at {outcome.stage}: {outcome.message}")
        finally:  # the helpers are ended on leaving `lanes`; this lane's sample is cancelled by `own`'s own finally
            own.close()
            write_manifest(config, report)
    return report


def in_batch_order(outcomes: Iterable[tuple[int, Outcome]]) -> Iterator[Outcome]:
    """Outcomes that come as lanes finish them, in the batch's order (so ``on_error: stop`` stops
    where a sequential fit would, and the manifest lists the batch as given)."""
    waiting: dict[int, Outcome] = {}
    following = 0
    for index, outcome in outcomes:
        waiting[index] = outcome
        while following in waiting:
            yield waiting.pop(following)
            following += 1


# How often the main thread looks whether a sample has finished: short against any sample (the
# tiniest take ~20 ms) and long enough to leave the cores to the chains.
_POLL_SECONDS = 0.002


@dataclass
class DatasetFit:
    """One dataset on its way through a batch: what is known of it so far, and the stage it is at."""

    id: str
    path: Path | None
    started: float = field(default_factory=time.perf_counter)
    stage: str = "load"
    provenance: Provenance | None = None
    dataset: Dataset | None = None
    model: Any = None
    structure: Structure | None = None
    sampling: Sampling | None = None


def fit_datasets(fitter: Fitter, claims: Iterable[tuple[int, str]], paths: Mapping[str, Path], *,
                 threads: int) -> Iterator[tuple[int, Outcome]]:
    """Fit the claimed (position, dataset id) pairs one sample at a time; yield (position, Outcome) as each ends.

    nutpie samples in its own threads, outside the GIL. So while a dataset samples, this thread
    finishes the one before (optional outputs, writing) and prepares the next (load, check,
    build, sampler model), claiming it only then: another lane may take it first
    (`batchfit.lanes.Claims`). A dataset's draws depend only on its data and seed.
    """
    running: tuple[int, DatasetFit] | None = None
    try:
        for index, dataset_id in claims:
            prepared = _prepare(fitter, dataset_id, paths)  # while `running` samples
            if isinstance(prepared, Outcome):
                yield index, prepared
                continue
            finished = running
            if finished is not None:
                while not finished[1].sampling.finished:
                    time.sleep(_POLL_SECONDS)
            fitter.start(prepared.sampling, threads=threads)
            running = index, prepared
            if finished is not None:  # finished while the next one samples
                yield finished[0], _complete(fitter, finished[1], threads=threads)
        if running is not None:
            finished, running = running, None
            yield finished[0], _complete(fitter, finished[1], threads=threads)
    finally:  # with a sample running only when the caller stops (on_error: stop, or an interrupt)
        if running is not None:
            running[1].sampling.cancel()
        after_sampling()


def after_sampling() -> None:
    """Wait until no nutpie chain thread of this process is left, once none of its samples is wanted.

    A failed sample's chain threads may still be winding down, and a process that exits under
    them dies (see `compat.wait_for_sampler_threads`). Only called when no sampler is running:
    the threads of a sampler whose result nobody takes do not end, so waiting while other
    datasets sample ran into the minute's timeout after every failed sample.
    """
    if not wait_for_sampler_threads():
        log.warning("nutpie's chain threads did not end within a minute after sampling")


def _prepare(fitter: Fitter, dataset_id: str, paths: Mapping[str, Path]) -> DatasetFit | Outcome:
    """Load, check and build one dataset and make its sampler model; a failure becomes its Outcome."""
    job = DatasetFit(dataset_id, paths.get(dataset_id))
    try:
        if dataset_id not in paths:
            raise BatchfitError(f"dataset '{dataset_id}' is not among the config's datasets")
        job.provenance = fitter.provenance(dataset_id, paths[dataset_id])
        job.dataset = load_dataset(dataset_id, paths[dataset_id], fitter.ref.coding)
        job.stage = "build"
        job.model = fitter.build(job.dataset)
        job.stage = "compile"
        job.structure = fitter.structure(job.model, job.dataset)
        if job.structure.error is not None:
            raise RuntimeError(f"compiling model structure {job.structure.id[:12]} failed: "
                               f"{one_line(job.structure.error)}") from job.structure.error
        job.stage = "sample"
        job.sampling = fitter.sampling(job.model, job.dataset, job.structure)
    except Exception as exc:  # noqa: BLE001 - isolate the dataset; the failure record says what to fix
        return _failed(fitter.config, job, exc)
    return job


def _complete(fitter: Fitter, job: DatasetFit, *, threads: int) -> Outcome:
    """Take a started dataset's sample, add its outputs and write its fit; a failure becomes its Outcome."""
    config = fitter.config
    try:
        tree = fitter.result(job.sampling, job.model, job.dataset, job.structure, threads=threads,
                             provenance=job.provenance)
        job.stage = "write"
        # The sidecar goes first and comes back last: a job killed in between leaves a fit
        # without one (the plan then reads the fit itself), never a sidecar of another fit.
        sidecar_path(config, job.id).unlink(missing_ok=True)
        write_fit(tree, config.fit_path(job.id))
        record(config, job.id, job.provenance)
    except Exception as exc:  # noqa: BLE001 - as in `_prepare`
        return _failed(config, job, exc)
    config.failure_path(job.id).unlink(missing_ok=True)
    return Outcome(job.id, "ok", time.perf_counter() - job.started, fallback=tree.attrs["fallback"])


def _failed(config: Config, job: DatasetFit, exc: Exception) -> Outcome:
    """Record a dataset's failure (and drop its stale fit); the Outcome names the stage and the fix.

    An unexpected exception (`errors.is_expected`) is batchfit's bug: logged at ERROR with its
    traceback, which its failure record keeps too, never retried another way.
    """
    message = one_line(exc)
    trace = ""
    if not is_expected(exc):
        trace = "".join(traceback.format_exception(exc))
        log.error("%s: batchfit failed at %s, a bug to report with this traceback:\n%s", job.id, job.stage, trace)
    if not isinstance(exc, BatchfitError):  # e.g. nutpie's or h5py's own words: add whose and where
        message = (f"{job.stage} failed for dataset '{job.id}' (file {job.path}): "
                   f"{message}{hint(message)}")
    outcome = Outcome(job.id, "failed", time.perf_counter() - job.started, job.stage, type(exc).__name__, message,
                      trace)
    record_failed(config, outcome, job.path)
    return outcome


def record_failed(config: Config, outcome: Outcome, path: Path | None) -> None:
    """Write a failed dataset's record and drop its fit from an older run, which is stale now."""
    record_failure(config, outcome, path)
    config.fit_path(outcome.dataset).unlink(missing_ok=True)
    sidecar_path(config, outcome.dataset).unlink(missing_ok=True)


class Progress:
    """Logs ``progress: D/T datasets, R/s, ETA S s`` every ``seconds`` or every tenth of the batch.

    One line a dataset would drown a long batch's log; one at the end says nothing while it runs.
    """

    def __init__(self, total: int, *, seconds: float = 10.0):
        self.total = total
        self.done = 0
        self.seconds = seconds
        self.every = max(1, total // 10)
        self.start = self.last = time.perf_counter()
        self.last_done = 0

    def done_one(self) -> None:
        """Count a finished dataset (fitted or failed); log when the interval is up or the batch is done."""
        self.done += 1
        now = time.perf_counter()
        if self.done < self.total and now - self.last < self.seconds and self.done - self.last_done < self.every:
            return
        rate = self.done / max(now - self.start, 1e-9)
        log.info("progress: %d/%d datasets, %.2f/s, ETA %.0f s", self.done, self.total, rate,
                 (self.total - self.done) / rate)
        self.last, self.last_done = now, self.done


def hint(message: str) -> str:
    """What to look at for the sampler errors that come from the data rather than from batchfit."""
    if "initialization points failed" in message:
        return (" (the log density is not finite at any starting point: look for extreme values in "
                "the dataset, e.g. 1e300, or for data the model's priors rule out)")
    return ""


def record_failure(config: Config, outcome: Outcome, path: Path | None) -> None:
    """Write a dataset's failure record atomically (read by collect into failures.csv)."""
    record = {"dataset": outcome.dataset, "path": str(path) if path else "", "stage": outcome.stage,
              "error_type": outcome.error_type, "message": outcome.message, "traceback": outcome.traceback}
    with atomic_path(config.failure_path(outcome.dataset)) as tmp:
        tmp.write_text(json.dumps(record, indent=1))


def write_manifest(config: Config, report: BatchReport) -> None:
    """Write the batch manifest (the fit rule's declared output) atomically."""
    data = {"batch": report.batch, "compile": report.compile,
            "datasets": {o.dataset: dataclasses.asdict(o) for o in report.outcomes}}
    with atomic_path(config.batch_manifest_path(report.batch)) as tmp:
        tmp.write_text(json.dumps(data, indent=1))
