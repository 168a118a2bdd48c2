"""The predict stage end to end in real Snakemake runs: a grid, per-dataset files and a horizon, each predicted
on the sweep's fits; a refit re-predicts that dataset only, and new inputs alone refit nothing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from testkit import HIERARCHICAL, mtimes, output_of, planned_jobs, snakemake, sweep_settings, write_config

# The bundled model, and how it extends a shop's data for predict.horizon: the next x values of its first group.
EXTEND = '''

def extend(data, horizon):
    step = 0.5
    return {"x": data["x"].max() + step * np.arange(1, horizon + 1), "group": np.zeros(horizon, dtype=int)}
'''


@pytest.mark.slow
def test_grid_files_and_horizon_predict_end_to_end_and_refit_only_what_changed(session_cache, tmp_path) -> None:
    from batchfit.model.simulate import simulate_datasets

    (tmp_path / "model.py").write_text(HIERARCHICAL.read_text() + EXTEND)
    simulate_datasets(tmp_path / "model.py", tmp_path / "data", 4, seed=3, prefix="shop")
    settings = sweep_settings(session_cache, model="model.py", batch_size=2, columns={"group": {"scope": "dataset"}},
                              predict={"grid": {"group": ["g00", "g01"], "x": {"start": -2, "stop": 2, "num": 11}}})
    config = write_config(tmp_path / "sweep.yaml", settings)
    results = tmp_path / "results"
    ids = [f"shop_{i:03d}" for i in range(4)]

    # 1. the grid: the default target fits, then predicts every dataset, with one compile of the forward function
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)[-4000:]
    assert sorted(p.stem for p in (results / "predictions").glob("*.nc")) == ids
    table = pd.read_csv(results / "predictions.csv")
    assert len(table) == 4 * 22 and set(table["variable"]) == {"y_obs"} and set(table["group"]) == {"g00", "g01"}
    assert sorted(p.name for p in (results / "plots" / "predictions").glob("*.png")) == [f"{d}.png" for d in ids]
    compile_log = next((results / "logs" / "compile").glob("*.log")).read_text()
    assert "forward function" in compile_log and "compiled in" in compile_log, compile_log
    for log in (results / "logs" / "predict").glob("*.log"):
        assert "forward function" in log.read_text() and "cache hit" in log.read_text(), log.read_text()
    report = snakemake(tmp_path, config, "--report", "report.html")
    assert report.returncode == 0, output_of(report)[-3000:]
    text = (tmp_path / "report.html").read_text()
    assert "7. Predictions" in text and "Predictions of dataset" in text

    # 2. a changed dataset: one fit and one prediction, of that dataset alone
    data = pd.read_csv(tmp_path / "data" / "shop_002.csv")
    data.loc[0, "y"] += 1.0
    data.to_csv(tmp_path / "data" / "shop_002.csv", index=False)
    dry = snakemake(tmp_path, config, "-n")
    assert planned_jobs(dry)["fit"] == 1 and planned_jobs(dry)["predict_batch"] == 1, output_of(dry)
    before = mtimes(results / "predictions")
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)[-4000:]
    after = mtimes(results / "predictions")
    assert [name for name in after if after[name] != before[name]] == ["shop_002.nc"]
    manifests = [json.loads(p.read_text()) for p in (results / "predictions" / "batches").glob("*.json")]
    assert sorted(len(m["datasets"]) for m in manifests) == [1, 2, 2]

    # 3. files for two datasets: `snakemake predict` predicts them and refits nothing
    (tmp_path / "new").mkdir()
    for dataset_id, n in (("shop_000", 3), ("shop_003", 5)):
        pd.DataFrame({"group": ["g01"] * n, "x": np.linspace(0, 1, n)}).to_csv(tmp_path / "new" / f"{dataset_id}.csv",
                                                                                index=False)
    write_config(config, {**settings, "predict": {"data": "new/*.csv"}})
    dry = snakemake(tmp_path, config, "predict", "-n")
    assert "fit" not in planned_jobs(dry) and planned_jobs(dry)["predict_batch"] == 1, output_of(dry)
    fits_before = mtimes(results / "fits")
    run = snakemake(tmp_path, config, "predict")
    assert run.returncode == 0, output_of(run)[-4000:]
    assert mtimes(results / "fits") == fits_before
    table = pd.read_csv(results / "predictions.csv")
    assert table.groupby("dataset").size().to_dict() == {"shop_000": 3, "shop_003": 5}
    # a changed file re-predicts that dataset only
    pd.DataFrame({"group": ["g00"], "x": [0.5]}).to_csv(tmp_path / "new" / "shop_003.csv", index=False)
    dry = snakemake(tmp_path, config, "predict", "-n")
    assert planned_jobs(dry)["predict_batch"] == 1 and "shop_003" in output_of(dry)

    # 3b. the same new inputs as groups of one table: a changed group re-predicts that dataset only
    new = pd.concat([pd.read_csv(tmp_path / "new" / f"{d}.csv").assign(shop=d) for d in ("shop_000", "shop_003")])
    new.to_csv(tmp_path / "new.csv", index=False)
    write_config(config, {**settings, "predict": {"data": {"table": "new.csv", "by": "shop"}}})
    run = snakemake(tmp_path, config, "predict")
    assert run.returncode == 0, output_of(run)[-4000:]
    assert mtimes(results / "fits") == fits_before
    table = pd.read_csv(results / "predictions.csv")
    assert table.groupby("dataset").size().to_dict() == {"shop_000": 3, "shop_003": 1}
    np.testing.assert_allclose(table[table["dataset"] == "shop_000"]["x"], np.linspace(0, 1, 3))
    new.loc[new["shop"] == "shop_000", "x"] += 1.0
    new.iloc[::-1].to_csv(tmp_path / "new.csv", index=False)  # another row order too: shop_003's rows are the same
    before = mtimes(results / "predictions")
    run = snakemake(tmp_path, config, "predict")
    assert run.returncode == 0, output_of(run)[-4000:]
    after = mtimes(results / "predictions")
    assert [name for name in after if after[name] != before[name]] == ["shop_000.nc"]

    # 4. a horizon: the model file's extend gives each dataset its next x values
    write_config(config, {**settings, "predict": {"horizon": 3}})
    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)[-4000:]
    assert mtimes(results / "fits") == fits_before
    table = pd.read_csv(results / "predictions.csv")
    assert table.groupby("dataset").size().to_dict() == dict.fromkeys(ids, 3) and set(table["group"]) == {"g00"}
    data = pd.read_csv(tmp_path / "data" / "shop_001.csv")
    np.testing.assert_allclose(table[table["dataset"] == "shop_001"]["x"], data["x"].max() + [0.5, 1.0, 1.5])
    assert yaml.safe_load(config.read_text())["predict"] == {"horizon": 3}


def test_a_sweep_of_variants_predicts_per_variant_those_that_ask(session_cache, tmp_path) -> None:
    """Planned only (a dry run): each variant with predict gets its own predict jobs, table and curves."""
    from batchfit.model.simulate import simulate_datasets

    simulate_datasets(HIERARCHICAL, tmp_path / "data", 4, seed=5, prefix="shop")
    settings = sweep_settings(session_cache, batch_size=2, columns={"group": {"scope": "dataset"}},
                              variants={"normal": {"params": {"noise": "normal"}},
                                        "student": {"params": {"noise": "student"},
                                                    "predict": {"grid": {"group": ["g00"], "x": [0.0, 1.0]}}}})
    dry = snakemake(tmp_path, write_config(tmp_path / "sweep.yaml", settings), "-n")
    assert dry.returncode == 0, output_of(dry)[-3000:]
    jobs = planned_jobs(dry)
    assert jobs["predict_batch"] == 2 and jobs["collect_predictions"] == 1 and jobs["prediction_plots"] == 1, jobs
    assert "results/student/predictions.csv" in output_of(dry) and "results/normal/predictions" not in output_of(dry)
