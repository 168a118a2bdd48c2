"""The compiled bundle: a sweep's cache entries as one file that travels with the workflow.

Without a shared filesystem (Kubernetes, cloud batch systems, HTCondor: Snakemake moves every
job's files through a storage plugin) each fit job starts with an empty ``cache_dir``. So the
compile job also writes a bundle, a zip of the entries it compiled (their manifests and numba
files), with a sha256 per member in its ``bundle.json``; and, for a sweep that asks for optional
outputs, PyTensor's and numba's own file caches, which those outputs' functions load from. A fit
job's cache that lacks an entry installs it from the bundle (`install_entry`, called by
`batchfit.cache.store.get_or_build` under the entry's lock); a cache that has it ignores the bundle.

A bundle is the same kind of machine code as the cache: it is only read from the sweep's own
storage, which the user controls as they do ``cache_dir`` (docs/cache.md, Safety).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from batchfit.common.atomic import atomic_path
from batchfit.errors import CacheError

if TYPE_CHECKING:  # store imports this module: get_or_build installs entries from a bundle
    from batchfit.cache.store import CacheDir

BUNDLE_FORMAT = 1
MANIFEST = "bundle.json"
# PyTensor's and numba's file caches (`batchfit.cache.store.open_cache`): the entries' callbacks
# need none of them, the optional outputs' functions (`batchfit.compile.extras`) load from them.
_SHARED_CACHES = ("pytensor/numba", "numba")


def write_bundle(cache: CacheDir, entries: Mapping[str, Mapping[str, Any]], path: str | Path, *,
                 shared_caches: bool = False) -> dict[str, Any]:
    """Write the bundle of ``entries`` (key: verified manifest, `read_entry`) to ``path``; return its manifest.

    ``shared_caches``: add PyTensor's and numba's file caches, whole (which of their files a
    model's functions use is known to no index), for the optional outputs (`batchfit.compile.extras`);
    a fit job's sampling loads nothing else from them. Members are stored uncompressed: numba's
    object code is small, and a fit job should spend its start sampling, not inflating.
    """
    members = {}
    for key, entry in sorted(entries.items()):
        members[_relative(cache, cache.entry_path(key))] = cache.entry_path(key)
        for name in entry["files"]:
            members[_relative(cache, cache.numba_dir / name)] = cache.numba_dir / name
    for sub in _SHARED_CACHES if shared_caches else ():
        for file in sorted((cache.root / sub).rglob("*")):
            if file.is_file() and not file.name.startswith("."):
                members.setdefault(_relative(cache, file), file)
    files = {}
    with atomic_path(Path(path)) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as bundle:
        for name, file in members.items():
            data = file.read_bytes()
            files[name] = hashlib.sha256(data).hexdigest()
            bundle.writestr(name, data)
        manifest = {"format": BUNDLE_FORMAT, "keys": sorted(entries), "files": files}
        bundle.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def _relative(cache: CacheDir, file: Path) -> str:
    return file.relative_to(cache.root).as_posix()


def bundle_keys(path: str | Path) -> list[str]:
    """The entry keys a bundle holds."""
    with _open(path) as bundle:
        return list(_manifest(bundle, path)["keys"])


def install_entry(cache: CacheDir, key: str, path: str | Path) -> bool:
    """Install entry ``key`` from the bundle at ``path`` into ``cache``; False if the bundle lacks it.

    The caller holds the entry's lock (`get_or_build`). Every member is checked against the
    bundle's sha256 while it is extracted into a directory inside the cache, then moved into place
    with a rename: the entry's files first, its manifest last, so no process ever sees a partial
    entry. Files of PyTensor's and numba's caches are only added where the cache has none (an
    existing numba index may list more functions than the bundle's). A damaged bundle is an error.
    """
    with _open(path) as bundle:
        manifest = _manifest(bundle, path)
        if key not in manifest["keys"]:
            return False
        entry_name = _relative(cache, cache.entry_path(key))
        wanted = [name for name in manifest["files"]
                  if name != entry_name and (_entry_file(name, key) or _shared(name))]
        staging = Path(tempfile.mkdtemp(prefix=".bundle-", dir=cache.entries_dir.parent))
        try:
            for name in [*wanted, entry_name]:
                _extract(bundle, name, manifest["files"][name], staging, path)
            for name in wanted:
                target = cache.root / name
                if _entry_file(name, key) or not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / name, target)
            os.replace(staging / entry_name, cache.entry_path(key))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True


def _entry_file(name: str, key: str) -> bool:
    path = PurePosixPath(name)
    return path.parent.as_posix() == "batchfit/numba" and f"-{key}." in path.name


def _shared(name: str) -> bool:
    return any(name.startswith(f"{sub}/") for sub in _SHARED_CACHES)


def _extract(bundle: zipfile.ZipFile, name: str, digest: str, staging: Path, path: str | Path) -> None:
    data = bundle.read(name)
    if hashlib.sha256(data).hexdigest() != digest:
        raise CacheError(f"compiled bundle {path}: member {name} does not match its sha256; the bundle is "
                         "damaged, delete it and run the compile job again")
    target = staging / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _open(path: str | Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise CacheError(f"compiled bundle {path} is unreadable ({exc}); delete it and run the compile job "
                         "again") from exc


def _manifest(bundle: zipfile.ZipFile, path: str | Path) -> dict[str, Any]:
    try:
        manifest = json.loads(bundle.read(MANIFEST))
        if manifest.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"format {manifest.get('format')}, expected {BUNDLE_FORMAT}")
        _check_names(manifest["files"])
        return manifest
    except (KeyError, ValueError, AttributeError) as exc:
        raise CacheError(f"compiled bundle {path} has no valid {MANIFEST} ({exc}); delete it and run the "
                         "compile job again") from exc


def _check_names(names: Iterable[str]) -> None:
    """Refuse member names that would land outside the cache (absolute, or with ``..``)."""
    for name in names:
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts:
            raise ValueError(f"member name {name!r} points outside the cache")
