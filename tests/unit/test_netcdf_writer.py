"""`batchfit.fitting.netcdf_writer` writes the file xarray's own netCDF4 writer writes.

Each tree is written by both; the files must decode to identical trees and hold the same
netCDF structure: groups, dimensions (in order), variables (in order) with their types,
dimensions, attributes, storage layout, filters and byte order; and, one level down, the same
HDF5 objects with the same stored types of data and attributes.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from batchfit.fitting.netcdf_writer import _encoded, write_datatree


def _structure(group: netCDF4.Group) -> dict:
    """Everything netCDF4 reports about a group and its subgroups, attribute types included."""
    def attributes(obj):
        return [(name, repr(obj.getncattr(name))) for name in obj.ncattrs()]

    return {
        "attrs": attributes(group),
        "dims": [(name, len(dim), dim.isunlimited()) for name, dim in group.dimensions.items()],
        "variables": [(name, repr(var.datatype), var.dimensions, attributes(var), var.chunking(), var.filters(),
                       var.endian()) for name, var in group.variables.items()],
        "groups": {name: _structure(sub) for name, sub in group.groups.items()},
    }


def _hdf5_layout(path: Path) -> list:
    """Each HDF5 object's storage and each attribute's stored type and shape, below what netCDF4
    reports (a one-element list of text is NC_STRING from xarray's writer, NC_CHAR otherwise)."""
    layout = []

    def visit(name, obj):
        attrs = [(key, str(obj.attrs.get_id(key).dtype), obj.attrs.get_id(key).shape) for key in obj.attrs]
        storage = (str(obj.dtype), obj.shape, obj.chunks, obj.compression, repr(obj.fillvalue)) \
            if isinstance(obj, h5py.Dataset) else ()
        layout.append((name, attrs, storage))

    with h5py.File(path, "r") as f:
        visit("/", f)
        f.visititems(visit)
    return layout


def _assert_written_as_xarray_writes(tree: xr.DataTree, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.nc", tmp_path / "theirs.nc"
    write_datatree(tree, ours)
    tree.to_netcdf(theirs, engine="netcdf4")
    with netCDF4.Dataset(ours) as a, netCDF4.Dataset(theirs) as b:
        assert _structure(a) == _structure(b)
    assert _hdf5_layout(ours) == _hdf5_layout(theirs)
    with xr.open_datatree(ours, engine="netcdf4") as a, xr.open_datatree(theirs, engine="netcdf4") as b:
        xr.testing.assert_identical(a.load(), b.load())
        for node in a.subtree:  # assert_identical compares values, not types
            for name, var in node.variables.items():
                assert var.dtype == b[node.path].variables[name].dtype, (node.path, name)


def _fit_like_tree() -> xr.DataTree:
    """What fits hold: nutpie's stats (uint, bool, text or None), labelled and unlabelled dims,
    label columns as text, a non-index coordinate, provenance attributes of every kind; and a
    nested group with times (CF-encoded as numbers with units)."""
    rng = np.random.default_rng(0)
    chains, draws = 2, 7
    sample = ("chain", "draw")
    index = {"chain": np.arange(chains), "draw": np.arange(draws)}
    a = rng.normal(size=(chains, draws, 3))
    a[0, 1, 2] = np.nan
    posterior = xr.Dataset(
        {"a": ((*sample, "groups"), a, {"batchfit_role": "free"}),
         "small": (sample, rng.normal(size=(chains, draws)).astype(np.float32)),
         "count": ((*sample, "count_dim_0"), rng.integers(0, 9, size=(chains, draws, 2)))},
        coords={**index, "groups": pd.Index(["north", "south", "é"], dtype=object),
                "region": ("groups", np.array(["n", "s", "s"]))},
        attrs={"sample_dims": ["chain", "draw"], "creation_library": "ArviZ"})
    message = np.full((chains, draws), None, dtype=object)
    message[1, 3] = "divergence at step 4"
    stats = xr.Dataset(
        {"depth": (sample, rng.integers(0, 5, size=(chains, draws)).astype(np.uint64)),
         "diverging": (sample, rng.random((chains, draws)) < 0.2),
         "index_in_trajectory": (sample, rng.integers(-3, 3, size=(chains, draws))),
         "energy": (sample, rng.normal(size=(chains, draws))),
         "divergence_message": (sample, message),
         "no_message": (sample, np.full((chains, draws), None, dtype=object))},
        coords=index, attrs={"inference_library": "nutpie", "inference_library_settings": '{"a": 1}'})
    constant = xr.Dataset({"group": ("group_dim_0", np.array([0, 2, 1, 1], dtype=np.int32)),
                           "group_labels": ("group_code", np.array(["g0", "g1", "g2"], dtype=object)),
                           "x": ("x_dim_0", np.array([0.5, np.nan, -1.0]))})
    inner = xr.Dataset({"y": ("y_dim_0", [1.0, 2.0]), "at": ("y_dim_0", pd.date_range("2026-12-04", periods=2))})
    tree = xr.DataTree.from_dict({"posterior": posterior, "sample_stats": stats, "constant_data": constant,
                                  "extra/inner": inner})
    tree.attrs.update({"dataset": "store_01", "seed": np.int64(2019041200017468964), "chains": 2,
                       "sampling_time": 0.25, "version": np.float32(1.5), "sampler": '{"draws": 7}'})
    return tree


def test_a_fit_like_tree_is_written_as_xarray_writes_it(tmp_path):
    tree = _fit_like_tree()
    with netCDF4.Dataset(tmp_path / "probe.nc", "w") as nc:
        assert _encoded(tree, nc) is not None, "written by xarray, not by the writer under test"
    _assert_written_as_xarray_writes(tree, tmp_path)


@pytest.mark.parametrize("what", ["compression asked for", "bytes", "empty dimension",
                                  "numeric list attribute", "text fill value"])
def test_what_the_writer_does_not_handle_is_written_by_xarray(what, tmp_path):
    """Anything outside what fits hold goes to xarray's writer, whose file it then is."""
    data = xr.Dataset({"v": ("d", np.arange(3.0))})
    if what == "compression asked for":
        data["v"].encoding = {"zlib": True, "complevel": 3}
    elif what == "bytes":
        data["v"] = ("d", np.array([b"a", b"bc", b""]))
    elif what == "empty dimension":
        data = xr.Dataset({"v": ("d", np.zeros(0))})
    elif what == "numeric list attribute":
        data.attrs["bounds"] = [1, 2]
    else:
        data["v"] = ("d", np.array(["a", "b", "c"], dtype=object), {"_FillValue": "?"})
    tree = xr.DataTree.from_dict({"posterior": data})
    with netCDF4.Dataset(tmp_path / "probe.nc", "w") as nc:
        assert _encoded(tree, nc) is None
    _assert_written_as_xarray_writes(tree, tmp_path)


_DTYPES = st.sampled_from([np.float64, np.float32, np.int8, np.int32, np.int64, np.uint64, np.bool_, np.str_])
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=5)


@st.composite
def _variables(draw):
    """A variable of any type a fit holds, text with missing values and floats with NaN included."""
    shape = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    dims = tuple(f"d{len(shape)}_{i}_{n}" for i, n in enumerate(shape))
    kind = draw(st.sampled_from(["numeric", "text or none", "all none"]))
    if kind == "numeric":
        dtype = np.dtype(draw(_DTYPES))
        elements = _TEXT if dtype.kind == "U" else None
        data = draw(arrays(dtype, shape, elements=elements))
    else:
        values = draw(st.lists(st.none() if kind == "all none" else st.one_of(st.none(), _TEXT),
                               min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        data = np.array(values + [None], dtype=object)[:-1].reshape(shape)
    return dims, data


_ATTRIBUTES = st.dictionaries(
    st.text("abcdefgh_", min_size=1, max_size=6),
    st.one_of(_TEXT, st.integers(-2**62, 2**62), st.floats(allow_nan=False), st.lists(_TEXT, min_size=1, max_size=3)),
    max_size=3)


@settings(max_examples=40, deadline=None)
@given(variables=st.lists(_variables(), min_size=1, max_size=4), attrs=_ATTRIBUTES, var_attrs=_ATTRIBUTES)
def test_any_dataset_of_fit_types_is_written_as_xarray_writes_it(variables, attrs, var_attrs, tmp_path_factory):
    data = xr.Dataset({f"v{i}": (dims, values, var_attrs if i == 0 else {})
                       for i, (dims, values) in enumerate(variables)}, attrs=attrs)
    tree = xr.DataTree.from_dict({"posterior": data})
    tmp_path = tmp_path_factory.mktemp("tree")
    with netCDF4.Dataset(tmp_path / "probe.nc", "w") as nc:
        assert _encoded(tree, nc) is not None
    _assert_written_as_xarray_writes(tree, tmp_path)
