"""Atomic file writes: readers (and Snakemake) never see a half-written output file."""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The temporary name atomic_path gives a target: .{stem}.{pid}.{8 hex digits}.tmp{suffix}
_TMP_NAME = re.compile(r"\.(?P<stem>.+)\.\d+\.[0-9a-f]{8}\.tmp(?P<suffix>(\.[^.]*)?)")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it onto `path` only if the block succeeds.

    The block must create the file at the yielded path (e.g. ``to_netcdf(tmp)``,
    ``to_csv(tmp)``). The temporary file lives in the same directory, so the final
    ``os.replace`` is an atomic rename: `path` is either the old file or the complete new one.
    On any exception (including KeyboardInterrupt) the temporary file is removed and the
    exception propagates. The temporary name keeps the target's suffix so writers that infer
    the format from the extension still work, and starts with a dot so globs skip it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"atomic write of {path}: the block did not create {tmp}")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temporaries(paths: Iterable[str | Path]) -> list[Path]:
    """Delete the temporary files `atomic_path` left beside `paths` when its process was killed.

    Only for a caller that owns `paths` (no other process may be writing them): a fit job owns
    the fit and failure files of its batch's datasets. Each directory is listed once, however
    many paths it holds. Returns the files removed.
    """
    wanted: dict[Path, set[tuple[str, str]]] = {}
    for path in map(Path, paths):
        wanted.setdefault(path.parent, set()).add((path.stem, path.suffix))
    removed = []
    for directory, targets in wanted.items():
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            for entry in entries:
                match = _TMP_NAME.fullmatch(entry.name)
                if match and (match["stem"], match["suffix"]) in targets:
                    Path(entry.path).unlink(missing_ok=True)
                    removed.append(Path(entry.path))
    return removed


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write a small JSON output atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
