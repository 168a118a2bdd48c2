"""The records on disk (`batchfit.records`): each kind as its writer writes it reads back, and a file of an
older format, another kind or another dataset is refused with an error naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from testkit import HIERARCHICAL, REPO

from batchfit.config import Config, config_from_dict
from batchfit.errors import DatasetError, RecordError
from batchfit.fitting.fit_register import files_entry
from batchfit.fitting.netcdf_writer import write_fit
from batchfit.fitting.outcome import BatchReport, record_failure, write_manifest
from batchfit.fitting.provenance import record_digest
from batchfit.fitting.refit_records import KFOLD, Refit, RefitManifest, RefitOutcome, RefitPlan
from batchfit.layout import ResultsLayout
from batchfit.outputs.adopt import job_output
from batchfit.outputs.collect import collect
from batchfit.outputs.fit_reader import read_fit
from batchfit.predictions.fit_draws import read_fit_draws
from batchfit.predictions.inputs import Expected
from batchfit.predictions.records import write_predict_manifest
from batchfit.records import fit_attributes
from batchfit.records.compile_stamp import CompileStamp, ReferenceFit
from batchfit.records.failure import FailureRecord
from batchfit.records.manifest import BatchManifest, Outcome
from batchfit.records.plan import PlanRecord
from batchfit.records.provenance_sidecar import ProvenanceSidecar
from batchfit.records.simulation_truth import SimulationTruth
from batchfit.sweep.plan import plan, sweep_plan, write_plan
from batchfit.sweep.predict_plan import PredictPlan, sweep_predict_plan, write_predict_plan
from batchfit.sweep.resources import fit_resources


def sweep(tmp_path: Path) -> Config:
    """Three of the example's datasets, their results under tmp_path."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("store_000.csv", "store_001.csv", "store_002.csv"):
        shutil.copy(REPO / "data" / "example" / name, data / name)
    return config_from_dict({"model": str(HIERARCHICAL), "datasets": [str(data / "*.csv")], "batch_size": 2,
                             "results_dir": str(tmp_path / "results")})


def older(path: Path, **changes: object) -> None:
    """Rewrite the record at ``path`` as a batchfit before its format version wrote it (no kind nor version),
    or with ``changes``."""
    fields = json.loads(path.read_text())
    if not changes:
        del fields["record"], fields["version"]
    path.write_text(json.dumps({**fields, **changes}))


def refused(path: Path, *expected: str) -> str:
    """The pattern of a `RecordError` naming ``path`` and saying ``expected``."""
    return rf"record {path}: .*" + ".*".join(expected)


# --- the compile stamp
def stamp() -> CompileStamp:
    return CompileStamp(key="k" * 40, structure="s" * 40, path="cached", reference_dataset="store_000",
                        line="compiled in 1.0 s", reference_fit=ReferenceFit(seconds=1.5, peak_rss_mb=300, draws=200,
                                                                             chains=2), forward_key=None)


def test_a_compile_stamp_reads_back_and_an_older_one_is_refused_naming_it(tmp_path):
    path = tmp_path / "stamp.json"
    stamp().write(path)
    assert CompileStamp.read(path) == stamp()
    unmeasured = CompileStamp(**{**stamp().__dict__, "reference_fit": None, "forward_key": "f" * 40})
    unmeasured.write(path)
    assert CompileStamp.read(path) == unmeasured
    stamp().write(path)
    older(path)
    with pytest.raises(RecordError, match=refused(path, "no record kind and version", "compile stage runs again")):
        fit_resources(config_from_dict({"model": "m.py", "datasets": ["d.csv"]}).sampler, 10, path)


def test_a_record_of_a_newer_format_or_another_kind_or_damaged_is_refused(tmp_path):
    path = tmp_path / "stamp.json"
    stamp().write(path)
    older(path, version=CompileStamp.VERSION + 1)
    with pytest.raises(RecordError, match=refused(path, f"format version {CompileStamp.VERSION + 1}")):
        CompileStamp.read(path)
    stamp().write(path)
    with pytest.raises(RecordError, match=refused(path, "a compile stamp record, not a failure record")):
        FailureRecord.read(path)
    path.write_text('{"record": "compile stamp", "vers')
    with pytest.raises(RecordError, match=refused(path, "cannot read")):
        CompileStamp.read(path)
    with pytest.raises(FileNotFoundError):
        CompileStamp.read(tmp_path / "missing.json")


# --- the plan
def test_the_recorded_plan_reads_back_as_the_plan_and_an_older_one_is_refused_naming_it(tmp_path):
    config = sweep(tmp_path)
    planned = plan(config)
    write_plan(config, planned)
    recorded = sweep_plan(config, job=True)
    assert dict(recorded.datasets) == dict(planned.datasets) and recorded.batches == planned.batches
    assert len(PlanRecord.read(config.layout.plan).batches) == 2
    older(config.layout.plan)
    with pytest.raises(RecordError, match=refused(config.layout.plan, "run the sweep again")):
        sweep_plan(config, job=True)


# --- the batch manifests
def test_a_batch_manifest_reads_back_and_an_older_one_is_refused_naming_it(tmp_path):
    config = sweep(tmp_path)
    outcomes = [Outcome("store_000", "ok", 1.25, fallback="why not", warnings=["divergences"]),
                Outcome("store_001", "failed", 0.5, stage="build", error_type="DatasetError", message="bad")]
    write_manifest(config, BatchReport("batch-1", "compiled in 1.0 s", outcomes))
    path = config.layout.batch_manifest("batch-1")
    manifest = BatchManifest.read(path)
    assert manifest.batch == "batch-1" and manifest.compile == "compiled in 1.0 s"
    assert list(manifest.datasets.values()) == outcomes
    write_predict_manifest(config.layout, "predict-1", ["forward cached"], outcomes[:1])
    predicted = BatchManifest.read(config.layout.predict_manifest("predict-1"))
    assert predicted.forward == ("forward cached",) and list(predicted.datasets) == ["store_000"]
    older(path)
    with pytest.raises(RecordError, match=refused(path, "its job runs again")):
        job_output(config.layout.root, lambda job: job.batches, "fit")


# --- the failure records
def test_a_failure_record_reads_back_and_an_older_one_or_another_datasets_is_refused_naming_it(tmp_path):
    config = sweep(tmp_path)
    outcome = Outcome("store_001", "failed", 0.5, stage="build", error_type="DatasetError", message="bad 'store_001'",
                      reason="bad", traceback="frames", rows=12, groups="group=3", dropped_where=1, dropped_missing=0)
    file = tmp_path / "data" / "store_001.csv"
    record_failure(config, outcome, file)
    path = config.layout.failure("store_001")
    record = FailureRecord.read_of("store_001", path)
    assert record == FailureRecord.of(outcome, file)
    assert (record.path, record.why, record.row()["rows"]) == (str(file), "bad", "12")
    with pytest.raises(RecordError, match=refused(path, "of dataset 'store_001', not of 'store_002'")):
        FailureRecord.read_of("store_002", path)
    older(path)
    with pytest.raises(RecordError, match=refused(path, "tried again by the next run")):
        collect(config, ["store_001"])


# --- the provenance sidecars
def test_a_sidecar_reads_back_and_an_older_one_leaves_the_digest_to_the_fit_itself(tmp_path):
    layout = ResultsLayout(tmp_path / "results")
    layout.fits.mkdir(parents=True)
    xr.Dataset(attrs={fit_attributes.PROVENANCE: "the fit's"}).to_netcdf(layout.fit("d"), engine="netcdf4")
    record_digest(layout, "d", "the sidecar's")
    stat = layout.fit("d").stat()
    assert ProvenanceSidecar.read(layout.sidecar("d")) == ProvenanceSidecar("d", "the sidecar's", stat.st_size,
                                                                            stat.st_mtime_ns)
    assert files_entry(layout, "d")[:2] == ["fit", "the sidecar's"]
    older(layout.sidecar("d"))
    with pytest.raises(RecordError, match=refused(layout.sidecar("d"), "read from the file it describes")):
        ProvenanceSidecar.read(layout.sidecar("d"))
    assert files_entry(layout, "d")[:2] == ["fit", "the fit's"]


# --- the fit file's attributes
def fit_tree(dataset_id: str) -> xr.DataTree:
    draws = {"chain": [0, 1], "draw": [0, 1, 2]}
    posterior = xr.Dataset({"mu": (("chain", "draw"), np.zeros((2, 3)))}, coords=draws)
    stats = xr.Dataset({"diverging": (("chain", "draw"), np.zeros((2, 3), dtype=bool))}, coords=draws)
    tree = xr.DataTree.from_dict({"posterior": posterior, "sample_stats": stats})
    tree.attrs = {fit_attributes.FORMAT: fit_attributes.VERSION, fit_attributes.DATASET: dataset_id,
                  fit_attributes.PROVENANCE: "digest", fit_attributes.STRUCTURE: "structure"}
    return tree


def test_both_readers_of_a_fit_read_its_attributes_and_refuse_another_format_naming_it(tmp_path):
    path = tmp_path / "d.nc"
    write_fit(fit_tree("d"), path)
    posterior, _ = read_fit("d", path)
    assert posterior.attrs[fit_attributes.PROVENANCE] == "digest"
    draws = read_fit_draws("d", path)
    assert (draws.provenance, draws.structure) == ("digest", "structure")
    with pytest.raises(DatasetError, match="fit is for dataset 'd'"):
        read_fit_draws("e", path)
    tree = fit_tree("d")
    tree.attrs[fit_attributes.FORMAT] = fit_attributes.VERSION + 1
    write_fit(tree, path)
    for read in (read_fit, read_fit_draws):
        with pytest.raises(DatasetError, match=rf"file {path}\): the fit has format version "
                                               f"{fit_attributes.VERSION + 1}.*delete it"):
            read("d", path)
    del tree.attrs[fit_attributes.FORMAT]
    write_fit(tree, path)
    with pytest.raises(DatasetError, match="the fit has no format version"):
        read_fit("d", path)


# --- the prediction plan, the refits' plan and manifests, SBC's truth records
def test_the_recorded_prediction_plan_reads_back_and_an_older_one_is_refused_naming_it(tmp_path):
    config = sweep(tmp_path)
    planned = PredictPlan(["store_000", "store_001"], {"predict-1": {"store_001": Expected("p1", "f1")}},
                          {"store_000": Expected("p0", "f0")})
    write_predict_plan(config, planned)
    assert sweep_predict_plan(config, job=True) == PredictPlan(planned.predicted, planned.batches)
    older(config.layout.predict_plan)
    with pytest.raises(RecordError, match=refused(config.layout.predict_plan, "run the sweep again")):
        sweep_predict_plan(config, job=True)


REFIT = Refit("normal", "store_000", KFOLD, "kfold-1-of-2", (0, 2), "digest", "structure")


@pytest.mark.parametrize("record", [
    RefitPlan({"store_000": KFOLD}, {}, [REFIT], {"refit-1": [REFIT]}),
    RefitManifest("refit-1", "normal", "compiled", {"store_000/kfold-1-of-2": RefitOutcome("failed", 0.5, "bad")}),
    SimulationTruth("sim-00001", "digest", "sha", "model.py", "store_000", {"mu": [[0.5, 1.0]]},
                    {"mu": {"group": ["a", "b"]}}),
], ids=lambda record: record.KIND)
def test_the_other_records_read_back_and_an_older_one_is_refused_naming_it(tmp_path, record):
    path = tmp_path / "record.json"
    record.write(path)
    assert type(record).read(path) == record
    older(path)
    with pytest.raises(RecordError, match=refused(path, "no record kind and version", type(record).REMEDY)):
        type(record).read(path)
