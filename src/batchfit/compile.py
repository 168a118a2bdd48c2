"""Compile a model structure once into the shared cache, and load it in every later process.

A structure's entry holds batchfit's two nutpie callbacks (:mod:`batchfit.callbacks`), compiled
from the graphs of :mod:`batchfit.graphs` under their content address (``sampler_key``). This
module says how to build an entry and how to load one; :func:`batchfit.cache.get_or_build`
owns the rest (locking, verification, manifests, statistics).

A miss compiles in a child process (``python -m batchfit.compile``; two at once, each compiling
part of the entry, when the job has two cores): the parent then loads the entry exactly like
any later process would, so every fit runs the very same machine code (code
JIT-compiled in-process can differ in the last bit from code emitted for the cache), and the
parent's memory never holds an LLVM compile. The children's warnings and log lines are passed on
to the parent's log.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.cache import CacheDir, CorruptEntry, Fetched, get_or_build
from batchfit.cache_heal import damage_message, heal, is_damage_error, retry_after_healing
from batchfit.callbacks import WrapperSpec, make_callback, missing_inner
from batchfit.compat import import_nutpie
from batchfit.config import OutputSettings
from batchfit.errors import BatchfitError, CachedPathUnsupported, one_line
from batchfit.extras import warm_extras
from batchfit.graphs import SamplerGraphs, compile_sampler_functions, sampler_key
from batchfit.nopython import record_generic_fallbacks
from batchfit.sampler import CompiledModel, SamplerFunctions
from batchfit.standby import Standby, finish

log = logging.getLogger("batchfit")

NO_OUTPUTS = OutputSettings(log_likelihood=False, posterior_predictive=False)

# Exit code of a compile worker that failed reading a damaged cache file: the parent heals the
# cache (one process, once every worker has exited) and builds the entry again.
DAMAGED_EXIT = 3
# Exit code of a compile worker whose model the cached path cannot take (`CachedPathUnsupported`):
# the parent raises it, and the structure goes through nutpie's own compile. Any other failure
# of a worker is batchfit's bug: the parent raises it with the worker's traceback.
UNSUPPORTED_EXIT = 4

# What numba and PyTensor read once, when imported: the cache's directories (`open_cache`) and
# numba's CPU target (`batchfit.cputarget`). A compile worker may start before its parent has
# set them, so it imports those libraries only once told them (`worker_environment`).
WORKER_ENVIRONMENT = ("PYTENSOR_FLAGS", "NUMBA_CACHE_DIR", "NUMBA_CPU_NAME")


def worker_environment() -> str:
    """The line a compile worker reads before importing numba and PyTensor: this process's values
    of WORKER_ENVIRONMENT (null: unset), as JSON."""
    return json.dumps({name: os.environ.get(name) for name in WORKER_ENVIRONMENT}, sort_keys=True)


@dataclass(frozen=True)
class ModelSource:
    """How a child process rebuilds the same model: the model file, one dataset and its coding."""

    model_file: Path
    dataset_id: str
    dataset_path: Path
    coding: dict[str, Any] = dataclasses.field(default_factory=dict)  # Coding.for_dataset(dataset_id)
    outputs: OutputSettings = NO_OUTPUTS  # the optional outputs to pre-compile


@dataclass(frozen=True)
class CompileReport:
    """How a compiled model was obtained, for the one log line per job."""

    key: str
    hit: bool
    seconds: float
    compile_seconds: float

    @classmethod
    def of(cls, fetched: Fetched[Any]) -> CompileReport:
        return cls(fetched.key, fetched.hit, fetched.seconds, fetched.compile_seconds)

    def line(self) -> str:
        if self.hit:
            return (f"cache hit {self.key[:12]}: ready in {self.seconds:.2f} s "
                    f"(saved {self.compile_seconds:.1f} s of compiling)")
        return f"cache miss {self.key[:12]}: compiled in {self.compile_seconds:.1f} s"


# What a compile worker builds: every part of an entry, or one of the two halves that two workers
# build at once (the log density's callback takes about three quarters of a compile).
PARTS: dict[str, tuple[str, ...]] = {"all": ("logp", "expand"), "logp": ("logp",), "rest": ("expand",)}


def build_entry(model: Any, cache: CacheDir, key: str, graphs: SamplerGraphs,
                outputs: OutputSettings = NO_OUTPUTS, part: str = "all") -> dict[str, Any]:
    """Compile ``part`` of the entry for ``model`` into the cache's numba directory; return the manifest's spec.

    Every part but "logp" also runs the per-process functions and the optional ``outputs`` once,
    so that what the fit stage compiles through PyTensor lands in PyTensor's numba cache too.
    """
    # Not at the top: a compile worker imports this module before it is told numba's environment.
    from numba.core.errors import NumbaError

    clock = _StageClock(key)
    with record_generic_fallbacks() as fallbacks:
        spec, logp_fn, expand_fn = compile_sampler_functions(model, graphs)
    if fallbacks:
        # A cached callback cannot run an object-mode op (nutpie's call fails at initialisation):
        # say so now, before compiling the callbacks, so the structure goes through nutpie's own compile.
        ops = ", ".join(sorted({type(op).__name__ for op, _ in fallbacks}))
        raise CachedPathUnsupported(f"the model uses an operation with no numba implementation ({ops}), which "
                                    "numba runs in object mode and batchfit's cached callbacks cannot call")
    clock.stage("log density, gradient and expansion functions")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Cannot cache compiled function.*")
        for kind in PARTS[part]:
            try:
                make_callback(spec, kind, key, cache, (logp_fn if kind == "logp" else expand_fn).vm.jit_fn)
            except NumbaError as exc:
                unsupported = numba_failure_of_the_model(exc, kind)
                if unsupported is None:
                    raise
                raise unsupported from exc
            if not list(cache.numba_dir.glob(f"batchfit_{kind}*-{key}.*.nbc")):
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
    """Logs how long each stage of a compile took: where a cold sweep's time goes."""

    def __init__(self, key: str):
        self.key = key
        self.last = time.perf_counter()

    def stage(self, name: str) -> None:
        now = time.perf_counter()
        log.info("compile %s: %s in %.1f s", self.key[:12], name, now - self.last)
        self.last = now


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


def compile_model(model: Any, cache: CacheDir, *, source: ModelSource | None = None,
                  lock_timeout: float = 600.0, workers: int | Standby = 1) -> CompiledModel:
    """Return the compiled callbacks for ``model``, compiling them only if no process did before.

    With ``source`` a miss compiles in child processes, two at once if ``workers`` (the cores
    this job may use, or a `Standby` of workers already starting) allows (see module docstring
    and `build_in_child`); without it, in this process.
    """
    with _collector_paused():
        graphs = SamplerGraphs.of(model)
        key = sampler_key(model, graphs)

    prepared: list[SamplerFunctions] = []  # the per-process functions, built while a child compiles

    def prepare_functions() -> None:
        import_nutpie()  # every caller samples next
        prepared.append(SamplerFunctions(model))

    def build() -> dict[str, Any]:
        if source is not None:
            return build_in_child(source, cache, key, workers=workers, meanwhile=prepare_functions)
        return retry_after_healing(cache, f"compiling cache entry {key[:12]}",
                                   lambda: build_entry(model, cache, key, graphs, NO_OUTPUTS))

    def load(entry: dict[str, Any]) -> tuple[WrapperSpec, Any, Any]:
        with _collector_paused():
            return load_callbacks(cache, key, entry)

    fetched = get_or_build(cache, key, load=load, build=build, lock_timeout=lock_timeout)
    spec, logp, expand = fetched.value

    def functions() -> CompiledModel:
        with _collector_paused():
            return CompiledModel(key, spec, logp, expand, model, CompileReport.of(fetched),
                                 functions=prepared[0] if prepared else None)

    # The per-process functions compile through PyTensor, which reads its own files in the cache.
    return retry_after_healing(cache, f"cache entry {key[:12]}", functions)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Run the block without Python's cyclic garbage collector.

    A warm start imports numba's and PyTensor's dispatch modules (unpickling numba's environments
    does) and builds graphs: hundreds of thousands of objects that all survive, and each allocation
    burst sets off collections that walk the whole heap, pymc's and pytensor's included. Pausing
    them for these short, bounded steps shortened a warm start by about a sixth
    (benchmarks/cache_load.py: 0.642 s before, 0.541 s after); garbage made meanwhile is collected
    once the collector runs again. Long steps (a compile) are never run paused.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_in_child(source: ModelSource, cache: CacheDir, key: str, *, workers: int | Standby = 1,
                   meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
    """Compile an entry in fresh interpreters that rebuild the same model; return its manifest.

    ``workers``: how many may compile at once (the job's cores), or a `Standby` of workers
    started earlier (`batchfit.pipeline.run_compile`). With two or more, one interpreter
    compiles the log density's callback (the longest part; it takes a worker already started)
    while another compiles the rest: numba compiles a function on one core. A worker that failed
    reading a damaged cache file exits with DAMAGED_EXIT; once all have exited this process
    removes the damage (here, not in the workers: two workers healing at once each see only
    what the other left) and one worker builds the entry again (in a fresh process, so no
    half-loaded numba state is reused); the damage is reported in the job's own warnings. The
    workers' other output goes to our log.

    ``meanwhile`` runs in this thread while the workers compile (this process would only wait);
    the threads that wait for the workers only pass their work and read their output: they import
    nothing, so no import ever runs beside this thread's.
    """
    argv = ["--cache-dir", str(cache.root), "--key", key, "--model-file", str(source.model_file),
            "--dataset-id", source.dataset_id, "--dataset-path", str(source.dataset_path),
            "--coding", json.dumps(source.coding), "--outputs", json.dumps(dataclasses.asdict(source.outputs))]
    standby = _told(workers if isinstance(workers, Standby) else Standby(__name__, workers))
    parts = ("logp", "rest") if standby.limit >= 2 else ("all",)
    with ThreadPoolExecutor(len(parts)) as pool:
        running = {part: pool.submit(_run_worker, proc, [*argv, "--part", part], part)
                   for part, proc in zip(parts, standby.take(len(parts)), strict=True)}
        if meanwhile is not None:
            meanwhile()
        procs = {part: future.result() for part, future in running.items()}
    damaged = [part for part, proc in procs.items() if proc.returncode == DAMAGED_EXIT]
    if damaged:
        removed = heal(cache)
        if not removed:
            raise BatchfitError(f"the compile worker ({damaged[0]}) failed reading cache {cache.root}, but no "
                                f"damaged file was found there: {_result(procs[damaged[0]])['damaged']}")
        warnings.warn(f"compiling cache entry {key[:12]}: {damage_message(cache, removed)}", stacklevel=3)
        procs = {"all": _run_worker(_told(Standby(__name__, 1)).take(1)[0], [*argv, "--part", "all"], "all")}
    for proc in procs.values():
        if proc.returncode == UNSUPPORTED_EXIT:
            raise CachedPathUnsupported(_result(proc)["unsupported"])
    for part, proc in procs.items():
        if proc.returncode != 0:
            detail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
            failure = RuntimeError(f"the compile worker ({part}) failed: {detail}")
            failure.add_note(f"the worker's output:\n{proc.stderr.rstrip()}")
            raise failure
    manifests = [_result(proc)["manifest"] for proc in procs.values()]
    if any(manifest != manifests[0] for manifest in manifests):
        raise RuntimeError(f"the compile workers of cache entry {key[:12]} built different callback layouts")
    return manifests[0]


def _told(standby: Standby) -> Standby:
    """``standby``, its processes told the environment to import numba and PyTensor under
    (again, if its starter told them already: the same line is written once)."""
    standby.announce(worker_environment())
    return standby


def _run_worker(proc: subprocess.Popen, argv: list[str], part: str) -> subprocess.CompletedProcess:
    """Give a started worker its arguments and wait for it."""
    return finish(proc, json.dumps(argv).encode(), f"compile worker ({part})")


def _result(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """The JSON line a worker printed last."""
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _standby_start() -> list[str] | None:
    """A `batchfit.standby` worker's imports, then its arguments (None if its parent sent none).

    What the model file, the graphs and numba's compile import (~1.2 s of the worker's start),
    done while the parent is still importing, reading the data and computing the key. First
    xarray, pandas and SciPy's sparse arrays (~0.5 s), which read none of WORKER_ENVIRONMENT:
    the compile job starts this process before it has read its config. Then, once its parent
    has said what they are (one line, `worker_environment`), numba and PyTensor.
    """
    import scipy.sparse  # noqa: F401
    import xarray  # noqa: F401

    early = {"numba", "pytensor"} & sys.modules.keys()
    if early:  # a library's new import: they would ignore the parent's environment
        raise RuntimeError(f"the compile worker imported {sorted(early)} before its environment")
    environment = sys.stdin.readline()
    if not environment:
        return None
    for name, value in json.loads(environment).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    import pymc  # noqa: F401
    import pytensor.link.numba.dispatch  # noqa: F401

    work = sys.stdin.read()
    return json.loads(work) if work else None


def main(argv: Sequence[str] | None = None) -> int:
    """Compile worker: rebuild a model from its file and one dataset, compile it into the cache.

    Without ``argv``, a `batchfit.standby` process, which reads them from stdin (`_standby_start`).
    """
    from batchfit.cache import open_cache
    from batchfit.coding import Coding
    from batchfit.data import load_dataset
    from batchfit.modelfile import build_model, load_model_file

    if argv is None:
        argv = _standby_start()
        if argv is None:  # its parent died, or needed no worker
            return 0
    parser = argparse.ArgumentParser(prog="python -m batchfit.compile")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--dataset-id", required=True)
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--coding", default="{}", help="the dataset's text-column coding (JSON)")
    parser.add_argument("--outputs", default="{}", help="the optional outputs to pre-compile (JSON)")
    parser.add_argument("--part", choices=sorted(PARTS), default="all", help="what of the entry to compile")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(message)s")
    log.setLevel(logging.INFO)  # batchfit's own lines; other libraries' warnings and worse
    logging.captureWarnings(True)
    cache = open_cache(args.cache_dir, trust_shared=True)  # the parent already checked it
    coding = json.loads(args.coding)
    dataset = load_dataset(args.dataset_id, Path(args.dataset_path), Coding.from_json(coding) if coding else None)
    model = build_model(load_model_file(Path(args.model_file)), dataset)
    with _collector_paused():
        graphs = SamplerGraphs.of(model)
        key = sampler_key(model, graphs)
    if key != args.key:
        print(json.dumps({"unsupported": f"the model built from {args.model_file} differs between processes "
                                         f"(key {key[:12]} != {args.key[:12]}): for the cached path, build_model "
                                         "must build the same model from the same dataset every time"}))
        return UNSUPPORTED_EXIT
    outputs = json.loads(args.outputs)
    try:
        manifest = build_entry(model, cache, key, graphs, OutputSettings(
            bool(outputs.get("log_likelihood")), bool(outputs.get("posterior_predictive"))), args.part)
    except CachedPathUnsupported as exc:
        print(json.dumps({"unsupported": str(exc)}))
        return UNSUPPORTED_EXIT
    except Exception as exc:
        if not is_damage_error(exc, cache):
            raise  # batchfit's bug: the traceback goes to the parent, which fails the structure with it
        # Not healed nor retried here: the parent heals once all workers are done (see build_in_child).
        print(json.dumps({"damaged": f"{type(exc).__name__}: {exc}"}))
        return DAMAGED_EXIT
    print(json.dumps({"key": key, "manifest": manifest}))
    return 0


if __name__ == "__main__":
    from batchfit.quick_exit import quick_exit

    quick_exit(main())  # the work is done, its files closed: no interpreter teardown
