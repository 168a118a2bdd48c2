"""Datasets that fail alike, reported once: ``201 datasets (ABW, AFG, … 199 more): TypeError ... at model.py:14``.

A sweep's datasets usually fail for few reasons, most often one model error that every dataset
meets. `batchfit check`, `batchfit status` and the end of a run list each distinct reason once,
with how many datasets and which, instead of one line per dataset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Dataset ids named in a group's line; the others are counted.
SHOWN_IDS = 3


def group_by_reason(reasons: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """(reason, dataset ids) for each distinct reason of ``reasons`` (dataset id -> reason), the most
    common first (ties in order of first appearance), each group's ids in the given order."""
    groups: dict[str, list[str]] = {}
    for dataset_id, reason in reasons.items():
        groups.setdefault(reason, []).append(dataset_id)
    order = {reason: i for i, reason in enumerate(groups)}
    return sorted(groups.items(), key=lambda item: (-len(item[1]), order[item[0]]))


def id_list(dataset_ids: Sequence[str], shown: int = SHOWN_IDS) -> str:
    """``ABW, AFG, CHN, … 198 more``."""
    more = len(dataset_ids) - shown
    return ", ".join(dataset_ids[:shown]) + (f", … {more} more" if more > 0 else "")


def group_line(reason: str, dataset_ids: Sequence[str]) -> str:
    """``201 datasets (ABW, AFG, CHN, … 198 more): <reason>``."""
    n = len(dataset_ids)
    return f"{n} dataset{'s' if n != 1 else ''} ({id_list(dataset_ids)}): {reason}"


def grouped_lines(reasons: Mapping[str, str]) -> list[str]:
    """One `group_line` per distinct reason of ``reasons`` (dataset id -> reason), the most common first."""
    return [group_line(reason, ids) for reason, ids in group_by_reason(reasons)]
