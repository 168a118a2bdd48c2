"""A sweep of variants (#48): variants and grids in one config, fitted per variant, compared per dataset."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import arviz_stats
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from testkit import HIERARCHICAL, VARIANTS, mtimes, output_of, planned_jobs, snakemake, write_config, write_sweep

import batchfit
from batchfit.config import config_from_dict, load_config
from batchfit.errors import ConfigError
from batchfit.outputs.compare import K_COLUMN, PARETO_K, compared_variants
from batchfit.variants import variant_configs

BASE = {"model": "models/m.py", "datasets": ["data/*.csv"], "results_dir": "out"}


def test_variants_are_the_base_config_with_their_overrides_deep_merged_each_in_its_own_folder():
    config = config_from_dict(BASE | {"sampler": {"draws": 300, "chains": 2}, "params": {"noise": "normal"},
                                      "variants": {"plain": {}, "wide": {"sampler": {"target_accept": 0.95}},
                                                   "t": {"params": {"noise": "student"}}}})
    configs = variant_configs(config)
    assert list(configs) == ["plain", "wide", "t"]
    assert [c.results_dir for c in configs.values()] == [Path("out/plain"), Path("out/wide"), Path("out/t")]
    assert [c.sampler.target_accept for c in configs.values()] == [0.8, 0.95, 0.8]
    assert all(c.sampler.draws == 300 and c.sampler.chains == 2 for c in configs.values())  # merged, not replaced
    assert [dict(c.params) for c in configs.values()] == [{"noise": "normal"}] * 2 + [{"noise": "student"}]
    assert all(c.outputs.log_likelihood and c.cache_dir == config.cache_dir for c in configs.values())
    assert [c.variant for c in configs.values()] == list(configs)
    assert not config_from_dict(BASE).outputs.log_likelihood  # on by default with variants only
    assert variant_configs(config_from_dict(BASE)) == {}


def test_a_grid_makes_a_variant_per_combination_with_paramspace_ids():
    config = config_from_dict(BASE | {"grid": {"params.prior_scale": [1.0, 2.5], "sampler.target_accept": [0.9]},
                                      "variants": {"a": {}, "b": {"model": "models/m.py"}}})
    configs = variant_configs(config)
    assert list(configs) == ["a_prior_scale~1.0_target_accept~0.9", "a_prior_scale~2.5_target_accept~0.9",
                             "b_prior_scale~1.0_target_accept~0.9", "b_prior_scale~2.5_target_accept~0.9"]
    assert [c.params["prior_scale"] for c in configs.values()] == [1.0, 2.5, 1.0, 2.5]
    assert {c.sampler.target_accept for c in configs.values()} == {0.9}
    only_grid = variant_configs(config_from_dict(BASE | {"grid": {"model": ["models/m.py"]}}))
    assert list(only_grid) == ["model~m"]


@pytest.mark.parametrize(("settings", "key", "words"), [
    ({"variants": {"a": {"sampler": {"drawz": 5}}}}, "variants.a.sampler.drawz", "did you mean 'draws'"),
    ({"variants": {"a": {"sampler": {"draws": 0}}}}, "variants.a.sampler.draws", "must be >= 1"),
    ({"variants": {"a": {"datasets": ["x/*.csv"]}}}, "variants.a.datasets", "every variant of a sweep shares it"),
    ({"variants": {"a": {"compare": {"method": "psis"}}}}, "variants.a.compare", "every variant of a sweep shares it"),
    ({"variants": {"a/b": {}}}, "variants.a/b", "not usable as a folder name"),
    ({"variants": {"fits": {}}}, "variants.fits", "results_dir already uses"),
    ({"variants": {"a": 3}}, "variants.a", "must be a mapping"),
    ({"grid": {"results_dir": ["x", "y"]}}, "grid.results_dir", "every variant of a sweep shares it"),
    ({"grid": {"sampler.draws": [10, "many"]}}, "grid.sampler.draws", "must be an integer"),
    ({"grid": {"params.scale": []}}, "grid.params.scale", "at least 1"),
])
def test_a_bad_variant_or_grid_is_an_error_naming_its_key(settings, key, words):
    with pytest.raises(ConfigError) as error:
        variant_configs(config_from_dict(BASE | settings))
    assert error.value.key == key and words in str(error.value), str(error.value)


def test_a_variants_model_file_must_exist_and_compare_needs_the_log_likelihood(tmp_path):
    config = config_from_dict(BASE | {"model": "models/hierarchical.py", "variants": {"a": {"model": "nope.py"}}})
    with pytest.raises(ConfigError, match="nope.py' does not exist") as error:
        variant_configs(config)
    assert error.value.key == "variants.a.model"
    off = config_from_dict(BASE | {"outputs": {"log_likelihood": False}, "variants": {"a": {}, "b": {}}})
    with pytest.raises(ConfigError, match="remove 'outputs: {log_likelihood: false}'") as error:
        compared_variants(off)
    assert error.value.key == "outputs.log_likelihood"
    with pytest.raises(ConfigError, match="compares variants, and this config has 1") as error:
        compared_variants(config_from_dict(BASE | {"variants": {"a": {}}}))
    assert error.value.key == "variants"


def test_comparison_csv_is_arviz_stats_compare_of_each_datasets_fits(variant_sweep):
    """Each fit's elpd is PSIS-LOO's where it is reliable, and arviz_stats.compare's ranks, differences and
    weights of the elpds compared; a fit where PSIS-LOO flags observations is refitted without each
    (compare.method auto: reloo, which tests/e2e/test_exact_compare.py checks against refits by hand)."""
    results = variant_sweep.parent / "results"
    comparison = pd.read_csv(results / "comparison.csv", keep_default_na=False)
    assert list(comparison.columns) == ["dataset", "variant", "elpd_loo", "se", "p_loo", "n_obs", K_COLUMN, "rank",
                                        "elpd_diff", "dse", "weight", "method", "n_refits", "note"]
    assert sorted(comparison["dataset"].unique()) == ["shop_000", "shop_001", "shop_002"]
    for dataset_id in ("shop_000", "shop_002"):
        trees = {v: xr.open_datatree(results / v / "fits" / f"{dataset_id}.nc") for v in VARIANTS}
        rows = comparison[comparison["dataset"] == dataset_id].set_index("variant")
        for variant, tree in trees.items():
            row, loo = rows.loc[variant], arviz_stats.loo(tree, pointwise=True)
            flagged = int((loo.pareto_k.values > PARETO_K).sum())
            assert (row[K_COLUMN], row["method"], row["n_refits"]) == ((flagged, "reloo", flagged) if flagged
                                                                        else (0, "psis", 0))
            if not flagged:
                np.testing.assert_allclose([row["elpd_loo"], row["se"], row["p_loo"]], [loo.elpd, loo.se, loo.p],
                                           rtol=1e-9)
            assert row["n_obs"] == tree["log_likelihood"]["y_obs"].sizes["y_obs_dim_0"]
        if set(rows["method"]) == {"psis"}:  # as arviz_stats.compare of the fits themselves
            expected = arviz_stats.compare(trees, round_to="none")
            np.testing.assert_allclose(rows.loc[list(trees), ["elpd_diff", "dse", "weight"]].to_numpy(float),
                                       expected.loc[list(trees), ["elpd_diff", "dse", "weight"]].astype(float),
                                       rtol=1e-9, atol=1e-12)
        best = rows["elpd_loo"].max()
        np.testing.assert_allclose(rows["elpd_diff"], rows["elpd_loo"] - best, atol=1e-9)
        assert rows.loc[rows["elpd_loo"] == best, "rank"].tolist() == [0]
        assert rows["weight"].sum() == pytest.approx(1.0)
        for tree in trees.values():
            tree.close()


def test_each_variant_fits_its_own_model_with_its_params_in_the_provenance(variant_sweep, monkeypatch):
    monkeypatch.chdir(variant_sweep.parent)  # the config's paths are relative to the project folder
    results = variant_sweep.parent / "results"
    for variant, overrides in VARIANTS.items():
        with xr.open_datatree(results / variant / "fits" / "shop_001.nc") as tree:
            assert yaml.safe_load(tree.attrs["params"]) == overrides["params"]
    with batchfit.open_results(variant_sweep, variant="student") as student:
        assert student.dataset_ids == ["shop_000", "shop_001", "shop_002"]
        sensitivity = pd.read_csv(results / variant / "sensitivity.csv", keep_default_na=False)  # the rule ran
        assert sorted(sensitivity["dataset"].unique()) == ["shop_000", "shop_001", "shop_002"]
    model = batchfit.build_model(load_config(variant_sweep), "shop_001", variant="student")
    assert type(model["y_obs"].owner.op).__name__ == "StudentTRV"


def test_open_results_stacks_the_variants_and_status_and_compare_commands_take_them(variant_sweep, monkeypatch,
                                                                                     tmp_path):
    monkeypatch.chdir(variant_sweep.parent)  # the config's paths are relative to the project folder
    results = variant_sweep.parent / "results"
    for source in (variant_sweep, results):
        with batchfit.open_results(source) as stacked:
            assert list(stacked.variants) == list(VARIANTS)
            assert list(stacked.datasets.columns[:2]) == ["variant", "dataset"]
            assert stacked.datasets.groupby("variant", sort=False).size().to_dict() == {v: 3 for v in VARIANTS}
            assert set(stacked.summary["variant"]) == set(VARIANTS) and len(stacked.failures) == 0
            assert set(stacked.tree.children) == set(VARIANTS)
            one = stacked.dataset("shop_002")
            for variant in VARIANTS:
                with batchfit.open_results(results / variant) as alone:
                    xr.testing.assert_identical(one[variant]["posterior"].to_dataset(),
                                                alone.dataset("shop_002")["posterior"].to_dataset())
            pd.testing.assert_frame_equal(stacked.comparison, pd.read_csv(results / "comparison.csv"))
    status = subprocess.run([sys.executable, "-m", "batchfit.cli", "status", "--config", variant_sweep.name],
                            cwd=variant_sweep.parent, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, status.stderr
    health = {}  # each variant's health line: datasets.csv's counts
    for variant in VARIANTS:
        statuses = pd.read_csv(results / variant / "datasets.csv")["status"]
        health[variant] = f"  3 fitted: {(statuses == 'ok').sum()} ok, {(statuses == 'warning').sum()} warning"
    lines = [line for line in status.stdout.splitlines() if not line.startswith("    ")]
    assert [lines[0], lines[1], lines[3], lines[4], lines[5], lines[7]] == [
        "variant normal (results/normal):", "  3 dataset(s): 3 fitted, 0 pending, 0 failed",
        "  time left: none, nothing is pending",
        "variant student (results/student):", "  3 dataset(s): 3 fitted, 0 pending, 0 failed",
        "  time left: none, nothing is pending"]
    for line, variant in ((lines[2], "normal"), (lines[6], "student")):
        assert line.startswith(health[variant]) and line.endswith(f"(results/{variant}/datasets.csv)"), line
    shutil.copytree(variant_sweep.parent, tmp_path / "copy")  # the command line's compare: the rule's table
    again = subprocess.run([sys.executable, "-m", "batchfit.cli", "compare", "--config", variant_sweep.name],
                           cwd=tmp_path / "copy", capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "copy" / "results" / "comparison.csv"),
                                  pd.read_csv(results / "comparison.csv"))
    unknown = subprocess.run([sys.executable, "-m", "batchfit.cli", "check", "--config", variant_sweep.name,
                              "--variant", "wide"], cwd=variant_sweep.parent, capture_output=True, text=True,
                             timeout=300)
    assert unknown.returncode != 0 and "no variant 'wide' (its variants: normal, student)" in unknown.stderr


def test_adding_a_variant_to_a_finished_sweep_fits_only_it_and_editing_one_refits_only_it(variant_sweep, tmp_path):
    shutil.copytree(variant_sweep.parent, tmp_path, dirs_exist_ok=True)  # keeps the fits' modification times
    config, results = tmp_path / variant_sweep.name, tmp_path / "results"
    fitted = {variant: mtimes(results / variant / "fits") for variant in VARIANTS}
    settings = yaml.safe_load(config.read_text())
    settings["variants"]["wide"] = {"params": {"noise": "normal"}, "sampler": {"target_accept": 0.95}}
    write_config(config, settings)

    dry = snakemake(tmp_path, config, "--dry-run")
    assert dry.returncode == 0, output_of(dry)[-3000:]
    planned = planned_jobs(dry)
    assert planned["fit"] == 1 and "compile" not in planned, planned  # normal's model and params: compiled
    assert "results/wide/batches/" in dry.stdout and "results/normal/batches/" not in dry.stdout

    run = snakemake(tmp_path, config)
    assert run.returncode == 0, output_of(run)[-3000:]
    assert {variant: mtimes(results / variant / "fits") for variant in VARIANTS} == fitted
    assert len(mtimes(results / "wide" / "fits")) == 3
    comparison = pd.read_csv(results / "comparison.csv")
    assert comparison.groupby("dataset").size().to_dict() == {f"shop_00{i}": 3 for i in range(3)}
    assert (comparison.groupby("dataset")["weight"].sum() - 1).abs().max() < 1e-9

    settings["variants"]["wide"]["sampler"]["target_accept"] = 0.97
    write_config(config, settings)
    dry = snakemake(tmp_path, config, "--dry-run")
    assert planned_jobs(dry)["fit"] == 1 and "results/wide/batches/" in dry.stdout, output_of(dry)[-3000:]
    assert "results/student/batches/" not in dry.stdout and "results/normal/batches/" not in dry.stdout


SCALE_MODEL = """\
import pymc as pm


def build_model(data, prior_scale=1.0, how="data"):
    with pm.Model() as model:
        x = pm.Data("x", data["x"])
        y = pm.Data("y", data["y"])
        scale = pm.Data("prior_scale", data["prior_scale"]) if how == "data" else prior_scale
        b = pm.Normal("b", 0.0, scale)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y_obs", b * x, sigma, observed=y, shape=x.shape)
    return model
"""


def scale_sweep(root: Path, cache: Path) -> Path:
    """A grid of prior scales, the scale entering as pm.Data or as a constant (SCALE_MODEL), over 2 datasets."""
    from batchfit.model.simulate import simulate_datasets

    simulate_datasets(HIERARCHICAL, root / "data", 2, seed=3, prefix="s")
    (root / "scale.py").write_text(SCALE_MODEL)
    return write_config(root / "scales.yaml", {
        "model": "scale.py", "datasets": ["data/*.csv"], "cache_dir": str(cache), "results_dir": "results",
        "sampler": {"draws": 200, "tune": 200, "chains": 2, "seed": 5},
        "grid": {"params.prior_scale": [0.001, 1000.0], "params.how": ["data", "const"]}})


def test_a_number_param_in_pm_data_shares_one_structure_and_a_constant_one_does_not(tmp_path, monkeypatch):
    from batchfit.compile.fingerprint import structure_of
    from batchfit.fitting.fitter import reference_model, sweep_reader
    from batchfit.sweep.check import param_lines

    monkeypatch.chdir(tmp_path)
    configs = variant_configs(load_config(scale_sweep(tmp_path, tmp_path / "cache")))
    models = {v: reference_model(c, sweep_reader(c)).model for v, c in configs.items()}
    structures = {v: structure_of(m) for v, m in models.items()}
    data = [structures[f"prior_scale~{s}_how~data"] for s in (0.001, 1000.0)]
    const = [structures[f"prior_scale~{s}_how~const"] for s in (0.001, 1000.0)]
    assert data[0] == data[1] and const[0] != const[1] and data[0] not in const
    shared = param_lines(configs["prior_scale~0.001_how~data"].params, models["prior_scale~0.001_how~data"])
    assert shared[0] == "param prior_scale = 0.001: enters as pm.Data 'prior_scale', so every value shares one compile"
    own = param_lines(configs["prior_scale~0.001_how~const"].params, models["prior_scale~0.001_how~const"])
    assert own[0].startswith("param prior_scale = 0.001: no pm.Data: a value that changes the model's graph")


def test_variants_sharing_a_compile_each_sample_with_their_own_parameter(tmp_path, session_cache):
    """Two prior scales through one compiled structure: each fit's prior is its own (its pm.Data value)."""
    config = scale_sweep(tmp_path, session_cache)
    for scale in (0.001, 1000.0):
        run = subprocess.run([sys.executable, "-m", "batchfit.cli", "run", "--config", config.name, "--variant",
                              f"prior_scale~{scale}_how~data"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    fits = {scale: xr.open_datatree(tmp_path / "results" / f"prior_scale~{scale}_how~data" / "fits" / "s_000.nc")
            for scale in (0.001, 1000.0)}
    assert fits[0.001].attrs["compile_key"] == fits[1000.0].attrs["compile_key"]  # one compile
    for scale, tree in fits.items():
        assert float(tree["constant_data"]["prior_scale"]) == scale
    # b's prior sd 0.001 holds it at 0; with 1000 the data decide (the simulated slope is 0.7)
    assert float(np.abs(fits[0.001]["posterior"]["b"]).max()) < 0.01
    assert float(fits[1000.0]["posterior"]["b"].mean()) > 0.3


def test_sensitivity_needs_the_log_likelihood():
    with pytest.raises(ConfigError, match="needs each fit's log-likelihood") as error:
        config_from_dict(BASE | {"outputs": {"sensitivity": True}})
    assert error.value.key == "outputs.sensitivity"


def test_sensitivity_csv_is_psense_summary_of_each_fit_whose_log_prior_is_pymcs(tmp_path, session_cache, monkeypatch):
    """outputs.sensitivity: each fit keeps pm.compute_log_prior's log_prior; sensitivity.csv is psense_summary's."""
    import pymc as pm

    from batchfit.outputs.sensitivity import COLUMNS, THRESHOLD, write_sensitivity

    config = write_config(tmp_path / "sens.yaml", yaml.safe_load(write_sweep(tmp_path, session_cache, 2).read_text())
                          | {"outputs": {"log_likelihood": True, "sensitivity": True}})
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "run", "--config", config.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    loaded = load_config(config)
    write_sensitivity(loaded)
    table = pd.read_csv(tmp_path / "results" / "sensitivity.csv", keep_default_na=False)
    assert list(table.columns) == COLUMNS and sorted(table["dataset"].unique()) == ["shop_000", "shop_001"]
    for dataset_id in ("shop_000", "shop_001"):
        with xr.open_datatree(tmp_path / "results" / "fits" / f"{dataset_id}.nc") as tree:
            expected = arviz_stats.psense_summary(tree, threshold=THRESHOLD, round_to=16)
            theirs = pm.stats.compute_log_prior(tree.copy(), model=batchfit.build_model(loaded, dataset_id),
                                          extend_inferencedata=False, progressbar=False)
            for name, values in theirs.data_vars.items():
                np.testing.assert_allclose(tree["log_prior"][name].values, values.values, rtol=1e-10)
        rows = table[table["dataset"] == dataset_id].set_index("parameter")
        assert list(rows.index) == list(expected.index)
        np.testing.assert_allclose(rows[["prior", "likelihood"]].values, expected[["prior", "likelihood"]].values)
        assert list(rows["diagnosis"]) == list(expected["diagnosis"])
    page = (tmp_path / "results" / "report" / "sensitivity.html").read_text()
    fitted = table.groupby("parameter").size()  # a group's element is in the datasets that have the group
    sensitive = table[table["prior"] > THRESHOLD].groupby("parameter").size().reindex(fitted.index, fill_value=0)
    assert all(f"<td>{p}</td><td>{fitted[p]}</td><td>{n}</td>" in page for p, n in sensitive.items())
