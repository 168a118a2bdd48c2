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
import glob
import hashlib
import io
import json
import os
import pickle
import pickletools
import re
import shutil
import stat
import struct
import sys
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from filelock import FileLock, Timeout

from batchfit.atomic import atomic_path
from batchfit.errors import CacheError

ENTRY_FORMAT = 1


@dataclass(frozen=True)
class CacheDir:
    """A validated cache directory and the paths inside it."""

    root: Path

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
            "(see README, 'Sharing a cache')."
        )
    if st.st_mode & stat.S_IWOTH and not sticky and not trust_shared:
        warnings.warn(
            f"cache directory {path} is world-writable; any local user could place code in it. "
            f"Run 'chmod o-w {path}'.",
            stacklevel=2,
        )


def open_cache(root: str | Path, *, trust_shared: bool = False) -> CacheDir:
    """Create (private by default) and validate the cache directory, then point PyTensor at it."""
    cache = CacheDir.at(root)
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


def file_digest(path: Path) -> str:
    """sha256 of a file, to detect truncated, corrupted or replaced cache files."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_entry(cache: CacheDir, key: str, manifest: dict[str, Any]) -> None:
    """Record an entry atomically, with digests of the numba files it owns."""
    files = sorted(cache.numba_dir.glob(f"*-{key}.*"))
    record = {
        "format": ENTRY_FORMAT,
        "key": key,
        "created": time.time(),
        "files": {f.name: file_digest(f) for f in files},
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
            actual = file_digest(cache.numba_dir / name)
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


# --- integrity of every file in the cache directory --------------------------------------------
#
# batchfit's manifests only cover its own callbacks; PyTensor's and numba's files (pytensor/,
# numba/) have no checksums, and numba trusts its pickles: a truncated index stops every
# compile with an UnpicklingError. So one validator knows each kind of file and checks its
# *structure* without running anything from it (a pickle must parse to its last byte, a shared
# library must hold its section table, ...); ``batchfit cache verify`` runs it over the whole
# directory, and a compile that fails with an error that damage causes runs it, removes what
# it finds and tries once more.

# Errors that reading a truncated, emptied or overwritten pickle or compressed stream raises.
DAMAGE_ERRORS: tuple[type[BaseException], ...] = (pickle.UnpicklingError, EOFError, zlib.error)
# numba's methods that read its cache files: unpickling garbage can raise nearly any type there.
_NUMBA_READERS = frozenset({"_load_index", "_load_data"})
_NUMBA_CACHING = os.path.join("numba", "core", "caching.py")


@dataclass(frozen=True)
class Damage:
    """A cache file that cannot be what its name says, and why."""

    path: Path
    reason: str

    def line(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}: {self.reason}"


def _pickles_problem(data: bytes, count: int) -> str | None:
    """Whether ``data`` is exactly ``count`` complete pickles (numba: index 2, data file 1)."""
    if not data:
        return "empty"
    stream = io.BytesIO(data)
    try:
        for _ in range(count):
            for _opcode in pickletools.genops(stream):
                pass
    except Exception as exc:  # noqa: BLE001 - parsing bytes only; any failure means a broken pickle
        return f"not a complete pickle ({type(exc).__name__}: {exc})"
    if stream.tell() != len(data):
        return "unexpected bytes after the pickled data"
    return None


def _json_problem(data: bytes) -> str | None:
    try:
        json.loads(data)
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    return None


def _jsonl_problem(data: bytes) -> str | None:
    bad = [i for i, line in enumerate(data.splitlines(), 1) if line.strip() and _json_problem(line)]
    return f"lines {bad[:5]} are not valid JSON" if bad else None


def _elf_problem(data: bytes) -> str | None:
    """A compiled extension must be an ELF file holding its section table (it ends the file)."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return "not an ELF shared library"
    order = "<" if data[5] == 1 else ">"
    # e_shoff, then e_shentsize and e_shnum, at their offsets in the 64- or 32-bit header
    offset_format, at, sizes_at = (order + "Q", 0x28, 0x3A) if data[4] == 2 else (order + "I", 0x20, 0x2E)
    (table,) = struct.unpack_from(offset_format, data, at)
    entry_size, entries = struct.unpack_from(order + "HH", data, sizes_at)
    end = table + entry_size * entries
    if end > len(data):
        return f"truncated shared library ({len(data)} bytes, its section table ends at byte {end})"
    return None


def _version_module_problem(data: bytes) -> str | None:
    """PyTensor's lazylinker_ext/__init__.py: empty (not built yet) or '_version = X'."""
    if re.fullmatch(rb"\s*(_version = [0-9.]+\s*)?", data) is None:
        return "not PyTensor's '_version = ...' line"
    return None


def _checker(path: Path) -> Callable[[bytes], str | None] | None:
    """How to check a file of this name; None for files whose content nothing reads (locks, C sources)."""
    name = path.name
    if name.endswith(".nbi"):
        return lambda data: _pickles_problem(data, 2)  # numba's version, then (stamp, {signature: data file})
    if name.endswith(".nbc"):
        return lambda data: _pickles_problem(data, 1)  # one compiled overload
    if name.endswith(".json"):
        return _json_problem
    if name.endswith(".jsonl"):
        return _jsonl_problem
    if name.endswith(".so"):
        return _elf_problem
    if name == "__init__.py" and path.parent.name == "lazylinker_ext":
        return _version_module_problem
    return None


def file_problem(path: Path) -> str | None:
    """Why the cache file ``path`` is damaged (truncated, emptied or garbage), or None if it looks intact."""
    check = _checker(path)
    if check is None:
        return None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None  # removed meanwhile (e.g. by a repair in another process)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return check(data)


def _in_progress(path: Path) -> bool:
    """A temporary file of an atomic write (batchfit's ``.x.pid.hex.tmp.ext``, numba's ``x.tmp.uid``)."""
    return ".tmp" in path.name


def find_damage(cache: CacheDir) -> list[Damage]:
    """Every damaged file in the cache directory (one walk, reading only files something reads)."""
    found = []
    for path in sorted(cache.root.rglob("*")):
        if path.is_file() and not path.is_symlink() and not _in_progress(path):
            reason = file_problem(path)
            if reason is not None:
                found.append(Damage(path, reason))
    return found


_KEY_IN_NAME = re.compile(r"(?:^|-)([0-9a-f]{40})\.")


def entry_key_of(cache: CacheDir, path: Path) -> str | None:
    """The entry a file of batchfit's (a manifest or a callback's numba file) belongs to."""
    if path.parent not in (cache.entries_dir, cache.numba_dir):
        return None
    found = _KEY_IN_NAME.search(path.name)
    return found.group(1) if found else None


def remove_damage(cache: CacheDir, damage: Damage) -> None:
    """Remove a damaged file and whatever depends on it, so its owner rebuilds it on next use.

    A batchfit file takes its whole entry with it; a numba index its data files (unreachable
    without it); a damaged file of PyTensor's compiled C extension the extension (PyTensor
    compiles it again); the statistics log keeps its readable lines.
    """
    path = damage.path
    key = entry_key_of(cache, path)
    if key is not None:
        remove_entry(cache, key)
    elif path.parent.name == "lazylinker_ext":
        shutil.rmtree(path.parent, ignore_errors=True)
    elif path == cache.stats_path:
        lines = [line for line in path.read_bytes().splitlines(keepends=True) if not _json_problem(line)]
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"".join(lines))
    else:
        if path.name.endswith(".nbi"):
            for data_file in path.parent.glob(f"{glob.escape(path.name[:-len('.nbi')])}.*.nbc"):
                data_file.unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def heal(cache: CacheDir) -> list[Damage]:
    """Find and remove every damaged file; return what was removed (for the caller's warning)."""
    found = find_damage(cache)
    for damage in found:
        remove_damage(cache, damage)
    return found


def damage_message(cache: CacheDir, found: list[Damage]) -> str:
    """One warning naming every damaged file that was removed."""
    names = "; ".join(d.line(cache.root) for d in found)
    return f"{len(found)} damaged file(s) in cache {cache.root} removed and rebuilt: {names}"


def is_damage_error(exc: BaseException, cache: CacheDir) -> bool:
    """Whether ``exc`` (or an exception it came from) is what reading a damaged cache file raises.

    Specific on purpose: an unpickling, end-of-file or zlib error anywhere; any error raised
    while numba reads one of its cache files (unpickling garbage can raise nearly any type) or
    while Python runs a module from the cache directory (PyTensor's compiled C extension).
    An AttributeError from an API change elsewhere is a bug, not damage, and is never retried.
    """
    root = str(cache.root) + os.sep
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, DAMAGE_ERRORS):
            return True
        for frame in traceback.extract_tb(current.__traceback__):
            in_numba_reader = frame.name in _NUMBA_READERS and frame.filename.endswith(_NUMBA_CACHING)
            if in_numba_reader or frame.filename.startswith(root):
                return True
        todo += [current.__cause__, current.__context__]
    return False


def retry_after_healing[T](cache: CacheDir, what: str, action: Callable[[], T]) -> T:
    """Run ``action``; if it fails on a damaged cache file, remove the damage (warning which) and run it once more."""
    try:
        return action()
    except Exception as exc:
        if not is_damage_error(exc, cache):
            raise
        removed = heal(cache)
        if not removed:  # nothing damaged on disk: retrying would fail the same way
            raise
        warnings.warn(f"{what}: {damage_message(cache, removed)}", stacklevel=2)
    return action()


# --- numba: let exec-generated wrapper functions be cached under a content key -------------

_WRAPPER_KEYS: WeakKeyDictionary = WeakKeyDictionary()


def register_wrapper(py_func: Any, key: str, cache: CacheDir) -> None:
    """Have numba cache ``py_func`` (generated from source) in ``cache`` under ``key``.

    numba can only cache functions defined in files; batchfit's wrappers are generated from
    source, so a locator maps them to the cache directory with the content key as the
    disambiguator and as the source stamp (a changed key never loads an old entry).
    """
    _install_locator()
    _WRAPPER_KEYS[py_func] = (key, cache.numba_dir)


_locator_installed = False


def _install_locator() -> None:
    global _locator_installed
    if _locator_installed:
        return
    from numba.core.caching import CacheImpl, _CacheLocator

    class _WrapperLocator(_CacheLocator):
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
        def from_function(cls, py_func: Any, py_file: str) -> _WrapperLocator | None:
            found = _WRAPPER_KEYS.get(py_func)
            return None if found is None else cls(*found)

    CacheImpl._locator_classes.insert(0, _WrapperLocator)
    _locator_installed = True
