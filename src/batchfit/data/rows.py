"""The config's row rules and column bounds, applied to a dataset's rows before the model sees them.

``rows: {where: "EVID == 0", drop_missing: [DV]}`` keeps the rows where the expression holds (pandas'
``DataFrame.query``, always with its Python engine, so that an optional package cannot change what
it does), then drops those missing a value in a listed column. ``columns: {TIME: {min: 0}}`` bounds
a column: a value outside fails the dataset, naming the row. The same code runs in check, fit, SBC
and ``batchfit.load_dataset``; the rules are part of every fit's provenance.

A CSV file's columns are typed by pandas from every row, so a column holding ``.`` on the dosing rows
a rule drops is text; once rules dropped rows, a text column whose remaining values are all numbers
is typed again, as reading those rows alone would type it (`infer_numbers`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from batchfit.errors import DatasetError, one_line
from batchfit.settings import ColumnSettings, RowRules

if TYPE_CHECKING:  # pandas is imported where it is used: planning a sweep of files (the Snakefile's parse) needs none
    import pandas as pd


@dataclass(frozen=True)
class DroppedRows:
    """How many of a dataset's rows each rule dropped: `where`, then `missing` (any `drop_missing` column)."""

    where: int = 0
    missing: int = 0

    @property
    def total(self) -> int:
        return self.where + self.missing


def apply_where_and_missing(frame: pd.DataFrame, rules: RowRules, *, dataset: str | None = None,
                            path: str | Path | None = None) -> tuple[pd.DataFrame, DroppedRows]:
    """The rows ``rules`` keep (the frame's index kept, so rows keep their numbers) and how many each dropped.

    A rule naming a column the rows lack, or an expression that cannot be evaluated on them, is a
    `DatasetError` naming the config key and the columns there are.
    """
    where, present = rule_masks(frame, rules, dataset=dataset, path=path)
    return frame[where & present], DroppedRows(int((~where).sum()), int((where & ~present).sum()))


def rule_masks(frame: pd.DataFrame, rules: RowRules, *, dataset: str | None = None,
               path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether `rows.where` holds, and whether it has a value in every `rows.drop_missing` column. Each
    rule judges a row alone, so a table's groups can be judged in one go."""
    import pandas as pd

    where = np.ones(len(frame), dtype=bool)
    if rules.where is not None and len(frame):
        try:
            result = frame.eval(rules.where, engine="python")
        except pd.errors.UndefinedVariableError as exc:
            name = str(exc).split("'")[1] if "'" in str(exc) else str(exc)
            raise DatasetError(f"rows.where ({rules.where!r}) names column {name!r}, which the dataset lacks; its "
                               f"columns: {_names(frame)}", dataset=dataset, path=path, column=name) from None
        except Exception as exc:  # noqa: BLE001 - pandas' evaluation raises many types; all mean the same here
            raise DatasetError(f"rows.where ({rules.where!r}) cannot be evaluated on the dataset's rows: "
                               f"{type(exc).__name__}: {one_line(exc)}", dataset=dataset, path=path) from None
        values = np.asarray(result)
        if values.shape != (len(frame),) or values.dtype != bool:
            raise DatasetError(f"rows.where ({rules.where!r}) gives no true/false per row", dataset=dataset, path=path)
        where = values
    present = np.ones(len(frame), dtype=bool)
    if rules.drop_missing:
        absent = [name for name in rules.drop_missing if name not in frame.columns]
        if absent:
            raise DatasetError(f"rows.drop_missing names column {absent[0]!r}, which the dataset lacks; its columns: "
                               f"{_names(frame)}", dataset=dataset, path=path, column=absent[0])
        present = frame[list(rules.drop_missing)].notna().all(axis=1).to_numpy()
    return where, present


def infer_numbers(frame: pd.DataFrame, keep_text: Collection[str]) -> pd.DataFrame:
    """``frame`` with each text column (but ``keep_text``) whose values all read as numbers turned into numbers
    (int64 without missing values, else float64), as pandas types a CSV file of just these rows."""
    import pandas as pd

    changed = {}
    for name, column in frame.items():
        if name in keep_text or pd.api.types.is_numeric_dtype(column.dtype) or not column.notna().any():
            continue
        if isinstance(column.dtype, pd.CategoricalDtype):
            continue
        try:
            changed[name] = pd.to_numeric(column.astype(object), errors="raise")
        except (ValueError, TypeError):
            continue
    return frame.assign(**changed) if changed else frame


def check_bounds(arrays: Mapping[str, np.ndarray], columns: Mapping[str, ColumnSettings], *,
                 row_index: np.ndarray | None = None, dataset: str | None = None,
                 path: str | Path | None = None) -> None:
    """Raise a `DatasetError` for the first bounded column (`columns.<name>.min`/`max`) holding a value out of
    its bounds, or text, naming the column, the value and its row (``row_index``: each row's number in the
    file or table, else its position)."""
    for name, settings in columns.items():
        if settings.min is None and settings.max is None:
            continue
        if name not in arrays:
            raise DatasetError(f"columns.{name} sets bounds for column {name!r}, which the dataset lacks; its columns: "
                               f"{', '.join(arrays) or '(none)'}", dataset=dataset, path=path, column=name)
        array = np.asarray(arrays[name])
        if array.dtype.kind not in "biuf":
            raise DatasetError(f"column {name!r} holds text (e.g. {array.flat[0]!r}), but columns.{name} bounds it, so "
                               "it must hold numbers", dataset=dataset, path=path, column=name)
        values = array.astype(float)
        for bound, side, limit, outside in (("min", "below", settings.min, np.less),
                                            ("max", "above", settings.max, np.greater)):
            if limit is None:
                continue
            mask = outside(values, limit)
            if mask.any():
                flat = mask.reshape(mask.shape[0], -1).any(axis=1) if mask.ndim else mask.reshape(1)
                first = int(np.argmax(flat))
                row = int(row_index[first]) if row_index is not None and mask.ndim else first
                raise DatasetError(
                    f"column {name!r} has {int(flat.sum())} value(s) {side} its {bound} {limit:g} "
                    f"(columns.{name}.{bound}), the first {values[mask].flat[0]:g} at row index {row} (counting "
                    "from 0)", dataset=dataset, path=path, column=name)


def _names(frame: pd.DataFrame) -> str:
    return ", ".join(map(str, frame.columns)) or "(none)"
