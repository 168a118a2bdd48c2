"""Simulation-based calibration: it passes a correct model, fails a wrong simulator, counts failed
fits, and fits only what is new or missing when run again.

A tiny model (normal mean and scale, 15 rows) with short chains keeps each fit cheap; every test
shares the session's compile cache, so the model compiles once per session.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats

from batchfit.config import Config, config_from_dict
from batchfit.pipeline import run_fit
from batchfit.sbc import (
    data_paths,
    rank_simulations,
    run_sbc,
    sbc_config,
    sbc_root,
    simulate,
    truth_path,
)

REPO = Path(__file__).resolve().parents[1]

MODEL = """
import pymc as pm

def build_model(data):
    with pm.Model() as model:
        y = pm.Data("y", data["y"])
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y_obs", mu, {scale}, observed=y, shape=y.shape)
    return model
"""


def _write_sweep(root: Path, cache: Path, n: int, *, simulator_scale: str | None = None) -> dict:
    """A model file, a 15-row template dataset and a config dict for an SBC of ``n`` simulations."""
    (root / "model.py").write_text(MODEL.format(scale="sigma"))
    pd.DataFrame({"y": np.round(np.random.default_rng(0).normal(size=15), 4)}).to_csv(root / "t.csv", index=False)
    sbc = {"n_simulations": n, "thin": 2, "seed": 7}
    if simulator_scale is not None:
        (root / "simulator.py").write_text(MODEL.format(scale=simulator_scale))
        sbc["simulator"] = str(root / "simulator.py")
    return {"model": str(root / "model.py"), "datasets": [str(root / "t.csv")], "cache_dir": str(cache),
            "results_dir": str(root / "results"), "batch_size": 50,
            "sampler": {"draws": 200, "tune": 200, "chains": 2, "seed": 3}, "sbc": sbc}


def _config(root: Path, cache: Path, n: int, **kwargs: str) -> Config:
    return config_from_dict(_write_sweep(root, cache, n, **kwargs))


def _with_n(config: Config, n: int) -> Config:
    return dataclasses.replace(config, sbc=dataclasses.replace(config.sbc, n_simulations=n))


def _fit_stamps(config: Config) -> dict[str, int]:
    """Modification time of every simulated fit: a refit changes it."""
    return {p.stem: p.stat().st_mtime_ns for p in (sbc_root(config) / "fits").glob("*.nc")}


@pytest.mark.slow
def test_correct_model_passes_and_simulations_follow_the_prior(tmp_path: Path, session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 40)
    result = run_sbc(config, threads=2)
    assert result.passed, result.verdict()
    assert result.verdict().startswith("SBC PASS: 40 of 40 simulations fitted, ranks among 200 draws")
    # The true values are prior draws and the data are drawn given them (checked against scipy).
    truths = [json.loads(truth_path(config, s).read_text())["truth"] for s in data_paths(config)]
    mu = np.array([t["mu"] for t in truths])
    sigma = np.array([t["sigma"] for t in truths])
    assert stats.kstest(mu, stats.norm(0, 1).cdf).pvalue > 0.01
    assert stats.kstest(sigma, stats.halfnorm(scale=1).cdf).pvalue > 0.01
    z = np.concatenate([(pd.read_csv(p)["y"].to_numpy() - m) / s
                        for p, m, s in zip(data_paths(config).values(), mu, sigma, strict=True)])
    assert stats.kstest(z, stats.norm.cdf).pvalue > 0.01
    # ranks.csv holds the rank of each truth among the thinned draws of its fit.
    ranks = pd.read_csv(sbc_root(config) / "ranks.csv")
    assert len(ranks) == 80 and set(ranks["parameter"]) == {"mu", "sigma"}
    row = ranks[(ranks["simulation"] == "sim-00003") & (ranks["parameter"] == "sigma")].iloc[0]
    with xr.open_dataset(sbc_root(config) / "fits" / "sim-00003.nc", group="posterior") as post:
        draws = post["sigma"].isel(draw=slice(None, None, 2)).values.ravel()
    assert row["rank"] == int((draws < truths[3]["sigma"]).sum())
    tree = xr.open_datatree(sbc_root(config) / "ranks.nc")
    assert tree["prior_sbc"]["sigma"].shape == (1, 40)
    assert (sbc_root(config) / "plots" / "sigma.png").stat().st_size > 1000


@pytest.mark.slow
def test_simulator_with_twice_the_noise_fails_clearly(tmp_path: Path, session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 30, simulator_scale="2 * sigma")
    result = run_sbc(config, threads=2)
    assert not result.passed
    verdict = (sbc_root(config) / "verdict.txt").read_text()
    assert verdict.startswith("SBC FAIL: 30 of 30 simulations fitted") and "non-uniform ranks: sigma" in verdict
    table = result.table.set_index("parameter")
    assert table.loc["sigma", "outside_band"] and table.loc["sigma", "pot_c_p_value"] < 1e-3
    ranks = pd.read_csv(sbc_root(config) / "ranks.csv").query("parameter == 'sigma'")["rank"]
    assert ranks.median() < 20  # the truth lies below almost every draw: the fit sees twice the noise


@pytest.mark.slow
def test_failed_simulated_fits_are_counted(tmp_path: Path, session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 12)
    simulate(config)
    paths = data_paths(config)
    for sim in ("sim-00003", "sim-00007"):  # a fit that cannot even load its data
        frame = pd.read_csv(paths[sim], dtype=str)
        frame.loc[4, "y"] = "oops"
        frame.to_csv(paths[sim], index=False)
    assert run_fit(sbc_config(config)) == 2
    result = rank_simulations(config, plots=False)
    assert sorted(result.failed) == ["sim-00003", "sim-00007"] and not result.passed
    assert "2 of 12 simulated fit(s) failed (sim-00003, sim-00007" in result.verdict()
    assert result.verdict().startswith("SBC FAIL: 10 of 12 simulations fitted")
    assert set(pd.read_csv(sbc_root(config) / "ranks.csv")["simulation"]) == set(paths) - {"sim-00003", "sim-00007"}
    failed = pd.read_csv(sbc_root(config) / "failed_simulations.csv")
    assert list(failed["simulation"]) == ["sim-00003", "sim-00007"] and failed["message"].str.contains("oops").all()


@pytest.mark.slow
def test_more_simulations_fit_only_the_new_ones_and_a_killed_run_resumes(tmp_path: Path,
                                                                         session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 10)
    run_sbc(config)
    before = _fit_stamps(config)
    data_before = {s: p.read_bytes() for s, p in data_paths(config).items()}
    manifests = set((sbc_root(config) / "batches").glob("*.json"))

    more = _with_n(config, 15)
    result = run_sbc(more)
    assert len(result.fitted) == 15
    after = _fit_stamps(more)
    assert {s for s in after if after[s] != before.get(s)} == {f"sim-{i:05d}" for i in range(10, 15)}
    assert all(data_paths(config)[s].read_bytes() == b for s, b in data_before.items())
    [new] = set((sbc_root(config) / "batches").glob("*.json")) - manifests
    assert sorted(json.loads(new.read_text())["datasets"]) == [f"sim-{i:05d}" for i in range(10, 15)]

    # A run killed after simulating sim-00004 again (its truth file not yet written) and before
    # fitting sim-00002: the re-run redraws sim-00004 identically, so only sim-00002 is fitted.
    truth_path(more, "sim-00004").unlink()
    (sbc_root(more) / "fits" / "sim-00002.nc").unlink()
    data4 = data_paths(more)["sim-00004"].read_bytes()
    run_sbc(more)
    final = _fit_stamps(more)
    assert {s for s in final if final[s] != after.get(s)} == {"sim-00002"}
    assert data_paths(more)["sim-00004"].read_bytes() == data4 and truth_path(more, "sim-00004").exists()


def test_an_edited_helper_of_the_simulator_makes_every_simulation_outdated(
        tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's noise scale from a module of the user's: editing it changes every simulation's
    digest, so they are drawn again (the plan does this without building anything)."""
    from batchfit.sbc import simulation_digests

    (tmp_path / "bf_sbc_noise.py").write_text("SCALE = 'sigma'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _config(tmp_path, session_cache, 3, simulator_scale="sigma")
    simulator = tmp_path / "simulator.py"
    simulator.write_text("import bf_sbc_noise\n" + simulator.read_text())
    before = simulation_digests(config)
    assert simulation_digests(config) == before
    (tmp_path / "bf_sbc_noise.py").write_text("SCALE = '2 * sigma'\n")
    after = simulation_digests(config)
    assert after.keys() == before.keys() and all(after[s] != before[s] for s in before)


def test_a_template_that_is_not_a_dataset_is_a_config_error(tmp_path: Path, session_cache: Path) -> None:
    from batchfit.errors import ConfigError

    raw = _write_sweep(tmp_path, session_cache, 5)
    raw["sbc"]["template"] = "nope"
    with pytest.raises(ConfigError, match=r"sbc\.template.*'nope' is not among the config's datasets"):
        simulate(config_from_dict(raw))


@pytest.mark.slow
def test_snakemake_sbc_target(tmp_path: Path, session_cache: Path) -> None:
    raw = _write_sweep(tmp_path, session_cache, 6)
    raw["batch_size"] = 3
    (tmp_path / "config.yaml").write_text(json.dumps(raw))
    run = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "sbc", "--cores", "2", "--configfile",
         str(tmp_path / "config.yaml")], cwd=REPO, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert run.returncode == 0, run.stderr[-3000:]
    root = tmp_path / "results" / "sbc"
    assert (root / "verdict.txt").read_text().startswith("SBC ")
    assert len(list((root / "batches").glob("*.json"))) == 2  # two fit jobs of three simulations
    assert len(pd.read_csv(root / "ranks.csv")) == 12
    assert (root / "plots" / "mu.png").exists()
