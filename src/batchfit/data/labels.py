"""The codes of text (label) columns: for each column its labels in code order, for the sweep or per dataset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ColumnCoding:
    """How one label column's text becomes codes.

    `levels` are the labels in code order, the same for every dataset; None when the column
    is coded within each dataset (`scope: dataset`). `as_text` columns are read as text in
    every file (the config lists them), even where a file's values look like numbers.
    """

    levels: tuple[str, ...] | None
    order: str  # "sorted", "appearance" or "listed"
    as_text: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description; equal descriptions code a column identically."""
        return {"levels": None if self.levels is None else list(self.levels), "order": self.order,
                "as_text": self.as_text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ColumnCoding:
        levels = data["levels"]
        return cls(None if levels is None else tuple(levels), data["order"], bool(data["as_text"]))


@dataclass(frozen=True)
class Coding:
    """The label columns of a sweep and how each is coded; `columns_of` lists each dataset's columns."""

    labels: Mapping[str, ColumnCoding]
    columns_of: Mapping[str, tuple[str, ...]]

    @property
    def as_text(self) -> frozenset[str]:
        """Columns read as text in every file."""
        return frozenset(name for name, column in self.labels.items() if column.as_text)

    def for_dataset(self, dataset_id: str) -> dict[str, Any]:
        """The coding of one dataset's label columns as JSON-able data (for provenance digests).

        It changes exactly when loading that dataset would give other codes or coordinates.
        `Coding.from_json` of it loads that dataset identically.
        """
        columns = self.columns_of.get(dataset_id, ())
        return {name: self.labels[name].to_json() for name in sorted(columns) if name in self.labels}

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> Coding:
        """The coding described by `for_dataset` (e.g. passed to another process)."""
        return cls({name: ColumnCoding.from_json(column) for name, column in data.items()}, {})
