"""A fit job without a shared filesystem: the inputs the submitting side stages for it
(batchfit.fitting.job_inputs) and the adoption of what it wrote (batchfit.outputs.adopt).

The staged coding is compared with the coding a job on the shared filesystem computes from every
dataset (`sweep_coding`), which is what the two kinds of job must agree on.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from batchfit.config import Config, config_from_dict
from batchfit.data.coding import sweep_coding
from batchfit.data.discovery import DatasetIndex, discover_datasets
from batchfit.errors import BatchfitError
from batchfit.fitting.fit_register import FitRegister
from batchfit.fitting.job_inputs import JobInputs, stage_inputs
from batchfit.fitting.provenance import record_digest
from batchfit.layout import ResultsLayout
from batchfit.outputs.adopt import adopt_batch_outputs
from batchfit.records.failure import FailureRecord
from batchfit.records.manifest import BatchManifest, Outcome

# A sweep-wide text column whose level "Z" appears only in a dataset outside the batch, and a column
# that is text in the batch but numeric in another dataset (so numeric for the whole sweep).
TABLES = {"a1": "site,dose,y\nX,lo,1.0\n", "a2": "site,dose,y\nY,hi,2.0\n", "a3": "site,dose,y\nZ,3,0.5\n"}


def sweep(tmp_path: Path) -> Config:
    data = tmp_path / "data"
    data.mkdir()
    for dataset_id, text in TABLES.items():
        (data / f"{dataset_id}.csv").write_text(textwrap.dedent(text))
    (tmp_path / "results").mkdir()
    return config_from_dict({"model": "m.py", "datasets": [str(data / "*.csv")],
                             "results_dir": str(tmp_path / "results")}, source="sweep.yaml")


def test_a_staged_job_codes_its_datasets_as_the_whole_sweep_does(tmp_path):
    config = sweep(tmp_path)
    paths = discover_datasets(config.data_sources)
    sweep_coding(config.data_sources, paths)  # records the registry, as the sweep's plan does
    shared = sweep_coding(config.data_sources, paths)  # as a job on the shared filesystem reads it
    stage_inputs(config, paths, ["a1"], "a2", tmp_path / "staged")

    inputs = JobInputs(staged=tmp_path / "staged")
    staged_paths = inputs.datasets(config)
    assert list(staged_paths) == ["a1", "a2"]  # the batch and the reference, nothing else
    for dataset_id, path in staged_paths.items():
        assert path.read_bytes() == paths[dataset_id].read_bytes()
        assert staged_paths.source(dataset_id) == paths[dataset_id]  # what its fit and failure record name
    assert inputs.members() == ["a1"]
    staged = inputs.coding(config, staged_paths)
    assert staged == shared
    assert staged.for_dataset("a1") == shared.for_dataset("a1")
    # what the same coding from the job's files alone would get wrong: the level Z, the numeric dose
    alone = dataclasses.replace(config, results_dir=tmp_path / "alone")
    assert sweep_coding(alone.data_sources, staged_paths) != shared


def test_staging_names_what_is_missing(tmp_path):
    config = sweep(tmp_path)
    paths = discover_datasets(config.data_sources)
    with pytest.raises(BatchfitError, match="label registry .*coding.json is missing"):
        stage_inputs(config, paths, ["a1"], "a2", tmp_path / "staged")
    sweep_coding(config.data_sources, paths)
    with pytest.raises(BatchfitError, match="dataset 'b9' is not among the sweep's datasets"):
        stage_inputs(config, paths, ["a1", "b9"], "a2", tmp_path / "staged")
    with pytest.raises(BatchfitError, match="staged inputs .* are unreadable"):
        JobInputs(staged=tmp_path / "nothing").members()


def job_outputs(root: Path, batch: str, fitted: dict[str, str], failed: list[str]) -> Path:
    """A fit job's own results directory: fits (stand-in bytes) with sidecars, failure records, its manifest."""
    job = ResultsLayout(root / batch)
    job.fits.mkdir(parents=True)
    job.failures.mkdir(parents=True)
    job.batches.mkdir(parents=True)
    for dataset_id, digest in fitted.items():
        job.fit(dataset_id).write_bytes(f"fit of {dataset_id}".encode())
        record_digest(job, dataset_id, digest)
    outcomes = [Outcome(d, "ok", 1.0) for d in fitted] + [Outcome(d, "failed", 1.0, message="bad") for d in failed]
    for outcome in outcomes[len(fitted):]:
        FailureRecord.of(outcome, None).write(job.failure(outcome.dataset))
    BatchManifest.of(batch, outcomes).write(job.batch_manifest(batch))
    return job.root


def test_collect_adopts_a_jobs_fits_and_failures_as_if_the_job_had_written_them_itself(tmp_path):
    results = ResultsLayout(tmp_path / "results")
    for directory in (results.fits, results.failures):
        directory.mkdir(parents=True)
    results.failure("d1").write_text("an old failure of d1")  # d1 now fits: its old failure goes
    results.fit("d2").write_bytes(b"an old fit of d2")  # d2 now fails: its stale fit goes
    record_digest(results, "d2", "old")
    job = job_outputs(tmp_path / "outputs", "batch-1", {"d1": "digest-1"}, ["d2"])

    assert adopt_batch_outputs(results, [job]) == 1
    assert results.fit("d1").read_bytes() == b"fit of d1"
    register = FitRegister.current(results)  # the adopted datasets are listed as touched: read from their files
    assert register.digest("d1") == "digest-1" and register.failed("d2")  # d1's sidecar describes the adopted fit
    assert not results.failure("d1").exists()
    assert not results.fit("d2").exists() and not results.sidecar("d2").exists()
    assert FailureRecord.read_of("d2", results.failure("d2")).message == "bad"
    assert BatchManifest.read(results.batch_manifest("batch-1")).batch == "batch-1"


def test_a_directory_that_is_no_jobs_output_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BatchfitError, match="not a fit job's output directory"):
        adopt_batch_outputs(ResultsLayout(tmp_path / "results"), [tmp_path / "empty"])


def staged_sweep(tmp_path: Path, cache: Path, emptied: int) -> tuple[Config, DatasetIndex, Path]:
    """A two-dataset sweep of the bundled model staged for one job, the last ``emptied`` copies empty
    (as if they arrived broken); run from ``tmp_path``, where the sweep's patterns are relative to."""
    from testkit import write_sweep

    from batchfit.config import load_config

    config = load_config(write_sweep(tmp_path, cache, 2))
    paths = discover_datasets(config.data_sources)
    Path(config.results_dir).mkdir()
    sweep_coding(config.data_sources, paths)  # records the registry, as the sweep's plan does
    staged = tmp_path / "staged"
    stage_inputs(config, paths, list(paths), list(paths)[0], staged)
    for dataset_id in list(paths)[len(paths) - emptied:]:
        copy = JobInputs(staged=staged).datasets(config)[dataset_id]
        copy.unlink()
        copy.write_text("")
    return dataclasses.replace(config, results_dir=tmp_path / "job"), paths, staged


def test_a_staged_datasets_failure_names_the_sweeps_file_not_the_copy(tmp_path, session_cache, monkeypatch):
    """The user never sees the staged copy: the failure record and its message name the sweep's file."""
    from batchfit.fitting.batch import fit_batch

    monkeypatch.chdir(tmp_path)
    config, paths, staged = staged_sweep(tmp_path, session_cache, emptied=1)
    good, bad = list(paths)
    report = fit_batch(config, [good, bad], batch_id="b", threads=1, inputs=JobInputs(staged=staged))

    assert [o.status for o in report.outcomes] == ["ok", "failed"], report.outcomes
    record = json.loads(config.layout.failure(bad).read_text())
    assert f"file {paths[bad]}" in record["message"] and str(staged) not in record["message"], record
    assert record["path"] == str(paths[bad])


def test_a_staged_job_that_can_build_no_model_names_the_sweeps_files(tmp_path, session_cache, monkeypatch):
    from batchfit.errors import ModelContractError
    from batchfit.fitting.batch import fit_batch

    monkeypatch.chdir(tmp_path)
    config, paths, staged = staged_sweep(tmp_path, session_cache, emptied=1)
    copy = JobInputs(staged=staged).datasets(config)[list(paths)[0]]
    copy.unlink()
    copy.mkdir()  # unreadable, and another reason than the empty one's: a line of its own
    with pytest.raises(ModelContractError, match="no dataset could be loaded") as raised:
        fit_batch(config, list(paths), batch_id="b", threads=1, inputs=JobInputs(staged=staged))
    assert all(f"file {path}" in str(raised.value) for path in paths.values()), raised.value
    assert str(staged) not in str(raised.value)
