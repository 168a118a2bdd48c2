"""Atomic file writes: readers (and Snakemake) never see a half-written output file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
