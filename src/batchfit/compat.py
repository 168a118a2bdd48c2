"""Every use of another library's private API, in one place.

batchfit reaches below the public APIs of PyMC where no public one gives what it needs. Each
use names the upstream code and the version it was written against; ``tests/test_compat.py``
fails with the API's name when an upgrade removes or changes one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from weakref import WeakKeyDictionary

__all__ = [
    "NUTPIE_THREAD_PREFIX",
    "coordinate_index",
    "dispatched_densities",
    "end_snakemake_rate_timers",
    "import_nutpie",
    "library_roots",
    "is_numba_cache_reader",
    "load_cached_cfunc",
    "nutpie_model",
    "netcdf4_encoded",
    "netcdf4_put_whole",
    "nutpie_trace",
    "register_cache_locator",
    "stop_pathlib_interning",
    "wait_for_sampler_threads",
    "with_labels",
]

# nutpie 0.16 names the threads that run chains "nutpie-worker-N" (its Rust sampler's thread pool).
NUTPIE_THREAD_PREFIX = "nutpie-worker-"


@functools.cache
def _density_dispatchers() -> dict[str, Any]:
    """PyMC's dispatchers that attach functions to a random-variable op class.

    ``pymc.logprob.abstract._logprob``/``_logcdf`` and ``pymc.distributions.distribution._support_point``
    (pymc 6.4) are ``functools.singledispatch`` functions: ``pm.CustomDist`` registers the user's
    ``logp``/``logcdf``/``support_point`` on a class created per call
    (``pymc/distributions/custom.py``, ``_CustomDist.rv_op``). No public API returns them, and
    the cache key must cover them because they are compiled into the log density.
    """
    from pymc.distributions.distribution import _support_point
    from pymc.logprob.abstract import _logcdf, _logprob

    return {"logp": _logprob, "logcdf": _logcdf, "support_point": _support_point}


def dispatched_densities(op_class: type) -> dict[str, Any]:
    """Functions PyMC registered for exactly ``op_class`` (not inherited), plus its ``_random_fn``.

    Only classes created at run time (``pm.CustomDist``) carry user code here; library classes
    return their library functions, which the library versions in the key already pin.
    """
    found = {name: dispatcher.registry[op_class] for name, dispatcher in _density_dispatchers().items()
             if op_class in dispatcher.registry}
    # pymc 6.4 stores CustomDist's ``random=`` as the class attribute ``_random_fn``
    # (pymc/distributions/custom.py, CustomDistRV); it draws the posterior predictive.
    random_fn = op_class.__dict__.get("_random_fn")
    if random_fn is not None:
        found["random"] = random_fn
    return found


@functools.cache
def library_roots() -> tuple[str, ...]:
    """Directories of installed packages and the standard library (code pinned by versions)."""
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}))


def sampler_threads() -> list[str]:
    """Names of this process's nutpie chain threads that are still alive (Linux; elsewhere none)."""
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                name = fh.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(NUTPIE_THREAD_PREFIX):
            names.append(name)
    return names


def wait_for_sampler_threads(timeout: float = 60.0) -> bool:
    """Wait, without holding the GIL, until nutpie's chain threads have ended; False on timeout.

    When sampling fails (e.g. "All initialization points failed"), ``nutpie.sample`` raises while
    its chain threads are still winding down; they need the GIL to drop their Python objects. A
    process that exits meanwhile finalizes the interpreter under them, and a thread calling
    ``PyGILState_Ensure`` during finalization is unwound through Rust code: SIGSEGV at exit,
    after every output was written (seen with nutpie 0.16.11). Sleeping releases the GIL.
    """
    deadline = time.monotonic() + timeout
    while sampler_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- CPython 3.12.0-3.12.5: pathlib's interned path parts are never freed ----------------------

class _SysWithoutIntern(ModuleType):
    """``sys`` as pathlib sees it, but ``intern`` returns the string itself (an equal string)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)

    @staticmethod
    def intern(string: str) -> str:
        return string


def stop_pathlib_interning() -> None:
    """Keep pathlib from interning the parts of every path it parses, on the Pythons where
    interned strings are never freed.

    CPython 3.12.0 to 3.12.5 make every interned string immortal
    ([cpython#113993](https://github.com/python/cpython/issues/113993); mortal again from 3.12.6,
    gh-123065), and their pathlib interns each part of a path it parses (``sys.intern`` in
    ``PurePath._parse_path``, ``Lib/pathlib.py``; gone in 3.14, gh-119518): every distinct file
    name a process touches stays in memory ([cpython#121780](https://github.com/python/cpython/issues/121780)).
    A job goes through several paths per dataset (data, fit, sidecar, summary entry, temporary
    names); collect's peak memory at 10,000 datasets was 7 MiB lower without it (measured by
    hand). pathlib reaches ``sys.intern`` through its module global ``sys``, which gets a
    stand-in; interning changes no string's value, only which object holds it.
    """
    import pathlib

    if (3, 12) <= sys.version_info[:2] and sys.version_info[:3] < (3, 12, 6) \
            and not isinstance(pathlib.sys, _SysWithoutIntern):
        pathlib.sys = _SysWithoutIntern("sys")


# --- Snakemake: the scheduler's last rate-limit timer holds the exit ------------------------------

def end_snakemake_rate_timers() -> int:
    """Cancel the timers Snakemake's job scheduler leaves behind when a run ends; return how many.

    After each pass the scheduler (snakemake 9.27, ``JobScheduler._schedule_reevalutation`` in
    ``snakemake/scheduling/job_scheduler.py``) starts a ``threading.Timer`` of the
    ``--max-jobs-per-timespan`` timespan (1 s by default) to look again once its rate limit
    allows. The timer is not a daemon thread, so the interpreter waits for the last one before it
    exits: every run ended a second after its last job (at N=100 tiny datasets a tenth of the
    sweep). Called from the workflow's ``onsuccess``/``onerror``, when the scheduler has returned
    and no job is left; the timer only wakes the scheduler, so cancelling it loses nothing.
    The timespan cannot be set shorter instead: Snakemake's parser reads ``100/100ms`` as 100 minutes.
    """
    import threading

    timers = [thread for thread in threading.enumerate() if isinstance(thread, threading.Timer)
              and getattr(thread.function, "__module__", None) == "snakemake.scheduling.job_scheduler"]
    for timer in timers:
        timer.cancel()
    return len(timers)


# --- xarray: a Dataset encoded as its netCDF4 writer stores it -----------------------------------

def netcdf4_encoded(dataset: Any, nc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``dataset``'s variables and attributes as xarray's netCDF4 writer stores them in ``nc`` (an
    open ``netCDF4.Dataset``): bools as int8 with a ``dtype`` attribute, floats with
    ``_FillValue`` NaN, object arrays as text or floats, non-index coordinates named in a
    ``coordinates`` attribute.

    `batchfit.fitting.fit_file` makes the netCDF4 calls itself, so that its files are the ones
    ``DataTree.to_netcdf(engine="netcdf4")`` writes. ``encode_dataset_coordinates`` (xarray
    2026.9, ``xarray/conventions.py``) and the store's ``encode`` (``WritableCFDataStore.encode``
    in ``xarray/backends/common.py``: ``cf_encoder``, then object arrays to text or floats, then
    the netCDF4 store's own step) are what ``xarray.backends.writers.dump_to_store`` runs; they
    are not in xarray's API reference.
    """
    from xarray.backends import NetCDF4DataStore
    from xarray.conventions import encode_dataset_coordinates

    return NetCDF4DataStore(nc).encode(*encode_dataset_coordinates(dataset))


def netcdf4_put_whole(variable: Any, data: Any) -> None:
    """Write all of ``variable`` (a ``netCDF4.Variable``) from ``data``, an array of its shape.

    ``variable[...] = data`` first works out the slice in Python (``_StartCountStride`` in
    netCDF4 1.7, ``netCDF4/utils.py``): 0.23 ms of a variable's 0.25 ms write for a fit's small
    arrays (measured by hand), ~7 ms of writing each fit's 34 variables, on a core the chains
    sample on. ``Variable._put(data, start, count, stride)`` (``netCDF4/_netCDF4.pyx``, what
    ``__setitem__`` ends with) takes the whole-variable slice as it is; it makes the data
    contiguous, casts them to the variable's type (text included) and checks their size itself.
    """
    shape = variable.shape
    variable._put(data, [0] * len(shape), list(shape), [1] * len(shape))


# --- numba: caching generated functions and loading them without the compiler ------------------

_CACHED_FUNCTIONS: WeakKeyDictionary = WeakKeyDictionary()


def register_cache_locator(py_func: Callable, key: str, directory: Path) -> None:
    """Have numba cache ``py_func`` (generated from source) in ``directory`` under ``key``.

    numba only caches functions defined in files: its cache locators
    (``numba.core.caching._CacheLocator`` subclasses, tried in order from
    ``CacheImpl._locator_classes``; numba 0.68) find a file's directory and stamp. batchfit's
    callbacks are generated from source, so a locator of our own maps them to the cache with
    the content key as both disambiguator and source stamp: a changed key never loads old code.
    """
    _install_locator()
    _CACHED_FUNCTIONS[py_func] = (key, directory)


@functools.cache
def _install_locator() -> None:
    from numba.core.caching import CacheImpl, _CacheLocator

    class _GeneratedSourceLocator(_CacheLocator):
        def __init__(self, key: str, path: Path):
            self._key = key
            self._path = path

        def ensure_cache_path(self) -> None:
            self._path.mkdir(parents=True, exist_ok=True)

        def get_cache_path(self) -> str:
            return str(self._path)

        def get_source_stamp(self) -> str:
            return self._key

        def get_disambiguator(self) -> str:
            return self._key

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> _GeneratedSourceLocator | None:
            found = _CACHED_FUNCTIONS.get(py_func)
            return None if found is None else cls(*found)

    CacheImpl._locator_classes.insert(0, _GeneratedSourceLocator)


def load_cached_cfunc(py_func: Callable, sig: Any) -> Any:
    """Load a cached cfunc without compiling anything.

    ``numba.cfunc(..., cache=True)`` first initializes numba's whole typing and lowering
    registry (about half a second per process) although loading machine code needs none of
    it; this goes straight to the cache and fails if the entry is not there. It uses numba
    0.68's ``CFunc`` internals (``numba/core/ccallback.py``: ``_targetdescr``, ``_cache``,
    ``_sig``, ``_library``, ``_wrapper_name``, ``_wrapper_address``, ``_cache_hits``) as
    ``CFunc.compile`` itself does after a cache hit. Raises LookupError when it is absent.
    """
    from numba.core.ccallback import CFunc
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import nrt

    cfunc = CFunc(py_func, (sig.args, sig.return_type), {}, {})
    cfunc.enable_caching()
    with global_compiler_lock:
        context = cfunc._targetdescr.target_context
        nrt.rtsys.initialize(context)  # the memory-management symbols the machine code links to
        cres = cfunc._cache._load_overload(cfunc._sig, context)
    if cres is None:
        raise LookupError("the callback is not in numba's cache index")
    cfunc._library = cres.library
    cfunc._wrapper_name = cres.fndesc.llvm_cfunc_wrapper_name
    cfunc._wrapper_address = cres.library.get_pointer_to_function(cfunc._wrapper_name)
    cfunc._cache_hits += 1
    return cfunc




def is_numba_cache_reader(function: str, filename: str) -> bool:
    """Whether a traceback frame is numba reading one of its cache files.

    numba 0.68 reads index and data files in ``IndexDataCacheFile._load_index`` and
    ``_load_data`` (``numba/core/caching.py``); unpickling garbage there can raise nearly any
    exception type, so a failure in these frames means a damaged file, not a bug.
    """
    return function in ("_load_index", "_load_data") and filename.endswith(os.path.join("numba", "core", "caching.py"))


# --- nutpie: imported without the arviz it never uses for us ------------------------------------

class _LoadedOnFirstUse(ModuleType):
    """What nutpie's own module binds as ``arviz``: loads the real package when one of its names is read.

    Never left in ``sys.modules`` (see `import_nutpie`): only nutpie's module holds it, so nothing
    that walks ``sys.modules`` (``inspect.getmodule``, which lazy_loader's ``load`` runs for a
    missing module) can touch it. ``importlib.util.LazyLoader`` is not used: it needs the module in
    ``sys.modules``, and any attribute read (``__file__`` included) loads it.
    """

    def __getattr__(self, name: str) -> Any:
        package = importlib.import_module(self.__name__)
        vars(self).update(vars(package))
        return getattr(package, name)


# What nutpie's modules import besides nutpie itself and ``arviz``: imported before the stand-in
# goes into ``sys.modules``, so that only nutpie's own modules run while it is there.
_NUTPIE_IMPORTS = ("numpy", "pandas", "pyarrow", "xarray", "pytensor", "pymc", "arviz_base")


def import_nutpie() -> ModuleType:
    """``import nutpie``, with the ``arviz`` it imports loaded only when nutpie uses one of its names.

    nutpie 0.16 imports ``arviz`` at the top of ``nutpie/sample.py`` for ``arviz.from_dict``; the
    arviz 1.x meta-package imports arviz_stats (scipy.stats, xarray_einstats) and arviz_plots
    (matplotlib.pyplot) with it: over a second of every fit job, for names batchfit's path never
    uses (it builds the trace itself, `nutpie_trace`; `benchmarks/imports.py` measures the
    saving). PyMC defers its own arviz import for the same reason (pymc-devs/pymc#8276).

    The stand-in is in ``sys.modules`` only while ``import nutpie`` runs, after everything else
    nutpie imports: a stand-in left there was loaded by ``inspect.getmodule`` (which lazy_loader
    calls for a missing optional module, python/cpython#139669) in the middle of importing
    arviz_base, which then failed as partially initialised (batchfit issue #43). Called from the
    main thread only, like every import of a job (`tests/test_thread_imports.py`).
    """
    if "nutpie" in sys.modules:
        return sys.modules["nutpie"]
    for name in _NUTPIE_IMPORTS:
        importlib.import_module(name)
    if "arviz" in sys.modules:
        import nutpie

        return nutpie
    stand_in = _LoadedOnFirstUse("arviz")
    sys.modules["arviz"] = stand_in
    try:
        import nutpie
    finally:
        if sys.modules.get("arviz") is stand_in:
            del sys.modules["arviz"]
    return nutpie


# --- nutpie: a sampler model from our own callbacks --------------------------------------------

def nutpie_model(*, dims: dict[str, Any], reparameterized_names: Sequence[str], logp: Any, expand: Any,
                 initial_point: Callable[[Any], Any], data: dict[str, Any], record: Any, names: Sequence[str],
                 slices: Sequence[slice], shapes: Sequence[tuple[int, ...]], n_dim: int, n_expanded: int,
                 coords: dict[str, Any]) -> Any:
    """nutpie's ``CompiledPyMCModel`` around batchfit's callbacks and user-data record.

    nutpie 0.16 builds it only in ``compile_pymc_model``, which compiles its own callbacks; its
    dataclass fields (``nutpie/compile_pymc.py``: ``_n_dim``, ``_shapes``, ``_coords``,
    ``shared_var_keys``, ``user_data``, ``n_expanded``, ``shape_info``) are filled here as that
    function fills them. ``shared_var_keys`` is empty: ``with_data`` is not used, a new record is.
    """
    import_nutpie()
    from nutpie.compile_pymc import CompiledPyMCModel

    return CompiledPyMCModel(
        dims=dims,
        reparameterized_names=list(reparameterized_names),
        compiled_logp_func=logp,
        compiled_expand_func=expand,
        initial_point_func=initial_point,
        shared_data=data,
        shared_var_keys={},
        user_data=record,
        n_expanded=n_expanded,
        shape_info=(list(names), list(slices), list(shapes)),
        logp_func=None,
        expand_func=None,
        _n_dim=n_dim,
        _shapes={name: tuple(shape) for name, shape in zip(names, shapes, strict=True)},
        _coords=coords,
    )


def coordinate_index(labels: Sequence[Any]) -> Any:
    """Coordinate labels as a pandas Index of a type nutpie's trace accepts.

    nutpie 0.16 converts int64, float64 and text indexes; an int32 index, which PyMC keeps for
    ``coords={"site": np.unique(codes)}`` of an int32 column, fails the whole sample with
    "Coordinate site value has unsupported type ... Could not convert to Value", in
    ``pm.sample(nuts_sampler="nutpie")`` too. Other labels become text, as arviz writes them.
    """
    import pandas as pd

    index = pd.Index(list(labels))
    kind = index.dtype.kind
    if kind in "iu":
        return index.astype("int64")
    if kind == "f":
        return index.astype("float64")
    return pd.Index([str(label) for label in labels], dtype=object)


def with_labels(compiled: Any) -> Any:
    """nutpie's ``compile_pymc_model`` result with coordinate labels its sampler accepts (`coordinate_index`).

    Its ``_coords`` field (``nutpie/compile_pymc.py``, ``CompiledPyMCModel``; nutpie 0.16) holds
    ``pd.Index(values)`` of every coordinate, which the sampler converts when it builds the trace.
    """
    coords = compiled._coords
    if coords is None:
        return compiled
    return dataclasses.replace(compiled, _coords={name: coordinate_index(labels) for name, labels in coords.items()})


# --- nutpie: the trace as a DataTree, without arviz.from_dict ----------------------------------

# Sample stats nutpie 0.16 leaves out of its DataTree while the setting that names them is off
# (``nutpie/sample.py``, ``_BackgroundSampler._extract``, its ``skips``).
_NUTPIE_OPTIONAL_STATS = {
    ("store_gradient",): ("gradient",),
    ("store_unconstrained",): ("unconstrained_draw",),
    ("adapt_options", "mass_matrix_options", "store_mass_matrix"): (
        "mass_matrix_inv", "mass_matrix_eigvals", "mass_matrix_stds"),
    ("store_divergences",): (
        "divergence_start", "divergence_end", "divergence_momentum", "divergence_start_gradient"),
    ("store_transformed",): ("transformed_position", "transformed_gradient", "transformation_mu"),
}
_SAMPLE_DIMS = ("chain", "draw")


def nutpie_trace(sampler: Any, raw: Any, model: Any) -> Any:
    """The DataTree nutpie itself would have returned for ``raw``, what ``sampler.wait()`` gave of a
    sampler from ``nutpie.sample(model, ..., blocking=False, return_raw_trace=True, save_warmup=False)``.

    The same ``posterior`` and ``sample_stats`` (values, dims, coordinates, the stats it keeps, its
    attributes), built as two ``xr.Dataset``s: nutpie 0.16 goes through ``arviz.from_dict``, which
    builds and aligns a DataArray per variable, the largest part of the main thread's work per
    dataset, and that work bounds a fit job's rate (README, "Throughput", has both profiles).
    Private: the arrow-to-array step ``nutpie.sample._add_arrow_data`` (it fills a chain's draws,
    with NaN or None where arrow has nulls) and the sampler's ``_settings``, which say the stats
    to keep and go into the ``sample_stats`` attributes (``_BackgroundSampler._extract``).
    ``tests/test_compat.py`` compares the result with nutpie's own on the same seed.
    """
    import json

    import numpy as np
    import pandas as pd
    import xarray as xr
    from arviz_base import make_attrs
    from nutpie import __version__ as nutpie_version
    from nutpie.sample import _add_arrow_data

    settings = sampler._settings.as_dict()
    draw_batches, stat_batches = raw.get_arrow_trace()
    skip = [name for path, names in _NUTPIE_OPTIONAL_STATS.items() if not _nested(settings["settings"], path)
            for name in names]
    n_tune = [int(stat.column("tuning").to_numpy().sum()) for stat in stat_batches]
    n_draws = max(draw.num_rows - tune for draw, tune in zip(draw_batches, n_tune, strict=True))
    posterior: dict[str, np.ndarray] = {}
    stats: dict[str, np.ndarray] = {}
    dims: dict[str, list[str]] = {}
    for chain, (draw, stat, tune) in enumerate(zip(draw_batches, stat_batches, n_tune, strict=True)):
        _add_arrow_data(posterior, n_draws, draw.slice(tune, draw.num_rows - tune), chain, len(draw_batches), dims, [])
        _add_arrow_data(stats, n_draws, stat.slice(tune, stat.num_rows - tune), chain, len(draw_batches), dims, skip)
    for name in (*model.reparameterized_names, *_SAMPLE_DIMS):
        posterior.pop(name, None)
    for name in _SAMPLE_DIMS:  # the stats' own chain and draw columns: arviz keeps the coordinates instead
        stats.pop(name, None)
    coords = {name: pd.Index(values) for name, values in model.coords.items()}
    library = {"inference_library": "nutpie", "inference_library_version": nutpie_version,
               "inference_library_settings": json.dumps(settings)}

    def dataset(arrays: dict[str, np.ndarray], attrs: dict[str, str]) -> Any:
        variables = {name: ((*_SAMPLE_DIMS, *(dims.get(name) or [f"{name}_dim_{i}" for i in range(a.ndim - 2)])), a)
                     for name, a in arrays.items()}
        # Every dimension gets a coordinate, as arviz gives it: the model's labels, else 0, 1, ...
        sizes = {dim: size for var_dims, a in variables.values() for dim, size in zip(var_dims, a.shape, strict=True)}
        index = {dim: coords[dim] if dim in coords else np.arange(size) for dim, size in sizes.items()}
        return xr.Dataset(variables, coords=index, attrs=make_attrs(attrs, sample_dims=list(_SAMPLE_DIMS)))

    return xr.DataTree.from_dict({"posterior": dataset(posterior, {}), "sample_stats": dataset(stats, library)})


def _nested(settings: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        if part not in settings:
            return False
        settings = settings[part]
    return settings
