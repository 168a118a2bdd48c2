"""The shared compiled-function cache directory: layout, trust, locking, entries and statistics.

Layout of ``cache_dir``::

    pytensor/                 PyTensor's base_compiledir; its numba cache is pytensor/numba/
    numba/                    numba's cache of other ``cache=True`` functions (NUMBA_CACHE_DIR)
    batchfit/numba/           numba object code of batchfit's sampler wrappers (cfuncs)
    batchfit/entries/KEY.json one manifest per compiled model structure (content address KEY)
    batchfit/locks/KEY.lock   held by the one process that compiles KEY
    batchfit/stats.jsonl      one line per hit or miss, for ``batchfit cache info``

Entries hold executable machine code, so a directory that other users can write to is only
used when it is ours or when the user explicitly trusts it (``cache.trust_shared``).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from batchfit.cache.bundle import install_entry
from batchfit.common.atomic import atomic_path
from batchfit.common.hashing import file_sha256
from batchfit.errors import CacheError

ENTRY_FORMAT = 1


@dataclass(frozen=True)
class CacheDir:
    """A validated cache directory and the paths inside it.

    ``bundle``: a compiled bundle (`batchfit.cache.bundle`) whose entries are installed when the
    directory lacks them, as on an executor without a shared filesystem; None: none.
    """

    root: Path
    bundle: Path | None = None

    @classmethod
    def at(cls, root: str | Path) -> CacheDir:
        """The cache directory at ``root`` (as configured: relative, or with ``~``), without creating it."""
        return cls(Path(root).expanduser().resolve())

    @property
    def pytensor_dir(self) -> Path:
        return self.root / "pytensor"

    @property
    def numba_dir(self) -> Path:
        return self.root / "batchfit" / "numba"

    @property
    def entries_dir(self) -> Path:
        return self.root / "batchfit" / "entries"

    @property
    def locks_dir(self) -> Path:
        return self.root / "batchfit" / "locks"

    @property
    def stats_path(self) -> Path:
        return self.root / "batchfit" / "stats.jsonl"

    def entry_path(self, key: str) -> Path:
        return self.entries_dir / f"{key}.json"

    def lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"


def check_trust(path: Path, *, trust_shared: bool) -> None:
    """Refuse a directory that other users can write to unless it is ours or explicitly trusted.

    Cache entries are machine code that batchfit loads and runs: whoever can write the
    directory can run code as the user. A world-writable directory we own gets a warning.
    """
    st = path.stat()
    writable_by_others = bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    if not writable_by_others:
        return
    ours = st.st_uid == os.getuid()
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if not ours and not trust_shared:
        raise CacheError(
            f"cache directory {path} is writable by other users and owned by uid {st.st_uid}, "
            "not by you. Cache entries are executable code, so anyone who can write there "
            "could run code as you. Use a private cache_dir, or, if you trust every user who can "
            "write it (e.g. your group on a cluster), set 'cache: {trust_shared: true}' in the config "
            "(see batchfit's docs/cache.md, 'Sharing a cache within a group')."
        )
    if st.st_mode & stat.S_IWOTH and not sticky and not trust_shared:
        warnings.warn(
            f"cache directory {path} is world-writable; any local user could place code in it. "
            f"Run 'chmod o-w {path}'.",
            stacklevel=2,
        )


def open_cache(root: str | Path, *, trust_shared: bool = False, bundle: str | Path | None = None) -> CacheDir:
    """Create (private by default) and validate the cache directory, then point PyTensor at it.

    ``bundle``: a compiled bundle to install missing entries from (see `CacheDir`).
    """
    cache = CacheDir(CacheDir.at(root).root, None if bundle is None else Path(bundle).resolve())
    try:
        cache.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise CacheError(f"cannot create cache directory {cache.root}: {exc.strerror}") from exc
    check_trust(cache.root, trust_shared=trust_shared)
    for sub in (cache.pytensor_dir, cache.numba_dir, cache.entries_dir, cache.locks_dir):
        sub.mkdir(parents=True, exist_ok=True)
    configure_pytensor(cache.pytensor_dir)
    configure_numba(cache.root / "numba")
    return cache


def configure_pytensor(compiledir: Path) -> None:
    """Make PyTensor compile into ``compiledir``.

    PyTensor reads its compile directory when it is first imported, so the flag goes into the
    environment (which also reaches child processes); if PyTensor is already imported, its
    numba cache path (where all of its numba code goes) is pointed there directly.
    """
    flag = f"base_compiledir={compiledir}"
    flags = [f for f in os.environ.get("PYTENSOR_FLAGS", "").split(",") if f and not f.startswith("base_compiledir=")]
    os.environ["PYTENSOR_FLAGS"] = ",".join([*flags, flag])
    if "pytensor" in sys.modules:  # too late for the flag: redirect the numba cache itself
        import pytensor.link.numba.cache as pytensor_numba_cache

        numba_dir = compiledir / "numba"
        numba_dir.mkdir(parents=True, exist_ok=True)
        pytensor_numba_cache.NUMBA_CACHE_PATH = numba_dir


def configure_numba(directory: Path) -> None:
    """Send numba's own file cache (``cache=True`` functions outside PyTensor) into the cache too."""
    os.environ["NUMBA_CACHE_DIR"] = str(directory)
    if "numba" in sys.modules:  # numba read the variable at import; its locator reads this
        import numba

        numba.config.CACHE_DIR = str(directory)


@contextlib.contextmanager
def compile_lock(cache: CacheDir, key: str, timeout: float) -> Iterator[bool]:
    """Hold the per-key lock while compiling; yields False if the wait timed out.

    The lock is an OS file lock (flock; on NFS the client maps it to a server-side lock), so
    the kernel releases it when its holder dies: a killed compile never deadlocks the others.
    After ``timeout`` seconds a waiter compiles anyway, since entries are written atomically.
    """
    lock = FileLock(cache.lock_path(key), timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        warnings.warn(
            f"waited {timeout:.0f} s for another process compiling cache entry {key[:12]}; "
            "compiling here as well",
            stacklevel=3,
        )
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def write_entry(cache: CacheDir, key: str, manifest: dict[str, Any]) -> None:
    """Record an entry atomically, with digests of the numba files it owns."""
    files = sorted(cache.numba_dir.glob(f"*-{key}.*"))
    record = {
        "format": ENTRY_FORMAT,
        "key": key,
        "created": time.time(),
        "files": {f.name: file_sha256(f) for f in files},
        **manifest,
    }
    with atomic_path(cache.entry_path(key)) as tmp:
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))


class CorruptEntry(Exception):
    """An entry failed its integrity check; the caller rebuilds it."""


def read_entry(cache: CacheDir, key: str) -> dict[str, Any] | None:
    """Return the manifest of a valid entry, None if absent; raise CorruptEntry if damaged."""
    path = cache.entry_path(key)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CorruptEntry(f"manifest {path.name} is unreadable ({exc})") from exc
    if not isinstance(record, dict) or record.get("key") != key or record.get("format") != ENTRY_FORMAT:
        raise CorruptEntry(f"manifest {path.name} does not belong to this entry")
    for name, digest in record.get("files", {}).items():
        try:
            actual = file_sha256(cache.numba_dir / name)
        except FileNotFoundError as exc:
            raise CorruptEntry(f"file {name} is missing") from exc
        if actual != digest:
            raise CorruptEntry(f"file {name} is truncated or modified")
    if not record.get("files"):
        raise CorruptEntry(f"manifest {path.name} lists no compiled files")
    return record


def remove_entry(cache: CacheDir, key: str) -> None:
    """Delete an entry's manifest and numba files (used to rebuild a damaged one)."""
    cache.entry_path(key).unlink(missing_ok=True)
    for f in cache.numba_dir.glob(f"*-{key}.*"):
        f.unlink(missing_ok=True)


def record_event(cache: CacheDir, event: str, key: str, seconds: float, saved: float = 0.0) -> None:
    """Append one hit/miss line to the statistics log (a short O_APPEND write is atomic)."""
    line = json.dumps({"t": time.time(), "event": event, "key": key,
                       "seconds": round(seconds, 4), "saved": round(saved, 4)})
    with contextlib.suppress(OSError):
        with open(cache.stats_path, "a") as fh:
            fh.write(line + "\n")


@dataclass(frozen=True)
class Fetched[T]:
    """What ``get_or_build`` returns: the loaded value and how it was obtained."""

    value: T
    key: str
    hit: bool
    seconds: float  # to obtain it here, loading and (on a miss) building
    compile_seconds: float  # what building the entry cost when it was built
    installed: bool = False  # a hit installed from the cache's compiled bundle first


def get_or_build[T](cache: CacheDir, key: str, *, load: Callable[[dict[str, Any]], T],
                    build: Callable[[], dict[str, Any]], lock_timeout: float) -> Fetched[T]:
    """The one way through the cache: load the entry ``key``, building it first if no process has.

    ``load(manifest)`` turns a verified entry into a value, raising ``CorruptEntry`` if its files
    cannot be used; ``build()`` writes the entry's files and returns the rest of its manifest.
    This function owns the rest: the per-key lock (one process builds, the others wait and
    load), verification (a damaged entry is reported, removed and rebuilt), the manifest with
    the files' digests, and the hit/miss statistics. An entry the cache lacks but its compiled
    bundle holds (`CacheDir.bundle`) is installed from there, under the lock, and loaded: a hit.
    """
    start = time.perf_counter()
    loaded = _load_verified(cache, key, load)
    hit, installed = loaded is not None, False
    if loaded is None:
        with compile_lock(cache, key, lock_timeout):
            loaded = _load_verified(cache, key, load)  # built by another process while we waited
            if loaded is None and cache.bundle is not None and install_entry(cache, key, cache.bundle):
                installed = True
                loaded = _load_verified(cache, key, load)
            hit = loaded is not None
            if loaded is None:
                build_start = time.perf_counter()
                manifest = build()
                write_entry(cache, key, {**manifest, "compile_seconds": time.perf_counter() - build_start})
                loaded = _load_verified(cache, key, load)
        if loaded is None:
            raise CacheError(f"cache entry {key[:12]} was built but cannot be loaded from {cache.root}")
    value, entry = loaded
    seconds = time.perf_counter() - start
    compile_seconds = float(entry.get("compile_seconds", 0.0))
    record_event(cache, "hit" if hit else "miss", key, seconds, compile_seconds if hit else 0.0)
    return Fetched(value, key, hit, seconds, compile_seconds, installed)


def _load_verified[T](cache: CacheDir, key: str,
                      load: Callable[[dict[str, Any]], T]) -> tuple[T, dict[str, Any]] | None:
    """Load an entry and its manifest; a damaged one is reported, removed and treated as absent."""
    try:
        entry = read_entry(cache, key)
        return None if entry is None else (load(entry), entry)
    except CorruptEntry as exc:
        warnings.warn(f"cache entry {key[:12]} in {cache.root} is damaged: {exc}; rebuilding it", stacklevel=4)
        remove_entry(cache, key)
        return None
