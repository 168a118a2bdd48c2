"""``batchfit debug DATASET``: one dataset through what a fit job runs, in this process, to debug the model.

It loads the dataset as the sweep does (the sweep's coding of text columns, checked and cast to
the reference dataset's dtypes), builds its model with the user's ``build_model``, runs the fit
job's structure and cache-key checks and the cached path's compile or cache load, and samples one
short chain. Nothing is written under ``results_dir``; the cache gets what a fit job would put
there. When the model's code raises, `post_mortem` opens ``pdb`` at the model's own line.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchfit.cache.store import open_cache
from batchfit.compile.fingerprint import structure_of
from batchfit.compile.structures import CACHED, FAILED, NUTPIE
from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.errors import BatchfitError, DatasetError, ModelCodeError, one_line
from batchfit.fitting.fitter import Fitter, model_input, reference_model, sweep_reader
from batchfit.fitting.outcome import format_groups
from batchfit.model.model_file import baked_values, build_model, load_model_file
from batchfit.model.user_traceback import user_traceback

_PATHS = {CACHED: "batchfit's cached callbacks (the fast path)", NUTPIE: "nutpie's own compile (slower)"}


def debug_dataset(config: Config, dataset_id: str, *, draws: int = 200, tune: int = 200) -> Iterator[str]:
    """Run one dataset as a fit job does, yielding what is found as lines as it goes; then sample one
    chain of ``draws`` after ``tune`` (the sweep's other sampler settings) and summarise it.

    Raises what the fit job would record: a `batchfit.errors.ModelCodeError` when the model's code
    raises (its cause keeps the model's frames, for `post_mortem`), a DatasetError for bad data.
    """
    cache = open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    paths = discover_datasets(config.data_sources)
    if dataset_id not in paths:
        raise DatasetError(f"not among the datasets of config {config.source} ({len(paths)} dataset(s); "
                           "batchfit check lists the ids of files whose names are no usable ids)", dataset=dataset_id)
    path = paths[dataset_id]
    reader = sweep_reader(config, paths)
    try:
        ref = reference_model(config, reader)
    except BatchfitError:  # no dataset builds: this dataset's own build says why, below
        ref = None
    dataset = reader.load(dataset_id)
    size = format_groups(dataset.groups)
    yield f"dataset {dataset_id} ({path}): {dataset.n_rows} rows" + (f", groups {size}" if size else "")
    module = load_model_file(config.model)
    model = build_model(module, model_input(dataset, ref) if ref else dataset, config.params)
    if ref is None:  # it built, but no dataset of the sweep's first ones does: say why
        reference_model(config, reader)
    yield from model_lines(model)
    baked = baked_values(model, dataset)
    if baked:
        yield f"{baked}; a fit job samples it through nutpie's own compile for it alone (slower)"
    short = dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, chains=1, draws=draws, tune=tune))
    started = time.perf_counter()
    fitter = Fitter(short, ref, cache, compile_workers=1)
    data = model_input(dataset, ref)
    structure = fitter.structure(model, data)
    if structure.path == FAILED:
        raise BatchfitError(f"compiling model structure {structure.id[:12]} failed: {one_line(structure.error)}")
    where = "the reference's" if structure.id == fitter.reference.id else "a structure of its own"
    yield (f"structure {structure.id[:12]} ({where}; reference dataset {ref.dataset.id}), cache key "
           f"{structure.key or '(none: not on the cached path)'}: {_PATHS.get(structure.path, structure.path)}"
           + (f", because {structure.reason}" if structure.reason else "")
           + f" ({time.perf_counter() - started:.1f} s to compile or load)")
    started = time.perf_counter()
    tree = fitter.sample(model, data, structure, threads=1, provenance=fitter.provenance(dataset_id))
    yield from sample_lines(tree, draws, tune, time.perf_counter() - started)


def model_lines(model: Any) -> list[str]:
    """The model's graph in short: its free variables with their shapes, its data and its structure."""
    shapes = model.eval_rv_shapes()
    free = [f"{rv.name} {tuple(int(n) for n in shapes[rv.name])}" for rv in model.free_RVs]
    data = [f"{name} {tuple(var.get_value().shape)}" for name, var in model.named_vars.items()
            if hasattr(var, "get_value")]
    return [f"model: {len(free)} free variable(s): {', '.join(free) or '(none)'}",
            f"  observed: {', '.join(rv.name for rv in model.observed_RVs) or '(none)'}; "
            f"pm.Data: {', '.join(data) or '(none)'}",
            f"  structure key {structure_of(model)[:12]} (datasets with the same key share one compile)"]


def sample_lines(tree: Any, draws: int, tune: int, seconds: float) -> list[str]:
    """A short sample's outcome: its divergences, and each free variable's mean and sd (its first elements)."""
    from batchfit.outputs.summary_cache import summarise_posterior

    posterior = tree["posterior"].to_dataset()
    divergences = int(tree["sample_stats"]["diverging"].sum())
    table = summarise_posterior(posterior, str(tree.attrs.get("dataset", "")), "", None, list(posterior.data_vars))
    lines = [f"sampled 1 chain of {draws} draws after {tune} tuning steps in {seconds:.1f} s on "
             f"{tree.attrs.get('sampler_path')}: {divergences} divergence(s)"]
    shown = table.head(20)
    lines += [f"  {label}: mean {row['mean']:.4g}, sd {row['sd']:.4g}" for label, row in shown.iterrows()]
    if len(table) > len(shown):
        lines.append(f"  ... {len(table) - len(shown)} more element(s)")
    return lines


def post_mortem(exc: ModelCodeError, model_file: Path) -> None:
    """Open ``pdb`` on the failed model code, at the model's own frame where it raised."""
    import pdb

    cause = exc.__cause__
    tb = user_traceback(cause, model_file) if cause is not None else None
    pdb.post_mortem(tb if tb is not None else (cause or exc).__traceback__)
