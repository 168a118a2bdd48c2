"""The fit file's root attributes: their names and the file's format version, for its writer and its readers.

A fit (``fits/{id}.nc``, NetCDF-4 holding an ArviZ DataTree) is written by the fit job
(`batchfit.fitting.fitter.Fitter.finish` sets these, `batchfit.fitting.netcdf_writer` writes the file) and read by
collect through netCDF4 (`batchfit.outputs.fit_reader`), by the predictions through h5py
(`batchfit.predictions.fit_draws`) and by the plan, for its digest (`recorded_digest`). A prediction
(``predictions/{id}.nc``) records its digest under the same name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.errors import DatasetError

# The attribute naming the file's format version, and the version this batchfit writes and reads.
FORMAT = "batchfit_fit_format"
VERSION = 1

DATASET = "dataset"  # the dataset's id: a reader checks the file is the dataset's it expects
SOURCE = "source"  # the dataset's file (a table's, for a group of one)
PROVENANCE = "provenance"  # the digest of everything that determined the fit (`batchfit.fitting.provenance`)
STRUCTURE = "structure"  # the structure's id (`batchfit.compile.structures`)
FALLBACK = "fallback"  # why it was not sampled on batchfit's cached path ('' when it was)
ROWS = "rows"  # the dataset's rows the model saw


def check_format(attrs: Mapping[str, Any], dataset_id: str, path: str | Path) -> None:
    """Refuse a fit of another format version (an older batchfit's) or of another dataset than ``dataset_id``."""
    found = attrs.get(FORMAT)
    if found is not None:  # netCDF4 and h5py read a number written alone as an array of one
        found = np.ravel(found).tolist()[0] if np.size(found) == 1 else np.ravel(found).tolist()
    if found != VERSION:
        written = "no format version" if found is None else f"format version {found}"
        raise DatasetError(f"the fit has {written}, while this batchfit reads version {VERSION} (written by another "
                           "batchfit): delete it, and the dataset is fitted again", dataset=dataset_id, path=path)
    recorded = attrs.get(DATASET, dataset_id)
    if recorded != dataset_id:
        raise DatasetError(f"the fit is for dataset '{recorded}'", dataset=dataset_id, path=path)


def recorded_digest(path: str | Path) -> str | None:
    """The provenance digest a fit or prediction file recorded (None for a file without one)."""
    import netCDF4

    with netCDF4.Dataset(path) as nc:
        return nc.getncattr(PROVENANCE) if PROVENANCE in nc.ncattrs() else None
