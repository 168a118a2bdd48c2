"""The sweep's stages as plain functions: plan, compile, fit, collect, status.

The Snakemake rules (``scripts/*.py``) and the ``batchfit`` command line both call these, so a
sweep behaves the same with or without Snakemake.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.atomic import atomic_path
from batchfit.config import Config, check_model_file, config_from_dict
from batchfit.data import discover_datasets
from batchfit.errors import BatchfitError
from batchfit.provenance import expected_digests, recorded_digest

log = logging.getLogger("batchfit")


@dataclass(frozen=True)
class Plan:
    """Every dataset of the sweep, and the batches of those still to fit."""

    datasets: dict[str, Path]
    batches: dict[str, list[str]]


def batch_id(dataset_ids: Sequence[str], digests: Sequence[str] = ()) -> str:
    """A batch's name from its members and their expected provenance digests.

    The same pending datasets give the same job; a changed setting gives new names, so
    Snakemake runs the batch again instead of finding the manifest of an earlier run.
    """
    lines = [f"{d} {p}" for d, p in zip(dataset_ids, digests, strict=True)] if digests else dataset_ids
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    return f"batch-{digest}"


def is_pending(config: Config, dataset_id: str, expected_digest: str) -> bool:
    """A dataset needs fitting if it has no fit, or its fit recorded another provenance digest.

    By content, not modification time: touching the model or a data file refits nothing, and
    a changed sampler or outputs setting, model or data file refits exactly what it affects.
    """
    return recorded_digest(config, dataset_id) != expected_digest


def plan(config: Config) -> Plan:
    """Cut all datasets, in id order, into chunks of ``batch_size``; batch each chunk's pending ones.

    Only pending datasets are fitted, so adding a dataset to a finished sweep fits just that one,
    and a re-run retries just the datasets that failed or whose provenance changed. Chunks are
    cut from *all* datasets, not from the pending ones, so that finishing one batch never
    changes another: cluster executors re-read the Snakefile inside every job, and a batch
    must still exist, with the same members, when its job starts. Cheap enough for every
    parse: no model is built (see `batchfit.provenance` for the costs).
    """
    datasets = discover_datasets(config)
    expected = expected_digests(config, datasets)
    ids = list(datasets)
    size = config.batch_size
    batches = {}
    for chunk in (ids[i:i + size] for i in range(0, len(ids), size)):
        pending = [d for d in chunk if is_pending(config, d, expected[d])]
        if pending:
            batches[batch_id(pending, [expected[d] for d in pending])] = pending
    return Plan(datasets, batches)


def run_compile(config: Config) -> dict[str, Any]:
    """Fill the cache ahead of the fit jobs with the reference dataset's structure.

    A structure batchfit's cached path cannot take is reported (a warning) and left to nutpie's
    own compile in the fit jobs; other structures met in the fit jobs are compiled there, once.
    """
    from batchfit.fit import Fitter, prepare

    cache, _, ref = prepare(config)
    fitter = Fitter(config, ref, cache)
    structure = fitter.reference
    return {"key": structure.key, "structure": structure.id, "path": structure.path,
            "reference_dataset": ref.dataset.id, "line": fitter.compile_line}


def compile_stamp_path(config: Config) -> Path:
    """Where the compile stage records that the cache holds this model: inside the cache.

    Named by the model file's content and the library versions, so a sweep
    whose results were deleted (or a second sweep of the same model) finds the cache already
    filled and Snakemake skips the compile job; a changed model or an upgrade compiles again.
    """
    from importlib.metadata import version

    from batchfit import __version__
    from batchfit.fingerprint import LIBRARIES

    parts = [Path(config.model).read_bytes(), __version__.encode(),
             *(f"{name}={version(name)}".encode() for name in LIBRARIES)]
    digest = hashlib.sha256(b"\n".join(parts)).hexdigest()[:20]
    return Path(config.cache_dir) / "batchfit" / "compiled" / f"{Path(config.model).stem}-{digest}.json"


def fit_threads(config: Config, cores: int, n_batches: int) -> int:
    """Threads per fit job: all cores for one batch; otherwise split cores across parallel jobs.

    A job's fixed start-up (imports, cache load) is single-threaded, so with several batches
    it is better hidden by running jobs side by side than by giving one job every core.
    """
    parallel_jobs = max(1, min(n_batches, cores))
    return max(1, min(config.sampler.chains, cores // parallel_jobs))


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write a small JSON output atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))


def run_fit(config: Config, dataset_ids: Sequence[str] | None = None, *, threads: int = 1) -> int:
    """Fit the given datasets (default: every pending one) batch by batch; return the failure count."""
    from batchfit.fit import fit_batch

    batches = ({batch_id(list(dataset_ids)): list(dataset_ids)} if dataset_ids is not None
               else plan(config).batches)
    failed = 0
    for name, ids in batches.items():
        failed += fit_batch(config, ids, batch_id=name, threads=threads).n_failed
    return failed


def run_collect(config: Config) -> Any:
    """Combine every dataset's fit into posteriors.nc, summary.csv and failures.csv.

    Every fit must have the provenance the current config gives (see `collect`): a sweep never
    mixes fits made with other settings, models or data.
    """
    from batchfit.collect import collect

    datasets = discover_datasets(config)
    return collect(config, list(datasets), expected_provenance=expected_digests(config, datasets))


def failure_line(config: Config) -> str | None:
    """One line counting failed datasets, or None when every dataset was fitted."""
    failures = sorted(p.stem for p in (config.results_dir / "failures").glob("*.json"))
    failures = [f for f in failures if f in discover_datasets(config)]
    if not failures:
        return None
    return (f"batchfit: {len(failures)} dataset(s) failed ({', '.join(failures[:5])}"
            f"{', ...' if len(failures) > 5 else ''}); see {config.failures_csv_path}")


def snakemake_config(config: Mapping[str, Any], source: str) -> Config:
    """A Config from Snakemake's config dict, checked as `load_config` checks a config file.

    ``source`` names its files, so every error names the key and the file to fix.
    """
    checked = config_from_dict(dict(config), source=source)
    check_model_file(checked)
    return checked


@contextlib.contextmanager
def log_to(path: str | Path | None) -> Iterator[None]:
    """Send batchfit's log (and warnings) to a rule's log file for the duration of a job."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    previous = log.level
    log.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    except BatchfitError as exc:
        log.error("%s", exc)
        raise
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        log.setLevel(previous)
        handler.close()
