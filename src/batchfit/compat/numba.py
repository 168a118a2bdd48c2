"""numba: caching functions generated from source, and loading a cached cfunc without the compiler."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
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
