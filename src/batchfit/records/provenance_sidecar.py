"""The provenance sidecar: the small JSON beside a fit (``fits/{id}.json``) or a prediction
(``predictions/{id}.json``) that records its provenance digest and which file it describes.

The plan reads a dataset's digest from its sidecar rather than opening the NetCDF file, when the sidecar
describes the file there now (its size and modification time); otherwise from the file itself
(`batchfit.records.fit_attributes.recorded_digest`). Written by the fit and predict jobs and by collect when
it adopts a job's outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from batchfit.errors import RecordError
from batchfit.records.json_record import JsonRecord


@dataclass(frozen=True)
class ProvenanceSidecar(JsonRecord):
    """A dataset's file's provenance digest, with the size and modification time of the file it describes."""

    KIND = "provenance sidecar"
    VERSION = 1
    REMEDY = "delete it: the digest is then read from the file it describes"
    # In place, not through a temporary file: a torn sidecar is never valid JSON and is then ignored (the file
    # it describes is read), while a temporary left by a killed job beside a complete fit would never be
    # cleaned up (the dataset is not pending, so no job owns it).
    ATOMIC = False

    dataset: str
    provenance: str
    size: int
    mtime_ns: int

    @classmethod
    def describing(cls, described: Path, dataset_id: str, digest: str) -> Self:
        """The sidecar of the file ``described`` (just written), with its digest."""
        stat = described.stat()
        return cls(dataset_id, digest, stat.st_size, stat.st_mtime_ns)

    @classmethod
    def digest_for(cls, path: Path, described: os.stat_result) -> str | None:
        """The digest of the sidecar at ``path`` if it describes the file of ``described`` (its stat), else None:
        no sidecar, a damaged or older one, or one of another file."""
        try:
            side = cls.read(path)
        except (OSError, RecordError):
            return None
        return side.provenance if (side.size, side.mtime_ns) == (described.st_size, described.st_mtime_ns) else None
