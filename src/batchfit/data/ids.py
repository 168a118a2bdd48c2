"""Dataset ids: from a file's name or a table group's key values, safe to name files and Snakemake wildcards.

An id names output files (``fits/{id}.nc``) and appears in wildcards, so it keeps to
`SAFE_ID_RULE`; a name that breaks it, or that another dataset of the same source has too, gets a
safe id made from it (`unique_ids`), and the sweep records why (`batchfit check` lists them).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_SAFE_ID = re.compile(r"[A-Za-z0-9._+-]+")


SAFE_ID_RULE = (
    "a dataset id uses only letters A-Z a-z, digits 0-9 and '.', '_', '+', '-', does not start with '.' "
    "and does not contain '..'"
)


# The key of a table's rows that have no value in some key column: they form a dataset of their own, which fails
# naming them (`batchfit.data.discovery.missing_key_id`).
MISSING_KEY: tuple[Any, ...] = ()


KEY_SEPARATOR = "_"  # between the values of several key columns: store s01, item i007 -> s01_i007


def is_safe_id(dataset_id: str) -> bool:
    """Whether an id can name output files and Snakemake wildcards as it is (`SAFE_ID_RULE`)."""
    return (_SAFE_ID.fullmatch(dataset_id) is not None and not dataset_id.startswith(".")
            and ".." not in dataset_id)


def safe_id(name: str) -> str:
    """``name`` made a safe id: each run of other characters becomes ``_``, without a leading ``.`` or ``..``."""
    text = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._+-]+", "_", name)).lstrip(".")
    return text or "dataset"


def missing_key_id(table: str | Path, by: Sequence[str]) -> str:
    """The id of the rows of a table that have no value in some key column (key `MISSING_KEY`): they belong to
    no dataset, and fail as one, so that the sweep's verdict and failures.csv name them."""
    return safe_id(f"{Path(table).stem}.{'_'.join(by)}-missing")


def key_text(values: Sequence[Any]) -> str:
    """The id a group's key values ask for: each value as text (an integral number without ``.0``), several
    joined by `KEY_SEPARATOR`."""
    return KEY_SEPARATOR.join(_value_text(value) for value in values)


def _value_text(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return str(int(value))
    return str(value)


def unique_ids(names: Sequence[str], identities: Sequence[str]) -> list[str]:
    """A distinct safe id for each of ``names`` (the ids they ask for).

    A safe name no other has is its own id; the others get `safe_id` of it, with a digest of its
    ``identity`` (a file's path, a group's key values: distinct and stable) when two would get the same
    one (``a b`` beside ``a_b`` gives ``a_b-1f2e3d4c``). Depends only on the set of (name, identity)
    pairs: the same datasets always get the same ids, and no two the same.
    """
    counts = Counter(names)
    ids: list[str | None] = [name if is_safe_id(name) and counts[name] == 1 else None for name in names]
    rest = sorted((identities[i], i) for i in range(len(names)) if ids[i] is None)
    wanted = Counter(safe_id(names[i]) for _, i in rest)
    used = {i for i in ids if i is not None}
    for identity, i in rest:
        candidate = safe_id(names[i])
        if candidate in used or wanted[candidate] > 1:
            digest = hashlib.sha256(identity.encode()).hexdigest()
            size = 8
            while (choice := f"{candidate}-{digest[:size]}") in used:
                size += 1
            candidate = choice
        ids[i] = candidate
        used.add(candidate)
    return [str(i) for i in ids]
