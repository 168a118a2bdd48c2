"""The compiled model of a structure: loaded from the cache, or built into it first (`compile_model`).

The one path from a model to its callbacks: computes the content key, then
`batchfit.cache.store.get_or_build` loads the entry or has the workers build it.
"""

from __future__ import annotations

import logging
from typing import Any

from batchfit.cache.heal import retry_after_healing
from batchfit.cache.store import CacheDir, get_or_build
from batchfit.common.collector import paused
from batchfit.common.standby import Standby
from batchfit.compat.nutpie import import_nutpie
from batchfit.compile.callbacks import WrapperSpec
from batchfit.compile.entry import NO_OUTPUTS, build_entry, load_callbacks, refuse_object_mode_early
from batchfit.compile.graphs import SamplerGraphs, sampler_key
from batchfit.compile.sampler import CompiledModel, CompileReport, SamplerFunctions
from batchfit.compile.worker_pool import ModelSource, build_in_child

log = logging.getLogger("batchfit")


def compile_model(model: Any, cache: CacheDir, *, source: ModelSource | None = None,
                  lock_timeout: float = 600.0, workers: int | Standby = 1) -> CompiledModel:
    """Return the compiled callbacks for ``model``, compiling them only if no process did before.

    With ``source`` a miss compiles in child processes, two at once if ``workers`` (the cores
    this job may use, or a `Standby` of workers already starting) allows (see module docstring
    and `build_in_child`); without it, in this process.
    """
    with paused():
        graphs = SamplerGraphs.of(model)
        key = sampler_key(model, graphs)

    prepared: list[SamplerFunctions] = []  # the per-process functions, built while a child compiles

    def prepare_functions() -> None:
        import_nutpie()  # every caller samples next
        prepared.append(SamplerFunctions(model))

    def build() -> dict[str, Any]:
        if source is not None:
            return build_in_child(source, cache, key, workers=workers, meanwhile=prepare_functions,
                                  check=lambda: refuse_object_mode_early(model, graphs))
        return retry_after_healing(cache, f"compiling cache entry {key[:12]}",
                                   lambda: build_entry(model, cache, key, graphs, NO_OUTPUTS))

    def load(entry: dict[str, Any]) -> tuple[WrapperSpec, Any, Any]:
        with paused():
            return load_callbacks(cache, key, entry)

    fetched = get_or_build(cache, key, load=load, build=build, lock_timeout=lock_timeout)
    spec, logp, expand = fetched.value

    def functions() -> CompiledModel:
        with paused():
            return CompiledModel(key, spec, logp, expand, model, CompileReport.of(fetched),
                                 functions=prepared[0] if prepared else None)

    # The per-process functions compile through PyTensor, which reads its own files in the cache.
    return retry_after_healing(cache, f"cache entry {key[:12]}", functions)
