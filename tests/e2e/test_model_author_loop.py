"""A sweep as issue #45's new user ran it, through the real Snakemake: a file name with a space, datasets
too small, datasets whose model code fails in a helper module beside the model, outputs of a dataset that
left the sweep. Nothing stops the sweep; the run ends with batchfit's verdict, not a Snakemake traceback;
datasets.csv has a row per dataset; each failure keeps the model's own lines.

The references: the user's own traceback (calling their helper), ArviZ on the fits, the data files.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import arviz_stats
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import HIERARCHICAL, output_of, planned_jobs, snakemake, sweep_settings, table, write_config

import batchfit
from batchfit.model.simulate import simulate_datasets
from batchfit.outputs.health import DATASET_COLUMNS

HELPER = '''import numpy as np


def enough_rows(y):
    """The user's own check, in a module beside the model."""
    if np.size(y) < 3:
        raise ValueError(f"need at least 3 rows, got {np.size(y)}")
'''


def project_with_problems(root: Path, cache: Path) -> Path:
    """The hierarchical model calling a helper beside it; good datasets, one named with a space, one with
    4 rows (fitted, below health.min_rows), two with 2 rows (the helper raises); the config."""
    simulate_datasets(HIERARCHICAL, root / "data", 3, seed=5, prefix="d")
    table(8, 40, 4).to_csv(root / "data" / "d 003.csv", index=False)
    table(9, 4, 2).to_csv(root / "data" / "c_small.csv", index=False)
    for name in ("e_one", "e_two"):
        table(10, 2, 1).to_csv(root / "data" / f"{name}.csv", index=False)
    (root / "rowcheck.py").write_text(HELPER)
    model = re.sub(r"(?m)^def build_model\(data.*\):\n",
                   lambda m: f"from rowcheck import enough_rows\n\n\n{m.group(0)}    enough_rows(data['y'])\n",
                   HIERARCHICAL.read_text(), count=1)
    assert "enough_rows(data['y'])" in model
    (root / "model.py").write_text(model)
    return write_config(root / "sweep.yaml", sweep_settings(cache, model="model.py", batch_size=4,
                                                            health={"min_rows": 10}))


def helper_frame(root: Path) -> tuple[str, traceback.FrameSummary]:
    """The user's own error of their helper for 2 rows, and its frame: what they would see themselves."""
    spec = importlib.util.spec_from_file_location("rowcheck_45", root / "rowcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.enough_rows(np.zeros(2))
    except ValueError as exc:
        return f"ValueError: {exc}", traceback.extract_tb(exc.__traceback__)[-1]
    raise AssertionError("the helper accepted 2 rows")


@pytest.mark.slow
def test_a_sweep_with_bad_names_small_and_failing_datasets_runs_and_ends_with_batchfits_verdict(
        tmp_path: Path, hierarchical_entry: Path) -> None:
    config = project_with_problems(tmp_path, hierarchical_entry)
    results = tmp_path / "results"
    for path in (results / "fits" / "gone.nc", results / "fits" / "gone.json", results / "failures" / "old.json"):
        path.parent.mkdir(parents=True, exist_ok=True)  # outputs of datasets no longer in the sweep
        path.write_text("left by an earlier sweep")
    error, frame = helper_frame(tmp_path)

    run = snakemake(tmp_path, config)
    out = output_of(run)

    # 5: the run exits non-zero, and its last lines are batchfit's: counts, one line per reason, where to look
    assert run.returncode == 1, out
    last = run.stderr.rstrip().splitlines()[-3:]
    datasets = pd.read_csv(tmp_path / "results" / "datasets.csv")
    n_ok, n_warning = ((datasets["status"] == status).sum() for status in ("ok", "warning"))
    assert last[0].startswith(f"batchfit: 2 of 7 dataset(s) failed (5 fitted: {n_ok} ok, {n_warning} warning") \
        and last[0].endswith("), for 1 reason(s):"), last
    assert last[1] == f"  2 datasets (e_one, e_two): {error} at rowcheck.py:{frame.lineno}", last
    assert "results/failures.csv" in last[2] and "batchfit status --config" in last[2], last
    for crash in ("Error in rule", "CalledProcessError", "RuleException", "WorkflowError", "Traceback"):
        assert crash not in out, (crash, out)

    # 4: the file with a space got a safe id and was fitted; its path is recorded
    datasets = pd.read_csv(results / "datasets.csv", keep_default_na=False, na_values=[""],
                           dtype={"seed": "Int64"}).set_index("dataset")
    assert sorted(datasets.index) == ["c_small", "d_000", "d_001", "d_002", "d_003", "e_one", "e_two"]
    assert datasets.loc["d_003", "path"] == "data/d 003.csv" and (results / "fits" / "d_003.nc").is_file()

    # 6: datasets.csv, a row per dataset, against the data files and ArviZ on the fits
    assert list(datasets.reset_index().columns) == DATASET_COLUMNS
    for dataset_id, row in datasets.iterrows():
        frame_rows = pd.read_csv(tmp_path / row["path"])
        assert row["rows"] == len(frame_rows)
        assert row["groups"] == f"group={frame_rows['group'].nunique()}"
        if row["status"] == "failed":
            continue
        with xr.open_datatree(results / "fits" / f"{dataset_id}.nc") as fit:
            assert row["seed"] == int(fit.attrs["seed"]) and row["structure"] == fit.attrs["structure"][:12]
            assert row["sampler_path"] == fit.attrs["sampler_path"] == "cached"
            posterior = fit["posterior"].to_dataset()[["mu_a", "sigma_a", "a", "b", "sigma"]]
            assert row["divergences"] == int(fit["sample_stats"]["diverging"].sum())
            np.testing.assert_allclose(row["max_r_hat"], float(arviz_stats.rhat(posterior).to_array().max()))
            np.testing.assert_allclose(row["min_ess_bulk"], float(arviz_stats.ess(posterior).to_array().min()))
        assert row["wall_seconds"] > 0
    assert datasets.loc["c_small", "status"] == "warning"
    assert "4 rows < 10 (health.min_rows)" in datasets.loc["c_small", "message"]
    assert datasets.loc["e_one", "stage"] == "build"
    summary = pd.read_csv(results / "summary.csv")
    assert list(summary.columns[:3]) == ["dataset", "parameter", "mean"] and "status" not in summary.columns
    assert summary["parameter"].notna().all() and summary.groupby("dataset").size().min() > 1
    assert set(summary["dataset"]) == set(datasets.index[datasets["status"] != "failed"])
    with batchfit.open_results(results) as opened:  # its integers nullable, as a failed dataset has none
        pd.testing.assert_frame_equal(opened.datasets.set_index("dataset"), datasets, check_dtype=False)
        assert opened.datasets["seed"].dtype == "Int64"

    # 1: the failure keeps the model's own frames (model.py's and its helper's), the log the full traceback
    failures = pd.read_csv(results / "failures.csv").set_index("dataset")
    record = failures.loc["e_one"]
    assert record["reason"] == f"{error} at rowcheck.py:{frame.lineno}"
    assert f'File "{frame.filename}", line {frame.lineno}, in enough_rows\n    {frame.line}' in record["traceback"]
    assert f'File "{tmp_path / "model.py"}", line ' in record["traceback"] and "/batchfit/" not in record["traceback"]
    logs = "".join(p.read_text() for p in (results / "logs" / "fit").glob("*.log"))
    assert "Traceback (most recent call last)" in logs and "batchfit/model/model_file.py" in logs

    # 2: batchfit status groups the failures alike
    status = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "status", "--config", str(config)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert f"  2 datasets (e_one, e_two): at build: {error} at rowcheck.py:{frame.lineno}" in status.stdout.splitlines()
    one = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "status", "--config", str(config),
                          "--dataset", "c_small"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "c_small: fitted (warning; 4 rows, group=2; 4 rows < 10 (health.min_rows)" in one.stdout, one.stdout

    # 8: a fit job's header names its batch and dataset count, not its data files; orphans are moved away
    assert "data/d_000.csv" not in out and "data/e_one.csv" not in out
    assert sum("dataset(s); log results/logs/fit/batch-" in line for line in out.splitlines()) == 2, out
    assert not (results / "fits" / "gone.nc").exists() and not (results / "failures" / "old.json").exists()
    assert (results / "orphaned" / "fits" / "gone.nc").read_text() == "left by an earlier sweep"
    assert (results / "orphaned" / "fits" / "gone.json").is_file()
    assert (results / "orphaned" / "failures" / "old.json").is_file()

    # 5: run again unchanged: the verdict is reported again (non-zero), without any fit job
    again = snakemake(tmp_path, config)
    assert again.returncode == 1 and again.stderr.rstrip().splitlines()[-2] == last[1], output_of(again)
    assert "rule fit" not in again.stdout + again.stderr


def test_a_dry_run_neither_reads_the_datasets_for_sbc_nor_stops_at_an_unusable_name(
        tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's first sweep stopped at parse time in rules/sbc.smk, for a file name with a space,
    although no SBC was asked for. A dry run plans the fits of every file, SBC's settings unread."""
    simulate_datasets(HIERARCHICAL, tmp_path / "data", 2, seed=5, prefix="d")
    shutil.copy(tmp_path / "data" / "d_000.csv", tmp_path / "data" / "Côte d'Ivoire.csv")
    config = write_config(tmp_path / "sweep.yaml", sweep_settings(session_cache, sbc={"template": "no-such-dataset"}))
    run = snakemake(tmp_path, config, "-n")
    assert run.returncode == 0, output_of(run)
    assert planned_jobs(run)["fit"] == 1 and "fit batch-" in output_of(run)
    monkeypatch.chdir(tmp_path)
    renamed = batchfit.load_dataset("sweep.yaml", "C_te_d_Ivoire")  # the safe id `batchfit check` names
    assert renamed.path == Path("data/Côte d'Ivoire.csv")
