"""``batchfit cache info|verify|prune|clear``: look after a cache directory.

Entries are pruned whole: a sampler entry is its manifest plus the numba files it lists;
PyTensor's own numba files (``pytensor/``) are pruned by age and size like any other file.
Pruning takes each entry's compile lock, so it never removes an entry being written.
Verifying checks every entry's digests and every file's structure (:func:`batchfit.cache.heal.find_damage`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.cache.heal import entry_key_of, find_damage, remove_damage
from batchfit.cache.store import CacheDir, CorruptEntry, compile_lock, read_entry, remove_entry

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3, "GB": 1024**3}
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """'500M', '2G', '1024' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise ValueError(f"cannot read size '{text}'; use e.g. 500M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_age(text: str) -> float:
    """'30d', '12h', '90m' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not m:
        raise ValueError(f"cannot read age '{text}'; use e.g. 30d, 12h or 90m")
    return float(m.group(1)) * _AGES[m.group(2)]


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


@dataclass
class CacheInfo:
    """What ``batchfit cache info`` prints."""

    root: Path
    entries: int
    files: int
    bytes: int
    hits: int
    misses: int
    compile_seconds_saved: float
    compile_seconds_spent: float

    def lines(self) -> list[str]:
        return [
            f"location: {self.root}",
            f"entries: {self.entries} compiled models, {self.files} files, {self.bytes / 1024**2:.1f} MiB",
            f"hits: {self.hits}, misses: {self.misses}",
            f"compile seconds saved by hits: {self.compile_seconds_saved:.1f} "
            f"(spent compiling misses: {self.compile_seconds_spent:.1f})",
        ]


def cache_info(cache: CacheDir) -> CacheInfo:
    """Location, entries, size and hit/miss statistics."""
    files = _files(cache.root)
    hits = misses = 0
    saved = 0.0
    if cache.stats_path.exists():
        for line in cache.stats_path.read_text(errors="replace").splitlines():  # a damaged log still counts
            try:
                event = json.loads(line)
            except ValueError:
                continue
            hits += event.get("event") == "hit"
            misses += event.get("event") == "miss"
            saved += float(event.get("saved", 0.0))
    spent = 0.0
    entries = list(cache.entries_dir.glob("*.json"))
    for entry in entries:
        try:
            spent += float(json.loads(entry.read_text()).get("compile_seconds", 0.0))
        except (OSError, ValueError):
            continue
    return CacheInfo(cache.root, len(entries), len(files), _size(files), hits, misses, saved, spent)


def verify_cache(cache: CacheDir, *, repair: bool = False) -> list[str]:
    """Check every entry's digests and every file's structure (batchfit's, PyTensor's, numba's); list problems.

    With ``repair`` damaged files are removed with whatever depends on them (a damaged
    callback file takes its entry along); each is rebuilt when next needed.
    """
    problems = []
    damaged_entries = set()
    for manifest in sorted(cache.entries_dir.glob("*.json")):
        key = manifest.stem
        try:
            read_entry(cache, key)
        except CorruptEntry as exc:
            problems.append(f"entry {key[:12]}: {exc}")
            damaged_entries.add(key)
            if repair:
                remove_entry(cache, key)
    for damage in find_damage(cache):
        if entry_key_of(cache, damage.path) in damaged_entries:
            continue  # reported with its entry above
        problems.append(damage.line(cache.root))
        if repair:
            remove_damage(cache, damage)
    return problems


def prune_cache(cache: CacheDir, *, max_size: int | None = None, older_than: float | None = None,
                lock_timeout: float = 5.0) -> list[str]:
    """Remove entries unused for ``older_than`` seconds, then the least recently used until under ``max_size``."""
    now = time.time()
    units = _units(cache)
    removed = []
    units.sort(key=lambda u: u["used"])
    total = sum(u["bytes"] for u in units)
    for unit in units:
        too_old = older_than is not None and now - unit["used"] > older_than
        too_big = max_size is not None and total > max_size
        if not (too_old or too_big):
            continue
        if unit["key"] is not None:
            with compile_lock(cache, unit["key"], lock_timeout) as locked:
                if not locked:
                    continue
                remove_entry(cache, unit["key"])
        else:
            for path in unit["paths"]:
                path.unlink(missing_ok=True)
        total -= unit["bytes"]
        removed.append(unit["name"])
    return removed


def _units(cache: CacheDir) -> list[dict[str, Any]]:
    """Prunable units: each batchfit entry with its files, and each PyTensor numba function's files."""
    units = []
    for manifest in cache.entries_dir.glob("*.json"):
        key = manifest.stem
        paths = [manifest, *cache.numba_dir.glob(f"*-{key}.*")]
        units.append(_unit(f"entry {key[:12]}", key, paths))
    groups: dict[str, list[Path]] = {}
    for path in _files(cache.pytensor_dir):
        groups.setdefault(path.name.split(".")[0], []).append(path)
    units += [_unit(f"pytensor {name[:40]}", None, paths) for name, paths in groups.items()]
    return units


def _unit(name: str, key: str | None, paths: list[Path]) -> dict[str, Any]:
    existing = [p for p in paths if p.exists()]
    used = max((max(p.stat().st_atime, p.stat().st_mtime) for p in existing), default=0.0)
    return {"name": name, "key": key, "paths": existing, "bytes": _size(existing), "used": used}


def clear_cache(cache: CacheDir) -> None:
    """Delete everything in the cache directory (the directory itself stays)."""
    for child in cache.root.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
