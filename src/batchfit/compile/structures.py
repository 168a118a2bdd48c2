"""Every model structure a job meets, compiled once each, through the fastest path that takes it.

Datasets may build models of different structure (a branch in ``build_model``, a size taken
from the data as a Python int): each structure gets its own content-addressed cache entry,
compiled once for every job and later sweep. A structure batchfit's cached callbacks cannot
take (a shared variable that is not ``pm.Data``, an operation numba cannot cache, ...) is
fitted through nutpie's own ``compile_pymc_model``, which is what ``pm.sample(nuts_sampler=
"nutpie")`` runs: slower (compiled once per job and per set of sizes), never a dead end. A
structure with discrete free variables, which neither nutpie nor batchfit's callbacks can
sample, is fitted by ``pm.sample`` with PyMC's own step methods, as ``pm.sample`` itself does.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from batchfit.cache.heal import retry_after_healing
from batchfit.cache.store import CacheDir
from batchfit.common.standby import Standby
from batchfit.compat.nutpie import import_nutpie, with_labels
from batchfit.compile.build import compile_model
from batchfit.compile.extras import ExtraGroups
from batchfit.compile.fingerprint import structure_of
from batchfit.compile.sampler import DEFAULT_START, CompiledModel, SamplerFunctions, StartPoint
from batchfit.compile.worker_pool import ModelSource
from batchfit.errors import CachedPathUnsupported, ModelContractError, SamplerFailure, one_line
from batchfit.model.model_file import data_containers, swappable_inputs
from batchfit.model.python_mode import python_mode
from batchfit.settings import CacheSettings, OutputSettings

log = logging.getLogger("batchfit")

CACHED = "cached"  # batchfit's callbacks from the shared cache
NUTPIE = "nutpie"  # nutpie's compile_pymc_model, as pm.sample runs it
PYMC = "pymc"  # pm.sample with PyMC's own step methods: for discrete free variables
FAILED = "failed"  # compiling it failed in batchfit's own code: its datasets fail with the traceback


@dataclass
class Structure:
    """One structure and how its datasets are sampled: cached callbacks, or nutpie's own compile."""

    id: str
    path: str
    template: Any
    extras: ExtraGroups | None  # None on the FAILED path
    compiled: CompiledModel | None = None
    reason: str | None = None  # why the cached path could not take it (or nutpie's, on PyMC's path)
    error: BaseException | None = None  # on the FAILED path: batchfit's bug, which fails its datasets
    _nutpie: dict[tuple, Any] = field(default_factory=dict)
    _loader: SamplerFunctions | None = None

    @property
    def key(self) -> str:
        """The cache entry it was loaded from ('' on nutpie's path, which nutpie compiles in-process)."""
        return self.compiled.key if self.compiled is not None else ""

    def sampler_model(self, model: Any, start: StartPoint = DEFAULT_START) -> Any:
        """A nutpie sampler model for ``model``, whose values are also loaded into the template; its
        chains start as ``start`` says."""
        if self.compiled is not None:
            return self.compiled.sampler_for(model, start)
        return self.nutpie_model(model, start)

    def loaded(self, model: Any) -> AbstractContextManager[Any]:
        """The template holding ``model``'s values (as the optional outputs read them), locked
        against other datasets of the batch (see `SamplerFunctions.loaded`)."""
        if self.compiled is not None:
            return self.compiled.functions.loaded(model)
        if self._loader is None:
            self._loader = SamplerFunctions(self.template)
        return self._loader.loaded(model)

    def nutpie_model(self, model: Any, start: StartPoint = DEFAULT_START) -> Any:
        """``model`` compiled by nutpie's own ``compile_pymc_model`` (reused for equal sizes and values),
        its chains starting as ``start`` says (``initial_points`` and ``jitter_rvs``, as ``pm.sample``
        passes its ``initvals``)."""
        variant = (*_sizes_and_baked_values(model), start.key())
        compiled = self._nutpie.get(variant)
        if compiled is None:
            jitter = None if start.jitter_rvs is None else start.jittered(model)
            try:
                compiled = import_nutpie().compile_pymc_model(model, initial_points=start.overrides(),
                                                              jitter_rvs=jitter)
            except Exception as exc:
                raise SamplerFailure(f"nutpie's compile_pymc_model failed: {one_line(exc)}") from exc
            compiled = with_labels(compiled)
            self._nutpie[variant] = compiled
            return compiled
        names = {var.name for var in compiled.shared_var_keys}
        return compiled.with_data(**{name: var.get_value() for name, var in data_containers(model).items()
                                     if name in names})


def pymc_path_reason(model: Any) -> str:
    """Why ``model`` needs PyMC's own step methods ('' if it does not): free variables NUTS cannot
    sample, which PyMC gives Metropolis and kin (`pymc.step_methods.assign_step_methods`) and
    which nutpie refuses."""
    from pymc.vartypes import discrete_types

    discrete = [rv.name for rv in model.free_RVs if rv.dtype in discrete_types]
    if not discrete:
        return ""
    return (f"discrete free variable(s) {', '.join(discrete)}: nutpie and batchfit's cached path "
            "sample only continuous ones")


def _sizes_and_baked_values(model: Any) -> tuple:
    """What nutpie's compiled model fixes besides the structure: dimension lengths, data shapes,
    and the values of shared variables that are not ``pm.Data`` (``with_data`` swaps only those)."""
    containers = data_containers(model)
    swappable = set(swappable_inputs(model))
    lengths = tuple((name, _value(length)) for name, length in model.dim_lengths.items())
    shapes = tuple((name, np.shape(var.get_value(borrow=True))) for name, var in sorted(containers.items()))
    digest = hashlib.sha256()
    for var in _shared_variables(model):
        if var not in swappable:
            digest.update(np.ascontiguousarray(var.get_value(borrow=True)).tobytes())
    return lengths, shapes, digest.hexdigest()


def _value(length: Any) -> int:
    """A dimension length: a shared variable, a constant, or (rarely) an expression, evaluated by
    PyTensor's Python implementations (its default mode would compile it with numba, per dataset)."""
    if hasattr(length, "get_value"):
        return int(length.get_value())
    if hasattr(length, "data"):
        return int(length.data)
    with python_mode():
        return int(length.eval())


def _shared_variables(model: Any) -> list[Any]:
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.traversal import graph_inputs
    from pytensor.tensor.random.type import RandomType

    outputs = [*model.free_RVs, *model.observed_RVs, *model.deterministics, *model.potentials]
    return [v for v in graph_inputs(outputs) if isinstance(v, SharedVariable) and not isinstance(v.type, RandomType)]


class StructuresConfig(Protocol):
    """The parts of `batchfit.config.Config` that `Structures` reads."""

    max_structures: int
    outputs: OutputSettings
    cache: CacheSettings
    source: str


class Structures:
    """The structures of one job, met in dataset order; at most ``max_structures`` of them.

    A model that bakes its dataset's values in (`batchfit.model.model_file.baked_values`) is fitted
    through nutpie's own compile for that dataset alone, as ``pm.sample`` would: one compile per
    dataset, slower, never a failure; it does not count as one of the structures.
    ``compile_workers``: the processes a compile may run at once (the job's cores), or a
    `batchfit.common.standby.Standby` of compile workers already starting.
    """

    def __init__(self, config: StructuresConfig, cache: CacheDir, *, compile_workers: int | Standby = 1):
        self.config = config
        self.cache = cache
        self.compile_workers = compile_workers
        self.known: dict[str, Structure] = {}
        self._warned = False  # about datasets with a compile of their own, once per job
        self._pymc_warned: set[str] = set()  # structures on PyMC's path, warned about once each

    def for_model(self, model: Any, source: ModelSource, *, baked: str = "") -> Structure:
        """The structure of ``model`` (built from ``source``), compiling it on first sight.

        ``baked`` describes the dataset's values baked into the model ('' for none).
        """
        structure_id = structure_of(model)
        needs_pymc = pymc_path_reason(model)
        if needs_pymc:
            return self._pymc(structure_id, model, source, needs_pymc, baked)
        if baked:
            return self._own_compile(structure_id, model, source, (
                f"{baked}. Such a dataset is fitted by a compile of its own; to fit every dataset with one "
                "compile, pass these values through pm.Data as said"))
        found = self.known.get(structure_id)
        if found is not None:
            return found
        if len(self.known) >= self.config.max_structures:
            raise ModelContractError(
                f"dataset '{source.dataset_id}' builds a model of yet another structure: "
                f"{len(self.known) + 1} structures, more than max_structures: {self.config.max_structures}. "
                "A structure changes with the data when build_model takes a size from the data as a Python "
                "int (shape=(n_groups, k) with n_groups = len(...)) or branches on data values: give the "
                "variable dims= with coords from the data instead, so sizes are runtime values. If the "
                f"structures are expected, raise max_structures in {self.config.source}."
            )
        structure = self._compile(structure_id, model, source)
        self.known[structure_id] = structure
        return structure

    def _own_compile(self, structure_id: str, model: Any, source: ModelSource, reason: str) -> Structure:
        """A structure for one dataset only, on nutpie's path (compiled when sampled, never cached).

        Warned about once per job (a sweep may have thousands of such datasets); each dataset's
        log line and its fit's ``sampler_path`` say which took this path.
        """
        if not self._warned:
            self._warned = True
            warnings.warn(f"{reason}. (A compile of its own: nutpie's compile_pymc_model, as pm.sample runs it; "
                          "slower, and never cached.)", stacklevel=3)
        log.info("%s: fitted through nutpie's own compile (values baked into the model)", source.dataset_id)
        return Structure(structure_id, NUTPIE, model, self._extras(model), reason=reason)

    def _pymc(self, structure_id: str, model: Any, source: ModelSource, reason: str, baked: str) -> Structure:
        """A structure with discrete free variables: each dataset is sampled by ``pm.sample`` with
        PyMC's own step methods (NUTS for the continuous variables, Metropolis and kin for the
        discrete ones), which is what ``pm.sample`` runs for such a model. Nothing is cached; it
        compiles for every dataset and samples in Python, so it is much slower. Warned about once
        per structure; kept per structure unless values are baked in (then the template is the
        dataset's own)."""
        found = None if baked else self.known.get(structure_id)
        if found is not None:
            return found
        if structure_id not in self._pymc_warned:
            self._pymc_warned.add(structure_id)
            warnings.warn(f"model structure {structure_id[:12]} (first met in dataset '{source.dataset_id}') "
                          f"has {reason}, so its datasets are fitted by pm.sample with PyMC's own step methods "
                          "(NUTS for the continuous variables, Metropolis for the discrete ones), as pm.sample "
                          "does for this model: much slower, compiled for every dataset and never cached.",
                          stacklevel=3)
        structure = Structure(structure_id, PYMC, model, self._extras(model), reason=reason)
        if not baked:
            self.known[structure_id] = structure
        return structure

    def _compile(self, structure_id: str, model: Any, source: ModelSource) -> Structure:
        """The structure compiled into the cache; on nutpie's path if the cached path documents it
        cannot take it (`CachedPathUnsupported`); FAILED, with the error, if batchfit's code failed."""
        try:
            compiled = compile_model(model, self.cache, source=source, lock_timeout=self.config.cache.lock_timeout,
                                     workers=self.compile_workers)
        except CachedPathUnsupported as exc:
            compiled, reason = None, one_line(exc)
            warnings.warn(
                f"model structure {structure_id[:12]} (first met in dataset '{source.dataset_id}') is fitted "
                f"through nutpie's own compile_pymc_model, as pm.sample would, because batchfit's cached path "
                f"cannot take it: {reason}. Fits of this structure compile in every job.",
                stacklevel=2,
            )
        except Exception as exc:  # noqa: BLE001 - batchfit's bug: every dataset of the structure fails with it
            log.error("compiling model structure %s (first met in dataset '%s') failed, a bug to report with "
                      "this traceback", structure_id[:12], source.dataset_id, exc_info=exc)
            return Structure(structure_id, FAILED, model, None, error=exc)
        extras = self._extras(model)
        if compiled is None:
            return Structure(structure_id, NUTPIE, model, extras, reason=reason)
        log.info("structure %s: %s", structure_id[:12], compiled.report.line())
        return Structure(structure_id, CACHED, model, extras, compiled=compiled)

    def _extras(self, model: Any) -> ExtraGroups:
        """The optional outputs' functions for a structure (compiled into the cache, so healed like it)."""
        return retry_after_healing(self.cache, "optional outputs", lambda: ExtraGroups(model, self.config.outputs))
