"""A cache entry of a model structure: what it holds, how it is built (in a worker) and loaded.

An entry holds batchfit's two nutpie callbacks (`batchfit.compile.callbacks`), compiled from
the graphs of `batchfit.compile.graphs` under their content address (``sampler_key``), in the
cache's numba directory. `batchfit.cache.store.get_or_build` owns the rest (locking,
verification, manifests, statistics).
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from typing import Any

from batchfit import numba_ops
from batchfit.cache.heal import is_damage_error
from batchfit.cache.store import CacheDir, CorruptEntry
from batchfit.compat.pytensor import graph_function, lacks_numba_implementation
from batchfit.compile.ahead import compile_back_to_meet
from batchfit.compile.callbacks import WrapperSpec, make_callback, missing_inner
from batchfit.compile.extras import warm_extras
from batchfit.compile.graphs import SamplerGraphs, compile_sampler_functions
from batchfit.compile.sampler import SamplerFunctions
from batchfit.compile.worker_pool import NO_OUTPUTS, PARTS
from batchfit.errors import CachedPathUnsupported, one_line
from batchfit.numba_ops.nopython import record_generic_fallbacks
from batchfit.settings import OutputSettings

log = logging.getLogger("batchfit")


def build_entry(model: Any, cache: CacheDir, key: str, graphs: SamplerGraphs,
                outputs: OutputSettings = NO_OUTPUTS, part: str = "all") -> dict[str, Any]:
    """Compile ``part`` of the entry for ``model`` into the cache's numba directory; return the manifest's spec.

    Every part but "logp" also runs the per-process functions and the optional ``outputs`` once,
    so that what the fit stage compiles through PyTensor lands in PyTensor's numba cache too.
    """
    # Not at the top: a compile worker imports this module before it is told numba's environment.
    from numba.core.errors import NumbaError

    clock = _StageClock(key)
    # The expansion's worker also rewrites the log density's graph, whose node functions it compiles ahead.
    kinds = ("logp", "expand") if part == "rest" else PARTS[part]
    with record_generic_fallbacks() as fallbacks:
        spec, functions = compile_sampler_functions(model, graphs, kinds)
    if fallbacks:
        # A cached callback cannot run an object-mode op (nutpie's call fails at initialisation):
        # say so now, before compiling the callbacks, so the structure goes through nutpie's own compile.
        raise _object_mode_unsupported(fallbacks)
    clock.stage(f"PyTensor functions ({', '.join(functions)})")
    if part == "rest":
        # First: the log density's worker is the job's longest; this worker's own callback (a few
        # seconds of numba) then overlaps that worker's last step, the graph's function and callback.
        count = compile_back_to_meet(functions["logp"].maker.fgraph, lambda: bool(_callback_files(cache, "logp", key)))
        clock.stage(f"{count} of the log density's node functions, from its last node back")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Cannot cache compiled function.*")
        for kind in PARTS[part]:
            try:
                make_callback(spec, kind, key, cache, graph_function(functions[kind].vm.jit_fn))
            except NumbaError as exc:
                unsupported = numba_failure_of_the_model(exc, kind)
                if unsupported is None:
                    raise
                raise unsupported from exc
            if not _callback_files(cache, kind, key):
                raise CachedPathUnsupported(
                    f"numba could not cache the {kind} callback; the model uses an operation that "
                    "cannot be disk-cached (run 'batchfit check' to see which)"
                )
            clock.stage(f"nutpie's {kind} callback (numba, cached)")
    if part != "logp":
        SamplerFunctions(model).shapes()
        clock.stage("per-process functions (initial point, shapes)")
        warm_extras(model, outputs)
        clock.stage("optional outputs")
    return {"spec": spec.to_json()}


def refuse_object_mode_early(model: Any, graphs: SamplerGraphs) -> None:
    """Raise what `build_entry` would (`CachedPathUnsupported`) for a model with an object-mode
    operation, in the job, before its second compile worker gets its work (`build_in_child`'s check).

    Such a model goes through nutpie's own compile, which the job then waits for: the workers'
    imports and rewrites would come on top of it. Checked only where the graphs, as PyMC built
    them, hold an operation with no numba implementation (a quick walk, no rewrite); then both
    graphs are rewritten and converted as a single worker would (no numba compile), and only the
    object-mode operations that finds decide, named as in `build_entry`. Any other such model is
    still found by its workers.
    """
    from pytensor.graph.traversal import ancestors

    numba_ops.register()  # the ops PyMC's graphs hold that PyTensor's numba backend lacks

    nodes = (v.owner for v in ancestors([graphs.logp, graphs.expanded]) if v.owner is not None)
    if not any(lacks_numba_implementation(node.op) for node in nodes):
        return
    with record_generic_fallbacks() as fallbacks:
        compile_sampler_functions(model, graphs, PARTS["all"])
    if fallbacks:
        raise _object_mode_unsupported(fallbacks)


def _object_mode_unsupported(fallbacks: list[tuple[Any, Any]]) -> CachedPathUnsupported:
    """Why the cached path cannot take a model whose graphs PyTensor converted with these object-mode fallbacks."""
    ops = ", ".join(sorted({type(op).__name__ for op, _ in fallbacks}))
    return CachedPathUnsupported(f"the model uses an operation with no numba implementation ({ops}), which "
                                 "numba runs in object mode and batchfit's cached callbacks cannot call")


def _callback_files(cache: CacheDir, kind: str, key: str) -> list[Any]:
    """The machine-code files numba wrote for an entry's callback (none until it is compiled)."""
    return list(cache.numba_dir.glob(f"batchfit_{kind}*-{key}.*.nbc"))


def numba_failure_of_the_model(exc: Exception, kind: str) -> CachedPathUnsupported | None:
    """``exc``, from numba compiling a callback, as a failure of the model's graph (numba cannot type
    one of PyTensor's implementations of its operations), or None when it is batchfit's own.

    numba's message lists the places it was typing, innermost first (``File "...", line N``);
    the callback's own source is compiled under the name ``batchfit_{kind}`` (`make_callback`):
    if the innermost place is there, the callback itself is wrong, which is a bug.
    """
    places = re.findall(r'File "([^"]+)", line \d+', str(exc))
    if not places or places[0] == f"batchfit_{kind}":
        return None
    return CachedPathUnsupported(f"numba cannot compile the model's graph inside the {kind} callback: {one_line(exc)}")


class _StageClock:
    """Logs how long each stage of a compile took, in wall and this process's CPU time: where a cold
    sweep's time goes (the CPU time also on a machine that other work keeps busy)."""

    def __init__(self, key: str):
        self.key = key
        self.last = time.perf_counter()
        self.last_cpu = time.process_time()

    def stage(self, name: str) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        log.info("compile %s: %s in %.1f s (CPU %.1f s)", self.key[:12], name, now - self.last, cpu - self.last_cpu)
        self.last, self.last_cpu = now, cpu


def load_callbacks(cache: CacheDir, key: str, entry: dict[str, Any]) -> tuple[WrapperSpec, Any, Any]:
    """An entry's callbacks from numba's cache, without compiling; CorruptEntry if unusable."""
    spec = WrapperSpec.from_json(entry["spec"])
    try:
        logp = make_callback(spec, "logp", key, cache, missing_inner)
        expand = make_callback(spec, "expand", key, cache, missing_inner)
    except Exception as exc:
        # Absent from numba's index, or unreadable; anything else (an API change, say) is not
        # fixed by rebuilding.
        if not (isinstance(exc, LookupError) or is_damage_error(exc, cache)):
            raise
        raise CorruptEntry(f"numba could not load it ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from exc
    return spec, logp, expand
