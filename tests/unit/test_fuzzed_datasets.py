"""Fuzzed dataset files fail only with batchfit's own errors, naming the dataset (or are fitted);
data that only the sampler or the writer would trip over is caught too; `batchfit check` flags
exactly the fuzzed datasets the fit stage rejected.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from testkit import posterior_arrays, sweep_settings, table

from batchfit.config import Config, config_from_dict
from batchfit.errors import BatchfitError

if TYPE_CHECKING:
    from batchfit.records.manifest import Outcome


def _error_names(cls: type) -> set[str]:
    return {cls.__name__} | {name for sub in cls.__subclasses__() for name in _error_names(sub)}


BATCHFIT_ERRORS = _error_names(BatchfitError)
_FUZZ_IDS = itertools.count()


@dataclass
class Fuzz:
    """Where the fuzzed sweeps live, and each fuzzed dataset's sweep with its outcome."""

    root: Path
    cache: Path
    #: dataset id -> (its sweep's config, its outcome, or None when the sweep could not start)
    sweeps: dict[str, tuple[Config, Outcome | None]] = field(default_factory=dict)

    def sweep(self, dataset_id: str) -> tuple[Config, Path]:
        """A sweep of a clean reference dataset and the (yet unwritten) ``dataset_id``: its config and data dir.

        Each dataset gets its own sweep, as a user's would: the sweep-wide label coding then
        covers its labels, and one file that breaks the sweep does not break the others.
        """
        data = self.root / dataset_id / "data"
        data.mkdir(parents=True)
        table(0, 50, 4).to_csv(data / "aaa_ref.csv", index=False)
        config = config_from_dict(sweep_settings(
            self.cache, datasets=[str(data / "*")], results_dir=str(data.parent / "results"),
            sampler={"draws": 20, "tune": 20, "chains": 1, "seed": 1}))
        return config, data


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory, hierarchical_entry: Path) -> Fuzz:
    """The fuzzed sweeps of this module (the compiled model comes from the session cache)."""
    return Fuzz(tmp_path_factory.mktemp("fuzz"), hierarchical_entry)


_labels = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6)
_cells = {
    "float": st.floats(-50, 50, allow_nan=False),
    "wild": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
                      st.sampled_from(["", "nan", "inf", "-inf", "1e400", "NaN", " 1 ", "1,5"])),
    "text": _labels,
    "mixed": st.one_of(st.floats(-5, 5), st.integers(-3, 3), _labels, st.none(), st.booleans()),
    "label": st.sampled_from(["a", "b", "c"]),
}
_header = st.one_of(st.sampled_from(["group", "x", "y", "Y", "x ", "grp", "", "ÿ", "列", "y\u200b"]), _labels)


@st.composite
def malformed_tables(draw: st.DrawFn) -> tuple[str, bytes | pd.DataFrame]:
    """A dataset file's content: a valid table with 0-3 mutations, or an empty / garbage / huge file."""
    kind = draw(st.sampled_from(["table"] * 8 + ["empty", "header", "garbage", "huge"]))
    if kind == "empty":
        return ".csv", b""
    if kind == "header":
        return ".csv", b"group,x,y\n"
    if kind == "garbage":
        return draw(st.sampled_from([".csv", ".parquet", ".nc"])), draw(st.binary(min_size=1, max_size=200))
    if kind == "huge":
        n_rows = draw(st.integers(2000, 8000))
        frame = table(draw(st.integers(0, 100)), n_rows, draw(st.integers(1, 30)))
        columns = {name: frame[name].tolist() for name in frame.columns}
    else:
        n_rows = draw(st.integers(1, 12))
        columns = {"group": draw(st.lists(_cells["label"], min_size=n_rows, max_size=n_rows)),
                   "x": draw(st.lists(_cells["float"], min_size=n_rows, max_size=n_rows)),
                   "y": draw(st.lists(_cells["float"], min_size=n_rows, max_size=n_rows))}
    for _ in range(draw(st.integers(0, 3))):
        mutation = draw(st.sampled_from(["drop", "rename", "cells", "cells", "column", "extra"]))
        if mutation == "extra" or not columns:
            columns[draw(_header)] = draw(st.lists(_cells["mixed"], min_size=n_rows, max_size=n_rows))
            continue
        name = draw(st.sampled_from(sorted(columns)))
        if mutation == "drop":
            del columns[name]
        elif mutation == "rename":
            columns[draw(_header)] = columns.pop(name)
        elif mutation == "cells":
            for row in draw(st.lists(st.integers(0, n_rows - 1), min_size=1, max_size=3)):
                columns[name][row] = draw(st.one_of(_cells["wild"], _cells["mixed"]))
        else:
            cell = draw(st.sampled_from(sorted(_cells)))
            columns[name] = draw(st.lists(_cells[cell], min_size=n_rows, max_size=n_rows)) if n_rows <= 12 else \
                [draw(_cells[cell])] * n_rows
    suffix = draw(st.sampled_from([".csv"] * 5 + [".parquet", ".nc"]))
    return suffix, pd.DataFrame(columns)


def _netcdf_names(columns: Iterable[str]) -> list[str]:
    """Column names HDF5 can store as variables: no '/', not empty or '.', no two alike."""
    names: list[str] = []
    for column in columns:
        name = column.replace("/", "_")
        if name in ("", "."):
            name = "unnamed"
        while name in names:
            name += "_"
        names.append(name)
    return names


def _write(path: Path, content: bytes | pd.DataFrame) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif path.suffix == ".csv":
        content.to_csv(path, index=False)
    elif path.suffix == ".parquet":
        content.astype({c: str for c in content.columns if content[c].dtype == object}).to_parquet(path)
    else:
        frame = content.set_axis(_netcdf_names(content.columns), axis=1)
        frame = frame.astype({c: str for c in frame.columns if frame[c].dtype == object})
        frame.to_xarray().to_netcdf(path, engine="h5netcdf")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=malformed_tables())
def test_fuzzed_datasets_fail_only_with_batchfit_errors_naming_the_dataset(fuzz: Fuzz, case) -> None:
    from batchfit.fitting.batch import fit_batch

    suffix, content = case
    dataset_id = f"fz_{next(_FUZZ_IDS):04d}"
    config, data = fuzz.sweep(dataset_id)
    path = data / f"{dataset_id}{suffix}"
    try:
        _write(path, content)
    except ValueError as error:  # HDF5's strings cannot hold NUL: no user can have such a NetCDF file
        if "embedded NULLs" not in str(error):
            raise
        reject()
    try:
        outcome = fit_batch(config, [dataset_id], batch_id="fuzz").outcomes[0]
    except BatchfitError as error:  # e.g. numbers in `group` make it numeric for the sweep: no model builds
        assert "'aaa_ref'" in str(error) and f"'{dataset_id}'" in str(error), error
        fuzz.sweeps[dataset_id] = (config, None)
        return
    fuzz.sweeps[dataset_id] = (config, outcome)
    fit, failure = config.layout.fit(dataset_id), config.layout.failure(dataset_id)
    if outcome.status == "ok":
        assert fit.is_file() and not failure.exists()
        assert posterior_arrays(fit)
        return
    assert outcome.status == "failed" and not fit.exists()
    record = json.loads(failure.read_text())
    assert record["message"] == outcome.message and record["stage"] == outcome.stage
    assert f"'{dataset_id}'" in outcome.message, outcome
    assert "\n" not in outcome.message and "Traceback" not in outcome.message
    if outcome.stage in ("load", "build"):  # bad data must be caught by batchfit, not deep in PyMC
        assert outcome.error_type in BATCHFIT_ERRORS, outcome
    else:
        assert outcome.stage == "sample" and "initialization points failed" in outcome.message, outcome


KNOWN_DEEP_FAILURES = [  # (id, dataset, stage, what the record must say)
    pytest.param("extreme", table(5, 12, 3).assign(y=lambda f: f["y"] * 1e300), "sample",
                 ["sampling failed for dataset 'extreme'", "extreme.csv", "look for extreme values",
                  "pm.sample(nuts_sampler='nutpie')"],
                 id="extreme-values"),
    pytest.param("nul_label", table(5, 12, 3).assign(group=lambda f: f["group"].str.replace("g01", "g\x0001")),
                 "load", ["dataset 'nul_label'", "column 'group'", "NUL character"], id="nul-in-label"),
]


@pytest.mark.parametrize(("dataset_id", "frame", "stage", "fragments"), KNOWN_DEEP_FAILURES)
def test_sampler_and_writer_failures_name_dataset_and_file(fuzz: Fuzz, dataset_id: str, frame: pd.DataFrame,
                                                           stage: str, fragments: list[str]) -> None:
    """Data that only nutpie (non-finite log density) or h5py (NUL in labels) would trip over."""
    from batchfit.fitting.batch import fit_batch

    config, data = fuzz.sweep(dataset_id)
    frame.to_csv(data / f"{dataset_id}.csv", index=False)
    outcome = fit_batch(config, [dataset_id], batch_id="deep").outcomes[0]
    assert (outcome.status, outcome.stage) == ("failed", stage), outcome
    assert all(f in outcome.message for f in fragments), outcome.message
    assert not config.layout.fit(dataset_id).exists()


#: check_model compiles the model's sampler functions each time (seconds): check this many fuzzed sweeps
CHECKED_SWEEPS = 8


@pytest.fixture(scope="module")
def fuzzed(fuzz: Fuzz) -> Fuzz:
    """``fuzz`` holding fuzzed sweeps and their outcomes; the fuzzing test's examples are run here
    when that test has not run yet in this module (alone, or in another order)."""
    if not fuzz.sweeps:
        test_fuzzed_datasets_fail_only_with_batchfit_errors_naming_the_dataset(fuzz)
    return fuzz


def test_check_agrees_with_the_fuzzed_fits(fuzzed: Fuzz) -> None:
    """`batchfit check` flags exactly the fuzzed datasets whose data the fit stage rejected,
    also where the sweep could not start (no dataset builds: check names each one's reason)."""
    from batchfit.sweep.check import check_model

    # the failures first: they are what check must flag
    order = sorted(fuzzed.sweeps.items(), key=lambda kv: (kv[1][1] is not None and kv[1][1].status == "ok", kv[0]))
    assert order, "no fuzzed dataset was fitted"
    for dataset_id, (config, outcome) in order[:CHECKED_SWEEPS]:
        report = check_model(config)
        if outcome is None:
            assert not report.ok and f"'{dataset_id}'" in report.dataset_problems.get(dataset_id, ""), report.lines()
            continue
        assert not report.fallbacks
        flagged = dataset_id in report.dataset_problems
        column_problem = outcome.error_type in ("DatasetError", "MissingColumnError") and "column" in outcome.message
        data_problem = outcome.status == "failed" and (
            outcome.stage == "load" or (outcome.stage == "build" and column_problem))
        if flagged:
            assert outcome.status == "failed" and outcome.stage in ("load", "build"), (dataset_id, outcome)
            assert f"'{dataset_id}'" in report.dataset_problems[dataset_id]
        assert flagged or not data_problem, (dataset_id, outcome)
