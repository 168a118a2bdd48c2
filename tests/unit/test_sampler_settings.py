"""The sampler settings reach the sampler of every path, as pm.sample passes them, and a path that
cannot honour one is an error naming the setting, the path and the datasets.

Each setting is checked where the sampler shows it: nutpie's own record of its settings
(``sample_stats`` attribute ``inference_library_settings``, compared with what ``nutpie.sample`` records
for the same arguments), the stats and groups it keeps, the initial point it starts from (compared with
nutpie's ``compile_pymc_model``'s), a maximum tree depth a funnel saturates, and draws identical to
``pm.sample``'s and ``nutpie.sample``'s on the same seed.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import DISCRETE_FREE

from batchfit.config import config_from_dict
from batchfit.errors import ConfigError
from batchfit.fitting.batch import fit_batch
from batchfit.fitting.fitter import dataset_seed

SAMPLER = {"draws": 150, "tune": 150, "chains": 2, "seed": 5}

# Every nutpie setting away from its default (low-rank, so its own settings apply too).
NUTPIE_SETTINGS = {"max_treedepth": 6, "target_accept": 0.85, "adaptation": "low_rank",
                   "mass_matrix_eigval_cutoff": 20.0, "mass_matrix_gamma": 1e-4, "mass_matrix_switch_freq": 40,
                   "early_window_switch_freq": 5, "store_divergences": True, "store_unconstrained": True,
                   "store_gradient": True, "store_mass_matrix": True, "discard_tuned_samples": False}
# What nutpie.sample is given for them (pm.sample's names mapped as pm.sample maps them).
NUTPIE_ARGUMENTS = {"maxdepth": 6, "target_accept": 0.85, "adaptation": "low_rank", "mass_matrix_eigval_cutoff": 20.0,
                    "mass_matrix_gamma": 1e-4, "mass_matrix_switch_freq": 40, "early_window_switch_freq": 5,
                    "store_divergences": True, "store_unconstrained": True, "store_gradient": True,
                    "store_mass_matrix": True, "save_warmup": True}

REGRESSION = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"groups": data.coords["group"]}) as model:
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 2.0)
            sigma_a = pm.HalfNormal("sigma_a", 1.0)
            a = pm.Normal("a", mu, sigma_a, dims="groups")
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Normal("obs", a[group], sigma, observed=y, shape=y.shape)
        return model
""")
# A shared variable that is not pm.Data: batchfit's cached path cannot swap it, so nutpie's own compile fits it.
NUTPIE_PATH = REGRESSION.replace("import pymc as pm\n", "import pymc as pm\nimport pytensor\n").replace(
    "    with pm.Model(", '    offset = pytensor.shared(0.25, name="offset")\n    with pm.Model(').replace(
    "a[group], sigma", "a[group] + offset, sigma")
MODELS = {"cached": REGRESSION, "nutpie": NUTPIE_PATH}

# Neal's funnel: its neck needs long trajectories, so a shallow maximum depth is reached at most draws.
FUNNEL = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            scale = pm.Data("scale", data["scale"])
            v = pm.Normal("v", 0.0, 3.0)
            pm.Normal("x", 0.0, pm.math.exp(v / 2) * scale[0], shape=9)
        return model
""")

# Continuous for a dataset whose `kind` is 0, with a discrete free variable for one whose `kind` is 1: two
# structures, on batchfit's cached path and on pm.sample's.
MIXED = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            x = pm.Data("x", data["x"])
            y = pm.Data("y", data["y"])
            slope = pm.Binomial("k", n=10, p=0.5) if data["kind"][0] == 1 else pm.Normal("b", 0.0, 5.0)
            mu = pm.Normal("mu", 0.0, 5.0)
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("obs", mu + slope * x, sigma, observed=y, shape=x.shape)
        return model
""")


def grouped(seed: int, n_rows: int = 24) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    codes = np.arange(n_rows) % 3
    return pd.DataFrame({"group": [f"g{c}" for c in codes],
                         "y": (np.array([-1.0, 0.0, 1.5])[codes] + rng.normal(0.0, 0.5, n_rows)).round(4)})


def sloped(seed: int, slope: float, kind: int = 0, n_rows: int = 30) -> pd.DataFrame:
    x = np.linspace(-1.0, 1.0, n_rows)
    y = 1.0 + slope * x + np.random.default_rng(seed).normal(0.0, 1.0, n_rows)
    return pd.DataFrame({"x": x, "y": y.round(4), "kind": kind})


def sweep(tmp_path: Path, source: str, frames: dict[str, pd.DataFrame], cache: Path, sampler: dict, **more):
    """A config over ``frames`` (one CSV each, under ``tmp_path``) fitted by the model ``source``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "model.py").write_text(source)
    (tmp_path / "data").mkdir(exist_ok=True)
    for name, frame in frames.items():
        frame.to_csv(tmp_path / "data" / f"{name}.csv", index=False)
    return config_from_dict({"model": str(tmp_path / "model.py"), "datasets": [str(tmp_path / "data" / "*.csv")],
                             "sampler": {**SAMPLER, **sampler}, "cache_dir": str(cache),
                             "results_dir": str(tmp_path / "results"), **more})


def fit(config, ids: list[str]) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nutpie path's and pm.sample's path's own warnings
        return fit_batch(config, ids, batch_id="b").outcomes


def tree_of(config, dataset_id: str) -> xr.DataTree:
    with xr.open_datatree(config.layout.fit(dataset_id)) as tree:
        return tree.load()


def model_of(config, dataset_id: str):
    """The dataset's model, built exactly as batchfit builds it."""
    from batchfit.data.coding import sweep_coding
    from batchfit.data.dataset import load_dataset
    from batchfit.data.discovery import discover_datasets
    from batchfit.model.model_file import build_model, load_model_file

    paths = discover_datasets(config.data_sources)
    dataset = load_dataset(dataset_id, paths[dataset_id], sweep_coding(config.data_sources, paths))
    return build_model(load_model_file(config.model), dataset)


def nutpie_recorded(arguments: dict) -> dict:
    """The settings nutpie.sample records (``inference_library_settings``) when given ``arguments``."""
    import nutpie
    import pymc as pm

    with pm.Model() as model:
        pm.Normal("x", 0.0, 1.0)
    sampler = nutpie.sample(nutpie.compile_pymc_model(model), draws=SAMPLER["draws"], tune=SAMPLER["tune"],
                            chains=SAMPLER["chains"], seed=1, progress_bar=False, blocking=False, **arguments)
    settings = sampler._settings.as_dict()
    sampler.cancel()
    return settings


# --- nutpie's paths -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["cached", "nutpie"])
def test_nutpie_settings_reach_nutpie_as_pm_sample_passes_them(tmp_path, session_cache, path):
    """nutpie records the settings it was given, as nutpie.sample records the same arguments; it keeps
    the stats and groups they ask for (the warm-up with discard_tuned_samples: false); the fit records
    them under batchfit's names; and they change no compiled code (the same cache entry)."""
    config = sweep(tmp_path, MODELS[path], {"d": grouped(1)}, session_cache, NUTPIE_SETTINGS,
                   columns={"group": {"scope": "dataset"}})
    [outcome] = fit(config, ["d"])
    assert outcome.status == "ok", outcome
    tree = tree_of(config, "d")
    assert tree.attrs["sampler_path"] == path
    recorded = json.loads(tree["sample_stats"].attrs["inference_library_settings"])
    expected = nutpie_recorded(NUTPIE_ARGUMENTS)
    for settings in (recorded, expected):
        settings["settings"].pop("seed")  # the dataset's own
    assert recorded == expected
    assert json.loads(tree.attrs["sampler"]) == config.sampler_dict()
    assert {"warmup_posterior", "warmup_sample_stats", "unconstrained_posterior",
            "warmup_unconstrained_posterior"} <= set(tree.children)
    assert tree["warmup_posterior"].sizes["draw"] == SAMPLER["tune"]
    assert list(tree["warmup_posterior"].data_vars) == list(tree["posterior"].data_vars)
    stats = tree["sample_stats"].data_vars
    assert {"gradient", "unconstrained_draw", "divergence_start", "mass_matrix_eigvals"} <= set(stats)
    assert int(tree["sample_stats"]["depth"].max()) <= NUTPIE_SETTINGS["max_treedepth"]
    # the unconstrained vector's elements are labelled as nutpie's own compile labels them
    assert "sigma_a_log__" in tree["sample_stats"]["unconstrained_parameter"].values.tolist()

    defaults = sweep(tmp_path / "defaults", MODELS[path], {"d": grouped(1)}, session_cache, {},
                     columns={"group": {"scope": "dataset"}})
    [outcome] = fit(defaults, ["d"])
    plain = tree_of(defaults, "d")
    assert plain.attrs["compile_key"] == tree.attrs["compile_key"]  # '' on nutpie's path, which caches nothing
    assert set(plain.children) == {"posterior", "sample_stats", "observed_data", "constant_data"}


def test_nutpie_path_draws_are_nutpie_samples_on_the_same_seed(tmp_path, session_cache):
    """On nutpie's own compile the fit is ``nutpie.sample`` of ``compile_pymc_model`` with pm.sample's
    arguments for the settings (initvals as its initial_points): the same draws, bit for bit."""
    import nutpie

    settings = {**NUTPIE_SETTINGS, "initvals": {"mu": 0.5, "sigma_log__": -0.5}, "jitter_rvs": ["a"]}
    config = sweep(tmp_path, NUTPIE_PATH, {"d": grouped(2)}, session_cache, settings,
                   columns={"group": {"scope": "dataset"}})
    [outcome] = fit(config, ["d"])
    assert outcome.status == "ok", outcome
    model = model_of(config, "d")
    compiled = nutpie.compile_pymc_model(model, initial_points={"mu": np.array(0.5), "sigma_log__": np.array(-0.5)},
                                         jitter_rvs={model["a"]})
    theirs = nutpie.sample(compiled, draws=SAMPLER["draws"], tune=SAMPLER["tune"], chains=SAMPLER["chains"],
                           seed=dataset_seed(SAMPLER["seed"], "d"), progress_bar=False, **NUTPIE_ARGUMENTS)
    ours = tree_of(config, "d")
    for group in ("posterior", "warmup_posterior"):
        for name, values in theirs[group].data_vars.items():
            np.testing.assert_array_equal(ours[group][name].values, values.values, err_msg=f"{group}/{name}")


@pytest.mark.parametrize("path", ["cached", "nutpie"])
def test_initvals_and_jitter_give_the_initial_point_nutpies_compile_gives(tmp_path, session_cache, path):
    """The sampler model's initial point (what nutpie calls when a chain starts) is the one nutpie's
    compile_pymc_model gives for the same initial_points and jitter_rvs, on the same seed; without
    jitter it is the initvals themselves (on the unconstrained space)."""
    import nutpie

    from batchfit.fitting.fitter import Fitter, prepare

    initvals = {"mu": 0.7, "sigma_a": 2.0, "a": [0.1, 0.2, 0.3]}
    overrides = {name: np.asarray(value) for name, value in initvals.items()}
    for jitter in (None, ["mu"], []):
        config = sweep(tmp_path, MODELS[path], {"d": grouped(3)}, session_cache,
                       {"initvals": initvals, "jitter_rvs": jitter}, columns={"group": {"scope": "dataset"}})
        cache, _, ref = prepare(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitter = Fitter(config, ref, cache)
        model = fitter.build(ref.dataset)
        sampling = fitter.sampling(model, ref.dataset, fitter.structure(model, ref.dataset))
        ours = sampling.model.initial_point_func
        jittered = None if jitter is None else {model[name] for name in jitter}
        theirs = nutpie.compile_pymc_model(model, initial_points=overrides, jitter_rvs=jittered).initial_point_func
        for seed in (0, 7):
            np.testing.assert_array_equal(ours(seed), theirs(seed), err_msg=f"jitter_rvs {jitter}, seed {seed}")
        if jitter == []:
            np.testing.assert_allclose(ours(3), [0.7, np.log(2.0), 0.1, 0.2, 0.3, ours(3)[-1]])


def test_max_treedepth_3_saturates_a_funnel(tmp_path, session_cache):
    """At most 2^3 leapfrog steps: most draws of the funnel reach the maximum depth, few do at the default 10;
    health's max_treedepth_fraction is that share, and names it as the reason of the warning."""
    from batchfit.outputs.summary_cache import dataset_health

    frames = {"f": pd.DataFrame({"scale": [1.0]})}
    shallow = sweep(tmp_path / "shallow", FUNNEL, frames, session_cache, {"max_treedepth": 3})
    deep = sweep(tmp_path / "deep", FUNNEL, frames, session_cache, {})
    reached, health = {}, {}
    for name, config in (("shallow", shallow), ("deep", deep)):
        [outcome] = fit(config, ["f"])
        assert outcome.status == "ok", outcome
        stats = tree_of(config, "f")["sample_stats"]
        reached[name] = float(stats["maxdepth_reached"].mean())
        assert int(stats["depth"].max()) <= config.sampler.max_treedepth
        assert int(stats["n_steps"].max()) <= 2 ** config.sampler.max_treedepth
        health[name] = dataset_health(config.layout.fit("f"), config.health)
        assert health[name]["max_treedepth_fraction"] == pytest.approx(reached[name], rel=1e-12)
    assert reached["shallow"] > 0.5 and reached["deep"] < reached["shallow"] / 2, reached
    assert health["shallow"]["status"] == "warning"
    assert any(reason.startswith("max_treedepth_fraction ") and reason.endswith(" > 0")
               for reason in health["shallow"]["reasons"]), health["shallow"]["reasons"]


# --- pm.sample's own step methods -----------------------------------------------------------------------------------

def test_pm_sample_gets_step_initvals_max_treedepth_and_keeps_the_warmup(tmp_path, session_cache):
    """On pm.sample's path the fit is pm.sample with the same step methods, start, NUTS settings and seed:
    the same draws, the warm-up kept."""
    import pymc as pm

    settings = {"step": {"k": "metropolis", "sigma": "slice"}, "initvals": {"k": 3, "mu": 1.0},
                "max_treedepth": 4, "target_accept": 0.9, "discard_tuned_samples": False}
    config = sweep(tmp_path, DISCRETE_FREE, {"d": sloped(1, 3)}, session_cache, settings)
    [outcome] = fit(config, ["d"])
    assert outcome.status == "ok", outcome
    ours = tree_of(config, "d")
    assert ours.attrs["sampler_path"] == "pymc"
    model = model_of(config, "d")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = pm.sample(draws=SAMPLER["draws"], tune=SAMPLER["tune"], chains=SAMPLER["chains"], cores=1,
                           random_seed=dataset_seed(SAMPLER["seed"], "d"), model=model, progressbar=False,
                           compute_convergence_checks=False, nuts_sampler="pymc", initvals={"k": 3, "mu": 1.0},
                           step=[pm.Metropolis([model["k"]], model=model), pm.Slice([model["sigma"]], model=model)],
                           nuts={"max_treedepth": 4, "target_accept": 0.9}, discard_tuned_samples=False)
    timings = {"perf_counter_start", "perf_counter_diff", "process_time_diff"}  # when, not what, was drawn
    for group in ("posterior", "warmup_posterior", "sample_stats", "warmup_sample_stats"):
        for name, values in theirs[group].data_vars.items():
            if name not in timings:
                np.testing.assert_array_equal(ours[group][name].values, values.values, err_msg=f"{group}/{name}")
    assert int(ours["sample_stats"]["tree_depth"].max()) <= 4
    # the fit records the settings as pm.sample does: its own attributes (the warm-up's length among them)
    for name in ("inference_library", "inference_library_version", "tuning_steps"):
        assert ours["sample_stats"].attrs[name] == theirs["sample_stats"].attrs[name], name
    assert int(ours["sample_stats"].attrs["tuning_steps"]) == SAMPLER["tune"]
    assert json.loads(ours.attrs["sampler"]) == config.sampler_dict()


# --- settings a path cannot honour ----------------------------------------------------------------------------------

def test_a_setting_pm_samples_path_cannot_honour_is_an_error_everywhere(tmp_path, session_cache):
    """A nutpie setting for datasets pm.sample fits: batchfit check lists it under the structure, the
    compile stage refuses it when the reference's structure is the one, and the fit job fails exactly
    those datasets, naming the setting and the path; datasets of a structure nutpie samples are fitted."""
    from batchfit.sweep.check import check_model
    from batchfit.sweep.stages import run_compile

    frames = {"a_cont": sloped(1, 3.0, kind=0), "b_disc": sloped(2, 3, kind=1)}
    config = sweep(tmp_path, MIXED, frames, session_cache, {"store_gradient": True})
    report = check_model(config)
    by_path = {bucket.path: bucket for bucket in report.buckets.values()}
    assert set(by_path) == {"cached", "pymc"} and not by_path["cached"].settings
    assert [p.key for p in by_path["pymc"].settings] == ["sampler.store_gradient"] and not report.ok
    assert "sampler setting sampler.store_gradient cannot be honoured on this path" in "\n".join(report.lines())

    outcomes = {o.dataset: o for o in fit(config, sorted(frames))}
    assert outcomes["a_cont"].status == "ok"
    failed = outcomes["b_disc"]
    assert failed.status == "failed" and failed.error_type == "ConfigError"
    assert "sampler.store_gradient" in failed.message and "pm.sample with PyMC's own step methods" in failed.message
    assert "b_disc" in failed.message
    assert json.loads(config.layout.failure("b_disc").read_text())["message"] == failed.message

    # the discrete structure as the reference: the compile stage stops the sweep
    only_discrete = sweep(tmp_path / "disc", MIXED, {"b_disc": frames["b_disc"]}, session_cache,
                          {"store_gradient": True})
    with warnings.catch_warnings(), pytest.raises(ConfigError) as info:
        warnings.simplefilter("ignore")
        run_compile(only_discrete)
    assert info.value.key == "sampler.store_gradient" and "reference dataset 'b_disc'" in str(info.value)


@pytest.mark.parametrize(("settings", "key", "fragment"), [
    ({"step": {"mu": "metropolis"}}, "sampler.step", "this model's are all continuous and nutpie samples them"),
    ({"initvals": {"nope": 1.0}}, "sampler.initvals.nope", "'nope' is no free variable"),
    ({"initvals": {"a": 1.0}}, "sampler.initvals.a", "gives a start of shape (), but a has shape (3,)"),
    ({"initvals": {"sigma": -1.0}}, "sampler.initvals.sigma", "outside the support of sigma"),
    ({"jitter_rvs": ["zz"]}, "sampler.jitter_rvs", "'zz' is no free variable"),
])
def test_settings_that_do_not_fit_the_model_stop_the_compile_stage(tmp_path, session_cache, settings, key,
                                                                     fragment):
    from batchfit.sweep.stages import run_compile

    config = sweep(tmp_path, REGRESSION, {"d": grouped(4)}, session_cache, settings,
                   columns={"group": {"scope": "dataset"}})
    with pytest.raises(ConfigError) as info:
        run_compile(config)
    assert info.value.key == key and fragment in str(info.value) and "batchfit's cached path" in str(info.value)


@pytest.mark.parametrize(("settings", "key", "fragment"), [
    ({"adaptation": "draw_diag"}, "sampler.adaptation", "nutpie's setting"),
    ({"jitter_rvs": ["mu"]}, "sampler.jitter_rvs", "pm.sample jitters no start"),
    ({"step": {"k": "binary_metropolis"}}, "sampler.step.k", "binary_metropolis cannot sample k"),
    ({"step": {"mu": "slice", "sigma": "metropolis"}, "max_treedepth": 5}, "sampler.max_treedepth",
     "pm.sample uses for no variable"),
])
def test_settings_pm_samples_path_cannot_honour_are_named(settings, key, fragment):
    import pymc as pm

    from batchfit.fitting.sampler_settings import settings_problems

    with pm.Model() as model:
        k = pm.Binomial("k", n=10, p=0.5)
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("obs", mu + k, sigma, observed=np.array([1.0, 2.0]))
    sampler = config_from_dict({"model": "m.py", "datasets": ["d"], "sampler": settings}).sampler
    problems = settings_problems(sampler, "pymc", model)
    assert [p.key for p in problems] == [key] and fragment in problems[0].message, problems
    assert settings_problems(config_from_dict({"model": "m.py", "datasets": ["d"]}).sampler, "pymc", model) == []


# --- provenance ---------------------------------------------------------------------------------------------------

def test_a_changed_setting_makes_every_fit_pending_and_health_none(tmp_path, session_cache):
    """Every sampler setting is in the digest a fit records; health settings are not."""
    from batchfit.fitting.provenance import expected_digests
    from batchfit.sweep.plan import plan

    frames = {f"d{i}": grouped(10 + i) for i in range(2)}
    config = sweep(tmp_path, REGRESSION, frames, session_cache, {}, columns={"group": {"scope": "dataset"}})
    assert all(o.status == "ok" for o in fit(config, sorted(frames)))
    assert plan(config).batches == {}
    base = expected_digests(config, {d: tmp_path / "data" / f"{d}.csv" for d in frames}, record=False)
    for name, value in [("max_treedepth", 8), ("adaptation", "low_rank"), ("store_gradient", True),
                        ("initvals", {"mu": 0.1}), ("jitter_rvs", ()), ("discard_tuned_samples", False),
                        ("step", {"k": "metropolis"})]:
        changed = dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, **{name: value}))
        digests = expected_digests(changed, {d: tmp_path / "data" / f"{d}.csv" for d in frames}, record=False)
        assert all(digests[d] != base[d] for d in frames), name
        assert sorted(d for ids in plan(changed).batches.values() for d in ids) == sorted(frames), name
    healthier = dataclasses.replace(config, health=dataclasses.replace(config.health, max_r_hat=1.05))
    assert plan(healthier).batches == {}
