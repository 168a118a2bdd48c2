"""Reliability: bad inputs get clear errors, one failing dataset never sinks a sweep, nothing is lost.

Config and dataset problems must be reported before any work, naming the key / dataset / file /
column to fix; through the real Snakemake a failing dataset is recorded while the others are
fitted; a killed run leaves no half-written output and re-runs to the same posteriors; fuzzed
inputs only ever produce batchfit's own errors; an untrusted cache directory is refused.

The Snakemake tests run the real ``snakemake`` on the repository's Snakefile with
``--directory`` set to a temporary project, and share the session's compile cache.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from testkit import (
    HIERARCHICAL,
    REPO,
    manifests,
    mtimes,
    output_of,
    posterior_arrays,
    snakemake,
    snakemake_command,
    sweep_settings,
    table,
    write_config,
)

from batchfit import cli
from batchfit.config import Config, config_from_dict, load_config
from batchfit.errors import BatchfitError, ConfigError
from batchfit.model.simulate import simulate_datasets

if TYPE_CHECKING:
    from batchfit.fitting.outcome import Outcome

OTHER_UID = 54321  # owner of the "shared" cache directories (not the user running the tests)


def _error_names(cls: type) -> set[str]:
    return {cls.__name__} | {name for sub in cls.__subclasses__() for name in _error_names(sub)}


# --- 1. config errors: before any work, naming key and file -------------------------------------

CONFIG_ERRORS = [
    pytest.param({"sampeler": {"draws": 10}}, "sampeler", "did you mean 'sampler'", id="unknown-key"),
    pytest.param({"batch_size": "two"}, "batch_size", "must be an integer or 'auto', got 'two'", id="wrong-type"),
    pytest.param({"batch_size": 0}, "batch_size", "must be >= 1, got 0", id="zero-batch-size"),
    pytest.param({"sampler": {"draws": -5}}, "sampler.draws", "must be >= 1, got -5", id="negative-draws"),
    pytest.param({"sampler": {"chains": 0}}, "sampler.chains", "must be >= 1, got 0", id="zero-chains"),
    pytest.param({"health": {"max_r_hat": 0.5}}, "health.max_r_hat", "must be > 1", id="bad-threshold"),
    pytest.param({"model": "models/missing.py"}, "model", "does not exist", id="model-missing"),
    pytest.param({"model": "models/no_build.py"}, "model", "defines no function build_model", id="no-build-model"),
    pytest.param({"model": "models/broken.py"}, "model", "cannot be read as Python at line 1", id="model-syntax"),
    pytest.param({"datasets": ["nodata/*.csv"]}, "datasets", "matches no file", id="glob-matches-nothing"),
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory with three good datasets and two broken model files."""
    simulate_datasets(HIERARCHICAL, tmp_path / "data", 3, seed=11, prefix="d")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "no_build.py").write_text("import math\n\ndef build(data):\n    return None\n")
    (tmp_path / "models" / "broken.py").write_text("def build_model(data) return 1\n")
    return tmp_path


@pytest.mark.parametrize(("change", "key", "fragment"), CONFIG_ERRORS)
def test_config_error_via_cli_check(project: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture, change: dict, key: str, fragment: str) -> None:
    monkeypatch.chdir(project)
    config = write_config(project / "sweep.yaml", sweep_settings(session_cache, **change))
    code = cli.main(["check", "--config", str(config)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert f"key '{key}'" in err and str(config) in err and fragment in err, err
    assert not (project / "results").exists()


@pytest.mark.parametrize(("change", "key", "fragment"), CONFIG_ERRORS)
def test_config_error_via_snakemake_dry_run(project: Path, session_cache: Path, change: dict, key: str,
                                            fragment: str) -> None:
    config = write_config(project / "sweep.yaml", sweep_settings(session_cache, **change))
    run = snakemake(project, config, "-n")
    out = output_of(run)
    assert run.returncode != 0
    assert f"key '{key}'" in out and str(config) in out and fragment in out, out
    assert "On instance" not in out, "Snakemake's schema dump instead of batchfit's message"
    assert not (project / "results").exists()


def test_valid_config_dry_run_plans_batches_and_writes_nothing(project: Path, session_cache: Path) -> None:
    config = write_config(project / "sweep.yaml", sweep_settings(session_cache))
    run = snakemake(project, config, "-n")
    assert run.returncode == 0, output_of(run)
    assert "rule fit:" in run.stdout and "output: results/batches/batch-" in run.stdout
    assert not (project / "results").exists()


def test_config_file_defaults_are_the_schema_defaults_not_the_example(project: Path, session_cache: Path) -> None:
    """A --configfile replaces config/config.yaml: keys it omits get the documented defaults."""
    minimal = write_config(project / "minimal.yaml", {
        "model": str(HIERARCHICAL), "datasets": [str(project / "data/*.csv")], "cache_dir": str(session_cache)})
    run = snakemake(REPO, minimal, "-n", "--nolock", cores=1, timeout=300)  # in the repository, beside the example
    assert run.returncode == 0, output_of(run)
    assert "output: results/batches/batch-" in run.stdout  # the default results_dir, not results/example
    assert "results/example" not in run.stdout


# --- 2. dataset errors: per dataset, before compiling ----------------------------------------------


def test_check_lists_every_bad_dataset_with_file_and_column(project: Path, session_cache: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    data = project / "data"
    good = table(1, 30, 3)
    (data / "empty.csv").write_bytes(b"")
    (data / "latin1.csv").write_bytes(b"group,x,y\n\xe9t\xe9,1.0,2.0\n")
    (data / "notparquet.parquet").write_text("group,x,y\na,1,2\n")
    (data / "notes.txt").write_text("not a dataset\n")
    good.drop(columns="y").to_csv(data / "nocol.csv", index=False)
    good.assign(y=good["y"].astype(object).where(good.index != 4, "abc")).to_csv(data / "text.csv", index=False)
    good.assign(y=good["y"].where(good.index != 2, np.nan)).to_csv(data / "nan.csv", index=False)
    good.assign(x=good["x"].where(good.index != 5, np.inf)).to_csv(data / "inf.csv", index=False)
    good.to_csv(data / "a..b.csv", index=False)
    good.to_csv(data / "ctl\x01x.csv", index=False)
    (project / "other").mkdir()
    good.to_csv(project / "other" / "d_001.csv", index=False)  # same id as data/d_001.csv
    config = write_config(project / "sweep.yaml", sweep_settings(session_cache, datasets=["data/*", "other/*.csv"]))
    monkeypatch.chdir(project)

    code = cli.main(["check", "--config", str(config)])
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    expected = {  # a line of the report -> what it must say
        "data/empty.csv": ["dataset 'empty'", "the file is empty"],
        "data/latin1.csv": ["dataset 'latin1'", "cannot read the file as CSV"],
        "data/notparquet.parquet": ["dataset 'notparquet'", "cannot read the file as Parquet"],
        "data/notes.txt": ["dataset 'notes'", "unsupported file type '.txt'"],
        "data/nocol.csv": ["column 'y'", "is missing", "available columns: 'group', 'x'"],
        "data/text.csv": ["column 'y'", "non-numeric values such as 'abc'"],
        "data/nan.csv": ["column 'y'", "missing (NaN) values", "first at row index 2"],
        "data/inf.csv": ["column 'x'", "infinite values", "first at row index 5"],
        "data/a..b.csv": ["unusable dataset id 'a..b'"],
        "data/ctl\x01x.csv": [repr("ctl\x01x")],
        "other/d_001.csv": ["dataset 'd_001'", "data/d_001.csv", "same dataset id"],
    }
    for file, fragments in expected.items():
        matching = [line for line in lines if file in line]
        assert len(matching) == 1, (file, out)
        assert all(f in matching[0] for f in fragments), (fragments, matching[0])
    assert f"check: {len(expected)} dataset problem(s), 0 sweep problem(s), 0 structure(s)" in out
    assert not any("'d_000'" in line or "'d_002'" in line for line in lines), out
    assert "reference dataset: d_000" in out
    assert not (project / "results").exists()


# --- 3. failure isolation through the real snakemake ----------------------------------------------


@pytest.mark.slow
def test_failing_datasets_never_sink_the_sweep_and_reruns_fit_only_what_is_pending(
    tmp_path: Path, session_cache: Path
) -> None:
    data = tmp_path / "data"
    simulate_datasets(HIERARCHICAL, data, 4, seed=3, prefix="d")
    bad_nan = table(2, 40, 4)
    bad_nan.loc[7, "y"] = np.nan
    bad_nan.to_csv(data / "c_nan.csv", index=False)  # ids sort first: the batch starts with failures
    table(3, 40, 4).rename(columns={"y": "outcome"}).to_csv(data / "c_nocol.csv", index=False)
    model = Path(shutil.copy(HIERARCHICAL, tmp_path / "model.py"))  # run 6 touches it
    config = write_config(tmp_path / "sweep.yaml", sweep_settings(session_cache, batch_size=3, model=str(model)))
    results = tmp_path / "results"
    good = [f"d_{i:03d}" for i in range(4)]

    # Run 1: the two bad datasets fail, every good one is fitted, collect still writes everything.
    run = snakemake(tmp_path, config)
    out = output_of(run)
    assert run.returncode != 0, out
    assert "\nbatchfit: 2 dataset(s) failed (c_nan, c_nocol); see results/failures.csv\n" in out, out
    assert sorted(p.stem for p in (results / "fits").glob("*.nc")) == good
    failures = pd.read_csv(results / "failures.csv")
    assert list(failures.columns[:5]) == ["dataset", "path", "stage", "error_type", "message"]
    failures = failures.set_index("dataset")
    assert sorted(failures.index) == ["c_nan", "c_nocol"]
    assert failures.loc["c_nan", "stage"] == "build" and failures.loc["c_nan", "error_type"] == "DatasetError"
    assert "column 'y'" in failures.loc["c_nan", "message"] and "NaN" in failures.loc["c_nan", "message"]
    assert "column 'y' is missing" in failures.loc["c_nocol", "message"]
    assert "'outcome'" in failures.loc["c_nocol", "message"]
    summary = pd.read_csv(results / "summary.csv")
    status = summary.groupby("dataset")["status"].agg(set).to_dict()
    assert status["c_nan"] == {"failed"} and status["c_nocol"] == {"failed"}
    assert all(status[d] <= {"ok", "warning"} for d in good)
    assert set(summary.loc[summary["dataset"] == "d_000", "parameter"]) >= {"mu_a", "b", "sigma"}
    with xr.open_datatree(results / "posteriors.nc", engine="h5netcdf") as tree:
        assert sorted(tree["posterior"]["dataset"].values) == good
    assert not (results / "status.ok").exists()
    fitted = mtimes(results / "fits")

    # Run 2: fix c_nan; it is fitted, c_nocol fails again, no good dataset is touched. On one
    # core, so the jobs after collect run one at a time: the report's still come before status fails.
    table(2, 40, 4).to_csv(data / "c_nan.csv", index=False)
    before = manifests(results)
    forest = sorted((results / "plots" / "forest").glob("*.png"))
    report_files = [results / "plots" / "health.png", *forest,
                    *(results / "report" / f"{page}.html" for page in ("health", "summary", "failures", "provenance"))]
    assert forest and all(path.is_file() for path in report_files), report_files  # run 1 (two cores) wrote them
    for path in report_files:
        path.unlink()
    run = snakemake(tmp_path, config, cores=1)
    assert run.returncode != 0
    assert "batchfit: 1 dataset(s) failed (c_nocol)" in output_of(run)
    assert all(path.is_file() for path in report_files), output_of(run)
    new = {k: v for k, v in manifests(results).items() if k not in before}
    assert [sorted(m["datasets"]) for m in new.values()] == [["c_nan", "c_nocol"]]
    statuses = {d: o["status"] for m in new.values() for d, o in m["datasets"].items()}
    assert statuses == {"c_nan": "ok", "c_nocol": "failed"}
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "c_nan.nc"} == fitted
    assert (results / "fits" / "c_nan.nc").is_file() and not (results / "failures" / "c_nan.json").exists()
    fitted = mtimes(results / "fits")

    # Run 3: fix the other one; only it is fitted, in a batch of its own, and the sweep succeeds.
    table(3, 40, 4).to_csv(data / "c_nocol.csv", index=False)
    before = manifests(results)
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    [(batch, manifest)] = [(k, v) for k, v in manifests(results).items() if k not in before]
    assert list(manifest["datasets"]) == ["c_nocol"]
    log = (results / "logs" / "fit" / f"{batch}.log").read_text()
    assert "c_nocol: ok" in log
    assert not any(d in log for d in ["c_nan", *good]), log
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "c_nocol.nc"} == fitted
    assert pd.read_csv(results / "failures.csv").empty
    assert (results / "status.ok").exists()
    fitted = mtimes(results / "fits")

    # Run 4: a new dataset added to the finished sweep is the only one fitted.
    table(4, 60, 5).to_csv(data / "d_004.csv", index=False)
    before = manifests(results)
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    new = [v for k, v in manifests(results).items() if k not in before]
    assert [list(m["datasets"]) for m in new] == [["d_004"]]
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "d_004.nc"} == fitted
    assert set(pd.read_csv(results / "summary.csv")["dataset"]) == {"c_nan", "c_nocol", *good, "d_004"}
    fitted = mtimes(results / "fits")

    # Run 5: a corrected data file of a fitted dataset makes only that dataset pending again.
    old = posterior_arrays(results / "fits" / "d_001.nc")
    table(5, 50, 4).to_csv(data / "d_001.csv", index=False)
    before = manifests(results)
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    new = [v for k, v in manifests(results).items() if k not in before]
    assert [list(m["datasets"]) for m in new] == [["d_001"]]
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "d_001.nc"} == {
        k: v for k, v in fitted.items() if k != "d_001.nc"}
    assert mtimes(results / "fits")["d_001.nc"] > fitted["d_001.nc"]
    assert not np.array_equal(posterior_arrays(results / "fits" / "d_001.nc")["b"], old["b"])

    # Run 6: the model and every data file touched but unchanged: pending is by content, so no
    # fit job, nothing re-fitted.
    before, fitted = manifests(results), mtimes(results / "fits")
    for path in [model, *data.glob("*.csv")]:
        os.utime(path)
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    assert "rule fit:" not in run.stdout and manifests(results) == before and mtimes(results / "fits") == fitted


# --- 4. nothing half-written when a job is killed --------------------------------------------------


def _descendants_in_group(pgid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every live process in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:
            found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def _assert_every_output_readable(results: Path) -> None:
    for path in results.rglob("*"):
        if not path.is_file() or path.name.startswith("."):
            continue  # temporary files of atomic writes are never read as outputs
        if path.suffix == ".nc":
            with xr.open_datatree(path, engine="h5netcdf") as tree:
                if path.parent.name == "fits":
                    assert tree["posterior"].to_dataset().load().sizes["draw"] == 100
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".csv":
            pd.read_csv(path)


def unreachable(seed: int) -> pd.DataFrame:
    """A dataset whose log density is infinite at every starting point (nutpie cannot initialise)."""
    frame = table(seed, 12, 3)
    frame["y"] = 1e300
    return frame


def test_a_batch_whose_every_dataset_fails_to_initialise_exits_cleanly(tmp_path: Path, session_cache: Path) -> None:
    """nutpie raises while its chain threads still run; the process used to die with SIGSEGV at exit."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        unreachable(i).to_csv(data / f"bad{i}.csv", index=False)
    config = write_config(tmp_path / "sweep.yaml", sweep_settings(session_cache, results_dir=str(tmp_path / "results"),
                                                                 datasets=[str(data / "*.csv")]))
    run = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "fit", "--config", str(config)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode >= 0, f"killed by signal {-run.returncode}\n{output_of(run)}"
    assert run.returncode in (0, 1), output_of(run)
    for i in range(2):
        record = json.loads((tmp_path / "results" / "failures" / f"bad{i}.json").read_text())
        assert record["stage"] == "sample" and "initialization points failed" in record["message"], record


@pytest.mark.slow
def test_sweep_with_batches_that_all_fail_to_initialise_finishes(tmp_path: Path, session_cache: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):  # ids sort first: two batches of two, every dataset failing
        unreachable(i).to_csv(data / f"a_bad{i}.csv", index=False)
    table(9, 40, 4).to_csv(data / "b_good.csv", index=False)
    config = write_config(tmp_path / "sweep.yaml", sweep_settings(session_cache, batch_size=2))
    run = snakemake(tmp_path, config)
    out = output_of(run)
    assert run.returncode != 0, out
    assert "SIGSEGV" not in out and "died" not in out, out
    assert "batchfit: 4 dataset(s) failed (a_bad0, a_bad1, a_bad2, a_bad3)" in out, out
    failures = pd.read_csv(tmp_path / "results" / "failures.csv").set_index("dataset")
    assert sorted(failures.index) == [f"a_bad{i}" for i in range(4)]
    assert set(failures["stage"]) == {"sample"}
    summary = pd.read_csv(tmp_path / "results" / "summary.csv")
    assert set(summary.loc[summary["status"] != "failed", "dataset"]) == {"b_good"}
    assert (tmp_path / "results" / "posteriors.nc").exists()


@pytest.mark.slow
def test_killed_fit_job_leaves_nothing_half_written_and_a_rerun_gives_the_same_posteriors(
    tmp_path: Path, session_cache: Path
) -> None:
    ids = [f"s_{i}" for i in range(6)]
    runs = {}
    for name in ("killed", "reference"):
        project = tmp_path / name
        for i, dataset_id in enumerate(ids):
            (project / "data").mkdir(parents=True, exist_ok=True)
            table(100 + i, 3000, 6).to_csv(project / "data" / f"{dataset_id}.csv", index=False)
        runs[name] = (project, write_config(project / "sweep.yaml", sweep_settings(session_cache, batch_size=6)))

    # The uninterrupted reference run, in the background meanwhile.
    ref_project, ref_config = runs["reference"]
    reference = subprocess.Popen(snakemake_command(ref_project, ref_config), cwd=ref_project, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)

    project, config = runs["killed"]
    fits = project / "results" / "fits"
    job = subprocess.Popen(snakemake_command(project, config), cwd=project, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any(fits.glob("s_*.nc")):
            assert job.poll() is None, "snakemake ended before writing a fit"
            assert time.monotonic() < deadline, "no fit written in time"
            time.sleep(0.02)
        # Aim for the moment the next fit is being written (its temporary file exists).
        deadline = time.monotonic() + 10
        while not any(fits.glob(".*.tmp*")) and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.001)
        fit_jobs = [pid for pid, argv in _descendants_in_group(job.pid)
                    if argv and "python" in Path(argv[0]).name and any(a.endswith(".fit.py") for a in argv)]
        assert fit_jobs, _descendants_in_group(job.pid)
        for pid in fit_jobs:
            os.kill(pid, signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)  # and the whole job, as a cluster kill would
    finally:
        job.wait(timeout=60)
    written = sorted(p.stem for p in fits.glob("s_*.nc"))
    print("killed after", written, "leaving", sorted(p.name for p in fits.glob(".*")))
    assert 1 <= len(written) < len(ids), f"not killed in the middle of the batch: {written}"
    assert not (project / "results" / "batches").exists() or not any((project / "results" / "batches").iterdir())
    _assert_every_output_readable(project / "results")

    # Re-run (Snakemake's lock is stale after the kill): completes, fits only what is missing.
    snakemake(project, config, "--unlock")
    run = snakemake(project, config, "--rerun-incomplete")
    assert run.returncode == 0, output_of(run)
    [manifest] = manifests(project / "results").values()
    assert sorted(manifest["datasets"]) == [d for d in ids if d not in written]
    _assert_every_output_readable(project / "results")
    assert not list(fits.glob(".*.tmp*")), "the re-run removes what the killed job left half-written"

    out, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, out
    for dataset_id in ids:
        resumed = posterior_arrays(fits / f"{dataset_id}.nc")
        uninterrupted = posterior_arrays(ref_project / "results" / "fits" / f"{dataset_id}.nc")
        assert resumed.keys() == uninterrupted.keys()
        for name in resumed:
            assert np.array_equal(resumed[name], uninterrupted[name]), (dataset_id, name)


# --- 5. sampling health ---------------------------------------------------------------------------


def test_a_badly_sampling_dataset_is_a_warning_with_its_diagnostics(tmp_path: Path, session_cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfit.sweep.stages import run_collect, run_fit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for i in range(3):
        table(20 + i, 400, 8).to_csv(tmp_path / "data" / f"good_{i}.csv", index=False)
    table(99, 3, 3).to_csv(tmp_path / "data" / "tiny.csv", index=False)  # one row per group: a funnel
    thresholds = {"max_r_hat": 1.06, "min_ess_bulk": 150, "max_divergences": 0}
    config = config_from_dict(sweep_settings(session_cache, health=thresholds,
                                             sampler={"draws": 200, "tune": 200, "chains": 2, "seed": 3}))
    assert run_fit(config) == 0
    report = run_collect(config)
    assert (report.n_ok, report.n_warning, report.n_failed) == (3, 1, 0)
    assert report.warning_ids == ["tiny"]

    summary = pd.read_csv(config.layout.summary)
    health = summary.groupby("dataset")[["divergences", "max_r_hat", "min_ess_bulk", "status"]].agg(
        lambda column: column.drop_duplicates().item())
    assert health.notna().all().all(), health
    for dataset_id, row in health.iterrows():
        crossed = (row["divergences"] > thresholds["max_divergences"] or row["max_r_hat"] > thresholds["max_r_hat"]
                   or row["min_ess_bulk"] < thresholds["min_ess_bulk"])
        assert row["status"] == ("warning" if crossed else "ok"), (dataset_id, row)
    assert health.loc["tiny", "status"] == "warning"
    assert set(health.drop(index="tiny")["status"]) == {"ok"}
    per_parameter = summary[summary["dataset"] == "tiny"]
    assert math.isclose(health.loc["tiny", "max_r_hat"], per_parameter["r_hat"].max())
    assert math.isclose(health.loc["tiny", "min_ess_bulk"], per_parameter["ess_bulk"].min())


# --- 6. fuzzing: only batchfit's own errors, naming the dataset ------------------------------------

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


_yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
_yaml_values = st.recursive(
    _yaml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()),
                                               children, max_size=3)),
    max_leaves=8,
)
_KEYS = ["model", "datasets", "sampler", "sampler.draws", "sampler.tune", "sampler.chains", "sampler.seed",
         "sampler.target_accept", "batch_size", "cache_dir", "results_dir", "on_error", "outputs",
         "outputs.log_likelihood", "health", "health.max_r_hat", "health.min_ess_bulk", "max_structures",
         "cache", "cache.lock_timeout", "cache.trust_shared"]


@settings(max_examples=60, deadline=None)
@given(changes=st.lists(st.tuples(st.one_of(st.sampled_from(_KEYS), st.text(max_size=6)), _yaml_values), max_size=3),
       top=st.one_of(st.none(), _yaml_values))
def test_fuzzed_configs_give_config_errors_or_a_config(changes, top) -> None:
    data: object = {"model": "m.py", "datasets": ["d/*.csv"]}
    for key, value in changes:
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part), dict) or part not in node else {}
        node[last] = value
    if top is not None and not changes:
        data = top
    try:
        config = config_from_dict(data, source="fuzz.yaml")
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("config error (") and "in fuzz.yaml" in message
        assert "\n" not in message.replace(exc.key or "", "")  # one line, but for a key with a newline
        return
    assert isinstance(config, Config)
    assert config.sampler.draws >= 1 and config.model == Path("m.py")
    assert config.batch_size == "auto" or config.batch_size >= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=120),
                     st.builds(yaml.safe_dump, _yaml_values)))
def test_fuzzed_config_files_give_config_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:  # never a valid config: no model file exists here
        load_config(path)
    assert str(path) in str(info.value)


# --- 7. cache trust -------------------------------------------------------------------------------


def untrusted(path: Path) -> Path:
    """A directory owned by another user that everyone can write to."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.chown(path, OTHER_UID, -1)
    except PermissionError:
        pytest.skip("making a directory owned by another user needs root")
    path.chmod(0o777)
    return path


@pytest.mark.parametrize("command", [["check"], ["compile"], ["run"], ["cache", "info"]])
def test_untrusted_cache_is_refused_by_the_cli(project: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture, command: list[str]) -> None:
    shared = untrusted(project / "shared-cache")
    config = write_config(project / "sweep.yaml", sweep_settings(shared))
    monkeypatch.chdir(project)
    code = cli.main([*command, "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cache directory {shared}" in err and "writable by other users" in err
    assert f"owned by uid {OTHER_UID}" in err and "trust_shared: true" in err
    assert list(shared.iterdir()) == []  # refused before anything was written into it
    assert not (project / "results").exists()


def test_trust_shared_overrides_the_refusal(project: Path) -> None:
    shared = untrusted(project / "shared-cache")
    config = sweep_settings(shared, cache={"trust_shared": True})
    path = write_config(project / "sweep.yaml", config)
    env = {k: v for k, v in os.environ.items() if k != "PYTENSOR_FLAGS"}  # a separate process: its own cache
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "cache", "info", "--config", str(path)],
                         cwd=project, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, output_of(run)
    assert (shared / "batchfit" / "entries").is_dir()
    refused = write_config(project / "refused.yaml", sweep_settings(shared))
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "cache", "info", "--config", str(refused)],
                         cwd=project, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2 and "trust_shared" in run.stderr


@pytest.mark.slow
def test_untrusted_cache_stops_the_pipeline_and_trust_shared_lets_it_run(project: Path, session_cache: Path) -> None:
    shared = project / "shared-cache"
    shutil.copytree(session_cache, shared, symlinks=True)  # the session's entries: no cold compile
    untrusted(shared)
    config = write_config(project / "sweep.yaml", sweep_settings(shared))
    run = snakemake(project, config)
    assert run.returncode != 0
    logs = "\n".join(p.read_text() for p in (project / "results" / "logs").rglob("*.log"))
    assert f"cache directory {shared} is writable by other users" in logs and "trust_shared: true" in logs, logs
    assert not list((project / "results").glob("fits/*.nc")) and not (project / "results" / "summary.csv").exists()

    config = write_config(project / "sweep.yaml", sweep_settings(shared, cache={"trust_shared": True}))
    run = snakemake(project, config)
    assert run.returncode == 0, output_of(run)
    assert sorted(p.stem for p in (project / "results" / "fits").glob("*.nc")) == ["d_000", "d_001", "d_002"]
