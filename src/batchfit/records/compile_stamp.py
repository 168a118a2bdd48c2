"""The compile stamp: what the compile stage recorded for the fit and predict jobs of a model.

Written by the compile stage (`batchfit.sweep.stages.run_compile`) inside the cache, named by the model and the
versions (`batchfit.sweep.plan.compile_stamp_path`); read for a fit job's resources (the reference fit's
measurement) and for staging a job's inputs (the reference dataset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from batchfit.records.json_record import JsonRecord


@dataclass(frozen=True)
class ReferenceFit:
    """The compile job's measured fit of the reference dataset: its seconds, the process's peak memory (with
    what the sweep's longer posterior adds) and its iterations per chain and chains."""

    seconds: float
    peak_rss_mb: int
    draws: int
    chains: int


@dataclass(frozen=True)
class CompileStamp(JsonRecord):
    """The reference structure compiled into the cache (its entry's ``key``, its ``structure`` id and sampler
    ``path``), the reference dataset, the compile's one-line report, the measured fit (None when that fit
    failed) and the cache key of the predictions' forward function (None without one)."""

    KIND = "compile stamp"
    VERSION = 1
    REMEDY = "delete it, and the compile stage runs again"

    key: str
    structure: str
    path: str
    reference_dataset: str
    line: str
    reference_fit: ReferenceFit | None
    forward_key: str | None

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        measured = fields["reference_fit"]
        return super().from_fields({**fields, "reference_fit": None if measured is None else ReferenceFit(**measured)})
