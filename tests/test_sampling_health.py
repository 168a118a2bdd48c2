"""Sampling health: a dataset that samples badly is a warning, with its diagnostics, not a failure."""

from __future__ import annotations

import math
from pathlib import Path

import arviz_stats as azs
import pandas as pd
import pytest
import xarray as xr
from testkit import sweep_settings, table

from batchfit.config import config_from_dict
from batchfit.outputs.health import DIAGNOSTICS


def test_a_badly_sampling_dataset_is_a_warning_with_its_diagnostics(tmp_path: Path, session_cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfit.sweep.stages import run_collect, run_fit

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
