"""Refits for the exact comparisons: a fit's dataset without some rows, sampled on the compiled model.

Where PSIS-LOO cannot estimate an observation's predictive density (Pareto k above 0.7), the
compare rule of a sweep of variants uses refits (`batchfit.sweep.refit_plan` plans them,
`batchfit.outputs.exact_elpd` hands them to arviz_stats' ``reloo`` and ``loo_kfold``). A refit is
the dataset minus its held-out rows, swapped into the structure's compiled model exactly as a fit
job swaps datasets (a `Fitter`: one cache hit per job, then per refit only building models and
sampling), and its result is the held-out rows' pointwise log-likelihood under its draws, from
the model built on the held-out rows (the compiled log-likelihood a fit's
``outputs.log_likelihood`` uses, with the held-out rows' values loaded). Rows keep the dataset's
coding, so a group with no row left still has its parameter, drawn from the model's prior for it.

A refit job (rule ``refit``) runs one batch of one variant's refits in one process; each refit
writes ``<variant results_dir>/refits/fits/<dataset>/<id>.nc``, recording the digest of the fit it
refits and its held-out rows, so that a refit is never used for another fit or other rows
(`batchfit.fitting.refit_records.refit_done`, beside the plan's records).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.common.atomic import atomic_path
from batchfit.compile.fingerprint import structure_of
from batchfit.config import Config
from batchfit.data.dataset import Dataset
from batchfit.errors import BatchfitError, is_expected, one_line
from batchfit.fitting.batch import after_sampling
from batchfit.fitting.fitter import Fitter, dataset_seed, prepare
from batchfit.fitting.refit_records import HELD_OUT_DIM, Refit, RefitManifest, RefitOutcome, RefitPlan
from batchfit.fitting.sampler_health import sampler_diagnostics

log = logging.getLogger("batchfit")

def row_subset(dataset: Dataset, rows: np.ndarray) -> Dataset:
    """``dataset`` with only ``rows`` of every array that has one entry per row (the dataset's
    `Dataset.n_rows` along its first axis), every other array and the coding kept whole."""
    n = dataset.n_rows
    arrays = {name: array[rows] if array.ndim and array.shape[0] == n else array
              for name, array in dataset.arrays.items()}
    return dataclasses.replace(dataset, arrays=arrays)


def refit_seed(config: Config, refit: Refit) -> int:
    """A refit's seed: from the sweep's seed, the dataset and the refit's id only."""
    return dataset_seed(config.sampler.seed, f"{refit.dataset}/{refit.id}")


def refit_batch(config: Config, refits: Sequence[Refit], *, batch_id: str, threads: int = 1) -> RefitManifest:
    """Run one variant's ``refits`` with one compile (the fits' structure: a cache hit); write each result
    and the batch manifest, which is returned.

    A refit the model or data fail (its rows build another structure, the sampler fails) is recorded as
    failed, and compare keeps PSIS-LOO for its dataset; anything else is batchfit's bug and raises.
    """
    log.info("%s holds %d refit(s) of variant %s: %s", batch_id, len(refits), config.variant,
             " ".join(f"{r.dataset}/{r.id}" for r in refits))
    cache, _, ref = prepare(config, wanted=sorted({r.dataset for r in refits}))
    fitter = Fitter(config, ref, cache, compile_workers=threads)
    log.info("compile: %s", fitter.compile_line)
    loaded: dict[str, Dataset] = {}
    outcomes: dict[str, RefitOutcome] = {}
    for refit in refits:
        start = time.perf_counter()
        try:
            outcome = _refit(fitter, refit, loaded, threads)
        except Exception as exc:
            if not is_expected(exc):
                raise
            outcome = RefitOutcome("failed", time.perf_counter() - start, one_line(exc))
            log.warning("%s/%s: refit failed: %s", refit.dataset, refit.id, outcome.message)
        else:
            log.info("%s/%s: refitted without %d row(s) in %.2f s", refit.dataset, refit.id, len(refit.rows),
                     outcome.seconds)
        outcomes[f"{refit.dataset}/{refit.id}"] = outcome
    after_sampling()  # a failed sample's chain threads may outlive it
    manifest = RefitManifest(batch_id, config.variant, fitter.compile_line, outcomes)
    manifest.write(config.layout.refit_manifest(batch_id))
    failed = sum(o.status == "failed" for o in outcomes.values())
    log.info("%s: %d refitted, %d failed", batch_id, len(outcomes) - failed, failed)
    return manifest


def run_refit_job(config: Config, plan_path: Path, batch_id: str, *, threads: int = 1) -> RefitManifest:
    """The ``refit`` rule's job: batch ``batch_id`` of the recorded refit plan, in ``config`` (its variant's)."""
    plan = RefitPlan.read(plan_path)
    if plan.batch_variant(batch_id) != config.variant:
        raise BatchfitError(f"refit batch {batch_id} is variant {plan.batch_variant(batch_id)}'s, "
                            f"not {config.variant}'s")
    return refit_batch(config, plan.batches[batch_id], batch_id=batch_id, threads=threads)


def _refit(fitter: Fitter, refit: Refit, loaded: dict[str, Dataset], threads: int) -> RefitOutcome:
    """Sample the dataset without the refit's rows and write the held-out rows' log-likelihood under its draws."""
    start = time.perf_counter()
    config = fitter.config
    if refit.dataset not in loaded:  # a batch holds a dataset's refits one after another: one loaded at a time
        loaded.clear()
        loaded[refit.dataset] = fitter.ref.reader.load(refit.dataset)  # as a fit job loads it
    full = loaded[refit.dataset]
    held = np.asarray(refit.rows, dtype=np.intp)
    if held.size and (held.max() >= full.n_rows):
        raise BatchfitError(f"dataset '{refit.dataset}' has {full.n_rows} rows now, fewer than its fit's")
    train = row_subset(full, np.setdiff1d(np.arange(full.n_rows), held))
    model = _built(fitter, train, refit, "the dataset without its held-out rows")
    structure = fitter.structure(model, train)
    seed = refit_seed(config, refit)
    sampling = fitter.sampling(model, train, structure, seed=seed)
    fitter.start(sampling, threads=threads)
    tree, path, fallback = fitter.draws(sampling, model, train, structure, threads=threads)
    held_model = _built(fitter, row_subset(full, held), refit, "the held-out rows")
    sizes = {dim: (len(model.coords[dim] or ()), len(held_model.coords.get(dim) or ())) for dim in model.coords}
    differ = {dim: n for dim, n in sizes.items() if n[0] != n[1]}
    if differ:
        raise BatchfitError(f"the model's dims differ between the dataset without its held-out rows and those rows "
                            f"({', '.join(f'{d}: {a} and {b}' for d, (a, b) in differ.items())}): the held-out rows' "
                            "log-likelihood needs the refit's parameters, so its dims must come from the dataset's "
                            "coding (data.coords), not from the rows' values")
    with structure.loaded(held_model):
        log_likelihood = structure.extras.compute(held_model, tree, seed)["log_likelihood"]
    [values] = log_likelihood.data_vars.values()  # the plan takes only a model with one observed variable
    obs_dims = [dim for dim in values.dims if dim not in ("chain", "draw")]
    if len(obs_dims) != 1 or values.sizes[obs_dims[0]] != held.size:
        raise BatchfitError(f"the held-out rows' log-likelihood has dims {dict(values.sizes)}, not one value per "
                            f"held-out row ({held.size})")
    values = values.rename({obs_dims[0]: HELD_OUT_DIM}).assign_coords({HELD_OUT_DIM: held})
    divergences = int(sampler_diagnostics(tree["sample_stats"].to_dataset())["divergences"])
    outcome = RefitOutcome("ok", time.perf_counter() - start, "", path, divergences)
    attrs = {"dataset": refit.dataset, "variant": refit.variant, "method": refit.method, "refit": refit.id,
             "rows": json.dumps(list(refit.rows)), "fit_digest": refit.fit_digest, "seed": seed,
             "sampler_path": path, "fallback": fallback, "divergences": divergences}
    target = config.layout.refit(refit.dataset, refit.id)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        values.to_dataset(name="log_likelihood").assign_attrs(attrs).to_netcdf(tmp, engine="netcdf4")
    return outcome


def _built(fitter: Fitter, dataset: Dataset, refit: Refit, what: str) -> Any:
    """The model of ``dataset`` (part of the refit's dataset), which must have its fit's structure: a refit
    samples on the fit's compiled model, never compiles one of its own."""
    model = fitter.build(dataset)
    found = structure_of(model)
    if found != refit.structure:
        raise BatchfitError(
            f"{what} of dataset '{refit.dataset}' build model structure {found[:12]}, not its fit's "
            f"{refit.structure[:12]}: the model's graph depends on the data's values or sizes (a value "
            "baked in, a size taken as a Python int), so a refit would need a compile of its own; PSIS-LOO kept")
    return model
