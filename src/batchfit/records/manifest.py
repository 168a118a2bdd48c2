"""A job's batch manifest: each dataset's outcome, the job's declared output.

A fit job writes it (`batchfit.fitting.outcome.write_manifest`) under ``batches/``, a predict job under
``predictions/batches/`` (`batchfit.predictions.records`); collect adopts it from a job's own output directory
(`batchfit.outputs.adopt`) and `batchfit status` reads the fits' times and fallbacks from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Self

from batchfit.records.json_record import JsonRecord


@dataclass
class Outcome:
    """What happened to one dataset in a batch."""

    dataset: str
    status: str  # "ok" or "failed"
    seconds: float
    stage: str | None = None
    error_type: str | None = None
    message: str | None = None
    traceback: str = ""  # batchfit's bug's whole one (`errors.is_expected`), or the model's own frames
    fallback: str = ""  # a fitted dataset's: why it was not sampled on batchfit's cached path
    reason: str = ""  # a failure's message without the dataset: alike for datasets that fail alike
    rows: int | None = None  # the dataset's rows, once it was loaded
    groups: str = ""  # its distinct labels per text column (`format_groups`), once it was loaded
    dropped_where: int | None = None  # the rows the row rules dropped, once it was loaded (`batchfit.data.rows`)
    dropped_missing: int | None = None
    # a fitted dataset's health thresholds crossed that its sampler's statistics decide (divergences, tree
    # depth, E-BFMI) and its rows (`batchfit.fitting.sampler_health.sampler_reasons`); R-hat and ESS: collect's
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BatchManifest(JsonRecord):
    """A job's batch, each dataset's outcome by id, and how the job got its functions: a fit job's compile
    line, a predict job's lines of its forward functions."""

    KIND = "batch manifest"
    VERSION = 1
    REMEDY = "delete it, and its job runs again"

    batch: str
    datasets: dict[str, Outcome]
    compile: str = ""
    forward: tuple[str, ...] = ()

    @classmethod
    def of(cls, batch: str, outcomes: list[Outcome], *, compile: str = "", forward: tuple[str, ...] = ()) -> Self:
        return cls(batch, {o.dataset: o for o in outcomes}, compile, forward)

    def to_fields(self) -> dict[str, Any]:
        return {"batch": self.batch, "compile": self.compile, "forward": list(self.forward),
                "datasets": {d: asdict(o) for d, o in self.datasets.items()}}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        return cls(fields["batch"], {d: Outcome(**o) for d, o in fields["datasets"].items()}, fields["compile"],
                   tuple(fields["forward"]))
