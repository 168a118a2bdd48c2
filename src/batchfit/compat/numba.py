"""numba: caching functions generated from source, loading a cached cfunc without the compiler, and
compiling a cached function once between two processes."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

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
    registry (a noticeable part of every warm start) although loading machine code needs none of
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


_CLAIM_POLL_SECONDS = 0.02


@contextlib.contextmanager
def compiling_once(claims: Path, shared: Callable[[Callable], bool]) -> Iterator[None]:
    """Within the block, a function numba compiles into its disk cache (one ``shared`` says yes to,
    given its Python function) that another process using the same ``claims`` directory is compiling
    for the same types is not compiled again: this process waits for that compile's cache entry and
    loads it.

    Two processes that compile parts of one graph (`batchfit.compile.worker_pool`) often reach the same
    node function at once; each would compile it, on the same two cores. Before compiling, a
    process claims the entry (a file in ``claims``, created exclusively, holding its PID): numba
    0.68's ``Cache.load_overload`` is where a dispatcher looks for an entry before compiling
    (``Dispatcher.compile``), and ``Cache.save_overload`` writes it after; the claim goes when the
    entry is written, when the compile fails, or when its process has died. Both methods (and
    ``Dispatcher.compile``, to see a compile fail) are wrapped for the block.
    """
    from numba.core.caching import Cache
    from numba.core.dispatcher import Dispatcher

    claims.mkdir(parents=True, exist_ok=True)
    held: dict[Path, int] = {}  # this process's claims -> id of the cache compiling it
    load, save, compile_ = Cache.load_overload, Cache.save_overload, Dispatcher.compile

    def claim_of(cache: Any, sig: Any, codegen: Any) -> Path:
        entry = repr((cache._cache_path, cache._cache_file._index_name, cache._index_key(sig, codegen)))
        return claims / hashlib.sha256(entry.encode()).hexdigest()[:32]

    def load_once(self: Any, sig: Any, target_context: Any) -> Any:
        found = load(self, sig, target_context)
        if found is not None or not shared(self._py_func):
            return found
        claim = claim_of(self, sig, target_context.codegen())
        while claim not in held:
            try:
                with open(claim, "x") as f:
                    f.write(str(os.getpid()))
            except FileExistsError:
                _wait_while_claimed(claim)
                found = load(self, sig, target_context)
                if found is not None:
                    return found
                continue  # its compile failed: this process compiles it
            held[claim] = id(self)
        return None

    def save_once(self: Any, sig: Any, data: Any) -> None:
        try:
            save(self, sig, data)
        finally:
            claim = claim_of(self, sig, data.codegen)
            if held.pop(claim, None) is not None:
                claim.unlink(missing_ok=True)

    def compile_once(self: Any, sig: Any) -> Any:
        try:
            return compile_(self, sig)
        except BaseException:
            cache = id(getattr(self, "_cache", None))
            for claim in [claim for claim, owner in held.items() if owner == cache]:
                del held[claim]
                claim.unlink(missing_ok=True)
            raise

    Cache.load_overload, Cache.save_overload, Dispatcher.compile = load_once, save_once, compile_once
    try:
        yield
    finally:
        Cache.load_overload, Cache.save_overload, Dispatcher.compile = load, save, compile_
        for claim in held:
            claim.unlink(missing_ok=True)


def _wait_while_claimed(claim: Path) -> None:
    """Wait until ``claim`` is gone, or its process (another one) has died, whose claim it removes."""
    while True:
        try:
            pid = int(claim.read_text() or 0)
        except (FileNotFoundError, ValueError):
            if not claim.exists():
                return
            pid = 0  # being written: its process is alive
        if pid == os.getpid():
            raise RuntimeError(f"this process waits for its own compile ({claim})")
        if pid and not _alive(pid):
            claim.unlink(missing_ok=True)
            return
        time.sleep(_CLAIM_POLL_SECONDS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
