"""nutpie: imported without arviz, a sampler model around our callbacks, its trace without arviz, its threads."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# nutpie 0.16 names the threads that run chains "nutpie-worker-N" (its Rust sampler's thread pool).
NUTPIE_THREAD_PREFIX = "nutpie-worker-"


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
    (matplotlib.pyplot) with it: a noticeable part of every fit job, for names batchfit's path never
    uses (it builds the trace itself, `nutpie_trace`). PyMC defers its own arviz import for the same reason (https://github.com/pymc-devs/pymc/issues/8276).

    The stand-in is in ``sys.modules`` only while ``import nutpie`` runs, after everything else
    nutpie imports: a stand-in left there was loaded by ``inspect.getmodule`` (which lazy_loader
    calls for a missing optional module, https://github.com/python/cpython/issues/139669) in the
    middle of importing arviz_base, which then failed as partially initialised. Called from the
    main thread only, like every import of a job (`tests/e2e/test_thread_imports.py`).
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
# nutpie 0.16's name for the dimension of the flat unconstrained parameter vector (``nutpie/compile_pymc.py``,
# ``_UNCONSTRAINED_PARAMETER``), along which the optional stats of that vector lie (`_NUTPIE_OPTIONAL_STATS`).
UNCONSTRAINED_PARAMETER = "unconstrained_parameter"


def nutpie_trace(sampler: Any, raw: Any, model: Any) -> Any:
    """The DataTree nutpie itself would have returned for ``raw``, what ``sampler.wait()`` gave of a
    sampler from ``nutpie.sample(model, ..., blocking=False, return_raw_trace=True)``.

    The same groups (``posterior`` and ``sample_stats``; with ``save_warmup=True`` also
    ``warmup_posterior`` and ``warmup_sample_stats``; with ``store_unconstrained=True`` also
    ``unconstrained_posterior``, and its warm-up) with the same values, dims, coordinates, kept
    stats and attributes, built as ``xr.Dataset``s: nutpie 0.16 goes through ``arviz.from_dict``,
    which builds and aligns a DataArray per variable, the largest part of the main thread's work per
    dataset, and that work bounds a fit job's rate.
    Private: the arrow-to-array step ``nutpie.sample._add_arrow_data`` (it fills a chain's draws,
    with NaN or None where arrow has nulls) and the sampler's ``_settings`` (the stats to keep, and
    the ``sample_stats`` attributes), ``_save_warmup`` and ``_store_unconstrained``
    (``_BackgroundSampler._extract`` and ``_arrow_to_arviz``). ``tests/unit/test_compat.py`` compares the
    result with nutpie's own on the same seed, with and without the warm-up and the optional stats.
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
    n_chains = len(draw_batches)
    parts = {"posterior": ({}, {}, n_draws)}  # group: (draws, stats, length)
    if sampler._save_warmup:
        parts["warmup_posterior"] = ({}, {}, max(n_tune))
    dims: dict[str, list[str]] = {}
    for chain, (draw, stat, tune) in enumerate(zip(draw_batches, stat_batches, n_tune, strict=True)):
        for group, (draws, stats, length) in parts.items():
            start, stop = (tune, draw.num_rows) if group == "posterior" else (0, tune)
            _add_arrow_data(draws, length, draw.slice(start, stop - start), chain, n_chains, dims, [])
            _add_arrow_data(stats, length, stat.slice(start, stop - start), chain, n_chains, dims, skip)
    unconstrained = {}
    for group, (draws, stats, _) in parts.items():
        popped = {name: draws.pop(name) for name in model.reparameterized_names if name in draws}
        unconstrained[group.replace("posterior", "unconstrained_posterior")] = popped
        for name in _SAMPLE_DIMS:
            draws.pop(name, None)
            stats.pop(name, None)  # the stats' own chain and draw columns: arviz keeps the coordinates instead
    coords = {name: pd.Index(values) for name, values in model.coords.items()}
    library = {"inference_library": "nutpie", "inference_library_version": nutpie_version,
               "inference_library_settings": json.dumps(settings)}

    def dataset(arrays: dict[str, np.ndarray], attrs: dict[str, str]) -> Any:
        variables = {name: ((*_SAMPLE_DIMS, *(dims.get(name) or [f"{name}_dim_{i}" for i in range(a.ndim - 2)])), a)
                     for name, a in arrays.items()}
        # Every dimension gets a coordinate, as arviz gives it: the model's labels, else 0, 1, ...
        sizes = {dim: size for var_dims, a in variables.values() for dim, size in zip(var_dims, a.shape, strict=True)}
        index = {dim: coords[dim] if dim in coords else np.arange(size) for dim, size in sizes.items()}
        if UNCONSTRAINED_PARAMETER in sizes and UNCONSTRAINED_PARAMETER not in coords:
            index[UNCONSTRAINED_PARAMETER] = unconstrained_parameter_names(model)
        return xr.Dataset(variables, coords=index, attrs=make_attrs(attrs, sample_dims=list(_SAMPLE_DIMS)))

    groups = {"posterior": dataset(parts["posterior"][0], {}), "sample_stats": dataset(parts["posterior"][1], library)}
    if "warmup_posterior" in parts:
        draws, stats, _ = parts["warmup_posterior"]
        groups.update(warmup_posterior=dataset(draws, {}), warmup_sample_stats=dataset(stats, {}))
    if sampler._store_unconstrained:
        groups.update({group: dataset(arrays, {}) for group, arrays in unconstrained.items() if arrays})
    return xr.DataTree.from_dict(groups)


def unconstrained_parameter_names(model: Any) -> Any:
    """Labels of nutpie's flat unconstrained parameter vector, as nutpie's own compile gives them
    (``nutpie/compile_pymc.py``, ``_prepare_dims_and_coords``): ``name`` for a scalar, ``name_i.j`` for
    an element. For a sampler model whose coordinates lack them (batchfit's callbacks): its free
    variables are the first entries of its ``shape_info``, which fill its ``n_dim`` values."""
    import itertools

    import numpy as np
    import pandas as pd

    names, remaining = [], model.n_dim
    for base, _, shape in zip(*model.shape_info, strict=True):
        if remaining <= 0:
            break
        remaining -= int(np.prod(shape))
        names += [base if not idx else f"{base}_{'.'.join(map(str, idx))}"
                  for idx in itertools.product(*(range(length) for length in shape))]
    return pd.Index(names)


def _nested(settings: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        if part not in settings:
            return False
        settings = settings[part]
    return settings
