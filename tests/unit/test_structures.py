"""Datasets whose models differ in structure are all fitted: one compile per structure, and a
structure batchfit's cached path cannot take goes through nutpie's own compile, as pm.sample does.
Every posterior is checked against ``pm.sample(nuts_sampler="nutpie")`` on the same data, which
compiles through JAX in the reference venv (posterior_checks.reference_posteriors).
"""

from __future__ import annotations

import logging
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import DISCRETE_FREE, OBJECT_MODE_MODEL
from testkit.posterior_checks import assert_same_posterior, reference_posteriors

from batchfit.config import config_from_dict
from batchfit.fitting.batch import fit_batch
from batchfit.sweep.check import check_model

SAMPLER = {"draws": 400, "tune": 400, "chains": 2, "seed": 3}

# The number of groups enters as a Python int: every group count is another structure.
PYTHON_INT_SHAPE = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        n_groups = len(data.coords["group"])
        with pm.Model() as model:
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            a = pm.Normal("a", 0.0, 2.0, shape=(n_groups,))
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Normal("obs", a[group], sigma, observed=y, shape=y.shape)
        return model
""")

# A shared variable that is not pm.Data: batchfit cannot swap it, nutpie's compile can fit it.
PLAIN_SHARED = textwrap.dedent("""\
    import pymc as pm
    import pytensor

    def build_model(data):
        offset = pytensor.shared(float(data["y"].mean()), name="offset")
        with pm.Model() as model:
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 2.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Normal("obs", mu + offset, sigma, observed=y, shape=y.shape)
        return model
""")



def grouped(seed: int, n_groups: int, n_rows: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng([seed, n_groups])
    codes = np.arange(n_rows) % n_groups
    means = rng.normal(0.0, 1.0, n_groups)
    return pd.DataFrame({"group": [f"g{c}" for c in codes], "y": (means[codes] + rng.normal(0, 0.5, n_rows)).round(4)})


def sweep(tmp_path: Path, source: str, frames: dict[str, pd.DataFrame], session_cache: Path, **overrides):
    model = tmp_path / "model.py"
    model.write_text(source)
    data = tmp_path / "data"
    data.mkdir()
    for name, frame in frames.items():
        frame.to_csv(data / f"{name}.csv", index=False)
    config = config_from_dict({"model": str(model), "datasets": [str(data / "*.csv")], "sampler": SAMPLER,
                               "cache_dir": str(session_cache), "results_dir": str(tmp_path / "results"),
                               "columns": {"group": {"scope": "dataset"}}, **overrides})
    return config


def loaded(config, dataset_id: str):
    """The dataset loaded exactly as batchfit loads it."""
    from batchfit.data.coding import sweep_coding
    from batchfit.data.dataset import load_dataset
    from batchfit.data.discovery import discover_datasets

    paths = discover_datasets(config.data_sources)
    return load_dataset(dataset_id, paths[dataset_id], sweep_coding(config.data_sources, paths))


def reference(config, dataset_ids: list[str], python: Path) -> list[xr.Dataset]:
    """pm.sample with nutpie on each dataset (posterior_checks.reference_posteriors, in one process of
    the reference venv's `python`)."""
    return reference_posteriors(python, [(config.model, loaded(config, d)) for d in dataset_ids],
                                draws=SAMPLER["draws"], tune=SAMPLER["tune"], chains=2, random_seed=17)


def pymc_reference(config, dataset_id: str, **sample) -> xr.Dataset:
    """pm.sample with the ``nuts_sampler`` that ``sample`` names, in this process (no JAX involved)."""
    import pymc as pm

    from batchfit.model.model_file import build_model, load_model_file

    settings = {"draws": SAMPLER["draws"], "tune": SAMPLER["tune"], "chains": 2, "random_seed": 17, **sample}
    with build_model(load_model_file(config.model), loaded(config, dataset_id)):
        return pm.sample(progressbar=False, **settings).posterior


def attrs_and_posterior(config, dataset_id: str) -> tuple[dict, xr.Dataset]:
    with xr.open_datatree(config.layout.fit(dataset_id)) as tree:
        return dict(tree.attrs), tree["posterior"].to_dataset().load()


def test_datasets_of_different_structure_are_each_fitted_with_their_own_compile(tmp_path, session_cache,
                                                                               reference_python):
    frames = {"three": grouped(1, 3), "four": grouped(2, 4), "three_b": grouped(3, 3)}
    config = sweep(tmp_path, PYTHON_INT_SHAPE, frames, session_cache)
    report = fit_batch(config, sorted(frames), batch_id="b")
    assert [o.status for o in report.outcomes] == ["ok"] * 3, report.outcomes
    attrs = {name: attrs_and_posterior(config, name)[0] for name in frames}
    assert attrs["three"]["structure"] == attrs["three_b"]["structure"] != attrs["four"]["structure"]
    assert {a["sampler_path"] for a in attrs.values()} == {"cached"}
    assert attrs["three"]["compile_key"] != attrs["four"]["compile_key"]
    names = ["four", "three_b"]
    for name, expected in zip(names, reference(config, names, reference_python), strict=True):
        assert_same_posterior(attrs_and_posterior(config, name)[1], expected, label=name)


def test_too_many_structures_is_an_error_that_says_how_to_fix_it(tmp_path, session_cache):
    frames = {"a": grouped(1, 2), "b": grouped(2, 3), "c": grouped(3, 2)}
    config = sweep(tmp_path, PYTHON_INT_SHAPE, frames, session_cache, max_structures=1)
    outcomes = {o.dataset: o for o in fit_batch(config, sorted(frames), batch_id="b").outcomes}
    assert outcomes["a"].status == outcomes["c"].status == "ok"
    assert outcomes["b"].status == "failed" and outcomes["b"].stage == "compile"
    assert "max_structures: 1" in outcomes["b"].message and "dims=" in outcomes["b"].message
    assert "'b'" in outcomes["b"].message


# The observed values enter as a NumPy array, not pm.Data: baked into each dataset's model.
BAKED_OBSERVED = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 5.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Normal("obs", mu, sigma, observed=data["y"])
        return model
""")


def fitted_through_nutpie(tmp_path, session_cache, reference_python, source: str, frames: dict[str, pd.DataFrame],
                          warned: str) -> list[str]:
    """Sweep ``frames``: every dataset must be fitted through nutpie's own compile with the posterior
    pm.sample gives on its own data. Returns the warnings containing ``warned``."""
    config = sweep(tmp_path, source, frames, session_cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fit_batch(config, sorted(frames), batch_id="b")
    assert [o.status for o in report.outcomes] == ["ok"] * len(frames), report.outcomes
    names = sorted(frames)
    for name, expected in zip(names, reference(config, names, reference_python), strict=True):
        attrs, posterior = attrs_and_posterior(config, name)
        assert attrs["sampler_path"] == "nutpie" and attrs["compile_key"] == ""
        # the values differ per dataset: each must be sampled with its own, not the first one's
        assert_same_posterior(posterior, expected, label=name)
    return [str(w.message) for w in caught if warned in str(w.message)]


def test_a_model_with_baked_in_values_is_fitted_per_dataset_with_its_own_values(tmp_path, session_cache, caplog,
                                                                                reference_python):
    """Two datasets of equal size whose observed values are baked in (a compiled model shared
    between them would give both the first one's posterior), with one warning, and each
    dataset's structure built once (the reference dataset's is also the job's reference)."""
    frames = {f"d{i}": grouped(i, 2).assign(y=lambda f, i=i: f["y"] + 4.0 * i) for i in range(2)}
    caplog.set_level(logging.INFO, logger="batchfit")
    messages = fitted_through_nutpie(tmp_path, session_cache, reference_python, BAKED_OBSERVED, frames,
                                     "baked into the model")
    assert len(messages) == 1 and "column 'y'" in messages[0], messages
    for name in frames:
        assert caplog.text.count(f"{name}: fitted through nutpie's own compile") == 1, caplog.text


def test_a_structure_the_cached_path_cannot_take_is_fitted_through_nutpie_with_a_warning(tmp_path, session_cache,
                                                                                         reference_python):
    frames = {f"d{i}": grouped(i, 2).assign(y=lambda f, i=i: f["y"] + 3.0 * i) for i in range(3)}
    messages = fitted_through_nutpie(tmp_path, session_cache, reference_python, PLAIN_SHARED, frames,
                                     "compile_pymc_model")
    assert len(messages) == 1 and "offset" in messages[0], messages  # one warning, naming the reason


def test_an_object_mode_op_sends_its_structure_to_nutpie_before_compiling_callbacks(tmp_path, session_cache, caplog,
                                                                                     reference_python):
    """A cached callback cannot call an object-mode op: the compile says so, naming the op, and the
    structure is fitted through nutpie's own compile without first failing on the cached path."""
    frames = {"d": pd.DataFrame({"group": "g0", "y": np.round(np.random.default_rng(5).normal(0.6, 0.3, 20), 4)})}
    config = sweep(tmp_path, OBJECT_MODE_MODEL, frames, session_cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fit_batch(config, ["d"], batch_id="b")
    assert [o.status for o in report.outcomes] == ["ok"], report.outcomes
    messages = [str(w.message) for w in caught if "compile_pymc_model" in str(w.message)]
    assert len(messages) == 1 and "PythonSoftplus" in messages[0] and "object mode" in messages[0], messages
    assert "cached path failed" not in caplog.text
    attrs, posterior = attrs_and_posterior(config, "d")
    assert attrs["sampler_path"] == "nutpie"
    assert_same_posterior(posterior, reference(config, ["d"], reference_python)[0], label="d")

# A slope known to be a whole number: a discrete free variable, which NUTS cannot sample. pm.sample
# gives it PyMC's Metropolis (and the intercept and noise NUTS); nutpie refuses the model. (It mixes
# well, so the posteriors can be compared in Monte Carlo error; a change point's often does not.)


def whole_slope(seed: int, slope: int, n_rows: int = 40) -> pd.DataFrame:
    x = np.linspace(-1.0, 1.0, n_rows)
    return pd.DataFrame({"x": x, "y": 1.0 + slope * x + np.random.default_rng(seed).normal(0.0, 2.0, n_rows)})


def test_a_model_with_discrete_free_variables_is_fitted_by_pm_samples_own_step_methods(tmp_path, session_cache):
    """Not a dead end: each dataset is sampled as plain ``pm.sample()`` samples this model (NUTS and
    Metropolis), with one warning naming the variable, and the posterior is its own data's."""
    frames = {"three": whole_slope(1, 3), "seven": whole_slope(2, 7)}
    settings = {"draws": 1000, "tune": 1000}
    config = sweep(tmp_path, DISCRETE_FREE, frames, session_cache, sampler={**SAMPLER, **settings}, columns={})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fit_batch(config, sorted(frames), batch_id="b")
    assert [o.status for o in report.outcomes] == ["ok"] * len(frames), report.outcomes
    messages = [str(w.message) for w in caught if "PyMC's own step methods" in str(w.message)]
    assert len(messages) == 1 and "discrete free variable(s) k:" in messages[0], messages
    checked = check_model(config)  # says so before any sampling, too
    [bucket] = checked.buckets.values()
    assert bucket.path == "pymc" and "variable(s) k:" in bucket.reasons[0] and not checked.ok
    assert "pm.sample's own step methods" in "\n".join(checked.lines())
    for name in frames:
        attrs, posterior = attrs_and_posterior(config, name)
        assert attrs["sampler_path"] == "pymc" and attrs["compile_key"] == ""
        # nuts_sampler=None: what pm.sample picks for the model itself (PyMC's samplers here)
        expected = pymc_reference(config, name, nuts_sampler=None, cores=1, **settings)
        assert_same_posterior(posterior, expected, label=name)


# Only a discrete free variable: no NUTS step at all, so no NUTS settings and no divergences.
ONLY_DISCRETE = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            y = pm.Data("y", data["y"])
            k = pm.Binomial("k", n=20, p=0.5)
            pm.Normal("obs", k, 2.0, observed=y, shape=y.shape)
        return model
""")


def test_a_model_with_only_discrete_free_variables_is_fitted_and_records_no_divergences(tmp_path, session_cache):
    frames = {"d": pd.DataFrame({"y": np.random.default_rng(4).normal(13.0, 2.0, 5).round(3)})}
    config = sweep(tmp_path, ONLY_DISCRETE, frames, session_cache, columns={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fit_batch(config, ["d"], batch_id="b")
    assert [o.status for o in report.outcomes] == ["ok"], report.outcomes
    attrs, posterior = attrs_and_posterior(config, "d")
    assert attrs["sampler_path"] == "pymc"
    assert_same_posterior(posterior, pymc_reference(config, "d", nuts_sampler=None, cores=1), label="d")
    with xr.open_datatree(config.layout.fit("d")) as tree:  # collect counts divergences from it
        assert not tree["sample_stats"]["diverging"].values.any()


@pytest.mark.parametrize("n_rows", [30])
def test_nutpie_path_swaps_pm_data_between_datasets_of_equal_sizes(tmp_path, session_cache, n_rows, reference_python):
    source = PLAIN_SHARED.replace('float(data["y"].mean())', "0.5")  # the same baked value everywhere
    frames = {f"d{i}": grouped(10 + i, 2, n_rows).assign(y=lambda f, i=i: f["y"] * (1 + i)) for i in range(2)}
    config = sweep(tmp_path, source, frames, session_cache)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fit_batch(config, sorted(frames), batch_id="b")
    assert [o.status for o in report.outcomes] == ["ok"] * 2, report.outcomes
    posterior = attrs_and_posterior(config, "d1")[1]
    assert_same_posterior(posterior, reference(config, ["d1"], reference_python)[0], label="d1 after d0 (with_data)")
