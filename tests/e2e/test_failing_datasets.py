"""A dataset that fails never sinks the sweep: through the real Snakemake it is recorded (failures.csv,
summary.csv, the report) while every other dataset is fitted, and a re-run fits only what is pending;
a batch in which every dataset fails to initialise ends cleanly.

The Snakemake tests run the real ``snakemake`` on the repository's Snakefile (tests/testkit/) with
``--directory`` set to a temporary project, and share the session's compile cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import (
    HIERARCHICAL,
    manifests,
    mtimes,
    output_of,
    posterior_arrays,
    snakemake,
    sweep_settings,
    table,
    write_config,
)

from batchfit.model.simulate import simulate_datasets


def rerun(project: Path, config: Path, cores: int = 2) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """The sweep in ``project`` run again: the run, and the manifests of the batches it added, by batch."""
    before = manifests(project / "results")
    run = snakemake(project, config, cores=cores)
    return run, {k: v for k, v in manifests(project / "results").items() if k not in before}


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
    assert "\nbatchfit: 2 of 6 dataset(s) failed (4 fitted: " in out and "), for 2 reason(s):" in out, out
    assert "\n  1 dataset (c_nan): missing (NaN) values in column 'y'" in out, out
    assert "\n  1 dataset (c_nocol): column 'y' is missing; available columns: 'group', 'x', 'outcome'\n" in out, out
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
    status = pd.read_csv(results / "datasets.csv").set_index("dataset")["status"].to_dict()
    assert status["c_nan"] == "failed" and status["c_nocol"] == "failed"
    assert all(status[d] in {"ok", "warning"} for d in good)
    assert set(summary.loc[summary["dataset"] == "d_000", "parameter"]) >= {"mu_a", "b", "sigma"}
    with xr.open_datatree(results / "posteriors.nc", engine="h5netcdf") as tree:
        assert sorted(tree["posterior"]["dataset"].values) == good
    assert not (results / "status.txt").exists()  # reported, so that the next run checks again
    fitted = mtimes(results / "fits")

    # Run 2: fix c_nan; it is fitted, c_nocol fails again, no good dataset is touched. On one
    # core, so the jobs after collect run one at a time: the report's are written all the same.
    table(2, 40, 4).to_csv(data / "c_nan.csv", index=False)
    forest = sorted((results / "plots" / "forest").glob("*.png"))
    report_files = [results / "plots" / "health.png", *forest,
                    *(results / "report" / f"{page}.html" for page in ("health", "summary", "failures", "provenance"))]
    assert forest and all(path.is_file() for path in report_files), report_files  # run 1 (two cores) wrote them
    for path in report_files:
        path.unlink()
    run, new = rerun(tmp_path, config, cores=1)
    assert run.returncode != 0
    assert "batchfit: 1 of 6 dataset(s) failed" in output_of(run) and "1 dataset (c_nocol)" in output_of(run)
    assert all(path.is_file() for path in report_files), output_of(run)
    assert [sorted(m["datasets"]) for m in new.values()] == [["c_nan", "c_nocol"]]
    statuses = {d: o["status"] for m in new.values() for d, o in m["datasets"].items()}
    assert statuses == {"c_nan": "ok", "c_nocol": "failed"}
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "c_nan.nc"} == fitted
    assert (results / "fits" / "c_nan.nc").is_file() and not (results / "failures" / "c_nan.json").exists()
    fitted = mtimes(results / "fits")

    # Run 3: fix the other one; only it is fitted, in a batch of its own, and the sweep succeeds.
    table(3, 40, 4).to_csv(data / "c_nocol.csv", index=False)
    run, new = rerun(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    [(batch, manifest)] = new.items()
    assert list(manifest["datasets"]) == ["c_nocol"]
    log = (results / "logs" / "fit" / f"{batch}.log").read_text()
    assert "c_nocol: fitted in " in log
    assert not any(d in log for d in ["c_nan", *good]), log
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "c_nocol.nc"} == fitted
    assert pd.read_csv(results / "failures.csv").empty
    assert (results / "status.txt").read_text().startswith("ok: ")
    fitted = mtimes(results / "fits")

    # Run 4: a new dataset added to the finished sweep is the only one fitted.
    table(4, 60, 5).to_csv(data / "d_004.csv", index=False)
    run, new = rerun(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    assert [list(m["datasets"]) for m in new.values()] == [["d_004"]]
    assert {k: v for k, v in mtimes(results / "fits").items() if k != "d_004.nc"} == fitted
    assert set(pd.read_csv(results / "datasets.csv")["dataset"]) == {"c_nan", "c_nocol", *good, "d_004"}
    fitted = mtimes(results / "fits")

    # Run 5: a corrected data file of a fitted dataset makes only that dataset pending again.
    old = posterior_arrays(results / "fits" / "d_001.nc")
    table(5, 50, 4).to_csv(data / "d_001.csv", index=False)
    run, new = rerun(tmp_path, config)
    assert run.returncode == 0, output_of(run)
    assert [list(m["datasets"]) for m in new.values()] == [["d_001"]]
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
    assert "fit batch-" not in run.stdout and manifests(results) == before and mtimes(results / "fits") == fitted


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
    assert "batchfit: 4 of 5 dataset(s) failed" in out, out
    assert "  4 datasets (a_bad0, a_bad1, a_bad2, … 1 more): " in out, out  # one line: one reason
    failures = pd.read_csv(tmp_path / "results" / "failures.csv").set_index("dataset")
    assert sorted(failures.index) == [f"a_bad{i}" for i in range(4)]
    assert set(failures["stage"]) == {"sample"}
    datasets = pd.read_csv(tmp_path / "results" / "datasets.csv")
    assert set(datasets.loc[datasets["status"] != "failed", "dataset"]) == {"b_good"}
    assert (tmp_path / "results" / "posteriors.nc").exists()
