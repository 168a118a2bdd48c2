"""The private APIs batchfit relies on (all used in ``batchfit.compat``) still exist.

Each test names the API, so an upgrade that removes or renames one fails here with that name,
not as "damaged cache entry" in every job or as a silent change of behaviour.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest


def test_pymc_density_dispatchers_hold_custom_dist_functions():
    import pymc as pm

    from batchfit.compat.pymc import dispatched_densities

    def logp(value, mu):
        return -((value - mu) ** 2)

    def random(mu, rng=None, size=None):
        return rng.normal(mu, 1.0, size=size)

    rv = pm.CustomDist.dist(0.0, logp=logp, random=random)
    found = dispatched_densities(type(rv.owner.op))
    assert "logp" in found, "pymc.logprob.abstract._logprob no longer registers CustomDist's logp per class"
    # The registered function is PyMC's wrapper around ours: ours is in its closure.
    closure = [cell.cell_contents for cell in found["logp"].__closure__ or ()]
    assert logp in closure, "CustomDist's registered logp no longer closes over the user's function"
    assert found.get("random") is random, "CustomDistRV no longer stores random= as class attribute _random_fn"


def test_numba_cache_locator_and_cfunc_internals():
    from numba.core import caching, ccallback

    assert hasattr(caching, "_CacheLocator"), "numba.core.caching._CacheLocator is gone"
    assert isinstance(caching.CacheImpl._locator_classes, list), "numba CacheImpl._locator_classes is gone"
    for method in ("_load_index", "_load_data"):
        assert hasattr(caching.IndexDataCacheFile, method), f"numba IndexDataCacheFile.{method} is gone"
    source = inspect.getsource(ccallback.CFunc)
    for attribute in ("_targetdescr", "_cache", "_sig", "_library", "_wrapper_name", "_wrapper_address",
                      "_cache_hits"):
        assert f"self.{attribute}" in source, f"numba CFunc.{attribute} is gone"
    assert hasattr(caching.FunctionCache, "_load_overload"), "numba FunctionCache._load_overload is gone"


def test_numba_cache_lookup_and_save_around_a_compile():
    """What `compiling_once` wraps: a dispatcher's compile looks for an entry (``Cache.load_overload``)
    before compiling and writes it (``Cache.save_overload``) after, both keyed as ``_index_key`` keys."""
    from numba.core import caching, dispatcher

    compile_source = inspect.getsource(dispatcher.Dispatcher.compile)
    assert "self._cache.load_overload(sig, self.targetctx)" in compile_source, \
        "numba Dispatcher.compile no longer looks its entry up with Cache.load_overload"
    assert "self._cache.save_overload(sig, cres)" in compile_source, \
        "numba Dispatcher.compile no longer writes its entry with Cache.save_overload"
    assert inspect.signature(caching.Cache.load_overload).parameters.keys() == {"self", "sig", "target_context"}
    assert inspect.signature(caching.Cache.save_overload).parameters.keys() == {"self", "sig", "data"}
    assert inspect.signature(caching.Cache._index_key).parameters.keys() == {"self", "sig", "codegen"}
    cache_source = inspect.getsource(caching.Cache.__init__)
    for attribute in ("self._py_func", "self._cache_path", "self._cache_file"):
        assert attribute in cache_source, f"numba Cache lost {attribute}"
    assert "self._index_name" in inspect.getsource(caching.IndexDataCacheFile.__init__), \
        "numba IndexDataCacheFile._index_name is gone"


def test_nutpie_compiled_model_fields():
    from nutpie.compile_pymc import CompiledPyMCModel

    fields = {f.name for f in dataclasses.fields(CompiledPyMCModel)}
    needed = {"dims", "reparameterized_names", "compiled_logp_func", "compiled_expand_func", "initial_point_func",
              "shared_data", "shared_var_keys", "user_data", "n_expanded", "shape_info", "logp_func",
              "expand_func", "_n_dim", "_shapes", "_coords"}
    assert needed <= fields, f"nutpie CompiledPyMCModel lost fields {sorted(needed - fields)}"


def test_nutpie_names_its_chain_threads():
    """batchfit waits for these threads after a failed sample (see compat.wait_for_sampler_threads)."""
    import nutpie
    import pymc as pm

    from batchfit.compat.nutpie import NUTPIE_THREAD_PREFIX, sampler_threads, wait_for_sampler_threads

    with pm.Model() as model:
        pm.Normal("x", 0.0, 1.0, shape=3)
    sampler = nutpie.sample(nutpie.compile_pymc_model(model), draws=200_000, tune=100, chains=1,
                            progress_bar=False, blocking=False)
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        seen = sampler_threads()
        time.sleep(0.01)
    sampler.cancel()
    assert seen, f"no thread named {NUTPIE_THREAD_PREFIX}* while nutpie sampled"
    assert wait_for_sampler_threads(timeout=60), "nutpie's chain threads did not end after cancel()"


@pytest.mark.parametrize("labels", [np.arange(3, dtype=np.int32), (np.int64(1), np.int64(5)), ["a", "b"], [0.5, 1.5]])
def test_coordinate_index_is_of_a_type_nutpie_converts(labels):
    from batchfit.compat.nutpie import coordinate_index

    index = coordinate_index(labels)
    assert index.dtype.kind in "ifO"
    assert index.dtype.kind != "i" or index.dtype.itemsize == 8


def test_int32_labels_sample_through_nutpies_own_compile_once_converted():
    """PyMC keeps ``coords={"site": np.unique(codes)}`` of an int32 column as int32 labels, which
    nutpie's sampler refuses (so ``pm.sample(nuts_sampler="nutpie")`` fails on such a model);
    `compat.with_labels` gives nutpie's compiled model labels it takes, through its ``_coords``."""
    import nutpie
    import pymc as pm

    from batchfit.compat.nutpie import with_labels

    with pm.Model(coords={"site": np.unique(np.array([2, 0, 1, 2], dtype=np.int32))}) as model:
        pm.Normal("a", 0.0, 1.0, dims="site")
    compiled = nutpie.compile_pymc_model(model)
    settings = {"draws": 20, "tune": 20, "chains": 1, "seed": 1, "progress_bar": False}
    with pytest.raises(Exception, match="unsupported type"):  # still needed: nutpie refuses int32 labels
        nutpie.sample(compiled, **settings)
    trace = nutpie.sample(with_labels(compiled), **settings)
    assert trace.posterior["a"].dims[2:] == ("site",)
    assert trace.posterior["site"].values.tolist() == [0, 1, 2]


# nutpie.sample's settings whose DataTree differs: the warm-up kept as groups of their own, the optional
# stats (over the flat unconstrained vector, and the divergences' text), the unconstrained draws as a
# group, the low-rank adaptation's own stats
TRACE_SETTINGS = {
    "default": {"save_warmup": False},
    "warmup-and-optional-stats": {"save_warmup": True, "store_unconstrained": True, "store_gradient": True,
                                  "store_divergences": True, "store_mass_matrix": True, "maxdepth": 3},
    "low-rank": {"save_warmup": False, "adaptation": "low_rank", "store_mass_matrix": True},
}


@pytest.mark.parametrize("options", TRACE_SETTINGS.values(), ids=TRACE_SETTINGS)
def test_nutpie_trace_is_the_datatree_nutpie_returns(options):
    """`compat.nutpie_trace` against nutpie's own conversion of the same sample (same seed: nutpie's
    draws depend only on it): every group, value, dim, coordinate, kept stat and attribute but the time.

    The model has what the conversion treats differently: labelled and unlabelled dims, a
    matrix, a transformed variable (its unconstrained value is dropped, or kept as a group of its
    own), a deterministic.
    """
    import nutpie
    import pymc as pm
    import xarray as xr

    from batchfit.compat.nutpie import UNCONSTRAINED_PARAMETER, nutpie_trace, unconstrained_parameter_names

    with pm.Model(coords={"group": ["a", "b", "c"], "year": [2001, 2002]}) as model:
        mu = pm.Normal("mu", 0.0, 1.0, dims="group")
        scale = pm.HalfNormal("scale", 1.0)
        free = pm.Normal("free", 0.0, 1.0, shape=2)  # no dims: arviz names them free_dim_0
        matrix = pm.Normal("matrix", mu[:, None], scale, dims=("group", "year"))
        pm.Deterministic("total", matrix.sum() + free.sum())
    compiled = nutpie.compile_pymc_model(model)
    settings = {"draws": 150, "tune": 150, "chains": 2, "cores": 2, "seed": 11, "progress_bar": False, **options}
    theirs = nutpie.sample(compiled, **settings)
    sampler = nutpie.sample(compiled, blocking=False, return_raw_trace=True, **settings)
    for private in ("_settings", "_save_warmup", "_store_unconstrained"):
        assert hasattr(sampler, private), f"nutpie's _BackgroundSampler.{private} is gone"
    assert callable(getattr(sys.modules["nutpie.sample"], "_add_arrow_data", None)), \
        "nutpie.sample._add_arrow_data is gone"
    ours = nutpie_trace(sampler, sampler.wait(), compiled)

    assert list(ours.children) == list(theirs.children)
    for group in ours.children:
        mine, reference = ours[group].to_dataset(), theirs[group].to_dataset()
        xr.testing.assert_identical(mine.drop_attrs(), reference.drop_attrs())
        assert list(mine.data_vars) == list(reference.data_vars), group
        for name in mine.data_vars:
            assert mine[name].dtype == reference[name].dtype, (group, name)
        assert {k: v for k, v in mine.attrs.items() if k != "created_at"} == \
               {k: v for k, v in reference.attrs.items() if k != "created_at"}, group
    assert ours["posterior"].ds["free"].dims == ("chain", "draw", "free_dim_0")
    # batchfit's sampler models have no labels for the unconstrained vector: nutpie_trace gives nutpie's
    assert unconstrained_parameter_names(compiled).equals(compiled.coords[UNCONSTRAINED_PARAMETER])


def test_nutpie_imports_without_loading_arviz_until_an_arviz_name_is_used():
    """In a fresh process: nutpie still imports ``arviz`` (else the stand-in can go), through
    `import_nutpie` that loads none of arviz_stats, arviz_plots, matplotlib or scipy.stats and
    leaves no stand-in in ``sys.modules``; the first arviz name nutpie's module reads, and a
    user's ``import arviz``, are the package's own."""
    import subprocess

    code = """
import sys
from batchfit.compat.nutpie import import_nutpie

heavy = ("arviz_stats", "arviz_plots", "matplotlib", "scipy.stats")
import_nutpie()
sample_module = sys.modules["nutpie.sample"]  # nutpie.sample is the function
assert "arviz" in vars(sample_module), "nutpie no longer imports arviz in nutpie/sample.py: remove the stand-in"
assert "arviz" not in sys.modules, "the stand-in was left in sys.modules"
assert [m for m in heavy if m in sys.modules] == [], [m for m in heavy if m in sys.modules]
import arviz
import arviz_base
assert type(sys.modules["arviz"]).__name__ == "module" and sys.modules["arviz"].__file__.endswith("__init__.py")
assert sample_module.arviz.from_dict is arviz_base.from_dict
assert all(m in sys.modules for m in heavy), [m for m in heavy if m not in sys.modules]
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_walking_sys_modules_after_import_nutpie_loads_no_arviz():
    """What broke every fit job's first dataset in an install without JAX (issue #43): lazy_loader's
    ``load`` of a missing optional module calls ``inspect.stack()``, whose ``inspect.getmodule``
    reads ``__file__`` of every module in ``sys.modules``. After `import_nutpie` that walk, and a
    later import of arviz_base in a process that had not imported it, import nothing of arviz."""
    import subprocess

    code = """
import inspect, sys
import lazy_loader
from batchfit.compat.nutpie import import_nutpie

import_nutpie()
lazy_loader.load("batchfit_no_such_module")  # a missing module: lazy_loader walks the stack
inspect.getmodule(inspect.currentframe())
for module in list(sys.modules.values()):
    hasattr(module, "__file__")
assert "arviz" not in sys.modules and "arviz_stats" not in sys.modules, sorted(m for m in sys.modules if "arviz" in m)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr



def test_xarray_netcdf4_encoding_steps():
    """`compat.netcdf4_encoded`: xarray's ``encode_dataset_coordinates`` and its netCDF4 store's
    ``encode`` (the steps of ``dump_to_store``) give the variables its writer stores."""
    import netCDF4
    import xarray as xr
    import xarray.conventions

    from batchfit.compat.netcdf import netcdf4_encoded

    assert callable(getattr(xarray.conventions, "encode_dataset_coordinates", None)), \
        "xarray.conventions.encode_dataset_coordinates is gone"
    assert callable(getattr(xr.backends.NetCDF4DataStore, "encode", None)), \
        "xarray.backends.NetCDF4DataStore.encode is gone"
    data = xr.Dataset({"flag": ("d", [True, False]), "none": ("d", np.array([None, None], dtype=object)),
                       "x": ("d", [0.5, np.nan])}, coords={"label": ("d", ["a", "b"])})
    with netCDF4.Dataset("encoded.nc", "w", diskless=True) as nc:
        variables, attrs = netcdf4_encoded(data, nc)
    assert attrs == {}
    assert (variables["flag"].dtype, variables["flag"].attrs["dtype"]) == (np.int8, "bool")
    assert variables["none"].dtype == np.float64
    assert np.isnan(variables["x"].attrs["_FillValue"])
    assert variables["x"].attrs["coordinates"] == "label"


def test_paths_parsed_in_a_batchfit_process_leave_no_interned_strings():
    """`compat.stop_pathlib_interning`: after ``import batchfit``, parsing 10,000 distinct paths adds
    no interned strings (CPython 3.12.0-3.12.5 would keep each file name for good: cpython#121780)."""
    import subprocess

    code = """
import pathlib, sys
import batchfit
if (3, 12) <= sys.version_info[:2] and sys.version_info[:3] < (3, 12, 6):
    assert isinstance(pathlib.sys, type(sys)) and pathlib.sys.intern("a") == "a", \
        "pathlib no longer calls sys.intern through its module global sys"
before = sys.getunicodeinternedsize()
names = [str(pathlib.Path(f"data/store_{i}.csv")) for i in range(10_000)]
print(sys.getunicodeinternedsize() - before)
"""
    added = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert added < 100, f"{added} strings interned by pathlib stay in memory"


def test_snakemake_leaves_rate_limit_timers_that_the_workflow_ends(tmp_path):
    """`compat.end_snakemake_rate_timers`: when a run's onsuccess/onerror hooks run, Snakemake's
    scheduler (``JobScheduler._schedule_reevalutation``) has a non-daemon ``threading.Timer`` left,
    which the interpreter would wait for; once cancelled, no thread but the main one holds the exit.
    Checked for a run that succeeds and one that fails."""
    import subprocess

    (tmp_path / "Snakefile").write_text('''
import json, threading
from batchfit.compat.snakemake import end_snakemake_rate_timers

rule all:
    input: "a.txt", "b.txt"

rule a:
    output: "a.txt"
    shell: "touch {output}"

rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "test {config[fail]} = 0 && touch {output}"

def end(log):
    ended = end_snakemake_rate_timers()
    # a cancelled Timer's thread wakes and ends at once; any other non-daemon thread holds the exit
    holding = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
               and t.is_alive() and not (isinstance(t, threading.Timer) and t.finished.is_set())]
    with open("ended.json", "w") as out:
        json.dump({"ended": ended, "holding": holding}, out)

onsuccess: end(log)
onerror: end(log)
''')
    snakemake = [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", "--quiet", "all"]
    for fail, code in ((0, 0), (1, 1)):
        for name in ("a.txt", "b.txt", "ended.json"):
            (tmp_path / name).unlink(missing_ok=True)
        run = subprocess.run([*snakemake, "--config", f"fail={fail}"], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == code, run.stderr
        outcome = json.loads((tmp_path / "ended.json").read_text())
        assert outcome["ended"] >= 1, (
            "Snakemake's scheduler no longer leaves a threading.Timer from snakemake.scheduling.job_scheduler "
            "(JobScheduler._schedule_reevalutation) when a run ends: end_snakemake_rate_timers has nothing to do")
        assert outcome["holding"] == [], f"threads still holding Snakemake's exit: {outcome['holding']}"


@pytest.mark.parametrize("handler", ["onsuccess", "onerror"])
def test_a_systemexit_from_onsuccess_or_onerror_ends_snakemake_with_its_code_and_last_lines(tmp_path, handler):
    """`compat.exit_run`: Snakemake lets a SystemExit raised by an onsuccess or onerror handler through,
    releasing its lock, so a run ends with the handler's lines last and its exit status, whether its jobs
    all succeeded or not (#45: a sweep with failed datasets exits non-zero without a failed rule's
    traceback; #58: the verdict is the last line, success or not)."""
    import subprocess

    (tmp_path / "Snakefile").write_text(f'''
from batchfit.compat.snakemake import exit_run

rule all:
    output: "a.txt"
    shell: "touch {{output}}" if "{handler}" == "onsuccess" else "exit 1"

{handler}:
    exit_run(int(config["code"]), "verdict line one\\nverdict line two")
''')
    snakemake = [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", "all"]
    for code in (0, 3):
        (tmp_path / "a.txt").unlink(missing_ok=True)
        run = subprocess.run([*snakemake, "--config", f"code={code}"], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == code, run.stderr
        assert "Traceback" not in run.stderr
        assert run.stderr.rstrip().endswith("verdict line one\nverdict line two"), run.stderr
        assert not any((tmp_path / ".snakemake" / "locks").glob("*")), "the run left its lock behind"


def test_pytensor_numba_linker_wraps_the_graph_function_and_keys_node_functions():
    import numba
    import pytensor
    import pytensor.tensor as pt

    from batchfit.compat.pytensor import ArgumentTypes, cache_key_of, cache_keys_compiled, graph_function, result_type

    x = pt.dvector("x")
    # a constant no other test's graph has: its node functions are not in the session's PyTensor cache yet
    fn = pytensor.function([x], pt.exp(x * 0.7310585786).sum(), mode="NUMBA")
    jit_fn = fn.vm.jit_fn
    inner = graph_function(jit_fn)
    assert inner is not jit_fn, "PyTensor's final function no longer calls its graph's function as jitable_func"
    assert inner.py_func.__name__ == "numba_funcified_fgraph", "jitable_func is no longer the graph's function"
    types = ArgumentTypes()
    found = [types.function(node) for node in fn.maker.fgraph.toposort()]
    assert found and all(isinstance(key, str) for _, key in found), \
        "pytensor's numba_funcify_ensure_cache no longer returns (dispatcher, cache key) for these nodes"
    function = found[0][0]
    assert hasattr(function, "get_call_template") and hasattr(function.stats, "cache_hits"), \
        "numba Dispatcher.get_call_template or Dispatcher.stats.cache_hits is gone"
    assert cache_key_of(function), "pytensor.link.numba.cache.CACHED_SRC_FUNCTIONS no longer registers node functions"
    with cache_keys_compiled() as compiled:
        returned = result_type(function, types.of(fn.maker.fgraph.toposort()[0]))
    assert isinstance(returned, numba.types.Type), "numba Dispatcher.overloads no longer holds compile results"
    assert cache_key_of(function) in compiled, "numba's compile events no longer name the dispatcher compiled"


def test_pytensor_numba_dispatchers_resolve_an_op_without_numba_implementation_to_their_base_case():
    import pytensor.tensor as pt
    from pytensor.graph.op import Op

    from batchfit.compat.pytensor import lacks_numba_implementation

    class NoNumba(Op):
        def make_node(self, x):
            raise NotImplementedError

        def perform(self, node, inputs, outputs):
            raise NotImplementedError

    assert lacks_numba_implementation(NoNumba()), "pytensor's numba dispatchers no longer fall back for an unknown op"
    assert not lacks_numba_implementation(pt.exp(pt.dvector()).owner.op)
    assert not lacks_numba_implementation(pt.dot(pt.dmatrix(), pt.dvector()).owner.op)


@pytest.mark.parametrize("k", [1, 3])
def test_scipy_spline_keeps_the_tck_splev_evaluates(k):
    """``UnivariateSpline._eval_args``: the knots, coefficients and degree its ``__call__`` evaluates."""
    from scipy.interpolate import InterpolatedUnivariateSpline, splev

    from batchfit.compat.scipy import spline_tck

    spline = InterpolatedUnivariateSpline(np.linspace(0.0, 1.0, 6), [0.5, 1.0, 1.5, 1.0, 0.5, 0.2], k=k, ext=1)
    t, c, degree = spline_tck(spline)
    x = np.linspace(-0.5, 1.5, 41)
    assert degree == k and t.dtype == c.dtype == np.float64
    np.testing.assert_array_equal(splev(x, (t, c, degree), ext=spline.ext), spline(x))


def test_pymc_forward_sampling_helpers_take_the_arguments_batchfit_passes():
    """batchfit.compat.pymc.forward_volatility: the private helpers sample_posterior_predictive calls, with the
    parameters batchfit.predictions.forward_plan passes them (pymc/sampling/forward.py, pymc 6.4)."""
    from batchfit.compat.pymc import forward_volatility

    helpers = forward_volatility()
    parameters = {name: list(inspect.signature(getattr(helpers, name)).parameters)
                  for name in ("build_constant_data", "compute_volatile_vars", "warn_implicit_freeze")}
    assert parameters["build_constant_data"] == ["trace_constant_data", "trace_coords", "model"]
    assert parameters["compute_volatile_vars"] == ["fg", "vars_in_trace", "rvs", "constant_data", "volatile_vars",
                                                   "freeze_vars"]
    assert set(parameters["warn_implicit_freeze"]) == {"auto_frozen", "volatile_closure", "volatile_vars", "rv_set",
                                                       "vars_in_trace_set", "constant_data", "model", "trace_coords"}
@pytest.mark.parametrize("strata", [None, np.array(["a", "b", "b", "a", "c", "b", "a", "a", "c", "b", "a"])])
def test_kfold_folds_are_the_ones_arviz_stats_loo_kfold_draws(strata):
    """`compat.arviz_stats.kfold_folds`: loo_kfold's own splitters, as it calls them for k, stratify_by and
    seed; loo_kfold (save_fits) says which rows each of its folds held out."""
    import arviz_stats
    import xarray as xr
    from arviz_base import from_dict
    from arviz_stats.loo import SamplingWrapper

    from batchfit.compat.arviz_stats import kfold_folds

    n, k, seed = 11, 4, 5
    tree = from_dict({"posterior": {"mu": np.zeros((1, 20))},
                      "log_likelihood": {"y": np.zeros((1, 20, n))}})

    class Recorded(SamplingWrapper):  # no refit: loo_kfold only has to say which rows it holds out
        def sel_observations(self, idx):
            return idx, idx

        def sample(self, modified_observed_data):
            return modified_observed_data

        def get_inference_data(self, fitted_model):
            return fitted_model

        def log_likelihood__i(self, excluded_obs, idata__i):
            return xr.DataArray(np.zeros((1, 20, len(excluded_obs))), dims=["chain", "draw", "y_dim_0"])

    kfold = arviz_stats.loo_kfold(tree, Recorded(None, tree), k=k, stratify_by=strata, seed=seed, save_fits=True)
    folds = kfold_folds(n, k, seed, strata)
    assert sorted(set(folds.tolist())) == list(range(1, k + 1))
    assert {fold: np.flatnonzero(folds == fold).tolist() for fold in range(1, k + 1)} == {
        fold: sorted(fit["test_indices"].tolist()) for fold, fit in kfold.fold_fits.items()}
