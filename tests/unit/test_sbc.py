"""Simulation-based calibration: it passes a correct model, fails a wrong simulator, counts failed
fits, fits only what is new or missing when run again, and simulates and fits a template that
lacks some of the sweep's labels with the same coding.

A tiny model (normal mean and scale, 15 rows) with short chains keeps each fit cheap; every test
shares the session's compile cache, so the model compiles once per session.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats
from testkit import REPO, snakemake, write_config

from batchfit.config import Config, config_from_dict
from batchfit.sweep.sbc.ranks import rank_simulations
from batchfit.sweep.sbc.simulate import simulate
from batchfit.sweep.sbc.sweep import data_paths, sbc_config
from batchfit.sweep.stages import run_fit, run_sbc

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


# A per-group mean over the labels of the text column `group`, which the data pin down closely.
GROUPED_MODEL = """
import pymc as pm

def build_model(data):
    with pm.Model(coords={{"groups": {groups}}}) as model:
        group = pm.Data("group", data["group"])
        y = pm.Data("y", data["y"])
        z = pm.Normal("z", 0.0, 1.0, dims="groups")
        pm.Normal("y_obs", z[group], 0.1, observed=y, shape=y.shape)
    return model
"""
ALL_GROUPS = [f"g{i:02d}" for i in range(10)]
TEMPLATE_GROUPS = ["g07", "g02", "g05", "g03"]  # 4 of the sweep's 10, none of them first in any order


def _write_sweep(root: Path, cache: Path, n: int, *, simulator_scale: str | None = None,
                 grouped: bool = False) -> dict:
    """A model file, a 15-row template dataset and a config dict for an SBC of ``n`` simulations.

    ``grouped``: the model is `GROUPED_MODEL`, the template ``t`` holds 4 of the 10 groups, and
    the sweep's other dataset ``a`` (first by id) holds all 10, in another order of appearance.
    """
    rng = np.random.default_rng(0)
    template = pd.DataFrame({"y": np.round(rng.normal(size=15), 4)})
    model = MODEL.format(scale="sigma")
    datasets = [root / "t.csv"]
    if grouped:
        model = GROUPED_MODEL.format(groups='data.coords["group"]')
        template.insert(0, "group", [TEMPLATE_GROUPS[i % 4] for i in range(15)])
        other = pd.DataFrame({"group": rng.permutation(ALL_GROUPS), "y": np.round(rng.normal(size=10), 4)})
        other.to_csv(root / "a.csv", index=False)
        datasets.insert(0, root / "a.csv")
    (root / "model.py").write_text(model)
    template.to_csv(root / "t.csv", index=False)
    sbc = {"n_simulations": n, "thin": 2, "seed": 7, "template": "t"}
    if simulator_scale is not None:
        (root / "simulator.py").write_text(MODEL.format(scale=simulator_scale))
        sbc["simulator"] = str(root / "simulator.py")
    return {"model": str(root / "model.py"), "datasets": [str(p) for p in datasets], "cache_dir": str(cache),
            "results_dir": str(root / "results"), "batch_size": 50,
            "sampler": {"draws": 200, "tune": 200, "chains": 2, "seed": 3}, "sbc": sbc}


def _config(root: Path, cache: Path, n: int, **kwargs: str) -> Config:
    return config_from_dict(_write_sweep(root, cache, n, **kwargs))


def _with_n(config: Config, n: int) -> Config:
    return dataclasses.replace(config, sbc=dataclasses.replace(config.sbc, n_simulations=n))


def _fit_stamps(config: Config) -> dict[str, int]:
    """Modification time of every simulated fit: a refit changes it."""
    return {p.stem: p.stat().st_mtime_ns for p in (config.layout.sbc.root / "fits").glob("*.nc")}


@pytest.mark.slow
def test_correct_model_passes_and_simulations_follow_the_prior(tmp_path: Path, session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 40)
    result = run_sbc(config, threads=2)
    assert result.passed, result.verdict()
    assert result.verdict().startswith("SBC PASS: 40 of 40 simulations fitted, ranks among 200 draws")
    # The true values are prior draws and the data are drawn given them (checked against scipy).
    truths = [json.loads(config.layout.sbc.truth(s).read_text())["truth"] for s in data_paths(config)]
    mu = np.array([t["mu"] for t in truths])
    sigma = np.array([t["sigma"] for t in truths])
    assert stats.kstest(mu, stats.norm(0, 1).cdf).pvalue > 0.01
    assert stats.kstest(sigma, stats.halfnorm(scale=1).cdf).pvalue > 0.01
    z = np.concatenate([(pd.read_csv(p)["y"].to_numpy() - m) / s
                        for p, m, s in zip(data_paths(config).values(), mu, sigma, strict=True)])
    assert stats.kstest(z, stats.norm.cdf).pvalue > 0.01
    # ranks.csv holds the rank of each truth among the thinned draws of its fit.
    ranks = pd.read_csv(config.layout.sbc.ranks_csv)
    assert len(ranks) == 80 and set(ranks["parameter"]) == {"mu", "sigma"}
    row = ranks[(ranks["simulation"] == "sim-00003") & (ranks["parameter"] == "sigma")].iloc[0]
    with xr.open_dataset(config.layout.sbc.root / "fits" / "sim-00003.nc", group="posterior") as post:
        draws = post["sigma"].isel(draw=slice(None, None, 2)).values.ravel()
    assert row["rank"] == int((draws < truths[3]["sigma"]).sum())
    tree = xr.open_datatree(config.layout.sbc.root / "ranks.nc")
    assert tree["prior_sbc"]["sigma"].shape == (1, 40)
    assert (config.layout.sbc.root / "plots" / "sigma.png").stat().st_size > 1000


@pytest.mark.slow
def test_simulator_with_twice_the_noise_fails_clearly(tmp_path: Path, session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 30, simulator_scale="2 * sigma")
    result = run_sbc(config, threads=2)
    assert not result.passed
    verdict = (config.layout.sbc.root / "verdict.txt").read_text()
    assert verdict.startswith("SBC FAIL: 30 of 30 simulations fitted") and "non-uniform ranks: sigma" in verdict
    table = result.table.set_index("parameter")
    assert table.loc["sigma", "outside_band"] and table.loc["sigma", "pot_c_p_value"] < 1e-3
    ranks = pd.read_csv(config.layout.sbc.ranks_csv).query("parameter == 'sigma'")["rank"]
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
    assert set(pd.read_csv(config.layout.sbc.ranks_csv)["simulation"]) == set(paths) - {"sim-00003", "sim-00007"}
    failed = pd.read_csv(config.layout.sbc.root / "failed_simulations.csv")
    assert list(failed["simulation"]) == ["sim-00003", "sim-00007"] and failed["message"].str.contains("oops").all()


@pytest.mark.slow
def test_more_simulations_fit_only_the_new_ones_and_a_killed_run_resumes(tmp_path: Path,
                                                                         session_cache: Path) -> None:
    config = _config(tmp_path, session_cache, 10)
    run_sbc(config)
    before = _fit_stamps(config)
    data_before = {s: p.read_bytes() for s, p in data_paths(config).items()}
    manifests = set((config.layout.sbc.root / "batches").glob("*.json"))

    more = _with_n(config, 15)
    result = run_sbc(more)
    assert len(result.fitted) == 15
    after = _fit_stamps(more)
    assert {s for s in after if after[s] != before.get(s)} == {f"sim-{i:05d}" for i in range(10, 15)}
    assert all(data_paths(config)[s].read_bytes() == b for s, b in data_before.items())
    [new] = set((config.layout.sbc.root / "batches").glob("*.json")) - manifests
    assert sorted(json.loads(new.read_text())["datasets"]) == [f"sim-{i:05d}" for i in range(10, 15)]

    # A run killed after simulating sim-00004 again (its truth file not yet written) and before
    # fitting sim-00002: the re-run redraws sim-00004 identically, so only sim-00002 is fitted.
    more.layout.sbc.truth("sim-00004").unlink()
    (more.layout.sbc.root / "fits" / "sim-00002.nc").unlink()
    data4 = data_paths(more)["sim-00004"].read_bytes()
    run_sbc(more)
    final = _fit_stamps(more)
    assert {s for s in final if final[s] != after.get(s)} == {"sim-00002"}
    assert data_paths(more)["sim-00004"].read_bytes() == data4 and more.layout.sbc.truth("sim-00004").exists()


def _template_levels(root: Path, columns: dict) -> list[str]:
    """The labels of `group` the template gets under ``columns`` (config README): the sweep's (both
    datasets, in id order) or, with ``scope: dataset``, its own; sorted, or in order of appearance."""
    setting = columns.get("group", {})
    files = ["t"] if setting.get("scope") == "dataset" else ["a", "t"]
    labels = pd.concat([pd.read_csv(root / f"{name}.csv", dtype=str)["group"] for name in files])
    return list(pd.unique(labels)) if setting.get("order") == "appearance" else sorted(set(labels))


@pytest.mark.slow
@pytest.mark.parametrize("columns", [{}, {"group": {"order": "appearance"}}, {"group": {"scope": "dataset"}}],
                         ids=["sweep", "sweep-appearance", "dataset"])
def test_a_template_that_lacks_some_of_the_sweeps_labels(tmp_path: Path, session_cache: Path,
                                                         columns: dict) -> None:
    """The simulator and the fits code the template's `group` alike: `z` has the same labels, in the
    same order, in the truth, the simulated data, every fit and the ranks."""
    raw = _write_sweep(tmp_path, session_cache, 4, grouped=True)
    raw["columns"] = columns
    config = config_from_dict(raw)
    levels = _template_levels(tmp_path, columns)
    assert len(levels) == (4 if columns.get("group", {}).get("scope") == "dataset" else 10)
    result = run_sbc(config, threads=2)
    assert sorted(result.fitted) == list(data_paths(config)) and not result.failed
    ranks = pd.read_csv(config.layout.sbc.ranks_csv).set_index(["simulation", "parameter"])["rank"]
    assert set(ranks.index.get_level_values("parameter")) == {f"z[{g}]" for g in levels}
    tree = xr.open_datatree(config.layout.sbc.root / "ranks.nc")
    assert tree["prior_sbc"]["z"].shape == (1, 4, len(levels)) and list(tree["prior_sbc"]["groups"].values) == levels
    for sim, path in data_paths(config).items():
        truth = np.array(json.loads(config.layout.sbc.truth(sim).read_text())["truth"]["z"])
        assert truth.shape == (len(levels),)
        # The simulator's z[i] belongs to label levels[i]: each group's rows sit around it (noise 0.1).
        means = pd.read_csv(path, dtype={"group": str}).groupby("group")["y"].mean()
        assert sorted(means.index) == sorted(TEMPLATE_GROUPS)
        assert all(abs(truth[levels.index(g)] - mean) < 0.3 for g, mean in means.items())
        with xr.open_dataset(config.layout.sbc.root / "fits" / f"{sim}.nc", group="posterior") as post:
            assert list(post["groups"].values) == levels
            for g in levels:  # the rank of each label's truth among the thinned draws of that label
                draws = post["z"].sel(groups=g).isel(draw=slice(None, None, 2)).values.ravel()
                assert ranks[(sim, f"z[{g}]")] == int((draws < truth[levels.index(g)]).sum())


@pytest.mark.parametrize("scope", ["sweep", "dataset"])
def test_the_simulations_follow_the_coding_of_the_template_only(tmp_path: Path, session_cache: Path,
                                                                scope: str) -> None:
    """A new dataset brings nothing to the simulations unless it changes the template's labels: one
    with only known labels re-simulates and refits nothing, one with a new label of the sweep-wide
    `group` re-simulates and refits every simulation, with that label in their coding."""
    from batchfit.data.coding import sweep_coding
    from batchfit.data.discovery import discover_datasets
    from batchfit.fitting.provenance import expected_digests

    raw = _write_sweep(tmp_path, session_cache, 3, grouped=True)
    raw["columns"] = {"group": {"scope": scope}}

    def simulated(extra: list[str]) -> tuple[int, dict[str, str], dict[str, list[str]]]:
        """Simulate with ``extra`` data files in the sweep: simulations written, the expected digest
        and the `group` labels of each simulated dataset's fit."""
        config = config_from_dict({**raw, "datasets": [*raw["datasets"], *extra]})
        written = simulate(config).written
        sweep = sbc_config(config)
        datasets = discover_datasets(sweep.data_sources)
        coding = sweep_coding(sweep.data_sources, datasets)
        return (written, expected_digests(sweep, datasets),
                {sim: coding.for_dataset(sim)["group"]["levels"] for sim in datasets})

    written, digests, labels = simulated([])
    assert written == 3 and all(v == _template_levels(tmp_path, raw["columns"]) for v in labels.values())
    pd.DataFrame({"group": ["g01", "g04"], "y": [0.1, 0.2]}).to_csv(tmp_path / "b.csv", index=False)
    assert simulated([str(tmp_path / "b.csv")]) == (0, digests, labels)
    pd.DataFrame({"group": ["g10", "g04"], "y": [0.1, 0.2]}).to_csv(tmp_path / "c.csv", index=False)
    written, new_digests, new_labels = simulated([str(tmp_path / "b.csv"), str(tmp_path / "c.csv")])
    if scope == "dataset":  # the template's own labels: another dataset's do not concern it
        assert (written, new_digests, new_labels) == (0, digests, labels)
    else:
        assert written == 3 and all(new_digests[s] != digests[s] for s in digests)
        assert all(v == [*ALL_GROUPS, "g10"] for v in new_labels.values())


@pytest.mark.slow
def test_ranks_refuse_a_simulator_that_labels_a_dimension_otherwise(tmp_path: Path, session_cache: Path) -> None:
    """A simulator whose `groups` lists the template's labels in another order than the fitted model
    would have each true value ranked among another group's draws: an error naming both orders."""
    from batchfit.errors import ModelContractError

    raw = _write_sweep(tmp_path, session_cache, 2, grouped=True)
    raw["columns"] = {"group": {"scope": "dataset"}}
    (tmp_path / "simulator.py").write_text(GROUPED_MODEL.format(groups='data.coords["group"][::-1]'))
    raw["sbc"]["simulator"] = str(tmp_path / "simulator.py")
    levels = _template_levels(tmp_path, raw["columns"])
    with pytest.raises(ModelContractError, match=(
            rf"dimension 'groups' of variable 'z' has the labels \[{', '.join(levels[::-1])}\] in the simulator "
            rf".* but \[{', '.join(levels)}\] in the fit of sim-00000")):
        run_sbc(config_from_dict(raw))


def test_a_simulated_text_column_is_written_as_the_templates_labels(tmp_path: Path, session_cache: Path) -> None:
    """An observed text column (a categorical answer) is simulated as codes and written as their
    labels, which the simulated sweep codes back with the template's labels; a text column the
    template leaves empty has no labels in the simulated sweep either, also in a fit's helper
    process (which gets the simulated sweep's config as a dict)."""
    from batchfit.config import config_to_dict
    from batchfit.data.coding import sweep_coding
    from batchfit.data.dataset import load_dataset
    from batchfit.data.discovery import discover_datasets

    raw = _write_sweep(tmp_path, session_cache, 3)
    (tmp_path / "model.py").write_text(
        "import pymc as pm\n\n"
        "def build_model(data):\n"
        "    with pm.Model(coords={'answers': data.coords['answer']}) as model:\n"
        "        answer = pm.Data('answer', data['answer'])\n"
        "        p = pm.Dirichlet('p', a=[1.0] * len(data.coords['answer']), dims='answers')\n"
        "        pm.Categorical('answer_obs', p=p, observed=answer, shape=answer.shape)\n"
        "    return model\n")
    template = pd.DataFrame({"answer": ["no", "yes", "maybe"] * 5, "note": [None] * 15})
    template.to_csv(tmp_path / "t.csv", index=False)
    raw["columns"] = {"note": {"scope": "dataset"}}
    config = config_from_dict(raw)
    assert simulate(config).written == 3
    sweep = sbc_config(config)
    sweep = config_from_dict(config_to_dict(sweep), source=sweep.source)  # as `batchfit.fitting.lane_pool` passes it
    datasets = discover_datasets(sweep.data_sources)
    coding = sweep_coding(sweep.data_sources, datasets)
    for sim, path in datasets.items():
        text = pd.read_csv(path, dtype=str)["answer"]
        assert set(text) <= {"no", "yes", "maybe"}
        loaded = load_dataset(sim, path, coding)
        assert loaded.coords["answer"] == tuple(sorted(set(template["answer"])))
        assert [loaded.coords["answer"][c] for c in loaded["answer"]] == list(text)
        assert loaded.coords["note"] == () and (loaded["note"] == -1).all()


def test_an_edited_helper_of_the_simulator_makes_every_simulation_outdated(
        tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's noise scale from a module of the user's: editing it changes every simulation's
    digest, so they are drawn again (the plan does this without building anything)."""
    from batchfit.sweep.sbc.simulate import simulation_digests

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
    """Each fit job, a process of its own, codes the simulated files as the simulator coded the
    template: with all 10 of the sweep's groups, of which the template holds 4."""
    raw = _write_sweep(tmp_path, session_cache, 6, grouped=True)
    raw["batch_size"] = 3

    def run_sbc_target() -> pd.DataFrame:
        run = snakemake(REPO, write_config(tmp_path / "config.yaml", raw), "sbc", timeout=1200,
                        env={**os.environ, "PYTHONPATH": str(REPO / "src")})
        assert run.returncode == 0, run.stderr[-3000:]
        return pd.read_csv(root / "ranks.csv")

    root = tmp_path / "results" / "sbc"
    ranks = run_sbc_target()
    assert (root / "verdict.txt").read_text().startswith("SBC ")
    assert len(list((root / "batches").glob("*.json"))) == 2  # two fit jobs of three simulations
    assert len(ranks) == 60 and set(ranks["parameter"]) == {f"z[{g}]" for g in _template_levels(tmp_path, {})}
    assert (root / "plots" / "z.png").exists()
    # A dataset with a label new to the sweep gives the template an eleventh group: the checkpoint
    # draws every simulation again, and they are fitted with it.
    pd.DataFrame({"group": ["g10"], "y": [0.5]}).to_csv(tmp_path / "b.csv", index=False)
    raw["datasets"].append(str(tmp_path / "b.csv"))
    ranks = run_sbc_target()
    assert len(ranks) == 66 and set(ranks["parameter"]) == {f"z[g{i:02d}]" for i in range(11)}
