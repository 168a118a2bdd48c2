"""Which variables a fit keeps, summary.csv summarises and the status is scored on; summary.csv vs ArviZ.

One real batch of an ordered-logistic model (PyMC's default ``compute_p=True`` stores the n x K
probabilities ``y_obs_probs`` as a deterministic) is fitted once; collect runs on it with
different summary settings, which need no refit.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import arviz_stats
import numpy as np
import pandas as pd
import pymc as pm
import pytest
import xarray as xr
from arviz_base.utils import _subset_list

from batchfit.config import config_from_dict
from batchfit.errors import ConfigError
from batchfit.fitting.batch import fit_batch
from batchfit.fitting.provenance import sweep_parts
from batchfit.model.variables import DETERMINISTIC, FREE, OBSERVATION_SIZED, ROLE_ATTR, observation_sized, select_vars
from batchfit.outputs.collect import collect

MODEL = textwrap.dedent("""
    import numpy as np
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"groups": data.coords["group"]}) as model:
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            a = pm.Normal("a", 0.0, 1.0, dims="groups")
            b = pm.Normal("b", 0.0, 1.0)
            cutpoints = pm.Normal("cutpoints", np.array([-1.0, 1.0]), 1.0, shape=2,
                                  transform=pm.distributions.transforms.ordered)
            pm.Deterministic("a_centered", a - a.mean(), dims="groups")
            pm.Deterministic("spread", cutpoints[1] - cutpoints[0])
            pm.OrderedLogistic("y_obs", eta=a[group] + b * x, cutpoints=cutpoints, observed=y, shape=x.shape)
        return model
""")
FREE_VARS = {"a", "b", "cutpoints"}
SAMPLER = {"draws": 200, "tune": 200, "chains": 2, "seed": 7}


def write_data(root: Path) -> list[str]:
    """Two small ordinal datasets with different numbers of rows and groups."""
    rng = np.random.default_rng(3)
    for name, n, k in (("s1", 40, 3), ("s2", 25, 4)):
        x = rng.normal(size=n)
        group = [f"g{i % k}" for i in range(n)]
        y = np.digitize(x + rng.normal(size=n), [-0.5, 0.5])
        pd.DataFrame({"x": x, "group": group, "y": y}).to_csv(root / f"{name}.csv", index=False)
    return ["s1", "s2"]


def make_config(root: Path, cache: Path, **overrides):
    return config_from_dict({
        "model": str(root / "ordinal.py"), "datasets": [str(root / "data" / "*.csv")], "sampler": SAMPLER,
        "cache_dir": str(cache), "results_dir": str(root / "results"),
        "columns": {"group": {"scope": "dataset"}}, **overrides,
    })


@pytest.fixture(scope="module")
def ordinal(tmp_path_factory, session_cache):
    """The model file, data and one real fit of both datasets with the default settings."""
    root = tmp_path_factory.mktemp("ordinal")
    (root / "ordinal.py").write_text(MODEL)
    (root / "data").mkdir()
    ids = write_data(root / "data")
    config = make_config(root, session_cache)
    report = fit_batch(config, ids, batch_id="all")
    assert report.n_failed == 0, report.outcomes
    return {"root": root, "ids": ids, "config": config}


def read_summary(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, na_values=[""]).set_index("parameter")


# --- the fit keeps everything, with roles ----------------------------------------------------------

def test_fit_keeps_every_variable_with_its_role(ordinal):
    with xr.open_datatree(ordinal["config"].layout.fit("s1")) as tree:
        roles = {name: var.attrs[ROLE_ATTR] for name, var in tree["posterior"].ds.data_vars.items()}
        assert tree["posterior"].ds["y_obs_probs"].shape == (2, 200, 40, 3)
    assert roles == {"a": FREE, "b": FREE, "cutpoints": FREE, "a_centered": DETERMINISTIC,
                     "spread": DETERMINISTIC, "y_obs_probs": OBSERVATION_SIZED}


def test_observation_sized_deterministic_is_not_summarised_by_default(ordinal):
    config = ordinal["config"]
    collect(config, ordinal["ids"])
    summary = read_summary(config.layout.summary)
    variables = {re.sub(r"\[.*", "", p) for p in summary.index}
    assert variables == {"a", "b", "cutpoints", "a_centered", "spread"}
    with xr.open_datatree(config.layout.posteriors) as combined:
        assert set(combined["posterior"].ds.data_vars) == variables
        assert "y_obs_probs_dim_0" not in combined["posterior"].ds.dims


@pytest.mark.parametrize("summary_settings", [{}, {"ci_prob": 0.94}, {"ci_prob": 0.5, "ci_kind": "eti"}])
def test_summary_csv_equals_arviz_summary_on_the_same_draws(ordinal, summary_settings):
    """Every statistic column of summary.csv, for a real fit, against arviz_stats.summary."""
    config = make_config(ordinal["root"], ordinal["config"].cache_dir,
                         summary={"var_names": ["."], "filter_vars": "regex", **summary_settings})
    collect(config, ordinal["ids"])
    summary = pd.read_csv(config.layout.summary, keep_default_na=False, na_values=[""])
    for dataset_id in ordinal["ids"]:
        ours = summary[summary["dataset"] == dataset_id].set_index("parameter")
        with xr.open_datatree(config.layout.fit(dataset_id)) as tree:
            reference = arviz_stats.summary(tree, round_to="none", ci_prob=summary_settings.get("ci_prob"),
                                            ci_kind=summary_settings.get("ci_kind"))
        assert sorted(ours.index) == sorted(reference.index) and "y_obs_probs[0, 2]" in ours.index
        statistics = list(ours.columns[1:1 + len(reference.columns)])
        assert statistics == list(reference.columns)  # names and order, e.g. eti89_lb ... mcse_sd
        for column in reference.columns:
            np.testing.assert_allclose(ours[column], reference.loc[ours.index, column].astype(float),
                                       rtol=1e-10, atol=1e-12, err_msg=f"{dataset_id}: {column}")


def test_outputs_var_names_select_what_the_fit_keeps(ordinal, tmp_path):
    config = make_config(ordinal["root"], ordinal["config"].cache_dir, results_dir=str(tmp_path / "results"),
                         outputs={"var_names": ["~_probs", "~spread"], "filter_vars": "like"})
    assert fit_batch(config, ["s2"], batch_id="kept").n_failed == 0
    with xr.open_datatree(config.layout.fit("s2")) as tree:
        assert set(tree["posterior"].ds.data_vars) == {"a", "b", "cutpoints", "a_centered"}


def test_unknown_var_names_are_config_errors_naming_them(ordinal, tmp_path):
    root, cache = ordinal["root"], ordinal["config"].cache_dir
    config = make_config(root, cache, results_dir=str(tmp_path / "results"), outputs={"var_names": ["a", "betta"]})
    with pytest.raises(ConfigError, match=r"outputs\.var_names.*'betta'.*variables: a, b, cutpoints"):
        fit_batch(config, ["s1"], batch_id="bad")
    for key in ("summary", "health"):
        config = make_config(root, cache, **{key: {"var_names": ["^sig"], "filter_vars": "regex"}})
        with pytest.raises(ConfigError, match=rf"{key}\.var_names.*regular expression '\^sig'.*dataset 's1'"):
            collect(config, ordinal["ids"])


# --- selection semantics, against ArviZ ----------------------------------------------------------

NAMES = ["a", "a_centered", "b", "cutpoints", "spread", "y_obs_probs"]


@pytest.mark.parametrize(("var_names", "filter_vars"), [
    (["b", "a"], None), (["~a"], None), (["~a", "~b"], None),
    (["a"], "like"), (["~a"], "like"), (["_"], "like"),
    (["^a", "s$"], "regex"), (["~^a"], "regex"), (["~probs"], "regex"),
])
def test_selection_is_arviz_selection(var_names, filter_vars):
    expected = _subset_list(var_names, NAMES, filter_items=filter_vars, warn=False)
    assert select_vars(NAMES, var_names, filter_vars) == [n for n in NAMES if n in expected]


@pytest.mark.parametrize(("var_names", "filter_vars", "message"), [
    (["a", "sigma"], None, "variable 'sigma'"),
    (["~sigma"], None, "variable 'sigma'"),  # ArviZ only warns
    (["zz"], "like", "substring 'zz'"),
    (["~^z"], "regex", "regular expression '\\^z'"),
    (["a", "~b"], None, "mixes names"),  # ArviZ silently ignores 'a'
])
def test_selection_of_nothing_is_an_error(var_names, filter_vars, message):
    with pytest.raises(ValueError, match=message):
        select_vars(NAMES, var_names, filter_vars)


# --- which deterministics are observation-sized ----------------------------------------------------

def test_observation_sized_is_structural():
    """Shares a dimension with, or takes its shape from the data of, an observed variable;
    a per-group deterministic is not, even where there are as many groups as observations."""
    n = 4
    with pm.Model(coords={"groups": list("abcd"), "obs": range(n)}) as model:
        x = pm.Data("x", np.arange(n, dtype=float))
        group = pm.Data("group", np.arange(n))
        y = pm.Data("y", np.zeros(n))
        a = pm.Normal("a", dims="groups")
        mu = pm.Deterministic("mu", a[group] + x)
        pm.Deterministic("mu_named", mu, dims="obs")
        pm.Deterministic("a_centered", a - a.mean(), dims="groups")
        pm.Deterministic("a_plain", a * 2)
        pm.Deterministic("total", mu.sum())
        pm.Normal("y_obs", mu, 1.0, observed=y)
    assert observation_sized(model) == {"mu", "mu_named"}


def test_summary_and_health_settings_do_not_change_the_provenance(tmp_path):
    (tmp_path / "m.py").write_text("import pymc as pm\n")  # read for the user modules it imports (none)
    base = {"model": str(tmp_path / "m.py"), "datasets": ["*.csv"]}
    parts = sweep_parts(config_from_dict(base), model_sha256="0")
    other = config_from_dict({**base, "summary": {"var_names": ["a"], "ci_prob": 0.5},
                              "health": {"var_names": ["a"], "max_r_hat": 1.1}})
    assert sweep_parts(other, model_sha256="0") == parts
    kept = config_from_dict({**base, "outputs": {"var_names": ["a"]}})
    assert sweep_parts(kept, model_sha256="0") != parts
