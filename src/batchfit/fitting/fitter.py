"""One job's fitter: the reference model, one compile per structure, and each dataset's sample.

One job compiles (or loads from the cache) once and then only swaps data: every dataset's model
is built by the user's ``build_model`` (cheap Python), checked to have the reference structure,
and sampled with the cached callbacks (`Fitter`). `batchfit.fitting.batch` runs a batch through it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit import __version__
from batchfit.cache.store import CacheDir, open_cache
from batchfit.common.grouping import group_by_reason, group_line
from batchfit.common.hashing import file_sha256
from batchfit.common.standby import Standby
from batchfit.compat.nutpie import import_nutpie, nutpie_trace
from batchfit.compile.fingerprint import structure_of
from batchfit.compile.structures import CACHED, FAILED, NUTPIE, PYMC, Structure, Structures
from batchfit.compile.worker_pool import ModelSource
from batchfit.config import Config
from batchfit.data.coding import sweep_coding
from batchfit.data.dataset import Dataset, check_dataset, coerce_for_model
from batchfit.data.discovery import discover_datasets, source_of
from batchfit.data.labels import Coding
from batchfit.data.reader import DatasetReader
from batchfit.errors import (
    BatchfitError,
    CachedPathUnsupported,
    ConfigError,
    DatasetError,
    ModelCodeError,
    ModelContractError,
    SamplerFailure,
    one_line,
    reason_of,
)
from batchfit.fitting.groups import data_group, kept_posterior, kept_variables
from batchfit.fitting.job_inputs import SHARED, JobInputs
from batchfit.fitting.outcome import hint
from batchfit.fitting.provenance import Provenance, dataset_provenance, sweep_parts
from batchfit.fitting.sampler_settings import (
    PATH_WORDS,
    SettingProblem,
    nutpie_options,
    problems_line,
    pymc_options,
    settings_problems,
    start_point,
)
from batchfit.model.model_file import (
    baked_values,
    build_model,
    load_model_file,
    observed_and_constant_data,
    requirements,
)
from batchfit.model.variables import variable_roles
from batchfit.records import fit_attributes

log = logging.getLogger("batchfit")


def dataset_seed(global_seed: int, dataset_id: str) -> int:
    """A dataset's seed: from the global seed and its id only, never its position in a batch."""
    digest = hashlib.sha256(f"{global_seed}:{dataset_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class Reference:
    """The dataset whose model defines the structure, dtypes and compile for the whole sweep.

    `reader` loads every dataset of the job as the reference was loaded: with the sweep's coding of
    text columns (`coding`), the row rules and the per-dataset values.
    """

    dataset: Dataset
    model: Any
    requirements: dict[str, Any]
    reader: DatasetReader

    @property
    def coding(self) -> Coding:
        return self.reader.coding


def reference_model(config: Config, reader: DatasetReader) -> Reference:
    """Build the model for the first dataset (by id) that loads and builds.

    Every job uses the same reference and the same coding (the reader's: the sweep's), so all
    datasets get the same dtypes and codes and share one cache entry however they are batched.
    """
    module = load_model_file(config.model)
    paths = reader.index
    errors: dict[str, BatchfitError] = {}
    for dataset_id in paths:
        try:
            dataset = reader.load(dataset_id)
            model = build_model(module, dataset, config.params)
            reqs = requirements(model)
            check_dataset(dataset, reqs)
            return Reference(dataset, model, reqs, reader)
        except BatchfitError as exc:  # a staged copy's error names the sweep's file
            errors[dataset_id] = exc.naming(source_of(paths, dataset_id)) if isinstance(exc, DatasetError) else exc
            if len(errors) >= 3:
                break
    raise ModelContractError(f"no dataset could be loaded and built into a model (tried {len(errors)}):\n  "
                             + "\n  ".join(_grouped(errors, paths)))


def sweep_reader(config: Config, paths: Mapping[str, Path] | None = None, *, wanted: Iterable[str] | None = None,
                 record: bool = True) -> DatasetReader:
    """The reader of a sweep's datasets (``paths``: default, the config's), with the sweep's coding
    (`sweep_coding`; ``record`` false: not written)."""
    sources = config.data_sources
    paths = discover_datasets(sources) if paths is None else paths
    return DatasetReader(paths, sources.settings, sweep_coding(sources, paths, record=record), wanted=wanted)


def _grouped(errors: Mapping[str, BatchfitError], paths: Mapping[str, Path]) -> list[str]:
    """One line per distinct error of ``errors`` (the datasets' own message when one alone has it), each model
    error followed by the model's own traceback."""
    reasons = {d: reason_of(exc, d, source_of(paths, d)) for d, exc in errors.items()}
    lines = []
    for reason, ids in group_by_reason(reasons):
        first = errors[ids[0]]
        lines.append(str(first) if len(ids) == 1 else group_line(reason, ids))
        if isinstance(first, ModelCodeError):
            lines += [f"  {line}" for line in first.user_traceback.rstrip("\n").splitlines()]
    return lines


def prepare(config: Config, inputs: JobInputs = SHARED, *,
            wanted: Iterable[str] | None = None) -> tuple[CacheDir, DatasetReader, Reference]:
    """Open the cache (installing missing entries from the inputs' compiled bundle: `open_cache`),
    find the datasets and build the reference model, from the job's ``inputs``; ``wanted``: the datasets the
    job will load (its batch), whose tables' rows are read at once."""
    cache = open_cache(config.cache_dir, trust_shared=config.cache.trust_shared, bundle=inputs.bundle)
    paths = inputs.datasets(config)
    reader = DatasetReader(paths, inputs.data_settings(config), inputs.coding(config, paths), wanted=wanted)
    return cache, reader, reference_model(config, reader)


def model_input(dataset: Dataset, ref: Reference) -> Dataset:
    """``dataset`` as ``build_model`` receives it: checked and cast to the reference model's dtypes."""
    coerced = coerce_for_model(dataset, ref.requirements)
    return dataclasses.replace(dataset, arrays={**dataset.arrays, **coerced})


def model_source(config: Config, dataset: Dataset) -> ModelSource:
    """How a compile worker rebuilds the model of ``dataset``."""
    return ModelSource(Path(config.model).resolve(), dataset, config.outputs, dict(config.params))


@dataclass
class Sampling:
    """One dataset's sample: its seed, nutpie sampler model and, once started, nutpie's background sampler."""

    seed: int
    model: Any = None
    sampler: Any = None
    error: Exception | None = None  # what stopped the sampler model being built or started

    @property
    def finished(self) -> bool:
        """Whether `Fitter.draws` would return without waiting for the chains."""
        if self.sampler is None:
            return True
        try:
            return self.sampler.is_finished
        except TimeoutError:  # nutpie 0.16 raises this, instead of returning False, while chains run
            return False
        except Exception as exc:  # noqa: BLE001 - it raises the sample's own error (e.g. no initial point) here
            self.error = SamplerFailure(one_line(exc))  # for `Fitter.draws`, which then tries nutpie's own compile
            self.error.__cause__ = exc
            return True

    def cancel(self) -> None:
        """Stop the chains of a sample whose result is no longer wanted."""
        if not self.finished:
            self.sampler.cancel()


class Fitter:
    """Fits datasets of one model file: one compile per structure, then only sampling.

    ``compile_workers``: the processes a compile may run at once (the job's cores), or a
    `batchfit.common.standby.Standby` of compile workers already starting.
    """

    def __init__(self, config: Config, ref: Reference, cache: CacheDir, *, compile_workers: int | Standby = 1):
        self.config = config
        self.ref = ref
        self.module = load_model_file(config.model)
        self.model_hash = file_sha256(config.model)
        self.sweep_parts = sweep_parts(config, model_sha256=self.model_hash)
        self.structures = Structures(config, cache, compile_workers=compile_workers)
        self.roles = variable_roles(ref.model)  # the reference's: every structure is read alike
        self.kept = kept_variables(config, self.roles)
        self.chain_start = start_point(config.sampler)  # where nutpie's chains start
        self._problems: dict[tuple[str, str], list[SettingProblem]] = {}  # by structure and path
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
        every node it creates (``add_tag_trace``), a large part of building a model, on the main
        thread while both cores sample.
        Those tracebacks only explain errors of a graph PyTensor compiles or runs, and
        on that path a dataset's graph never is: its data are read into the cached callbacks (a
        new structure compiles in worker processes that build their own model; only a dataset
        falling back to nutpie's own compile compiles the graph built here). A sweep whose
        reference is on nutpie's or pm.sample's own compile keeps them.
        """
        import pytensor

        limit = 0 if self.reference.path == CACHED else pytensor.config.traceback__limit
        with pytensor.config.change_flags(traceback__limit=limit):
            return build_model(self.module, model_input(dataset, self.ref), self.config.params)

    def structure(self, model: Any, dataset: Dataset) -> Structure:
        """The compiled structure for ``model`` (compiled now if this job has not met it)."""
        if dataset.id == self.ref.dataset.id and structure_of(model) == self.reference.id:
            return self.reference  # not built twice when it has a compile of its own (values baked in)
        return self._structure(model, dataset)

    def _structure(self, model: Any, dataset: Dataset) -> Structure:
        return self.structures.for_model(model, model_source(self.config, dataset),
                                         baked=baked_values(model, dataset))

    def provenance(self, dataset_id: str) -> Provenance:
        """What a fit of this dataset records: its data hashed before they are loaded (a file changed
        meanwhile leaves a digest that no longer matches, and the dataset pending; a table's group is
        hashed from the very rows it is loaded from)."""
        return dataset_provenance(self.sweep_parts, dataset_id, self.ref.reader.digest(dataset_id),
                                  self.ref.coding.for_dataset(dataset_id))

    def settings_problems(self, structure: Structure, model: Any) -> list[SettingProblem]:
        """What of the sampler settings ``structure``'s path cannot honour, or does not fit its ``model``
        (`batchfit.fitting.sampler_settings.settings_problems`), found once per structure."""
        key = (structure.id, structure.path)
        if key not in self._problems:
            self._problems[key] = settings_problems(self.config.sampler, structure.path, model)
        return self._problems[key]

    def check_settings(self, structure: Structure, model: Any, dataset: Dataset, *, reference: bool = False) -> None:
        """Raise a `ConfigError` if ``structure``'s path cannot honour a sampler setting, naming the
        setting, the path and the dataset (a fit job records it as the dataset's failure; the compile
        stage stops the sweep with the ``reference`` dataset's)."""
        if structure.path == FAILED:
            return
        problems = self.settings_problems(structure, model)
        if problems:
            which = (f"the reference dataset '{dataset.id}' ({dataset.path}), and so every dataset of its model "
                     if reference else f"dataset '{dataset.id}' ({dataset.path}), of model ")
            raise ConfigError(
                f"{which}structure {structure.id[:12]}, is fitted {PATH_WORDS[structure.path]}, which cannot "
                f"take these sampler settings: {problems_line(problems)}", key=problems[0].key,
                source=self.config.source)

    def sampling(self, model: Any, dataset: Dataset, structure: Structure, *, seed: int | None = None) -> Sampling:
        """Everything a dataset's sample needs but the threads: its seed (else `dataset_seed`), nutpie sampler model.

        A sampler setting the structure's path cannot honour is a `ConfigError` (`check_settings`). A
        dataset the cached path cannot take is kept for `draws`, which tries nutpie's own compile.
        """
        self.check_settings(structure, model, dataset)
        sampling = Sampling(dataset_seed(self.config.sampler.seed, dataset.id) if seed is None else seed)
        if structure.path == PYMC:  # pm.sample builds its own sampler, in `draws`
            return sampling
        try:
            sampling.model = structure.sampler_model(model, self.chain_start)
        except (CachedPathUnsupported, SamplerFailure) as exc:
            sampling.error = exc
        return sampling

    def start(self, sampling: Sampling, *, threads: int) -> None:
        """Start sampling in nutpie's own threads (outside the GIL) and return at once."""
        if sampling.error is not None or sampling.model is None:  # nothing to start (PyMC's path samples in `draws`)
            return
        sampling.sampler = self._nutpie_sample(sampling.model, sampling.seed, threads, blocking=False)

    def draws(self, sampling: Sampling, model: Any, dataset: Dataset, structure: Structure, *,
              threads: int) -> tuple[Any, str, str]:
        """Wait for a started sample: its raw DataTree (`finish` completes it), the path and why not the cached one.

        If the cached path cannot take the dataset (`CachedPathUnsupported`) or nutpie's sampler
        fails on it there (`SamplerFailure`), it is sampled again through nutpie's own compile,
        which is what ``pm.sample(nuts_sampler="nutpie")`` runs: a dataset only fails when pm.sample
        would fail on it too, and its error says so; the fit records why it fell back. Any other
        exception is batchfit's bug, and fails the dataset with its traceback.
        """
        seed, path, fallback = sampling.seed, structure.path, structure.reason or ""
        if path == PYMC:
            return self._pymc_sample(model, dataset, seed), path, fallback
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
                tree, path = self._nutpie_sample(structure.nutpie_model(model, self.chain_start), seed, threads), NUTPIE
            except SamplerFailure as second:
                raise BatchfitError(
                    f"sampling failed for dataset '{dataset.id}' ({dataset.path}) on batchfit's cached path "
                    f"({fallback}) and through nutpie's own compile, which is what "
                    f"pm.sample(nuts_sampler='nutpie') runs: {one_line(second)}{hint(one_line(second))}"
                ) from second
        return tree, path, fallback

    def sample(self, model: Any, dataset: Dataset, structure: Structure, *, threads: int,
               provenance: Provenance) -> Any:
        """Sample one dataset's posterior and wait for it (`sampling`, `start`, `draws`); return its whole DataTree."""
        sampling = self.sampling(model, dataset, structure)
        self.start(sampling, threads=threads)
        tree, path, fallback = self.draws(sampling, model, dataset, structure, threads=threads)
        return self.finish(tree, model, dataset, structure, sampling.seed, provenance, path, fallback)

    def _nutpie_sample(self, sampler_model: Any, seed: int, threads: int, *, blocking: bool = True) -> Any:
        """nutpie's sample as a DataTree, or with ``blocking=False`` its background sampler
        (`compat.nutpie_trace` waits for it and gives the DataTree).

        A failed sample's chain threads may outlive it: whoever ends the samples of a process
        waits for them (`after_sampling`), not this call, since other datasets' samplers may
        still be running and their threads end only once this thread has taken their results.
        """
        s = self.config.sampler
        sampler = import_nutpie().sample(sampler_model, draws=s.draws, tune=s.tune, chains=s.chains,
                                         cores=max(1, min(threads, s.chains)), seed=seed, progress_bar=False,
                                         blocking=False, return_raw_trace=True, **nutpie_options(s))
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

        s = self.config.sampler
        try:
            return pm.sample(draws=s.draws, tune=s.tune, chains=s.chains, cores=1, random_seed=seed,
                             nuts_sampler="pymc", progressbar=False, compute_convergence_checks=False,
                             model=model, **pymc_options(s, model))
        except Exception as exc:
            raise BatchfitError(f"sampling failed for dataset '{dataset.id}' ({dataset.path}) in pm.sample with "
                                f"PyMC's own step methods, so pm.sample fails on it too: {one_line(exc)}") from exc

    def finish(self, tree: Any, model: Any, dataset: Dataset, structure: Structure, seed: int,
               provenance: Provenance, path: str, fallback: str) -> Any:
        """Add data groups, optional extras and provenance attributes to a sampled DataTree."""
        import xarray as xr

        observed, constant = observed_and_constant_data(model)
        groups = {"observed_data": data_group(observed, model, dataset),
                  "constant_data": data_group(constant, model, dataset)}
        with structure.loaded(model):  # the extras read the template; other datasets are sampling meanwhile
            groups.update(structure.extras.compute(model, tree, seed))  # before dropping: they may read any variable
        for group in ("posterior", "warmup_posterior"):  # the warm-up's with discard_tuned_samples: false
            if group in tree.children:
                groups[group] = kept_posterior(tree[group].to_dataset(), self.kept, self.roles)
        if "diverging" not in tree["sample_stats"].data_vars:  # PyMC's path with no NUTS step: none can diverge
            sizes = groups["posterior"].sizes
            groups["sample_stats"] = tree["sample_stats"].to_dataset().assign(
                diverging=(("chain", "draw"), np.zeros((sizes["chain"], sizes["draw"]), dtype=bool)))
        for name, ds in groups.items():
            tree[name] = xr.DataTree(ds)
        tree.attrs.update({
            fit_attributes.FORMAT: fit_attributes.VERSION,
            "batchfit_version": __version__,
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),  # sampled just now
            fit_attributes.DATASET: dataset.id,
            fit_attributes.SOURCE: str(dataset.path),
            "model_file": str(self.config.model),
            "seed": seed,
            "compile_key": structure.key,
            fit_attributes.STRUCTURE: structure.id,
            "sampler_path": path,
            fit_attributes.FALLBACK: fallback,  # why not batchfit's cached path ('' when it was)
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
