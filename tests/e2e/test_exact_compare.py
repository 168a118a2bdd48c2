"""Exact comparisons of variants where PSIS-LOO fails: refits without the held-out rows, on the compiled model.

Small datasets (10 rows, one an outlier) where PSIS-LOO flags the outlier (Pareto k > 0.7) in the
nearly Normal variant's fit. The reference is arviz_stats itself driving refits done by hand: its ``reloo``
and ``loo_kfold`` with a ``SamplingWrapper`` whose ``sample`` runs ``pm.sample`` (PyMC's own NUTS) on
the model built on the dataset without the held-out rows, and whose ``log_likelihood__i`` is
``pm.compute_log_likelihood`` of the model built on the held-out rows. Both sides start from the same
fit (batchfit's, whose PSIS-LOO decides which observations are refitted) and hold out the same rows
(K-fold: the same seed and strata give the same folds), so they differ only by the Monte Carlo error
of the refits.

The tolerance: a held-out row's elpd is log(mean over draws of exp(log-likelihood)); its Monte Carlo
standard error is, by the delta method, the MCSE of the mean of w = exp(ll - max ll) (arviz_stats'
``mcse``, which accounts for autocorrelation) over the mean of w. A fold's rows share their draws,
so their errors are added (an upper bound for correlated errors), folds and refits in quadrature,
both sides' together; the two estimates must agree within 4 of those standard errors. The outliers
(3.5 and 4 sd) keep the held-out densities' weights light-tailed, where the delta method holds
(checked against ten repeated pm.sample runs while writing this test: sd 0.11, mean estimate 0.12).
"""

from __future__ import annotations

import json
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
from arviz_stats.loo import SamplingWrapper
from testkit import output_of, snakemake, write_config

pytestmark = pytest.mark.slow

# Student-t noise whose degrees of freedom are a pm.Data (docs/variants.md): both variants share one compile,
# nearly Normal noise (nu = 1000), whose fit PSIS-LOO cannot handle with an outlier, and heavy tails (nu = 3).
MODEL = """\
import pymc as pm


def build_model(data, nu=3.0):
    with pm.Model() as model:
        y = pm.Data("y", data["y"])
        nu = pm.Data("nu", data["nu"])
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.StudentT("y_obs", nu=nu, mu=mu, sigma=sigma, observed=y, shape=y.shape)
    return model
"""
VARIANTS = {"normal": {"params": {"nu": 1000.0}}, "student": {"params": {"nu": 3.0}}}
SAMPLER = {"draws": 1000, "tune": 1000, "chains": 2, "seed": 7}
OUTLIERS = {"d0": 3.5, "d1": 4.0}
K = 4


def write_project(root: Path, cache: Path) -> Path:
    """Two datasets of nine N(0, 1) rows and an outlier, in sites a and b; the config of the sweep."""
    (root / "data").mkdir(parents=True)
    (root / "model.py").write_text(MODEL)
    for i, (dataset_id, outlier) in enumerate(OUTLIERS.items()):
        y = np.random.default_rng([58, i]).normal(0.0, 1.0, 9).round(3)
        pd.DataFrame({"y": [*y, outlier], "site": ["a", "b"] * 5}).to_csv(root / "data" / f"{dataset_id}.csv",
                                                                          index=False)
    return write_config(root / "config.yaml", {
        "model": "model.py", "datasets": ["data/*.csv"], "sampler": SAMPLER, "cache_dir": str(cache),
        "results_dir": "results", "variants": VARIANTS, "batch_size": 2})


@pytest.fixture(scope="module")
def exact_sweep(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep of both variants, run by Snakemake with the default compare settings (method auto)."""
    root = tmp_path_factory.mktemp("exact-compare")
    config = write_project(root, session_cache)
    run = snakemake(root, config)
    assert run.returncode == 0, output_of(run)[-4000:]
    return config


# --- the reference: arviz_stats with refits by hand --------------------------------------------------------


def build(frame: pd.DataFrame, nu: float):
    """The model file's build_model on these rows, as a user calls it (columns as arrays, the parameter too)."""
    namespace: dict = {}
    exec(compile(MODEL, "model.py", "exec"), namespace)
    return namespace["build_model"]({"y": frame["y"].to_numpy(dtype=float), "nu": np.asarray(nu)}, nu=nu)


class PyMCRefits(SamplingWrapper):
    """Refits by hand: pm.sample without the held-out rows, their log-likelihood from the model built on them."""

    def __init__(self, tree, frame: pd.DataFrame, nu: float):
        super().__init__(model=None, idata_orig=tree)
        self.frame, self.nu, self.n_refits = frame, nu, 0
        self.held_out: list[xr.DataArray] = []  # each refit's held-out log-likelihood, for the tolerance

    def sel_observations(self, idx):
        held = np.sort(np.atleast_1d(idx))
        return self.frame.drop(index=self.frame.index[held]), self.frame.iloc[held]

    def sample(self, modified_observed_data):
        import pymc as pm

        self.n_refits += 1
        model = build(modified_observed_data, self.nu)
        return model, pm.sample(draws=SAMPLER["draws"], tune=SAMPLER["tune"], chains=SAMPLER["chains"],
                                random_seed=100 + self.n_refits, nuts_sampler="pymc", progressbar=False,
                                compute_convergence_checks=False, model=model)

    def get_inference_data(self, fitted_model):
        return fitted_model

    def log_likelihood__i(self, excluded_obs, idata__i):
        import pymc as pm

        _, idata = idata__i
        held = build(excluded_obs, self.nu)
        values = pm.compute_log_likelihood(idata, model=held, extend_inferencedata=False, progressbar=False)["y_obs"]
        self.held_out.append(values.rename({values.dims[-1]: "row"}))
        return self.held_out[-1]


def held_out_mcse(log_likelihood: xr.DataArray) -> float:
    """The Monte Carlo standard error of a refit's held-out rows' summed elpd (see the module's docstring)."""
    total = 0.0
    for row in log_likelihood["row"].values if "row" in log_likelihood.dims else [None]:
        ll = log_likelihood.sel(row=row) if row is not None else log_likelihood
        w = np.exp(ll - ll.max())
        total += float(arviz_stats.mcse(xr.Dataset({"w": w}))["w"]) / float(w.mean())
    return total


def refit_files(results: Path, variant: str, dataset_id: str) -> dict[str, xr.DataArray]:
    """batchfit's refit results of one fit that the refit plan lists, by refit id."""
    plan = json.loads((results / "refits" / "plan.json").read_text())
    ids = [r["id"] for r in plan["refits"] if r["dataset"] == dataset_id and r["variant"] == variant]
    folder = results / variant / "refits" / "fits" / dataset_id
    return {refit: xr.load_dataset(folder / f"{refit}.nc")["log_likelihood"] for refit in ids}


def assert_refit_logs_hit_the_cache(results: Path) -> None:
    """No refit job compiled: each loaded the fits' compiled structure from the cache, once."""
    logs = sorted(results.glob("*/logs/refit/*.log"))
    assert logs, "no refit job ran"
    for log in logs:
        text = log.read_text()
        compiles = [line for line in text.splitlines() if " compile: " in line]
        assert len(compiles) == 1 and "compile: cache hit" in compiles[0], f"{log}:\n{text}"
        assert "cache miss" not in text and "nutpie's own compile" not in text, f"{log}:\n{text}"


# --- the tests ---------------------------------------------------------------------------------------------


def test_reloo_refits_each_flagged_observation_as_arviz_reloo_with_pm_sample_does(exact_sweep):
    results = exact_sweep.parent / "results"
    comparison = pd.read_csv(results / "comparison.csv", keep_default_na=False)
    flagged = comparison[comparison["n_pareto_k_gt_0.7"] > 0]
    assert len(flagged) >= 1, comparison  # the data make PSIS-LOO fail somewhere, or this test tests nothing
    for row in comparison.itertuples():
        frame = pd.read_csv(exact_sweep.parent / "data" / f"{row.dataset}.csv")
        with xr.open_datatree(results / row.variant / "fits" / f"{row.dataset}.nc") as tree:
            psis = arviz_stats.loo(tree, pointwise=True)
            n_flagged = int((psis.pareto_k.values > 0.7).sum())
            assert (row.method, row.n_refits, row.note) == (("reloo", n_flagged, "") if n_flagged else ("psis", 0, ""))
            if not n_flagged:
                assert row.elpd_loo == pytest.approx(psis.elpd, rel=1e-12)
                continue
            wrapper = PyMCRefits(tree, frame, VARIANTS[row.variant]["params"]["nu"])
            reference = arviz_stats.reloo(wrapper, loo_orig=psis, k_threshold=0.7, pointwise=True)
        ours = refit_files(results, row.variant, row.dataset)
        assert sorted(ours) == sorted(f"reloo-{i}" for i in np.flatnonzero(psis.pareto_k.values > 0.7))
        assert wrapper.n_refits == n_flagged
        tolerance = 4 * np.sqrt(sum(held_out_mcse(ll) ** 2 for ll in [*ours.values(), *wrapper.held_out]))
        assert abs(row.elpd_loo - reference.elpd) < tolerance, (row, reference.elpd, tolerance)
        assert row.p_loo == pytest.approx(reference.p, abs=tolerance)
    assert_refit_logs_hit_the_cache(results)


def test_kfold_holds_out_arviz_loo_kfolds_folds_and_matches_it_with_pm_sample(exact_sweep, tmp_path):
    """``batchfit compare`` (the refits in its own process) with K-fold stratified by site, on a copy of the sweep."""
    shutil.copytree(exact_sweep.parent, tmp_path, dirs_exist_ok=True)
    settings = yaml.safe_load((tmp_path / "config.yaml").read_text())
    settings["compare"] = {"method": "kfold", "kfold": {"k": K, "stratify_by": "site"}}
    write_config(tmp_path / "config.yaml", settings)
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "compare", "--config", "config.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]

    results = tmp_path / "results"
    comparison = pd.read_csv(results / "comparison.csv", keep_default_na=False)
    assert set(comparison["method"]) == {"kfold"} and set(comparison["n_refits"]) == {K}, comparison
    plan = json.loads((results / "refits" / "plan.json").read_text())
    dataset_id = "d0"
    frame = pd.read_csv(tmp_path / "data" / f"{dataset_id}.csv")
    for variant in VARIANTS:
        row = comparison[(comparison["dataset"] == dataset_id) & (comparison["variant"] == variant)].iloc[0]
        with xr.open_datatree(results / variant / "fits" / f"{dataset_id}.nc") as tree:
            wrapper = PyMCRefits(tree, frame, VARIANTS[variant]["params"]["nu"])
            reference = arviz_stats.loo_kfold(tree, wrapper, k=K, stratify_by=frame["site"].to_numpy(), seed=271,
                                              pointwise=True, save_fits=True)
        held_out = {tuple(fold["test_indices"].tolist()) for fold in reference.fold_fits.values()}
        planned = {tuple(r["rows"]) for r in plan["refits"] if r["dataset"] == dataset_id and r["variant"] == variant}
        assert planned == held_out, (planned, held_out)  # the same rows held out, fold by fold
        ours = refit_files(results, variant, dataset_id)
        assert len(ours) == len(wrapper.held_out) == K
        tolerance = 4 * np.sqrt(sum(held_out_mcse(ll) ** 2 for ll in [*ours.values(), *wrapper.held_out]))
        assert abs(row.elpd_loo - reference.elpd) < tolerance, (variant, row.elpd_loo, reference.elpd, tolerance)
    assert_refit_logs_hit_the_cache(results)



def test_a_stratify_by_column_a_dataset_lacks_is_an_error_naming_the_key(exact_sweep, tmp_path):
    shutil.copytree(exact_sweep.parent, tmp_path, dirs_exist_ok=True)
    settings = yaml.safe_load((tmp_path / "config.yaml").read_text())
    settings["compare"] = {"method": "kfold", "kfold": {"stratify_by": "region"}}
    write_config(tmp_path / "config.yaml", settings)
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "compare", "--config", "config.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "key 'compare.kfold.stratify_by'" in run.stderr and "dataset 'd0' has no column 'region'" in run.stderr
    assert "its columns: y, site" in run.stderr, run.stderr[-3000:]
