"""End to end: the real snakemake on a tiny sweep, every output opened; the CLI gives the same fits."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from testkit import HIERARCHICAL, mtimes, planned_jobs, snakemake, write_config, write_sweep

from batchfit.model.simulate import simulate_datasets


@pytest.mark.slow
def test_snakemake_sweep_writes_every_output_and_refits_only_new_datasets(tmp_path, session_cache):
    config = write_sweep(tmp_path, session_cache, 3)
    proc = snakemake(tmp_path, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = tmp_path / "results"

    ids = ["shop_000", "shop_001", "shop_002"]
    for dataset_id in ids:
        tree = xr.open_datatree(results / "fits" / f"{dataset_id}.nc")
        assert {"posterior", "sample_stats", "observed_data", "constant_data"} <= set(tree.children)
        assert tree.attrs["dataset"] == dataset_id
        assert tree["posterior"].ds.sizes["draw"] == 100
        labels = pd.read_csv(tmp_path / "data" / f"{dataset_id}.csv")["group"].unique()
        assert sorted(tree["posterior"].ds["groups"].values) == sorted(labels)
    with xr.open_datatree(results / "posteriors.nc") as combined:
        assert set(combined["posterior"]["dataset"].values) == set(ids)
    summary = pd.read_csv(results / "summary.csv")
    assert set(summary["dataset"]) == set(ids)
    assert {"mean", "sd", "eti89_lb", "eti89_ub", "mcse_mean", "r_hat", "ess_bulk", "ess_tail"} <= set(summary)
    assert set(pd.read_csv(results / "datasets.csv")["status"]) <= {"ok", "warning"}
    assert pd.read_csv(results / "failures.csv").empty
    assert (results / "status.txt").read_text().startswith("ok: ")
    logs = sorted((results / "logs" / "fit").glob("*.log"))
    assert len(logs) == 2  # 3 datasets in batches of 2
    assert all("cache hit" in log.read_text() for log in logs)

    before = mtimes(results / "fits")
    simulate_datasets(HIERARCHICAL, tmp_path / "extra", 4, seed=8, prefix="shop")
    (tmp_path / "extra" / "shop_003.csv").rename(tmp_path / "data" / "shop_003.csv")
    proc = snakemake(tmp_path, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = mtimes(results / "fits")
    assert {k: after[k] for k in before} == before  # nothing refitted
    assert "shop_003.nc" in after
    with xr.open_datatree(results / "posteriors.nc") as combined:
        assert combined["posterior"].sizes["dataset"] == 4
    assert "summarised 1 of 4 fits" in (results / "logs" / "collect.log").read_text()  # only the new one

    # Another config file for the same model (here a renamed copy) reuses the compile stamp:
    # Snakemake plans fits for its own results_dir, but no compile job.
    renamed = write_config(tmp_path / "renamed.yaml",
                           yaml.safe_load(config.read_text()) | {"results_dir": "renamed-results"})
    dry = snakemake(tmp_path, renamed, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    planned = planned_jobs(dry)
    assert planned.get("fit") == 2 and "compile" not in planned, planned

    # The command line runs the same library functions: the same draws, bit for bit.
    write_config(tmp_path / "cli.yaml", yaml.safe_load(config.read_text()) | {"results_dir": "cli-results"})
    proc = subprocess.run([sys.executable, "-m", "batchfit.cli", "run", "--config", "cli.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for dataset_id in ids:
        a = xr.open_datatree(results / "fits" / f"{dataset_id}.nc")["posterior"].ds
        b = xr.open_datatree(tmp_path / "cli-results" / "fits" / f"{dataset_id}.nc")["posterior"].ds
        for name in a.data_vars:
            np.testing.assert_array_equal(a[name].values, b[name].values)


def test_finishing_a_batch_never_changes_another(tmp_path):
    """Cluster executors re-plan inside each job: a batch must keep its name and members."""
    from batchfit.config import config_from_dict
    from batchfit.fitting.fit_register import touching
    from batchfit.fitting.provenance import expected_provenance, record
    from batchfit.sweep.plan import plan

    simulate_datasets(HIERARCHICAL, tmp_path / "data", 7, prefix="shop")
    config = config_from_dict({"model": str(HIERARCHICAL),
                               "datasets": [str(tmp_path / "data" / "*.csv")], "batch_size": 3,
                               "results_dir": str(tmp_path / "results")})
    first = plan(config).batches
    assert [len(members) for members in first.values()] == [3, 3, 1]
    done_name, done = next(iter(first.items()))
    touching(config.layout, done_name, done)  # as a fit job lists its batch before writing its fits
    for dataset_id in done:  # a stand-in fit, recorded with the provenance a real fit would have
        config.layout.fit(dataset_id).parent.mkdir(parents=True, exist_ok=True)
        config.layout.fit(dataset_id).write_bytes(b"")
        record(config, dataset_id, expected_provenance(config, dataset_id))
    second = plan(config).batches
    assert second == {name: members for name, members in first.items() if name != done_name}


@pytest.mark.parametrize(("batch_size", "cores"), [("auto", 2), ("auto", 16), ("auto", None), (3, 2), (3, None)])
def test_batches_cover_every_dataset_once_and_auto_sizes_them_for_the_executor(tmp_path, batch_size, cores):
    """`batch_size: auto`: on one machine at most one batch per core, each of several datasets; on a
    cluster (cores None) batches of at least 20; an explicit size wins. Planned twice, the same."""
    from batchfit.config import config_from_dict
    from batchfit.sweep.plan import plan

    simulate_datasets(HIERARCHICAL, tmp_path / "data", 45, prefix="shop")
    config = config_from_dict({"model": str(HIERARCHICAL),
                               "datasets": [str(tmp_path / "data" / "*.csv")], "batch_size": batch_size,
                               "results_dir": str(tmp_path / "results")})
    batches = plan(config, cores).batches
    assert [d for members in batches.values() for d in members] == [f"shop_{i:03d}" for i in range(45)]
    sizes = [len(members) for members in batches.values()]
    if batch_size != "auto":
        assert sizes[:-1] == [batch_size] * (len(sizes) - 1)
    elif cores is None:
        assert min(sizes[:-1]) >= 20 and len(sizes) > 1
    else:
        assert len(sizes) <= cores and min(sizes[:-1]) >= 4
        assert len(sizes) == cores or 45 < 4 * cores  # every core gets a batch when there are enough
    assert plan(config, cores).batches == batches
