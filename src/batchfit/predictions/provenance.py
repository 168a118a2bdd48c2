"""Provenance of a prediction: a digest of everything that determines it, recorded with it and checked.

A dataset's prediction is determined by its fit (the fit's own provenance digest, which covers the model
file, the data, the settings and the code that fitted it), its new inputs (the new-data file's content
or its table group's rows; a grid's or a horizon's settings), the ``predict`` settings (all but ``x``,
which only the report reads) and the code that predicts (``batchfit/predictions``). A dataset's
prediction is pending when the digest it recorded (a sidecar ``predictions/{id}.json`` beside
``predictions/{id}.nc``, and the file's root attribute ``provenance``) differs from the expected one: a
refit or changed new inputs re-predict that dataset only, and new inputs alone refit nothing (they are
in no fit's digest).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from batchfit.common.hashing import package_sources, sources_digest
from batchfit.config import Config, config_to_dict
from batchfit.data.discovery import PREDICT_DATA, table_scans
from batchfit.fitting.provenance import DigestCache, Provenance, SweepParts, versions
from batchfit.layout import ResultsLayout
from batchfit.records.fit_attributes import recorded_digest
from batchfit.records.provenance_sidecar import ProvenanceSidecar

# The code a prediction comes from, besides what its fit's digest covers.
PREDICT_CODE = ("predictions",)


@functools.cache
def predict_code_sha256() -> str:
    return sources_digest(package_sources(*PREDICT_CODE))


def predict_parts(config: Config) -> SweepParts:
    """The parts every dataset's prediction shares."""
    settings = config_to_dict(config)["predict"]
    settings.pop("x", None)  # the report's axis, not the predictions'
    return SweepParts({"predict": settings, "predict_code": predict_code_sha256(),
                       "versions": versions()})


def prediction_provenance(parts: SweepParts, dataset_id: str, fit_digest: str, inputs_sha256: str) -> Provenance:
    """One dataset's prediction provenance: the shared parts, its fit's digest and its new inputs' sha256
    ('' for a grid or a horizon, which the shared parts hold)."""
    return Provenance(parts, {"dataset": dataset_id, "fit": fit_digest, "inputs_sha256": inputs_sha256})


def expected_prediction_digests(config: Config, fit_digests: Mapping[str, str], new_files: Mapping[str, Path],
                                predicted: list[str], *, record: bool = True) -> dict[str, str]:
    """The expected digest of each dataset in ``predicted``: from its expected fit digest (``fit_digests``;
    '' for an id with no dataset) and, with ``predict.data``, its new file's sha256 (through the data files'
    digest cache, so unchanged files are not hashed again) or its table group's rows' digest (the table's
    scan's), so that a changed group re-predicts that dataset only."""
    parts = predict_parts(config)
    cache = DigestCache(config.layout.data_digests)
    groups = {d: digest for scan in table_scans(config.data_sources, key=PREDICT_DATA)
              for d, digest in scan.digests.items()}

    def inputs(dataset_id: str) -> str:
        if dataset_id in groups:
            return groups[dataset_id]
        return cache.sha256(new_files[dataset_id]) if dataset_id in new_files else ""

    digests = {d: prediction_provenance(parts, d, fit_digests.get(d, ""), inputs(d)).digest for d in predicted}
    if record:
        cache.save()
    return digests


def record_prediction(layout: ResultsLayout, dataset_id: str, digest: str) -> None:
    """Write the sidecar of a prediction just written: its digest, and the file's size and modification time."""
    ProvenanceSidecar.describing(layout.prediction(dataset_id), dataset_id, digest).write(
        layout.prediction_sidecar(dataset_id))


def recorded_prediction(layout: ResultsLayout, dataset_id: str) -> str | None:
    """The digest of a dataset's prediction: None without one; from its sidecar when that describes this file,
    else from the file itself."""
    path = layout.prediction(dataset_id)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    digest = ProvenanceSidecar.digest_for(layout.prediction_sidecar(dataset_id), stat)
    if digest is not None:
        return digest
    try:
        return recorded_digest(path)
    except OSError:
        return None
