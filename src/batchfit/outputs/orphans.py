"""The outputs of datasets that left the sweep: moved out of the way, never deleted.

A data file removed from the sweep (or renamed, so that its id changed) left its ``fits/{id}.nc``,
its sidecar and its failure record behind, where they looked like part of the sweep. They are
moved to ``results_dir/orphaned/`` when a sweep starts and when it is collected: out of
``fits/`` and ``failures/``, but kept (a fit is never lost), and back in place by moving them back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from pathlib import Path

from batchfit.common.grouping import id_list
from batchfit.layout import ResultsLayout

log = logging.getLogger("batchfit")

# The files one dataset owns, by directory of the layout: the fit and its sidecar, its failure record, its
# predictions with their sidecar and rows.
_OWNED = (("fits", (".nc", ".json")), ("failures", (".json",)), ("predictions", (".nc", ".json", ".csv")))


def move_orphans(layout: ResultsLayout, dataset_ids: Collection[str]) -> list[str]:
    """Move the fits, sidecars, failure records and predictions of datasets not in ``dataset_ids`` to
    ``orphaned/fits/``, ``orphaned/failures/`` and ``orphaned/predictions/``; return those datasets' ids (sorted).

    A file of the same name already there is replaced: the newer one is the one worth keeping.
    Temporary files of writes under way (named with a leading dot) are left alone.
    """
    keep = set(dataset_ids)
    moved: set[str] = set()
    for name, suffixes in _OWNED:
        directory: Path = getattr(layout, name)
        try:
            entries = sorted(directory.iterdir())
        except FileNotFoundError:
            continue
        for path in entries:
            if path.name.startswith(".") or path.suffix not in suffixes or path.stem in keep or not path.is_file():
                continue
            target = layout.orphaned / name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            moved.add(path.stem)
    if moved:
        log.warning("moved the outputs of %d dataset(s) no longer in the sweep (%s) to %s", len(moved),
                    id_list(sorted(moved)), layout.orphaned)
    return sorted(moved)
