"""Fits made without a shared filesystem, moved into the sweep's results directory before collect.

Such a fit job writes only its declared output, a results directory of its own
(`batchfit.layout.ResultsLayout.batch_outputs`) that a storage plugin brings back to the submitting
machine; there collect first adopts each one: as if the job had written into ``results_dir``
itself (`batchfit.fitting.batch`), a fit replaces the dataset's old fit and failure record, a
failure replaces its old fit, and the batch's manifest joins the others (the plan reads them).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from batchfit.common.atomic import atomic_path
from batchfit.errors import BatchfitError
from batchfit.fitting.fit_register import touching
from batchfit.fitting.provenance import record_digest
from batchfit.layout import ResultsLayout

log = logging.getLogger("batchfit")


def adopt_batch_outputs(layout: ResultsLayout, directories: Iterable[str | Path]) -> int:
    """Copy each job's fits, failure records and manifest from ``directories`` into ``layout``; the number of fits."""
    fits = 0
    for directory in map(Path, directories):
        job = ResultsLayout(directory)
        manifests = sorted(job.batches.glob("*.json"))
        if len(manifests) != 1:
            raise BatchfitError(f"{directory} is not a fit job's output directory: it holds {len(manifests)} "
                                "batch manifests, not one")
        adopted = list(json.loads(manifests[0].read_text())["datasets"])
        touching(layout, f"adopted-{manifests[0].stem}", adopted)
        for dataset_id in adopted:
            if job.fit(dataset_id).exists():
                _adopt_fit(layout, job, dataset_id)
                fits += 1
            elif job.failure(dataset_id).exists():
                layout.fit(dataset_id).unlink(missing_ok=True)
                layout.sidecar(dataset_id).unlink(missing_ok=True)
                _copy(job.failure(dataset_id), layout.failure(dataset_id))
        _copy(manifests[0], layout.batch_manifest(manifests[0].stem))
    if fits:
        log.info("adopted %d fit(s) from the fit jobs' own output directories", fits)
    return fits


def _adopt_fit(layout: ResultsLayout, job: ResultsLayout, dataset_id: str) -> None:
    """The sidecar goes first and comes back last, as where the job writes itself (`batchfit.fitting.batch`)."""
    try:
        digest = json.loads(job.sidecar(dataset_id).read_text())["provenance"]
    except (OSError, ValueError, KeyError) as exc:
        raise BatchfitError(f"the fit of '{dataset_id}' in {job.root} has no readable sidecar ({exc})") from exc
    layout.sidecar(dataset_id).unlink(missing_ok=True)
    _copy(job.fit(dataset_id), layout.fit(dataset_id))
    record_digest(layout, dataset_id, digest)
    layout.failure(dataset_id).unlink(missing_ok=True)


def _copy(source: Path, target: Path) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
