"""Which datasets' predicted curves the report draws, known from the plan alone.

The plots job and the workflow both ask: the job draws them, and the workflow starts it as soon as the
predict jobs holding them are done, beside the others (`batches_drawn`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batchfit.settings import ReportSettings


def drawn_datasets(report: ReportSettings, predicted: Sequence[str]) -> list[str]:
    """The first ``report.first_datasets`` datasets of ``predicted``, and those ``report.datasets`` names that it
    holds (the plots job names the others in its error)."""
    known = set(predicted)
    return list(dict.fromkeys([*predicted[:report.first_datasets], *(d for d in report.datasets if d in known)]))


def batches_drawn(report: ReportSettings, predicted: Sequence[str],
                  batches: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The batches (id -> their datasets) holding a dataset the report draws."""
    drawn = set(drawn_datasets(report, predicted))
    return [batch for batch, members in batches.items() if not drawn.isdisjoint(members)]
