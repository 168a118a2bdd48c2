"""The compile workers a job starts: fresh interpreters that rebuild the model and compile an entry.

A miss compiles in child processes (`batchfit.compile.worker_process`; two at once, each compiling part
of the entry, when the job has two cores): the parent then loads the entry exactly like any
later process would, so every fit runs the very same machine code (code JIT-compiled in-process
can differ in the last bit from code emitted for the cache), and the parent's memory never holds
an LLVM compile. The workers' warnings and log lines are passed on to the parent's log; their
exit code says whether the model is one the cached path cannot take (`UNSUPPORTED_EXIT`) or
the cache was damaged (`DAMAGED_EXIT`); any other failure is batchfit's bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pickle
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.cache.heal import damage_message, heal
from batchfit.cache.store import CacheDir
from batchfit.common.standby import Standby, finish, standing_by
from batchfit.data.dataset import Dataset
from batchfit.errors import BatchfitError, CachedPathUnsupported
from batchfit.settings import OutputSettings

log = logging.getLogger("batchfit")

NO_OUTPUTS = OutputSettings(log_likelihood=False, posterior_predictive=False)

# What a compile worker builds: every part of an entry, or one of the two halves that two workers
# build at once (the log density's callback takes most of a compile).
PARTS: dict[str, tuple[str, ...]] = {"all": ("logp", "expand"), "logp": ("logp",), "rest": ("expand",)}

# Exit code of a compile worker that failed reading a damaged cache file: the parent heals the
# cache (one process, once every worker has exited) and builds the entry again.
DAMAGED_EXIT = 3


# Exit code of a compile worker whose model the cached path cannot take (`CachedPathUnsupported`):
# the parent raises it, and the structure goes through nutpie's own compile. Any other failure
# of a worker is batchfit's bug: the parent raises it with the worker's traceback.
UNSUPPORTED_EXIT = 4


# What numba and PyTensor read once, when imported: the cache's directories (`open_cache`) and
# numba's CPU target (`batchfit.numba_ops.cputarget`). A compile worker may start before its parent has
# set them, so it imports those libraries only once told them (`worker_environment`).
WORKER_ENVIRONMENT = ("PYTENSOR_FLAGS", "NUMBA_CACHE_DIR", "NUMBA_CPU_NAME")
WORKER_MODULE = "batchfit.compile.worker_process"  # what a worker runs: python -m WORKER_MODULE


def worker_environment() -> str:
    """The line a compile worker reads before importing numba and PyTensor: this process's values
    of WORKER_ENVIRONMENT (null: unset), as JSON."""
    return json.dumps({name: os.environ.get(name) for name in WORKER_ENVIRONMENT}, sort_keys=True)


@dataclass(frozen=True)
class ModelSource:
    """How a child process rebuilds the same model: the model file and the very dataset this process loaded
    (a snapshot of it is what the child reads: no rereading of files or tables, rules or coding)."""

    model_file: Path
    dataset: Dataset
    outputs: OutputSettings = NO_OUTPUTS  # the optional outputs to pre-compile
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # build_model's keyword parameters

    @property
    def dataset_id(self) -> str:
        return self.dataset.id


def compile_workers(threads: int) -> AbstractContextManager[Standby]:
    """The compile workers of a job with ``threads`` cores, as a `Standby` of `batchfit.compile.worker_process`.

    With two or more, the one that compiles the log density's callback (a miss's longest part)
    starts now, on the core the job leaves idle: its imports overlap the job's own, its reading
    of the data and its computing of the model's key. Only that one: a second would slow the job,
    which a hit (every warm sweep) waits for. On a hit it is killed unused.
    """
    return standing_by(WORKER_MODULE, threads, start=1 if threads >= 2 else 0)


def build_in_child(source: ModelSource, cache: CacheDir, key: str, *, workers: int | Standby = 1,
                   check: Callable[[], object] | None = None,
                   meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
    """Compile an entry in fresh interpreters that rebuild the same model; return its manifest.

    ``workers``: how many may compile at once (the job's cores), or a `Standby` of workers
    started earlier (`batchfit.sweep.stages.run_compile`). With two or more, one interpreter
    compiles the log density's callback (the longest part; it takes a worker already started)
    while another compiles the rest: numba compiles a function on one core. A worker that failed
    reading a damaged cache file exits with DAMAGED_EXIT; once all have exited this process
    removes the damage (here, not in the workers: two workers healing at once each see only
    what the other left) and one worker builds the entry again (in a fresh process, so no
    half-loaded numba state is reused); the damage is reported in the job's own warnings. The
    workers' other output goes to our log.

    ``check`` runs in this thread once the first worker has its work, before the second gets its
    own: a failure (the model is one the cached path cannot take) kills both and is raised.
    ``meanwhile`` runs in this thread while the workers compile (this process would only wait);
    the threads that wait for the workers only pass their work and read their output: they import
    nothing, so no import ever runs beside this thread's.
    """
    with tempfile.TemporaryDirectory(prefix="batchfit-compile-") as directory:
        snapshot = Path(directory) / "dataset.pickle"
        snapshot.write_bytes(pickle.dumps(source.dataset))
        argv = ["--cache-dir", str(cache.root), "--key", key, "--model-file", str(source.model_file),
                "--dataset", str(snapshot), "--outputs", json.dumps(dataclasses.asdict(source.outputs)),
                "--params", json.dumps(source.params)]
        return _build(argv, cache, key, workers, check, meanwhile)


def _build(argv: list[str], cache: CacheDir, key: str, workers: int | Standby, check: Callable[[], object] | None,
           meanwhile: Callable[[], object] | None) -> dict[str, Any]:
    """`build_in_child` once the workers' arguments are known."""
    standby = _told(workers if isinstance(workers, Standby) else Standby(WORKER_MODULE, workers))
    parts = ("logp", "rest") if standby.limit >= 2 else ("all",)
    taken = dict(zip(parts, standby.take(len(parts)), strict=True))  # the second imports meanwhile
    # Where the two claim the node functions each compiles (`batchfit.compat.numba.compiling_once`).
    claims = tempfile.TemporaryDirectory(prefix="batchfit-claims-") if len(parts) > 1 else contextlib.nullcontext()
    with claims as claims_dir, ThreadPoolExecutor(len(parts)) as pool:
        shared = ["--claims", claims_dir] if claims_dir else []
        running = {}
        for part, proc in taken.items():
            running[part] = pool.submit(_run_worker, proc, [*argv, "--part", part, *shared], part)
            if check is not None and len(running) == 1:
                try:
                    check()
                except BaseException:
                    for started in taken.values():
                        started.kill()
                    running[part].result()
                    for idle in list(taken.values())[1:]:
                        idle.communicate()
                    raise
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
        procs = {"all": _run_worker(_told(Standby(WORKER_MODULE, 1)).take(1)[0], [*argv, "--part", "all"], "all")}
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
