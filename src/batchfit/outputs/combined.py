"""posteriors.nc: every fitted dataset's posterior stacked along a leading ``dataset`` dimension.

One NetCDF group per dataset does not scale (HDF5 is slow to create a variable, and each dataset
would add a set of them) and ArviZ cannot read it (a group is not an InferenceData). This
layout has a fixed number of variables whatever the number of datasets, and is a DataTree that
ArviZ takes as it is:

* ``/posterior``: each variable as ``(dataset, chain, draw, *dims)``, one HDF5 chunk per dataset,
  so a dataset is written (and read back) in one piece and the file is streamed to disk, never
  held in memory.
* ``/datasets``: one row per dataset: every root attribute of its fit (as text: ``model_hash``,
  ``created_at``, ``versions``, ...), ``fit_sha256`` (the fit file's content, used to reuse the
  dataset's block on the next collect), ``divergences``, and the masks below.

**Shapes that differ between datasets** (the rule): every dimension's coordinate is the union of
its labels over the datasets, in order of first appearance (the sweep's coding gives a label the
same code everywhere); a dataset's values sit at its own labels and are NaN elsewhere. Variables
that need this padding (or that some datasets lack) are stored as floating point. Where a
dimension's labels differ between datasets, ``/datasets/{dim}_present`` (dataset x label) says
which labels each dataset has, and ``/datasets/variable_present`` which variables (a structure
may lack some). `dataset_posterior` undoes the padding. A variable whose dimension *names*
differ between datasets is left out (root attribute ``excluded_variables``, with a warning):
read it from ``fits/{id}.nc``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import xarray as xr

log = logging.getLogger("batchfit")

LAYOUT = "stacked-v1"
DATASET_DIM = "dataset"
POSTERIOR = "posterior"
DATASETS = "datasets"
VARIABLE_PRESENT = "variable_present"
VARIABLE_DIM = "posterior_variable"
ORIGINAL_DTYPE = "original_dtype"
_BOOL_ATTR = "dtype"  # xarray's encoding of a boolean variable: int8 with attribute dtype="bool"


def fit_layout(posterior: xr.Dataset) -> dict[str, Any]:
    """What the stacked file needs to know of one fit, JSON-able: variables (dims, dtype, attrs) and coordinates."""
    variables = {
        str(name): {"dims": [str(d) for d in var.dims], "dtype": var.dtype.str, "attrs": plain_attrs(var.attrs)}
        for name, var in posterior.data_vars.items()
    }
    dims = {d for var in variables.values() for d in var["dims"]}
    coords = {d: _labels(posterior, d) for d in sorted(dims)}
    return {"variables": variables, "coords": coords}


def _labels(posterior: xr.Dataset, dim: str) -> list[Any]:
    if dim in posterior.coords:
        return np.asarray(posterior[dim].values).tolist()
    return list(range(posterior.sizes[dim]))


def plain_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as JSON values (NumPy scalars and arrays to Python)."""
    return {str(k): v.tolist() if isinstance(v, np.ndarray | np.generic) else v for k, v in attrs.items()}


@dataclass
class SweepLayout:
    """The union of every fit's layout: built with `add`, one fit at a time, in O(labels) memory."""

    n: int = 0
    dims: dict[str, list[str]] = field(default_factory=dict)  # variable -> dims
    dtypes: dict[str, list[str]] = field(default_factory=dict)  # variable -> distinct dtypes seen
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)  # variable -> attrs of its first fit
    counts: dict[str, int] = field(default_factory=dict)  # variable -> fits that have it
    labels: dict[str, dict[Any, None]] = field(default_factory=dict)  # dim -> union of labels, in order
    first: dict[str, list[Any]] = field(default_factory=dict)  # dim -> labels of the first fit having it
    varying: set[str] = field(default_factory=set)  # dims whose labels differ between fits
    excluded: dict[str, str] = field(default_factory=dict)  # variable -> why it is left out
    attr_keys: dict[str, None] = field(default_factory=dict)  # root attribute names, in order

    def add(self, layout: Mapping[str, Any], attr_keys: Sequence[str], dataset_id: str) -> None:
        self.n += 1
        self.attr_keys.update(dict.fromkeys(attr_keys))
        for dim, labels in layout["coords"].items():
            if dim not in self.first:
                self.first[dim] = list(labels)
                self.labels[dim] = dict.fromkeys(labels)
            elif labels != self.first[dim]:
                self.varying.add(dim)
                self.labels[dim].update(dict.fromkeys(labels))
        for name, var in layout["variables"].items():
            if name in self.excluded:
                continue
            if name not in self.dims:
                self.dims[name], self.attrs[name] = var["dims"], var["attrs"]
                self.dtypes[name], self.counts[name] = [], 0
            elif var["dims"] != self.dims[name]:
                self.excluded[name] = (f"dims {self.dims[name]} in one fit, {var['dims']} in that of "
                                       f"dataset '{dataset_id}'")
                continue
            if var["dtype"] not in self.dtypes[name]:
                self.dtypes[name].append(var["dtype"])
            self.counts[name] += 1

    @property
    def variables(self) -> list[str]:
        return [name for name in self.dims if name not in self.excluded]

    def padded(self, name: str) -> bool:
        """Whether a variable has NaN in some dataset: some lack it or have other labels along a dim."""
        return self.counts[name] < self.n or any(d in self.varying for d in self.dims[name])

    def dtype(self, name: str) -> np.dtype:
        dtype = np.result_type(*[np.dtype(d) for d in self.dtypes[name]])
        return np.dtype(np.float64) if self.padded(name) and dtype.kind not in "fc" else dtype

    def signature(self) -> str:
        """Everything that fixes the file's shapes and dtypes: equal signatures let blocks be copied between files."""
        return json.dumps({
            "layout": LAYOUT,
            "variables": {n: [self.dims[n], self.dtype(n).str, self.padded(n)] for n in self.variables},
            "coords": {d: list(self.labels[d]) for d in sorted(self.labels)},
            "varying": sorted(self.varying),
        }, default=str)


class StackedWriter:
    """Writes posteriors.nc block by block: ``put`` one dataset's posterior, or ``copy`` its block from an old file."""

    def __init__(self, nc: netCDF4.Dataset, layout: SweepLayout, dataset_ids: Sequence[str]):
        self.layout = layout
        self.positions = {d: {label: i for i, label in enumerate(labels)} for d, labels in layout.labels.items()}
        nc.setncatts({"layout": LAYOUT, "n_datasets": len(dataset_ids), "signature": layout.signature(),
                      "excluded_variables": json.dumps(layout.excluded)})
        self.posterior = nc.createGroup(POSTERIOR)
        self.info = nc.createGroup(DATASETS)
        dims = {d for name in layout.variables for d in layout.dims[name]}
        for group, group_dims in ((self.posterior, dims), (self.info, layout.varying & dims)):
            _coordinate(group, DATASET_DIM, list(dataset_ids))
            for d in sorted(group_dims):
                _coordinate(group, d, list(layout.labels[d]))
        for name in layout.variables:
            dtype, natural = layout.dtype(name), np.result_type(*[np.dtype(d) for d in layout.dtypes[name]])
            stored = np.dtype(np.int8) if dtype.kind == "b" else dtype
            shape = [len(layout.labels[d]) for d in layout.dims[name]]
            var = self.posterior.createVariable(
                name, stored, (DATASET_DIM, *layout.dims[name]), chunksizes=(1, *[max(1, n) for n in shape]),
                fill_value=np.nan if stored.kind == "f" else False)
            attrs = {k: v if not isinstance(v, bool | dict | list) else json.dumps(v)
                     for k, v in layout.attrs[name].items()}
            if dtype.kind == "b":
                attrs[_BOOL_ATTR] = "bool"
            if natural != dtype:  # an int or bool variable padded with NaN: how to give it back
                attrs[ORIGINAL_DTYPE] = natural.str
            var.setncatts(attrs)
        _coordinate(self.info, VARIABLE_DIM, layout.variables)
        self.info.createVariable(VARIABLE_PRESENT, "i1", (DATASET_DIM, VARIABLE_DIM)).setncattr(_BOOL_ATTR, "bool")
        for d in sorted(layout.varying & dims):
            self.info.createVariable(f"{d}_present", "i1", (DATASET_DIM, d)).setncattr(_BOOL_ATTR, "bool")
        self.info.createVariable("fit_sha256", str, (DATASET_DIM,))
        self.info.createVariable("divergences", "i8", (DATASET_DIM,))
        # the fit's attribute `dataset` is the coordinate; a name our own variables take is left out
        self.attr_keys = [key for key in layout.attr_keys if key not in self.info.variables]
        for key in self.attr_keys:
            self.info.createVariable(key, str, (DATASET_DIM,))

    def put(self, i: int, draws: Mapping[str, np.ndarray], coords: Mapping[str, Sequence[Any]]) -> None:
        """Write one dataset's draws (variable -> array, dims as in the layout) into block `i`, each value
        at the position of its label in `coords` (the fit's labels of each dim, as `fit_layout` gives them)."""
        index = {d: np.array([self.positions[d][label] for label in labels])
                 for d, labels in coords.items() if d in self.positions}
        for name in self.layout.variables:
            if name not in draws:
                continue
            var = self.posterior[name]
            values = draws[name]
            full = [len(self.layout.labels[d]) for d in self.layout.dims[name]]
            if list(values.shape) != full or any(d in self.layout.varying for d in self.layout.dims[name]):
                block = np.full(full, np.nan)
                block[np.ix_(*[index[d] for d in self.layout.dims[name]])] = values
                values = block
            var[i] = values.astype(np.int8) if values.dtype == bool else values

    def copy(self, i: int, old: netCDF4.Dataset, j: int) -> None:
        """Block `j` of an old file with the same signature into block `i`, raw (no decoding)."""
        for name in self.layout.variables:
            self.posterior[name][i] = old[POSTERIOR][name][j]

    def describe(self, i: int, posterior_layout: Mapping[str, Any], attrs: Mapping[str, Any], fit_sha256: str,
                 divergences: int) -> None:
        """Row `i` of /datasets: the fit's attributes, its content digest, divergences and presence masks."""
        for key in self.attr_keys:
            value = attrs.get(key, "")
            self.info[key][i] = value if isinstance(value, str) else json.dumps(value, default=str)
        self.info["fit_sha256"][i] = fit_sha256
        self.info["divergences"][i] = divergences
        has = posterior_layout["variables"]
        self.info[VARIABLE_PRESENT][i] = np.array([name in has for name in self.layout.variables], dtype=np.int8)
        for d in self.layout.varying:
            if f"{d}_present" in self.info.variables:
                mine = set(posterior_layout["coords"].get(d, []))
                self.info[f"{d}_present"][i] = np.array([label in mine for label in self.layout.labels[d]],
                                                        dtype=np.int8)


def _coordinate(group: netCDF4.Group, dim: str, labels: list[Any]) -> None:
    group.createDimension(dim, len(labels))
    values = np.asarray(labels)
    var = group.createVariable(dim, str if values.dtype.kind in "OUS" else values.dtype, (dim,))
    var[:] = values.astype(object) if values.dtype.kind in "OUS" else values


@contextmanager
def no_chunk_cache() -> Iterator[None]:
    """Files opened or created in this block have no HDF5 chunk cache.

    Collect writes (and reads) each block once, whole, so a cache would only hold blocks already
    done: netCDF's default (up to 64 MiB and 1,009 chunks per variable) made collect's memory
    grow with the number of datasets.
    """
    previous = netCDF4.get_chunk_cache()
    netCDF4.set_chunk_cache(0, 1, 1.0)
    try:
        yield
    finally:
        netCDF4.set_chunk_cache(*previous)


@contextmanager
def stacked_writer(path: Path, layout: SweepLayout, dataset_ids: Sequence[str]) -> Iterator[StackedWriter]:
    """Create posteriors.nc at `path` (a temporary name: see `batchfit.common.atomic`) and yield its writer."""
    with netCDF4.Dataset(path, mode="w") as nc:
        nc.set_auto_mask(False)
        yield StackedWriter(nc, layout, dataset_ids)


@contextmanager
def previous_blocks(path: Path, signature: str) -> Iterator[tuple[netCDF4.Dataset | None, dict[str, tuple[int, str]]]]:
    """An old posteriors.nc with the same signature, open, and its blocks: dataset id -> (index, fit_sha256).

    Anything else (no file, another layout or signature, unreadable) yields no blocks: every
    dataset is then read from its fit.
    """
    try:
        nc = netCDF4.Dataset(path)
    except (OSError, FileNotFoundError):
        yield None, {}
        return
    try:
        nc.set_auto_mask(False)
        if nc.__dict__.get("signature") != signature or DATASETS not in nc.groups:
            yield None, {}
            return
        info = nc[DATASETS]
        ids, digests = info[DATASET_DIM][:], info["fit_sha256"][:]
        yield nc, {str(d): (j, str(s)) for j, (d, s) in enumerate(zip(ids, digests, strict=True))}
    finally:
        nc.close()


def read_posterior(path: Path) -> xr.Dataset:
    """The posterior group of a fit, decoded and loaded."""
    with netCDF4.Dataset(path) as nc:
        return decoded_group(nc[POSTERIOR])


def decoded_group(group: netCDF4.Group, drop_variables: Sequence[str] = ()) -> xr.Dataset:
    """An open NetCDF group as ``xr.open_dataset(..., group=, drop_variables=)`` decodes it, loaded into memory.

    Through the already open file: xarray's own opening (file manager, backend guessing) costs
    about as much as reading a small fit.
    """
    return xr.decode_cf(xr.backends.NetCDF4DataStore(group), drop_variables=list(drop_variables)).load().drop_encoding()


def open_presence(path: Path) -> xr.Dataset:
    """posteriors.nc's `datasets` group without its text: which variables and labels each dataset has,
    all `dataset_posterior` reads.

    Not the whole group: xarray's netCDF4 backend reads every text variable of a group it opens
    (each dataset's provenance, keys and versions: a reader's memory would grow with the sweep).
    """
    with netCDF4.Dataset(path) as nc:
        group = nc[DATASETS]
        text = [name for name in group.variables if not name.endswith("_present") and name not in group.dimensions]
        return decoded_group(group, drop_variables=text)


def dataset_text(path: Path, names: Sequence[str], block: int = 1024) -> Iterator[dict[str, np.ndarray]]:
    """posteriors.nc's `datasets` text variables ``names``, ``block`` datasets at a time ('' where a name is absent).

    A block at a time, through netCDF4: all of them at once (each fit's provenance, keys and
    versions) would make a reader's memory grow with the sweep.
    """
    with netCDF4.Dataset(path) as nc:
        group = nc[DATASETS]
        n = len(group.dimensions[DATASET_DIM])
        for start in range(0, n, block):
            size = min(block, n - start)
            yield {name: (np.asarray(group.variables[name][start:start + size], dtype=object)
                          if name in group.variables else np.full(size, "", dtype=object)) for name in names}


def dataset_posterior(posterior: xr.Dataset, info: xr.Dataset, dataset_id: str) -> xr.Dataset:
    """One dataset's posterior from the stacked ones, padding removed: the selected variables of ``fits/{id}.nc``."""
    mine = posterior.sel({DATASET_DIM: dataset_id}, drop=True)
    row = info.sel({DATASET_DIM: dataset_id})
    present = [str(v) for v, has in zip(row[VARIABLE_DIM].values, row[VARIABLE_PRESENT].values, strict=True)
               if has and v in mine.data_vars]
    mine = mine[present]
    for name in list(row.data_vars):
        if str(name).endswith("_present") and name != VARIABLE_PRESENT:
            dim = str(name)[: -len("_present")]
            if dim in mine.dims:
                mine = mine.isel({dim: np.flatnonzero(row[name].values)})
    for name in list(mine.data_vars):
        attrs = dict(mine[name].attrs)
        original = attrs.pop(ORIGINAL_DTYPE, None)
        if original is not None:
            mine[name] = mine[name].astype(original)
            mine[name].attrs = attrs
    return mine.drop_vars([d for d in mine.coords if d not in mine.dims])
