"""The sweep's recorded plan, ``plan.json``: every dataset's file, each table group's table and key, the batches.

The sweep's main process writes it once its jobs are decided (`batchfit.sweep.plan.write_plan`); its jobs read
it back rather than plan again after other jobs changed what is pending (`batchfit.sweep.plan.sweep_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from batchfit.records.json_record import JsonRecord
from batchfit.settings import TableSource


@dataclass(frozen=True)
class PlanRecord(JsonRecord):
    """Dataset id -> its file (or table), the table and key values of each dataset that is a table's group,
    and batch id -> its datasets."""

    KIND = "plan"
    VERSION = 1
    REMEDY = "delete it and run the sweep again"

    datasets: dict[str, str]
    groups: dict[str, tuple[TableSource, tuple[Any, ...]]]
    batches: dict[str, list[str]]

    def to_fields(self) -> dict[str, Any]:
        """The tables listed once, each group naming its table by number: a sweep may hold 100,000 groups."""
        number: dict[TableSource, int] = {}
        groups = {d: [number.setdefault(table, len(number)), list(key)] for d, (table, key) in self.groups.items()}
        return {"datasets": self.datasets, "batches": self.batches,
                "tables": [{"table": str(t.table), "by": list(t.by)} for t in number], "groups": groups}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        tables = [TableSource(Path(t["table"]), tuple(t["by"])) for t in fields["tables"]]
        return cls(dict(fields["datasets"]), {d: (tables[n], tuple(key)) for d, (n, key) in fields["groups"].items()},
                   {b: list(ids) for b, ids in fields["batches"].items()})
