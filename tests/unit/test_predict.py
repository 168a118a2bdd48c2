"""Predictions on new inputs (batchfit.predictions; batchfit.predict in a notebook): equal to
pm.sample_posterior_predictive(..., predictions=True) on the same draws and seed, the new inputs each form gives,
the outputs, and bad input.

A small pharmacokinetic sweep (three subjects, a one-compartment oral model) is fitted once by batchfit; every
prediction is compared with PyMC's own on the model a user builds by hand (``pm.set_data`` on the fit's model).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import write_config

# A subject's weight is a column holding one value; the dose a config parameter (a 0-d array of each dataset).
# CL's prior depends on the weight (so a changed weight is upstream of a frozen variable); conc depends on TIME.
PK_MODEL = """\
import numpy as np
import pymc as pm
import pytensor.tensor as pt


def build_model(data, dose=100.0):
    with pm.Model() as model:
        time = pm.Data("TIME", data["TIME"])
        wt = pm.Data("WT", data["WT"])
        d = pm.Data("dose", data["dose"])
        dv = pm.Data("DV", data["DV"])
        log_cl = pm.Normal("log_cl", np.log(4.0) + 0.75 * pt.log(wt[0] / 70.0), 0.3)
        log_v = pm.Normal("log_v", np.log(40.0), 0.3)
        log_ka = pm.Normal("log_ka", np.log(1.2), 0.3)
        sigma = pm.HalfNormal("sigma", 0.3)
        cl = pm.Deterministic("CL", pt.exp(log_cl))
        v, ka = pt.exp(log_v), pt.exp(log_ka)
        ke = cl / v
        conc = pm.Deterministic("conc", d * ka / (v * (ka - ke)) * (pt.exp(-ke * time) - pt.exp(-ka * time)))
        pm.LogNormal("DV_obs", pt.log(conc), sigma, observed=dv, shape=time.shape)
    return model


def extend(data, horizon):
    last = data["TIME"][-1]
    return {"TIME": last + 2.0 * np.arange(1, horizon + 1), "WT": np.repeat(data["WT"][0], horizon)}
"""
TIMES = np.array([0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 24.0])
GRID = {"TIME": {"start": 0.25, "stop": 24.0, "num": 25}}


def subject(seed: int, weight: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    cl, v, ka = 4.0 * (weight / 70) ** 0.75 * np.exp(rng.normal(0, 0.2)), 40.0, 1.2
    ke = cl / v
    conc = 100.0 * ka / (v * (ka - ke)) * (np.exp(-ke * TIMES) - np.exp(-ka * TIMES))
    return pd.DataFrame({"TIME": TIMES, "WT": weight, "DV": (conc * np.exp(rng.normal(0, 0.15, TIMES.size))).round(4)})


def pk_settings(root: Path, cache: Path, predict: dict) -> dict:
    return {"model": str(root / "model.py"), "datasets": [str(root / "data" / "*.csv")], "params": {"dose": 100.0},
            "sampler": {"draws": 100, "tune": 150, "chains": 2, "seed": 3}, "cache_dir": str(cache),
            "results_dir": str(root / "results"), "predict": predict}


@pytest.fixture(scope="module")
def pk_sweep(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three subjects fitted by batchfit (compile, fit, collect) with predictions on a grid: the config file."""
    from batchfit.config import load_config
    from batchfit.sweep import stages
    from batchfit.sweep.collect_job import run_collect

    root = tmp_path_factory.mktemp("pk")
    (root / "model.py").write_text(PK_MODEL)
    (root / "data").mkdir()
    for i, weight in enumerate((55.0, 70.0, 92.0)):
        subject(i, weight).to_csv(root / "data" / f"s{i + 1}.csv", index=False)
    path = write_config(root / "config.yaml", pk_settings(root, session_cache, {"grid": GRID}))
    config = load_config(path)
    stamp = stages.run_compile(config, workers=2)
    assert stamp.forward_key, "the compile stage compiles the reference's forward function ahead"
    assert stages.run_fit(config) == 0
    run_collect(config)
    return path


def user_model(config, dataset_id: str, new: dict[str, np.ndarray]):
    """What a user predicts with: the sweep's model of the dataset, its data swapped by ``pm.set_data``."""
    import pymc as pm

    import batchfit

    model = batchfit.build_model(config, dataset_id)
    with model:
        pm.set_data(new)
    return model


def grid_inputs(data) -> dict[str, np.ndarray]:
    time = np.linspace(0.25, 24.0, 25)
    return {"TIME": time, "WT": np.repeat(data["WT"][0], time.size), "DV": np.zeros(time.size)}


def pymc_predictions(fit: xr.DataTree, model, var_names: list[str], seed: int) -> tuple[xr.DataTree, list[str]]:
    """pm.sample_posterior_predictive(..., predictions=True) and the warnings it gave."""
    import pymc as pm

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = pm.sample_posterior_predictive(fit, model=model, var_names=var_names, predictions=True,
                                              random_seed=seed, progressbar=False)
    return tree, [str(w.message) for w in caught]


def test_predictions_on_the_cached_path_equal_pymcs_on_the_same_draws_and_seed(pk_sweep: Path, caplog) -> None:
    """Bit for bit: the cached forward function is PyMC's, its generators reseeded as PyMC reseeds them and passed
    from draw to draw as PyTensor's function passes them; what is drawn and what is copied is PyMC's decision."""
    import batchfit

    with batchfit.open_results(pk_sweep) as results:
        for dataset_id in ("s1", "s2", "s3"):
            data = batchfit.load_dataset(pk_sweep, dataset_id)
            ours = batchfit.predict(pk_sweep, dataset_id)
            assert ours.attrs["prediction_path"] == "cached"
            var_names = list(ours["predictions"].data_vars)
            assert var_names == ["DV_obs", "conc", "CL"]  # the observed variable and every deterministic, copied last
            theirs, said = pymc_predictions(results.dataset(dataset_id), user_model(pk_sweep, dataset_id,
                                            grid_inputs(data)), var_names, int(ours.attrs["seed"]))
            for group in ("predictions", "predictions_constant_data"):
                a, b = ours[group].to_dataset(), theirs[group].to_dataset()
                assert list(a.data_vars) == list(b.data_vars), group
                for name in b.data_vars:
                    assert a[name].dims == b[name].dims, (group, name)
                    np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=f"{dataset_id} {name}")
                assert {k: list(v.values) for k, v in a.coords.items()} == {k: list(v.values)
                                                                            for k, v in b.coords.items()}
            # CL depends on no changed data: copied from the draws; conc is computed again; DV_obs drawn anew
            assert ours.attrs["copied"] == "CL" and ours.attrs["sampled"] == "DV_obs"
            np.testing.assert_array_equal(ours["predictions"]["CL"].values, results.dataset(dataset_id)
                                          ["posterior"]["CL"].values)
            # WT (longer now) is upstream of the frozen log_cl: PyMC warns, and so does the prediction's log
            assert len(said) == 1 and "'log_cl' (upstream Data/coords changed (WT))" in said[0]
    assert "'log_cl' (upstream Data/coords changed (WT))" in caplog.text


def test_a_whole_fit_from_open_results_predicts_with_no_warning(pk_sweep: Path) -> None:
    """open_results(...).dataset(id) is the whole fit (posterior, constant and observed data, sample stats): PyMC
    tells unchanged data from changed by its constant_data, and warns of nothing when nothing upstream changed."""
    import pymc as pm

    import batchfit

    with batchfit.open_results(pk_sweep) as results:
        fit = results.dataset("s2")
    assert {"posterior", "constant_data", "observed_data", "sample_stats"} <= set(fit.children)
    assert fit.attrs["dataset"] == "s2" and "provenance" in fit.attrs
    time = np.linspace(0.25, 24.0, 40)
    model = user_model(pk_sweep, "s2", {"TIME": time, "DV": np.zeros(time.size)})  # the weight unchanged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = pm.sample_posterior_predictive(fit, model=model, predictions=True, random_seed=1, progressbar=False)
    assert tree["predictions"]["DV_obs"].shape == (2, 100, 40)
    # the posterior alone does not say which data the fit saw: PyMC then takes every pm.Data as changed
    with pytest.warns(pm.exceptions.ImplicitFreezeWarning, match="log_cl"):
        pm.sample_posterior_predictive(fit["posterior"].to_dataset(), model=model, predictions=True,
                                       random_seed=1, progressbar=False)


def test_predictions_csv_holds_the_inputs_and_arviz_statistics_and_open_results_gives_them(pk_sweep: Path,
                                                                                          tmp_path: Path) -> None:
    import arviz_stats

    import batchfit
    from batchfit.config import load_config
    from batchfit.sweep.predict_job import run_predict

    config = load_config(pk_sweep)
    failed, line = run_predict(config)
    assert failed == 0 and "3 dataset(s) predicted" in line, line
    with batchfit.open_results(pk_sweep) as results:
        table = results.prediction_table
        tree = results.predictions("s3")
    assert list(table.columns[:6]) == ["dataset", "variable", "row", "element", "TIME", "WT"]
    assert "dose" in table.columns and list(table.columns[-4:]) == ["mean", "sd", "eti89_lb", "eti89_ub"]
    rows = table[(table["dataset"] == "s3") & (table["variable"] == "conc")]
    assert len(rows) == 25 and list(rows["row"]) == list(range(25))
    np.testing.assert_allclose(rows["TIME"], np.linspace(0.25, 24.0, 25))
    assert set(rows["WT"]) == {92.0}
    draws = tree["predictions"]["conc"]
    expected = arviz_stats.summary(tree["predictions"].to_dataset()[["conc"]], kind="stats", ci_kind="eti",
                                   ci_prob=0.89, round_to="none")
    np.testing.assert_allclose(rows["mean"], expected["mean"], rtol=1e-12)
    np.testing.assert_allclose(rows["sd"], expected["sd"], rtol=1e-12)
    np.testing.assert_allclose(rows[["eti89_lb", "eti89_ub"]], expected[["eti89_lb", "eti89_ub"]], rtol=1e-12)
    assert draws.dims == ("chain", "draw", "conc_dim_0")
    cl = table[(table["dataset"] == "s3") & (table["variable"] == "CL")]
    assert len(cl) == 1 and cl["row"].isna().all()  # not one value per row
    # nothing pending: a second run predicts nothing again
    before = {p.name: p.stat().st_mtime_ns for p in config.layout.predictions.glob("*.nc")}
    assert run_predict(config)[0] == 0
    assert before == {p.name: p.stat().st_mtime_ns for p in config.layout.predictions.glob("*.nc")}


def test_new_inputs_from_files_and_a_horizon_reuse_the_forward_function_of_other_lengths(pk_sweep: Path,
                                                                                        tmp_path: Path) -> None:
    """A file with other times (and no DV) and the model file's extend hook; both compile nothing new when their
    plan is the grid's: the forward function takes any length."""
    import yaml

    import batchfit
    from batchfit.config import load_config

    new = tmp_path / "new"
    new.mkdir()
    pd.DataFrame({"TIME": [1.0, 3.0, 30.0], "WT": 70.0}).to_csv(new / "s2.csv", index=False)
    settings = yaml.safe_load(pk_sweep.read_text())
    data_config = write_config(tmp_path / "data.yaml", {**settings, "predict": {"data": str(new / "*.csv")}})
    tree = batchfit.predict(data_config, "s2")
    assert tree["predictions"]["DV_obs"].shape == (2, 100, 3)
    np.testing.assert_array_equal(tree["predictions_constant_data"]["TIME"].values, [1.0, 3.0, 30.0])
    horizon_config = write_config(tmp_path / "horizon.yaml", {**settings, "predict": {"horizon": 4}})
    tree = batchfit.predict(horizon_config, "s1")
    np.testing.assert_array_equal(tree["predictions_constant_data"]["TIME"].values, [26.0, 28.0, 30.0, 32.0])
    # the three forms share one forward function: its key is in no attribute but the structure's and plan's
    keys = {batchfit.predict(c, "s2").attrs["forward_key"] for c in (pk_sweep, data_config, horizon_config)}
    assert len(keys) == 1
    # in a notebook, new data as a mapping (or DataFrame) of columns
    tree = batchfit.predict(pk_sweep, "s1", {"TIME": [2.0, 5.0], "WT": [55.0, 55.0]})
    assert tree["predictions"]["conc"].shape == (2, 100, 2)
    assert load_config(data_config).predict.source == "data"


def test_bad_new_inputs_fail_their_dataset_naming_file_and_column_and_the_others_are_predicted(
        pk_sweep: Path, tmp_path: Path) -> None:
    import yaml

    from batchfit.config import load_config
    from batchfit.sweep.predict_job import run_predict
    from batchfit.sweep.verdict import end_of_run, write_prediction_verdict

    new = tmp_path / "new"
    new.mkdir()
    pd.DataFrame({"TIME": [1.0, 2.0]}).to_csv(new / "s1.csv", index=False)  # no WT
    pd.DataFrame({"TIME": [1.0, 2.0], "WT": 70.0}).to_csv(new / "s2.csv", index=False)
    pd.DataFrame({"TIME": [1.0], "WT": 70.0}).to_csv(new / "s9.csv", index=False)  # no such dataset
    settings = yaml.safe_load(pk_sweep.read_text())
    results = tmp_path / "results"
    (tmp_path / "results").mkdir()
    for name in ("fits",):  # the sweep's fits, in this config's results directory
        (results / name).symlink_to(Path(settings["results_dir"]) / name)
    config = load_config(write_config(tmp_path / "c.yaml", {**settings, "results_dir": str(results),
                                                            "predict": {"data": str(new / "*.csv")}}))
    failed, line = run_predict(config)
    assert failed == 2 and "1 dataset(s) predicted" in line and "2 failed" in line, line
    failures = pd.read_csv(config.layout.prediction_failures_csv).set_index("dataset")
    assert "column 'WT'" in failures.loc["s1", "message"] and str(new / "s1.csv") in failures.loc["s1", "message"]
    assert "add it to the new-data file" in failures.loc["s1", "message"]
    assert "s9" in failures.loc["s9", "message"] and str(new / "s9.csv") in failures.loc["s9", "message"]
    assert "no dataset of the sweep has its id" in failures.loc["s9", "message"]
    assert config.layout.prediction("s2").exists() and not config.layout.prediction("s1").exists()
    # the run ends with them: collect_predictions' verdict, printed and exited on by the workflow's onsuccess
    assert write_prediction_verdict(config).startswith("batchfit: 2 prediction(s) failed:")
    code, lines = end_of_run(config)
    assert code == 1 and "s9" in lines and "prediction_failures.csv" in lines
    assert end_of_run(config) == (0, "")  # reported once
    # a grid column the datasets do not have
    grid = load_config(write_config(tmp_path / "g.yaml", {**settings, "results_dir": str(results),
                                                          "predict": {"grid": {"time": [1.0]}}}))
    failed, _ = run_predict(grid, ["s3"])
    assert failed == 1
    record = json.loads(grid.layout.prediction_failure("s3").read_text())
    assert "predict.grid names column 'time'" in record["message"] and "'TIME'" in record["message"]
    assert "s3.csv" in record["message"]


def test_a_dataset_with_new_inputs_but_no_fit_fails_naming_its_file(pk_sweep: Path, tmp_path: Path) -> None:
    import yaml

    from batchfit.config import load_config
    from batchfit.sweep.predict_job import run_predict

    settings = yaml.safe_load(pk_sweep.read_text())
    config = load_config(write_config(tmp_path / "c.yaml", {**settings, "results_dir": str(tmp_path / "empty")}))
    failed, _ = run_predict(config, ["s1"])
    record = json.loads(config.layout.prediction_failure("s1").read_text())
    assert failed == 1 and "has new inputs but no fit" in record["message"] and "s1.csv" in record["message"]


def test_the_prediction_plan_follows_fits_and_new_inputs_not_the_other_way(pk_sweep: Path, tmp_path: Path) -> None:
    """A refit re-predicts that dataset only; new inputs alone re-predict and refit nothing."""
    import shutil

    import yaml

    from batchfit.config import load_config
    from batchfit.sweep.plan import plan
    from batchfit.sweep.predict_job import run_predict
    from batchfit.sweep.predict_plan import predict_plan

    root = tmp_path / "copy"
    shutil.copytree(pk_sweep.parent, root, ignore=shutil.ignore_patterns("predictions*", "predict_plan.json"))
    settings = {**yaml.safe_load(pk_sweep.read_text()), "datasets": [str(root / "data" / "*.csv")],
                "results_dir": str(root / "results")}
    config = load_config(write_config(root / "config.yaml", settings))
    assert plan(config).batches == {} and run_predict(config)[0] == 0
    assert predict_plan(config).batches == {}
    frame = pd.read_csv(root / "data" / "s2.csv")
    frame.loc[0, "DV"] += 0.5
    frame.to_csv(root / "data" / "s2.csv", index=False)
    assert [list(b) for b in plan(config).batches.values()] == [["s2"]]
    assert [list(b) for b in predict_plan(config).batches.values()] == [["s2"]]
    frame.loc[0, "DV"] -= 0.5
    frame.to_csv(root / "data" / "s2.csv", index=False)  # back as it was: nothing pending
    assert plan(config).batches == {} and predict_plan(config).batches == {}
    changed = load_config(write_config(root / "grid.yaml", {**settings, "predict": {"grid": {
        "TIME": {"start": 1.0, "stop": 12.0, "num": 5}}}}))
    assert plan(changed).batches == {}  # new inputs refit nothing
    assert [sorted(b) for b in predict_plan(changed).batches.values()] == [["s1", "s2", "s3"]]


def test_the_grid_carries_a_datasets_single_values_and_labels_over(tmp_path: Path) -> None:
    from batchfit.data.dataset import Dataset
    from batchfit.errors import DatasetError
    from batchfit.predictions.new_data import grid_inputs, with_labels_of

    data = Dataset("d", tmp_path / "d.csv", {"x": np.array([1.0, 2.0, 3.0]), "wt": np.array([60.0, 60.0, 60.0]),
                                             "g": np.array([0, 1, 1]), "y": np.array([0.1, 0.2, 0.3]),
                                             "dose": np.asarray(5.0)}, {"g": ("a", "b")})
    new = grid_inputs(data, {"g": ["b", "a"], "x": {"start": 0.0, "stop": 1.0, "num": 3}})
    assert list(new.arrays["g"]) == [1, 1, 1, 0, 0, 0]
    np.testing.assert_array_equal(new.arrays["x"], [0.0, 0.5, 1.0] * 2)
    np.testing.assert_array_equal(new.arrays["wt"], [60.0] * 6)
    assert new.arrays["dose"].ndim == 0 and "y" not in new.arrays and new.coords["g"] == ("a", "b")
    with pytest.raises(DatasetError, match=r"label\(s\) 'c'.*column 'g'|column 'g'.*'c'"):
        grid_inputs(data, {"g": ["c"]})
    # a file's own coding of its labels becomes the dataset's
    recoded = with_labels_of(data, Dataset("d", tmp_path / "n.csv", {"g": np.array([0, 0])}, {"g": ("b",)}))
    assert list(recoded.arrays["g"]) == [1, 1] and recoded.coords["g"] == ("a", "b")
    with pytest.raises(DatasetError, match="'z'.*not among the dataset's labels"):
        with_labels_of(data, Dataset("d", tmp_path / "n.csv", {"g": np.array([0])}, {"g": ("z",)}))


def test_the_report_draws_curves_of_the_first_and_the_named_datasets(pk_sweep: Path, tmp_path: Path) -> None:
    import dataclasses

    from batchfit.config import load_config
    from batchfit.errors import ConfigError
    from batchfit.predictions.plots import write_prediction_plots
    from batchfit.sweep.predict_job import run_predict

    config = load_config(pk_sweep)
    run_predict(config)
    config = dataclasses.replace(config, report=dataclasses.replace(config.report, first_datasets=1,
                                                                     datasets=("s3",)))
    written = write_prediction_plots(config, ["s1", "s2", "s3"])
    assert [p.name for p in written] == ["s1.png", "s3.png"] and all(p.stat().st_size > 1000 for p in written)
    bad = dataclasses.replace(config, report=dataclasses.replace(config.report, datasets=("s7",)))
    with pytest.raises(ConfigError, match="report.datasets.*'s7'"):
        write_prediction_plots(bad, ["s1", "s2", "s3"])


def fitted(root: Path, cache: Path, model: str, data: dict[str, pd.DataFrame], predict: dict):
    """A tiny sweep of ``model`` on ``data`` (id -> table), fitted by batchfit: its Config."""
    from batchfit.config import load_config
    from batchfit.sweep import stages

    (root / "data").mkdir(parents=True)
    (root / "model.py").write_text(model)
    for dataset_id, frame in data.items():
        frame.to_csv(root / "data" / f"{dataset_id}.csv", index=False)
    config = load_config(write_config(root / "config.yaml", {
        "model": str(root / "model.py"), "datasets": [str(root / "data" / "*.csv")], "cache_dir": str(cache),
        "results_dir": str(root / "results"), "sampler": {"draws": 60, "tune": 60, "chains": 2, "seed": 1},
        "predict": predict}))
    stages.run_compile(config)
    assert stages.run_fit(config) == 0
    return config


# A latent value per row: its draws have the fit's rows, so the model cannot predict other rows.
LATENT_PER_ROW = """\
import numpy as np
import pymc as pm


def build_model(data):
    with pm.Model(coords={"row": np.arange(len(data["x"]))}) as model:
        x = pm.Data("x", data["x"], dims="row")
        y = pm.Data("y", data["y"], dims="row")
        b = pm.Normal("b", 0.0, 1.0)
        z = pm.Normal("z", 0.0, 0.5, dims="row")
        pm.Normal("obs", b * x + z, 0.3, observed=y, dims="row")
    return model
"""


def test_a_model_that_cannot_be_resized_fails_naming_the_variable_and_the_other_datasets_are_predicted(
        session_cache: Path, tmp_path: Path) -> None:
    from batchfit.sweep.predict_job import run_predict

    rng = np.random.default_rng(4)
    tables = {f"r{i}": pd.DataFrame({"x": rng.normal(size=6), "y": rng.normal(size=6)}) for i in range(2)}
    (tmp_path / "new").mkdir()
    pd.DataFrame({"x": np.linspace(-1, 1, 9)}).to_csv(tmp_path / "new" / "r0.csv", index=False)  # other rows
    pd.DataFrame({"x": np.linspace(-1, 1, 6)}).to_csv(tmp_path / "new" / "r1.csv", index=False)  # as many rows
    config = fitted(tmp_path, session_cache, LATENT_PER_ROW, tables, {"data": str(tmp_path / "new" / "*.csv")})
    failed, _ = run_predict(config)
    record = json.loads(config.layout.prediction_failure("r0").read_text())
    assert failed == 1 and "variable 'z'" in record["message"] and "dimension 'row' of length 6" in record["message"]
    assert "length 9" in record["message"] and str(tmp_path / "new" / "r0.csv") in record["message"]
    assert config.layout.prediction("r1").exists()


def test_a_model_the_cached_forward_function_cannot_take_is_predicted_by_pymc_itself(session_cache: Path,
                                                                                       tmp_path: Path) -> None:
    """A user's op with only a Python implementation: numba runs it in object mode, so the forward function is
    not cached; pm.sample_posterior_predictive predicts the dataset, which gives its own draws exactly."""
    from testkit import OBJECT_MODE_MODEL

    import batchfit

    rng = np.random.default_rng(5)
    config = fitted(tmp_path, session_cache, OBJECT_MODE_MODEL, {"o1": pd.DataFrame({"y": rng.normal(1, 0.3, 8)})},
                    {"grid": {"y": [0.0, 0.0, 0.0]}})
    ours = batchfit.predict(config, "o1")
    assert ours.attrs["prediction_path"] == "pymc" and ours["predictions"]["obs"].shape == (2, 60, 3)
    model = user_model(config, "o1", {"y": np.zeros(3)})
    theirs, _ = pymc_predictions(xr.open_datatree(config.layout.fit("o1")), model, ["obs"], int(ours.attrs["seed"]))
    np.testing.assert_array_equal(ours["predictions"]["obs"].values, theirs["predictions"]["obs"].values)


def test_rows_files_are_the_text_pandas_to_csv_writes(tmp_path: Path) -> None:
    """predictions.csv's rows are written without pandas; each cell is what DataFrame.to_csv writes for it."""
    from batchfit.predictions.table import as_text, read_rows, write_rows

    values = {
        "dataset": np.array(["s1", "s1", "s1", "s1"], dtype=object),
        "row": pd.array([0, 1, None, 3], dtype="Int64"),
        "element": np.array(["", "g01, 2", 'say "hi"', "line\nbreak"], dtype=object),
        "x": np.array([0.1, 1e-05, np.nan, 1e16]),
        "x32": np.array([0.1, 2.5, -3.0, np.inf], dtype=np.float32),
        "n": np.array([1, -2, 3, 2**40]),
        "flag": np.array([True, False, True, False]),
        "label": np.array(["a,b", None, "c", float("nan")], dtype=object),
        "mean": np.array([-0.0, 123456789.123456789, 5e-324, 1.0 / 3.0]),
    }
    frame = pd.DataFrame(values)
    rows = {name: as_text(np.asarray(column.astype(object).where(column.notna(), None)) if name == "row"
                          else np.asarray(column)) for name, column in frame.items()}
    write_rows(rows, tmp_path / "ours.csv")
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "ours.csv").read_text() == (tmp_path / "pandas.csv").read_text()
    assert read_rows(tmp_path / "ours.csv") == rows


def test_changed_interval_settings_recompute_each_datasets_statistics_and_keep_its_inputs(pk_sweep: Path,
                                                                                         tmp_path: Path) -> None:
    """collect_predictions with another summary.ci_prob: the statistics again from the stored draws (compared with
    ArviZ's), the inputs as they were; on a copy of the sweep's results, so the other tests see theirs."""
    import shutil

    import arviz_stats
    import yaml

    from batchfit.config import load_config
    from batchfit.predictions.collect import collect_predictions
    from batchfit.sweep.predict_job import run_predict

    assert run_predict(load_config(pk_sweep))[0] == 0
    settings = yaml.safe_load(pk_sweep.read_text())
    shutil.copytree(settings["results_dir"], tmp_path / "results")
    config = load_config(write_config(tmp_path / "config.yaml", {**settings, "results_dir": str(tmp_path / "results"),
                                                                 "summary": {"ci_prob": 0.5}}))
    before = pd.read_csv(config.layout.predictions_csv)
    collect_predictions(config, ["s1", "s2", "s3"])
    after = pd.read_csv(config.layout.predictions_csv)
    assert list(after.columns) == [*before.columns[:-2], "eti50_lb", "eti50_ub"]
    pd.testing.assert_frame_equal(after.iloc[:, :-4], before.iloc[:, :-4])
    rows = after[(after["dataset"] == "s2") & (after["variable"] == "conc")]
    with xr.open_datatree(config.layout.prediction("s2")) as tree:
        expected = arviz_stats.summary(tree["predictions"].to_dataset()[["conc"]].load(), kind="stats",
                                       ci_kind="eti", ci_prob=0.5, round_to="none")
    np.testing.assert_allclose(rows[["mean", "sd", "eti50_lb", "eti50_ub"]], expected, rtol=1e-12)


def test_the_curves_wait_only_for_the_batches_predicting_a_dataset_drawn() -> None:
    from batchfit.predictions.drawn import batches_drawn, drawn_datasets
    from batchfit.settings import ReportSettings

    predicted = [f"s{i}" for i in range(1, 9)]
    batches = {"a": {"s1": None, "s2": None}, "b": {"s3": None, "s4": None}, "c": {"s7": None}, "d": {"s8": None}}
    report = ReportSettings(first_datasets=3, datasets=("s7", "unknown"))
    assert drawn_datasets(report, predicted) == ["s1", "s2", "s3", "s7"]
    assert batches_drawn(report, predicted, batches) == ["a", "b", "c"]
    assert batches_drawn(ReportSettings(first_datasets=0, datasets=()), predicted, batches) == []


def test_the_predict_and_collect_predictions_jobs_do_not_import_matplotlib() -> None:
    """Only the curves' job draws: the others' processes start without matplotlib's import."""
    import subprocess
    import sys

    code = "import sys, batchfit.sweep.predict_job; print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", run.stdout


def test_each_jobs_work_runs_with_the_garbage_collector_on_after_a_paused_start(pk_sweep: Path, session_cache: Path,
                                                                                 tmp_path: Path) -> None:
    """The rule scripts of compile, fit, collect, plots, predict and the predictions' collect and plots pause Python's
    garbage collector before their imports (`batchfit.common.collector`); each job's work must turn it back
    on, its set-up frozen out of it. In one process that pauses before each job, as each rule script does, on
    a copy of the sweep."""
    import shutil
    import subprocess
    import sys

    root = tmp_path / "pk"
    shutil.copytree(pk_sweep.parent, root)
    path = write_config(root / "config.yaml", pk_settings(root, session_cache, {"grid": GRID}))
    code = f"""
import gc
import weakref
from batchfit.common import collector
from batchfit.config import load_config
from batchfit.fitting.batch import fit_batch
from batchfit.outputs.plots import write_plots
from batchfit.sweep.collect_job import run_collect
from batchfit.sweep.predict_job import run_collect_predictions, run_predict, run_prediction_plots
from batchfit.sweep.stages import run_compile

class Node:
    pass

def garbage():  # a reference cycle, unreachable: only a collection frees it, unless it was frozen first
    node = Node(); node.self = node
    return weakref.ref(node)

config = load_config({str(path)!r})
jobs = {{"compile": lambda: run_compile(config), "fit": lambda: fit_batch(config, ["s1"], batch_id="batch-s1"),
        "collect": lambda: run_collect(config), "plots": lambda: write_plots(config),
        "predict": lambda: run_predict(config, ["s1"]),
        "collect_predictions": lambda: run_collect_predictions(config),
        "prediction_plots": lambda: run_prediction_plots(config)}}
for name, job in jobs.items():
    collector.pause()
    before = garbage()  # of the job's start: frozen where its work begins
    job()
    gc.collect()
    print("job", name, gc.isenabled(), before() is not None)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("job ")]
    assert lines == [[name, "True", "True"] for name in ("compile", "fit", "collect", "plots", "predict",
                                                           "collect_predictions", "prediction_plots")]
