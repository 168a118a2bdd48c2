"""Sampling health: a dataset that samples badly is a warning, with its diagnostics, not a failure."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import arviz_stats as azs
import pandas as pd
import pytest
import xarray as xr
from testkit import SNAKEMAKE, output_of, snakemake, sweep_settings, table, write_config

from batchfit.config import config_from_dict, load_config
from batchfit.outputs.health import DIAGNOSTICS
from batchfit.sweep.verdict import end_of_run


def test_a_badly_sampling_dataset_is_a_warning_with_its_diagnostics(tmp_path: Path, session_cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfit.sweep.collect_job import run_collect
    from batchfit.sweep.stages import run_fit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for i in range(3):
        table(20 + i, 400, 8).to_csv(tmp_path / "data" / f"good_{i}.csv", index=False)
    table(99, 3, 3).to_csv(tmp_path / "data" / "tiny.csv", index=False)  # one row per group: a funnel
    thresholds = {"max_r_hat": 1.06, "min_ess_bulk": 150, "min_ess_tail": 100, "max_divergences": 0,
                  "max_treedepth_fraction": 0.0, "min_bfmi": 0.3}
    config = config_from_dict(sweep_settings(session_cache, health=thresholds,
                                             sampler={"draws": 200, "tune": 200, "chains": 2, "seed": 3}))
    assert run_fit(config) == 0
    report = run_collect(config)
    assert (report.n_ok, report.n_warning, report.n_failed) == (3, 1, 0)
    assert report.warning_ids == ["tiny"]

    summary = pd.read_csv(config.layout.summary)
    health = pd.read_csv(config.layout.datasets_csv).set_index("dataset")[[*DIAGNOSTICS, "status"]]
    assert health.notna().all().all(), health
    for dataset_id, row in health.iterrows():
        crossed = (row["divergences"] > thresholds["max_divergences"] or row["max_r_hat"] > thresholds["max_r_hat"]
                   or row["min_ess_bulk"] < thresholds["min_ess_bulk"]
                   or row["min_ess_tail"] < thresholds["min_ess_tail"]
                   or row["max_treedepth_fraction"] > thresholds["max_treedepth_fraction"]
                   or row["min_bfmi"] < thresholds["min_bfmi"])
        assert row["status"] == ("warning" if crossed else "ok"), (dataset_id, row)
        # the sampler's diagnostics, as ArviZ computes them from the fit's sample_stats
        with xr.open_datatree(config.layout.fit(dataset_id)) as tree:
            assert math.isclose(row["min_bfmi"], float(azs.bfmi(tree)["energy"].min()), rel_tol=1e-12)
            reached = tree["sample_stats"]["maxdepth_reached"]
            assert math.isclose(row["max_treedepth_fraction"], float(reached.mean()))
            assert reached.sizes == {"chain": 2, "draw": 200}  # the kept draws only
    assert health.loc["tiny", "status"] == "warning"
    assert set(health.drop(index="tiny")["status"]) == {"ok"}
    per_parameter = summary[summary["dataset"] == "tiny"]
    assert math.isclose(health.loc["tiny", "max_r_hat"], per_parameter["r_hat"].max())
    assert math.isclose(health.loc["tiny", "min_ess_bulk"], per_parameter["ess_bulk"].min())
    assert math.isclose(health.loc["tiny", "min_ess_tail"], per_parameter["ess_tail"].min())


# Only the thresholds a fit job can score itself (divergences and rows) can make a warning here, so what
# the fit log says of a dataset is all of datasets.csv's reasons for it.
JOB_THRESHOLDS = {"max_r_hat": 100.0, "min_ess_bulk": 0, "min_ess_tail": 0, "max_divergences": 0,
                  "max_treedepth_fraction": 1.0, "min_bfmi": 0.0, "min_rows": 10}


@pytest.mark.slow
def test_the_verdict_status_and_fit_log_state_the_warnings_datasets_csv_has(
        tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep with warnings: the run ends with its verdict (``N fitted: A ok, B warning (...)``), printed
    last although nothing failed; status.txt and ``batchfit status`` say the same; the fit log calls no
    dataset ``ok``, and its sampler warnings are datasets.csv's reasons, each checked against the fit
    file (divergences) and the data file (rows)."""
    (tmp_path / "data").mkdir()
    for i in range(3):
        table(30 + i, 60, 4).to_csv(tmp_path / "data" / f"good_{i}.csv", index=False)
    table(98, 8, 4).to_csv(tmp_path / "data" / "short.csv", index=False)  # fewer rows than health.min_rows
    table(99, 3, 3).to_csv(tmp_path / "data" / "tiny.csv", index=False)  # one row per group: a funnel, divergent
    config = write_config(tmp_path / "config.yaml", sweep_settings(
        session_cache, health=JOB_THRESHOLDS, sampler={"draws": 150, "tune": 150, "chains": 2, "seed": 5}))
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)[-3000:]

    results = tmp_path / "results"
    datasets = pd.read_csv(results / "datasets.csv", keep_default_na=False).set_index("dataset")
    expected = {}  # dataset -> its reasons, from the data file and the fit file
    for dataset_id in datasets.index:
        rows = len(pd.read_csv(tmp_path / "data" / f"{dataset_id}.csv"))
        with xr.open_datatree(results / "fits" / f"{dataset_id}.nc") as tree:
            divergences = int(tree["sample_stats"]["diverging"].sum())
        expected[dataset_id] = ([f"{rows} rows < 10 (health.min_rows)"] if rows < 10 else []) + (
            [f"{divergences} divergences > 0"] if divergences else [])
    assert {d: row["message"] for d, row in datasets.iterrows()} == {d: "; ".join(r) for d, r in expected.items()}
    assert expected["short"] and any("divergences" in reason for reason in expected["tiny"]), expected

    # the fit log: "fitted", never "ok", with the reasons datasets.csv gives
    logged = {}
    for log in (results / "logs" / "fit").glob("*.log"):
        for line in log.read_text().splitlines():
            found = re.search(r"INFO (\w+): (\w+) in [\d.]+ s(?:, sampler warning: (.+))?$", line)
            if found:
                logged[found[1]] = (found[2], found[3] or "")
    assert logged == {d: ("fitted", "; ".join(r)) for d, r in expected.items()}, logged

    # the verdict: its last line, status.txt's and batchfit status's counts
    warned = {d for d, r in expected.items() if r}
    crossed = {"rows < 10": sum(any("rows" in r for r in expected[d]) for d in warned),
               "divergences > 0": sum(any("divergences" in r for r in expected[d]) for d in warned)}
    counts = f"5 fitted: {5 - len(warned)} ok, {len(warned)} warning ("
    last = run.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"batchfit: {counts}") and last.endswith("; each dataset's health: results/datasets.csv")
    assert sorted(last.split(" (", 1)[1].split(")")[0].split(", ")) == sorted(f"{n} {t}" for t, n in crossed.items())
    assert (results / "status.txt").read_text() == f"ok: {last}\n"
    status = subprocess.run([str(SNAKEMAKE.with_name("batchfit")), "status", "--config", "config.yaml"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert status.stdout.splitlines()[:2] == ["5 dataset(s): 5 fitted, 0 pending, 0 failed",
                                              f"{last.removeprefix('batchfit: ').split(';')[0]} "
                                              "(results/datasets.csv)"], status.stdout

    # an earlier run's verdict is not this run's: printed only once written anew
    monkeypatch.chdir(tmp_path)  # the config's paths are relative to the project
    written = (results / "status.txt").stat().st_mtime
    assert end_of_run(load_config(config), since=written + 60) == (0, "")
    assert end_of_run(load_config(config), since=written) == (0, last)
