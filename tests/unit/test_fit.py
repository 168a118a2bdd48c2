"""Compile once, fit many: one ``fit_batch`` swaps data into one compiled model.

A batch of ten simulated datasets (different numbers of rows and groups) is fitted once in this
process with log-likelihood and posterior predictive enabled, counting every numba and PyTensor
compilation per dataset; the other tests read its outputs. All fits use the session cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import xarray as xr
from testkit import HIERARCHICAL
from testkit.fits import SAMPLER, assert_groups_equal, make_config, read_tree, write_datasets

import batchfit
from batchfit.errors import BatchfitError, DatasetError, ModelContractError
from batchfit.fitting.batch import fit_batch
from batchfit.fitting.fitter import dataset_seed

IDS = [f"d{i}" for i in range(10)]


# --- the instrumented batch --------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fit-data")
    write_datasets(root, range(10))
    return root


@pytest.fixture(scope="module")
def batch10(data_dir, tmp_path_factory, hierarchical_entry):
    """d0..d9 and then d0 again in one batch, counting compilations after each dataset."""
    import numba
    from numba.core import compiler, event
    from pytensor.compile.maker import FunctionMaker

    import batchfit.fitting.batch as fit_module

    results = tmp_path_factory.mktemp("fit-results")
    config = make_config(results, hierarchical_entry, [str(data_dir / "*.csv")], extras=True)
    counts = {"numba_events": 0, "numba_pipelines": 0, "pytensor_functions": 0}
    snapshots, trees, outcomes = [], [], []

    class Listener(event.Listener):
        def on_start(self, ev):
            counts["numba_events"] += 1

        def on_end(self, ev):
            pass

    real_core, real_init, real_fit_datasets = (compiler.CompilerBase._compile_core, FunctionMaker.__init__,
                                               fit_module.fit_datasets)

    def counting_core(self):
        counts["numba_pipelines"] += 1
        return real_core(self)

    def counting_init(self, *args, **kwargs):
        counts["pytensor_functions"] += 1
        return real_init(self, *args, **kwargs)

    def recording_fit_datasets(fitter, claims, *, threads):
        snapshots.append(dict(counts))  # after compile_model and the Fitter's set-up
        for index, outcome in real_fit_datasets(fitter, claims, threads=threads):
            snapshots.append(dict(counts))
            outcomes.append(outcome)
            trees.append(read_tree(config.layout.fit(outcome.dataset)) if outcome.status == "ok" else None)
            yield index, outcome

    ids = [*IDS, "d0"]
    with pytest.MonkeyPatch.context() as mp, event.install_listener("numba:compile", Listener()):
        mp.setattr(compiler.CompilerBase, "_compile_core", counting_core)
        mp.setattr(FunctionMaker, "__init__", counting_init)
        mp.setattr(fit_module, "fit_datasets", recording_fit_datasets)
        before = dict(counts)
        report = fit_batch(config, ids, batch_id="ten", threads=2)
        # the counters work: a jit function and a PyTensor function are both seen
        numba.njit(lambda x: x + 1)(1)
        import pytensor
        import pytensor.tensor as pt

        v = pt.dvector("v")
        pytensor.function([v], v * 2.0, mode="FAST_COMPILE")
        control = dict(counts)
    return {"config": config, "ids": ids, "report": report, "before": before, "snapshots": snapshots,
            "trees": trees, "outcomes": outcomes, "control": control, "data_dir": data_dir}


# --- 1. no recompilation inside a batch ------------------------------------------------------------

def test_no_compilation_after_the_first_dataset(batch10):
    assert [o.status for o in batch10["outcomes"]] == ["ok"] * 11, batch10["outcomes"]
    assert batch10["report"].compile.startswith("cache hit"), "the session cache holds the hierarchical model"
    snapshots = batch10["snapshots"]
    assert len(snapshots) == 12
    after_first = snapshots[1]
    for i, snap in enumerate(snapshots[2:], start=2):
        assert snap == after_first, f"compilations while fitting dataset {i} ({batch10['ids'][i - 1]}): {snapshots}"
    # the set-up did compile PyTensor functions (initial point, shapes, log-likelihood,
    # predictive), so the counter is live; the controls prove both counters count
    assert snapshots[0]["pytensor_functions"] > batch10["before"]["pytensor_functions"]
    control, last = batch10["control"], snapshots[-1]
    assert control["numba_events"] > last["numba_events"] and control["numba_pipelines"] > last["numba_pipelines"]
    assert control["pytensor_functions"] == last["pytensor_functions"] + 1


# --- 2. different sizes share one compile; outputs carry each dataset's coords ----------------------

def test_each_fit_has_its_own_groups_and_rows(batch10):
    sizes, keys = set(), set()
    for dataset_id, tree in zip(batch10["ids"], batch10["trees"], strict=True):
        frame = pd.read_csv(batch10["data_dir"] / f"{dataset_id}.csv")
        labels = sorted(frame["group"].unique())
        with xr.open_datatree(batch10["config"].layout.fit(dataset_id)) as fit:
            post = fit["posterior"].ds
            assert list(post["a"].dims) == ["chain", "draw", "groups"]
            assert list(post["groups"].values) == labels
            keys.add(fit.attrs["compile_key"])
        assert tree["posterior"]["a"].shape == (2, 100, len(labels))
        assert tree["log_likelihood"]["y_obs"].shape == (2, 100, len(frame))
        assert np.array_equal(tree["observed_data"]["y_obs"], frame["y"].to_numpy())
        assert np.array_equal(tree["constant_data"]["x"], frame["x"].to_numpy())
        sizes.add((len(labels), len(frame)))
    assert len(sizes) >= 8, sizes  # really different shapes ...
    assert len(keys) == 1  # ... one compile


# --- 3. no stale values -----------------------------------------------------------------------------

def test_refitting_a_dataset_later_in_the_batch_gives_identical_results(batch10):
    first, again = batch10["trees"][0], batch10["trees"][-1]
    assert batch10["ids"][0] == batch10["ids"][-1] == "d0"
    assert_groups_equal(first, again)
    # the datasets in between really were different
    assert batch10["trees"][-2]["posterior"]["a"].shape != first["posterior"]["a"].shape


# --- 4. position independence ------------------------------------------------------------------------

def test_posterior_does_not_depend_on_position_in_batch(batch10, tmp_path, session_cache):
    data_dir = batch10["data_dir"]
    x = "d3"
    runs = {"in the batch of 11": batch10["trees"][3]["posterior"]}
    for name, ids in {"alone": [x], "first of 3": [x, "d7", "d1"], "last of 2": ["d8", x]}.items():
        config = make_config(tmp_path / name.replace(" ", "-"), session_cache, [str(data_dir / "*.csv")])
        report = fit_batch(config, ids, batch_id="b")
        assert all(o.status == "ok" for o in report.outcomes), report.outcomes
        runs[name] = read_tree(config.layout.fit(x))["posterior"]
        with xr.open_datatree(config.layout.fit(x)) as tree:
            assert tree.attrs["seed"] == dataset_seed(SAMPLER["seed"], x)
    reference = runs.pop("alone")
    for name, post in runs.items():
        assert sorted(post) == sorted(reference)
        for var in reference:
            assert np.array_equal(post[var], reference[var]), f"{var} differs when {x} is fitted {name}"


def test_dataset_seeds_differ_between_ids_and_global_seeds_and_fit_nutpie_and_netcdf():
    ids = ["a", "b", "A", "", "1", "store_001", "store_010", "d3"]
    seeds = {(g, i): dataset_seed(g, i) for g in (0, 1, 2, 12, 2026) for i in ids}
    assert len(set(seeds.values())) == len(seeds), "two (global seed, id) pairs share a seed"
    # nutpie takes an unsigned 64-bit seed; the fit stores it as a NetCDF int64 attribute
    assert all(0 <= s <= np.iinfo(np.int64).max for s in seeds.values()), seeds


def test_dataset_seed_is_the_same_in_another_process():
    """A job on another machine or a re-run must draw the same: no per-process hash randomisation."""
    pairs = [(2026, "d3"), (1, "store_001"), (7, "")]
    code = "import json, sys; from batchfit.fitting.fitter import dataset_seed; " \
           "print(json.dumps([dataset_seed(g, i) for g, i in json.loads(sys.argv[1])]))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(pairs)], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == [dataset_seed(g, i) for g, i in pairs]


# --- 5. contract errors ------------------------------------------------------------------------------

BAKED_MODEL = textwrap.dedent("""
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            b = pm.Normal("b", 0.0, 1.0)
            pm.Normal("y_obs", b * data["x"], 1.0, observed=pm.Data("y", data["y"]))
        return model
""")

NO_COLUMN_MODEL = textwrap.dedent("""
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            x = pm.Data("slope_x", data["x"])
            b = pm.Normal("b", 0.0, 1.0)
            pm.Normal("y_obs", b * x, 1.0, observed=pm.Data("y", data["y"]))
        return model
""")


def _dataset(dataset_id: str, **arrays):
    from batchfit.data.dataset import Dataset

    return Dataset(id=dataset_id, path=Path(f"/data/{dataset_id}.csv"), arrays=arrays, coords={})


def test_column_baked_in_as_constant_is_named_with_the_fix(tmp_path):
    from batchfit.model.model_file import baked_values, build_model, load_model_file

    (tmp_path / "baked.py").write_text(BAKED_MODEL)
    data = _dataset("shop7", x=np.linspace(0.0, 1.0, 9), y=np.arange(9.0))
    text = baked_values(build_model(load_model_file(tmp_path / "baked.py"), data), data)
    assert "column 'x'" in text and "'shop7'" in text and "'y_obs'" in text
    assert "pm.Data('x', data['x'])" in text


def test_data_container_without_a_column_is_named_with_the_fix(tmp_path):
    from batchfit.model.model_file import build_model, load_model_file

    (tmp_path / "nocol.py").write_text(NO_COLUMN_MODEL)
    data = _dataset("shop8", x=np.linspace(0.0, 1.0, 9), y=np.arange(9.0))
    with pytest.raises(ModelContractError) as info:
        build_model(load_model_file(tmp_path / "nocol.py"), data)
    text = str(info.value)
    assert "'slope_x'" in text and "'shop8'" in text and "columns are: x, y" in text
    assert "Name each pm.Data after the column it holds" in text


# build_model of the hierarchical example, except that some datasets break the contract: one
# with a column 'w' uses it directly (baked in); one with 'offset_col' puts it in a pm.Data
# named 'offset', which has no column. For the others it builds exactly the bundled model, so
# the batch loads the session cache's entry.
CONTRACT_MODEL = textwrap.dedent("""
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"groups": data.coords["group"]}) as model:
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            mu_a = pm.Normal("mu_a", 0.0, 5.0)
            sigma_a = pm.HalfNormal("sigma_a", 2.0)
            a = pm.Normal("a", mu_a, sigma_a, dims="groups")
            b = pm.Normal("b", 0.0, 2.0)
            sigma = pm.HalfNormal("sigma", 2.0)
            mu = a[group] + b * x
            if "w" in data:
                mu = mu + data["w"]
            if "offset_col" in data:
                mu = mu + pm.Data("offset", data["offset_col"])
            pm.Normal("y_obs", mu, sigma, observed=y, shape=x.shape)
        return model
""")


@pytest.fixture
def contract_sweep(tmp_path):
    """Datasets a_ok, e_ok (fine), b_baked, c_nodata, d_text (a text x) and f_rank.nc (a 2-D x)."""
    data = tmp_path / "data"
    paths = write_datasets(data, [1, 2])
    base = pd.read_csv(paths["d1"])
    paths["d1"].rename(data / "a_ok.csv")
    paths["d2"].rename(data / "e_ok.csv")
    base.assign(w=np.linspace(0.0, 1.0, len(base))).to_csv(data / "b_baked.csv", index=False)
    base.assign(offset_col=np.linspace(0.0, 1.0, len(base))).to_csv(data / "c_nodata.csv", index=False)
    base.assign(x=base["x"].astype(str).where(base.index != 3, "abc")).to_csv(data / "d_text.csv", index=False)
    codes = pd.factorize(base["group"], sort=True)[0]
    xr.Dataset({"x": (("row", "k"), np.c_[base["x"], base["x"]]), "y": ("row", base["y"].to_numpy()),
                "group": ("row", codes)}).to_netcdf(data / "f_rank.nc")
    (tmp_path / "model.py").write_text(CONTRACT_MODEL)
    return tmp_path


def _failure(config, dataset_id):
    return json.loads(config.layout.failure(dataset_id).read_text())


def test_contract_failures_are_recorded_and_the_batch_goes_on(contract_sweep, hierarchical_entry):
    root = contract_sweep
    config = make_config(root / "results", hierarchical_entry,
                         [str(root / "data" / "*.csv"), str(root / "data" / "*.nc")],
                         model=root / "model.py", on_error="continue")
    ids = ["a_ok", "b_baked", "c_nodata", "d_text", "f_rank", "e_ok"]
    report = fit_batch(config, ids, batch_id="contract")
    assert report.compile.startswith("cache hit"), "the good datasets build the bundled model's structure"
    assert {o.dataset: o.status for o in report.outcomes} == {
        "a_ok": "ok", "b_baked": "ok", "c_nodata": "failed", "d_text": "failed", "f_rank": "failed", "e_ok": "ok"}
    assert config.layout.fit("a_ok").is_file() and config.layout.fit("e_ok").is_file()
    # b_baked's column 'w' is baked into its model: fitted by a compile of its own, as pm.sample would
    with xr.open_datatree(config.layout.fit("b_baked")) as tree:
        assert tree.attrs["sampler_path"] == "nutpie" and tree.attrs["compile_key"] == ""

    expected = {
        "c_nodata": ["'offset'", "'c_nodata'", "no column", "Name each pm.Data after the column it holds"],
        "d_text": ["column 'x'", "dataset 'd_text'", "non-numeric values such as 'abc'", "needs numbers"],
        "f_rank": ["column 'x'", "dataset 'f_rank'", "2 dimension(s)", "needs 1"],
    }
    for dataset_id, parts in expected.items():
        record = _failure(config, dataset_id)
        assert record["dataset"] == dataset_id and record["stage"] == "build", record
        assert record["path"].endswith(dataset_id + (".nc" if dataset_id == "f_rank" else ".csv"))
        for part in parts:
            assert part in record["message"], (part, record["message"])
        assert not config.layout.fit(dataset_id).exists()
    manifest = json.loads(config.layout.batch_manifest("contract").read_text())
    assert list(manifest["datasets"]) == ids
    assert manifest["datasets"]["d_text"]["stage"] == "build"
    assert manifest["datasets"]["d_text"]["error_type"] == DatasetError.__name__


def test_on_error_stop_raises_after_writing_the_manifest(contract_sweep, session_cache):
    root = contract_sweep
    config = make_config(root / "results", session_cache, [str(root / "data" / "*.csv")],
                         model=root / "model.py", on_error="stop")
    with pytest.raises(BatchfitError, match="c_nodata") as info:
        fit_batch(config, ["a_ok", "c_nodata", "e_ok"], batch_id="stop")
    assert "build" in str(info.value) and "'offset'" in str(info.value)
    manifest = json.loads(config.layout.batch_manifest("stop").read_text())
    assert {d: o["status"] for d, o in manifest["datasets"].items()} == {"a_ok": "ok", "c_nodata": "failed"}
    assert config.layout.fit("a_ok").is_file(), "fits written before the failure stay on disk"
    assert not config.layout.fit("e_ok").exists()
    assert _failure(config, "c_nodata")["stage"] == "build"


def test_integer_column_is_cast_to_the_models_float(tmp_path, session_cache):
    """Not a contract error: whole-number x values read as int64 are cast to the reference's float64."""
    data = tmp_path / "data"
    paths = write_datasets(data, [1])
    frame = pd.read_csv(paths["d1"])
    frame.assign(x=np.round(frame["x"] * 10).astype(int)).to_csv(data / "d1int.csv", index=False)
    config = make_config(tmp_path / "results", session_cache, [str(data / "*.csv")])
    report = fit_batch(config, ["d1int"], batch_id="ints")
    assert [o.status for o in report.outcomes] == ["ok"], report.outcomes
    with xr.open_datatree(config.layout.fit("d1int")) as tree:
        assert tree["constant_data"].ds["x"].dtype == np.float64


# --- 6. output layout ------------------------------------------------------------------------------

def test_fit_file_layout(batch10):
    import arviz

    config, dataset_id = batch10["config"], "d4"
    path = config.layout.fit(dataset_id)
    n_obs = len(pd.read_csv(batch10["data_dir"] / f"{dataset_id}.csv"))
    with xr.open_datatree(path) as tree:
        groups = {name.strip("/") for name in tree.groups} - {""}
        assert {"posterior", "sample_stats", "observed_data", "constant_data",
                "log_likelihood", "posterior_predictive"} <= groups
        for group in ("log_likelihood", "posterior_predictive"):
            assert tree[group].ds["y_obs"].shape == (2, 100, n_obs)
            assert tree[group].ds["y_obs"].dims[:2] == ("chain", "draw")
        assert set(tree["posterior"].ds.data_vars) == {"mu_a", "sigma_a", "a", "b", "sigma"}
        assert {"diverging"} <= set(tree["sample_stats"].ds.data_vars)
        constant = tree["constant_data"].ds
        assert set(constant.data_vars) == {"x", "group", "group_labels"}  # a label column keeps its labels
        labels = sorted(set(pd.read_csv(batch10["data_dir"] / f"{dataset_id}.csv")["group"]))
        assert constant["group_labels"].values.tolist() == labels
        attrs = dict(tree.attrs)
    assert attrs["batchfit_version"] == batchfit.__version__
    assert attrs["dataset"] == dataset_id
    assert attrs["model_hash"] == hashlib.sha256(HIERARCHICAL.read_bytes()).hexdigest()
    assert int(attrs["seed"]) == dataset_seed(SAMPLER["seed"], dataset_id)
    assert json.loads(attrs["sampler"]) == config.sampler_dict()

    data = arviz.from_netcdf(path)
    assert np.array_equal(np.asarray(data["posterior"]["b"]), batch10["trees"][4]["posterior"]["b"])
    assert np.asarray(data["log_likelihood"]["y_obs"]).shape == (2, 100, n_obs)


def test_fit_without_extras_has_no_extra_groups(batch10, tmp_path, session_cache):
    config = make_config(tmp_path / "results", session_cache, [str(batch10["data_dir"] / "*.csv")])
    fit_batch(config, ["d2"], batch_id="plain")
    with xr.open_datatree(config.layout.fit("d2")) as tree:
        groups = {name.strip("/") for name in tree.groups}
        assert "log_likelihood" not in groups and "posterior_predictive" not in groups
        assert {"posterior", "sample_stats", "observed_data", "constant_data"} <= groups


# --- 7. the log-likelihood is right ------------------------------------------------------------------

def test_log_likelihood_matches_scipy(batch10):
    for index, dataset_id, (chain, draw) in ((2, "d2", (1, 17)), (7, "d7", (0, 99))):
        frame = pd.read_csv(batch10["data_dir"] / f"{dataset_id}.csv")
        with xr.open_datatree(batch10["config"].layout.fit(dataset_id)) as tree:
            post = tree["posterior"].ds.isel(chain=chain, draw=draw)
            a = dict(zip(post["groups"].values, post["a"].values, strict=True))
            b, sigma = float(post["b"]), float(post["sigma"])
            loglik = tree["log_likelihood"].ds["y_obs"].values[chain, draw]
        mu = np.array([a[g] for g in frame["group"]]) + b * frame["x"].to_numpy()
        expected = scipy.stats.norm.logpdf(frame["y"].to_numpy(), mu, sigma)
        np.testing.assert_allclose(loglik, expected, rtol=1e-10, atol=1e-12)
        # the check can tell draws apart: another draw's values do not match these parameters
        other = batch10["trees"][index]["log_likelihood"]["y_obs"][1 - chain, (draw + 1) % 100]
        assert not np.allclose(other, expected)


@pytest.mark.parametrize("kind", ["shared", "integer shared", "constant", "expression"])
def test_observed_data_group_reads_every_kind_of_observed_value(kind, monkeypatch):
    """Observed data may be pm.Data, integer pm.Data (PyMC casts it), a plain array or an expression.

    Only a general expression is evaluated (compiling a small Python-linker function); the
    others are read without compiling anything per dataset.
    """
    import pymc as pm
    from pytensor.graph.basic import Variable

    from batchfit.model.model_file import observed_and_constant_data

    y = np.array([1, 2, 4]) if kind == "integer shared" else np.array([1.5, 2.0, 4.0])
    with pm.Model() as model:
        observed = {"shared": lambda: pm.Data("y", y), "integer shared": lambda: pm.Data("y", y),
                    "constant": lambda: y, "expression": lambda: pm.Data("y", y / 2.0) * 2.0}[kind]()
        pm.Normal("y_obs", pm.Normal("mu"), 1.0, observed=observed)
    evaluated = []
    real_eval = Variable.eval
    monkeypatch.setattr(Variable, "eval", lambda self, *a, **k: evaluated.append(self) or real_eval(self, *a, **k))
    observed_groups, _ = observed_and_constant_data(model)
    np.testing.assert_array_equal(observed_groups["y_obs"][1], y)
    assert len(evaluated) == (kind == "expression")


def test_per_process_functions_compile_no_c_code(monkeypatch):
    """Initial points and shapes run on PyTensor's Python implementations, a Scan's included.

    PyMC's LKJCorr puts a Scan in the initial point, whose inner function PyTensor links with C
    even under FAST_COMPILE: g++ for seconds in every fit job on an empty cache.
    """
    import pymc as pm
    from pytensor.link.c.op import COp

    from batchfit.compile.sampler import SamplerFunctions

    def no_c(op, *args, **kwargs):
        raise AssertionError(f"{op} was compiled to C")

    monkeypatch.setattr(COp, "make_c_thunk", no_c)
    with pm.Model() as model:
        pm.LKJCorr("corr", n=3, eta=2.0)
        pm.HalfNormal("sd", 1.5, shape=3)
    functions = SamplerFunctions(model)
    free, _ = functions.shapes()
    assert free == [(3,), (3,)]
    start = functions.initial_point(functions.free_names, functions.load_values(model))(1)
    assert start.shape == (6,) and np.isfinite(start).all()


def test_datasets_on_the_cached_path_are_built_without_creation_tracebacks(data_dir, tmp_path, hierarchical_entry):
    """PyTensor's per-node stack walk is skipped where a dataset's graph is only read for its data;
    the reference model, whose graphs are compiled, keeps its tracebacks, and the flag is restored."""
    import pytensor

    from batchfit.compile.structures import CACHED
    from batchfit.fitting.fitter import Fitter, prepare

    config = make_config(tmp_path / "results", hierarchical_entry, [str(data_dir / "*.csv")])
    cache, reader, ref = prepare(config)
    fitter = Fitter(config, ref, cache)
    assert fitter.reference.path == CACHED
    limit = pytensor.config.traceback__limit
    assert limit != 0 and all(rv.tag.trace for rv in ref.model.free_RVs)

    model = fitter.build(reader.load("d3"))
    assert model.free_RVs and not any(rv.tag.trace for rv in model.free_RVs)
    assert pytensor.config.traceback__limit == limit
