"""A sweep-wide table written a dataset at a time, and the report page drawn from it.

What the compare and sensitivity rules write: each dataset's rows are computed from its fit file
and appended, so memory holds one dataset's rows whatever the sweep's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pandas as pd

from batchfit.common.atomic import atomic_path


def write_table_and_page(path: Path, columns: Sequence[str], frames: Iterable[pd.DataFrame], page_path: Path,
                         page: Callable[[pd.DataFrame], str], *, keep_default_na: bool = True) -> list[Path]:
    """Write ``frames`` (each with ``columns``) to the CSV ``path`` one after the other, then the HTML
    ``page`` draws from the whole table to ``page_path``; both atomically. Returns both paths."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as file:
            file.write(",".join(columns) + "\n")
            for rows in frames:
                rows.to_csv(file, header=False, index=False)
    page_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(page_path) as tmp:
        tmp.write_text(page(pd.read_csv(path, keep_default_na=keep_default_na)), encoding="utf-8")
    return [path, page_path]
