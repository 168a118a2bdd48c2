"""Fits made without a shared filesystem, moved into the sweep's results directory before collect.

Such a fit job writes only its declared output, a results directory of its own
(`batchfit.layout.ResultsLayout.batch_outputs`) that a storage plugin brings back to the submitting
machine; there collect first adopts each one: as if the job had written into ``results_dir``
itself (`batchfit.fitting.batch`), a fit replaces the dataset's old fit and failure record, a
failure replaces its old fit, and the batch's manifest joins the others (the plan reads them).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from batchfit.common.atomic import atomic_path
from batchfit.errors import BatchfitError, RecordError
from batchfit.fitting.fit_register import touching
from batchfit.fitting.provenance import record_digest
from batchfit.layout import ResultsLayout
from batchfit.records.manifest import BatchManifest
from batchfit.records.provenance_sidecar import ProvenanceSidecar

log = logging.getLogger("batchfit")


def job_output(directory: str | Path, manifests: Callable[[ResultsLayout], Path], kind: str
               ) -> tuple[ResultsLayout, Path, list[str]]:
    """A job's own results directory: its layout, its one manifest (in the ``manifests`` directory of it) and the
    datasets the manifest lists; anything else is an error naming the ``kind`` of job."""
    job = ResultsLayout(Path(directory))
    found = sorted(manifests(job).glob("*.json"))
    if len(found) != 1:
        raise BatchfitError(f"{directory} is not a {kind} job's output directory: it holds {len(found)} "
                            "batch manifests, not one")
    return job, found[0], list(BatchManifest.read(found[0]).datasets)


def adopt_batch_outputs(layout: ResultsLayout, directories: Iterable[str | Path]) -> int:
    """Copy each job's fits, failure records and manifest from ``directories`` into ``layout``; the number of fits."""
    fits = 0
    for directory in directories:
        job, manifest, adopted = job_output(directory, lambda job: job.batches, "fit")
        touching(layout, f"adopted-{manifest.stem}", adopted)
        for dataset_id in adopted:
            if job.fit(dataset_id).exists():
                _adopt_fit(layout, job, dataset_id)
                fits += 1
            elif job.failure(dataset_id).exists():
                layout.fit(dataset_id).unlink(missing_ok=True)
                layout.sidecar(dataset_id).unlink(missing_ok=True)
                copy_file(job.failure(dataset_id), layout.failure(dataset_id))
        copy_file(manifest, layout.batch_manifest(manifest.stem))
    if fits:
        log.info("adopted %d fit(s) from the fit jobs' own output directories", fits)
    return fits


def _adopt_fit(layout: ResultsLayout, job: ResultsLayout, dataset_id: str) -> None:
    """The sidecar goes first and comes back last, as where the job writes itself (`batchfit.fitting.batch`)."""
    try:
        digest = ProvenanceSidecar.read(job.sidecar(dataset_id)).provenance
    except (OSError, RecordError) as exc:
        raise BatchfitError(f"the fit of '{dataset_id}' in {job.root} has no readable sidecar ({exc})") from exc
    layout.sidecar(dataset_id).unlink(missing_ok=True)
    copy_file(job.fit(dataset_id), layout.fit(dataset_id))
    record_digest(layout, dataset_id, digest)
    layout.failure(dataset_id).unlink(missing_ok=True)


def copy_file(source: Path, target: Path) -> None:
    """Copy ``source`` onto ``target`` atomically (a reader never sees half of it)."""
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
