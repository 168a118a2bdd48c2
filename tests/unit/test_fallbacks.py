"""A fallback never hides a bug (issue #43).

batchfit's cached path falls back to nutpie's own compile (what ``pm.sample(nuts_sampler="nutpie")``
runs) only for failures that are the model's: what the cached path documents it cannot take
(`CachedPathUnsupported`) and what nutpie's sampler meets on the model (`SamplerFailure`). An
exception from batchfit's own code fails the dataset, logged at ERROR and recorded with its
traceback; every fallback that happens is recorded in the fit and counted by collect and status.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest
import xarray as xr
from testkit.fits import make_config, write_datasets

import batchfit.compile.structures as structures_module
import batchfit.fitting.fitter as fit_module
from batchfit.errors import SamplerFailure
from batchfit.fitting.batch import fit_batch
from batchfit.outputs.collect import collect
from batchfit.records.manifest import Outcome
from batchfit.sweep.status import sweep_status


@pytest.fixture
def two_datasets(tmp_path: Path, hierarchical_entry: Path):
    write_datasets(tmp_path / "data", range(2), seed=41)
    return make_config(tmp_path / "results", hierarchical_entry, [str(tmp_path / "data" / "*.csv")])


def _fit(config, caplog) -> dict[str, Outcome]:
    with caplog.at_level(logging.INFO, logger="batchfit"):
        report = fit_batch(config, ["d0", "d1"], batch_id="b")
    return {o.dataset: o for o in report.outcomes}


def _assert_failed_loudly(config, outcomes, caplog, error: str) -> None:
    for dataset_id, outcome in outcomes.items():
        assert outcome.status == "failed", outcome
        record = json.loads(config.layout.failure(dataset_id).read_text())
        assert "Traceback (most recent call last)" in record["traceback"] and error in record["traceback"]
        assert not config.layout.fit(dataset_id).exists()
    assert any(r.levelno == logging.ERROR and error in r.getMessage() for r in caplog.records), caplog.text
    assert "nutpie's own compile" not in caplog.text  # no slow detour


def test_a_bug_while_sampling_on_the_cached_path_fails_the_dataset_with_its_traceback(two_datasets, caplog,
                                                                                        monkeypatch):
    def broken(sampler, raw, model):
        raise AttributeError("'NoneType' object has no attribute 'posterior' (a bug planted by the test)")

    monkeypatch.setattr(fit_module, "nutpie_trace", broken)
    _assert_failed_loudly(two_datasets, _fit(two_datasets, caplog), caplog, "planted by the test")


def test_a_bug_while_compiling_fails_the_structures_datasets_with_its_traceback(two_datasets, caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise NameError("name 'spec' is not defined (a bug planted by the test)")

    monkeypatch.setattr(structures_module, "compile_model", broken)
    _assert_failed_loudly(two_datasets, _fit(two_datasets, caplog), caplog, "planted by the test")


def test_a_sampler_failure_on_the_cached_path_falls_back_and_is_counted(two_datasets, caplog, monkeypatch):
    """nutpie's sampler failing on the cached path (here made to, for d1 only) is the model's kind
    of failure: d1 is sampled through nutpie's own compile, and the fit, collect and status say why."""
    real = fit_module.sampled_trace
    calls = []

    def failing_for_the_second_dataset(sampler, model):
        calls.append(model)
        if len(calls) == 2:  # one lane: d0's sample, then d1's on the cached path, then d1's retry
            sampler.wait()  # its chains are done with: the dataset is sampled again another way
            raise SamplerFailure("All initialization points failed (made to fail by the test)")
        return real(sampler, model)

    monkeypatch.setattr(fit_module, "sampled_trace", failing_for_the_second_dataset)
    outcomes = _fit(two_datasets, caplog)
    assert len(calls) == 3, "d1 was not sampled again"
    assert {d: o.status for d, o in outcomes.items()} == {"d0": "ok", "d1": "ok"}
    assert outcomes["d0"].fallback == "" and "made to fail by the test" in outcomes["d1"].fallback
    with xr.open_datatree(two_datasets.layout.fit("d1")) as tree:
        assert tree.attrs["sampler_path"] == "nutpie" and "made to fail" in tree.attrs["fallback"]
    report = collect(two_datasets, ["d0", "d1"])
    assert list(report.fallbacks.values()) == [["d1"]] and "1 not on batchfit's cached path" in report.one_line()
    datasets = pd.read_csv(two_datasets.layout.datasets_csv, keep_default_na=False).set_index("dataset")
    assert datasets.loc["d1", "fallback"] == outcomes["d1"].fallback and datasets.loc["d1", "sampler_path"] == "nutpie"
    assert datasets.loc["d0", "fallback"] == ""
    assert any("1 because" in line and "d1" in line for line in sweep_status(two_datasets).lines())
