"""Integrity of every file in the cache directory: find damage, remove it, rebuild what it held.

batchfit's manifests only cover its own callbacks; PyTensor's and numba's files (pytensor/,
numba/) have no checksums, and numba trusts its pickles: a truncated index stops every
compile with an UnpicklingError. So one validator knows each kind of file and checks its
*structure* without running anything from it (a pickle must parse to its last byte, a shared
library must hold its section table, ...); ``batchfit cache verify`` runs it over the whole
directory, and a compile that fails with an error that damage causes runs it, removes what
it finds and tries once more.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import pickletools
import re
import shutil
import struct
import traceback
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchfit.cache.store import CacheDir, remove_entry
from batchfit.common.atomic import atomic_path
from batchfit.compat.numba import is_numba_cache_reader

# Errors that reading a truncated, emptied or overwritten pickle or compressed stream raises.
DAMAGE_ERRORS: tuple[type[BaseException], ...] = (pickle.UnpicklingError, EOFError, zlib.error)


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
            in_numba_reader = is_numba_cache_reader(frame.name, frame.filename)
            if in_numba_reader or frame.filename.startswith(root):
                return True
        todo += [current.__cause__, current.__context__]
    return False


def heal_after(exc: BaseException, cache: CacheDir) -> list[Damage]:
    """If ``exc`` is what reading a damaged file raises, remove the damage; return what was removed.

    Empty when ``exc`` is no damage error, or when nothing damaged is on disk: retrying would then
    fail the same way, so the caller re-raises.
    """
    return heal(cache) if is_damage_error(exc, cache) else []


def retry_after_healing[T](cache: CacheDir, what: str, action: Callable[[], T]) -> T:
    """Run ``action``; if it fails on a damaged cache file, remove the damage (warning which) and run it once more."""
    try:
        return action()
    except Exception as exc:
        removed = heal_after(exc, cache)
        if not removed:
            raise
        warnings.warn(f"{what}: {damage_message(cache, removed)}", stacklevel=2)
    return action()
