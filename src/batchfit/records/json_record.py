"""What every JSON record shares: its kind and format version written with its fields, and checked on reading.

A record's file starts with ``"record": <kind>`` and ``"version": <n>``. A reader takes only its own kind at its
own version: a file of an older batchfit, of another kind or damaged is refused with a `RecordError` naming
the file and the record's remedy (what to delete or run again), never read with fields whose meaning changed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, Self

from batchfit.common.atomic import atomic_path
from batchfit.errors import RecordError


class JsonRecord:
    """The base of a record kept as JSON: a frozen dataclass whose subclass sets `KIND`, `VERSION` and `REMEDY`.

    `to_fields` and `from_fields` turn the dataclass into JSON's values and back; a subclass whose fields
    are not plain JSON (a nested dataclass, a tuple) overrides them.
    """

    KIND: ClassVar[str]
    VERSION: ClassVar[int]
    REMEDY: ClassVar[str]  # what a user does about a file of this kind that cannot be read
    ATOMIC: ClassVar[bool] = True  # through a temporary file (`batchfit.common.atomic`), or in place

    def to_fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls)})  # type: ignore[arg-type]

    def write(self, path: str | Path) -> None:
        """Write the record to ``path``, with its kind and format version."""
        text = json.dumps({"record": self.KIND, "version": self.VERSION, **self.to_fields()}, indent=1)
        if not self.ATOMIC:
            Path(path).write_text(text)
            return
        with atomic_path(path) as tmp:
            tmp.write_text(text)

    @classmethod
    def read(cls, path: str | Path) -> Self:
        """The record at ``path``; a `RecordError` if it is damaged, of another kind or of another format version.

        A missing file is a `FileNotFoundError`, as for any file."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise RecordError(f"cannot read the {cls.KIND} ({exc}); {cls.REMEDY}", path=path) from exc
        if not isinstance(data, dict) or "record" not in data or "version" not in data:
            raise RecordError(f"not a {cls.KIND} of format version {cls.VERSION}: it names no record kind and "
                              f"version (written by an older batchfit, or not by batchfit); {cls.REMEDY}", path=path)
        if data["record"] != cls.KIND:
            raise RecordError(f"a {data['record']} record, not a {cls.KIND}; {cls.REMEDY}", path=path)
        if data["version"] != cls.VERSION:
            raise RecordError(f"a {cls.KIND} of format version {data['version']}, while this batchfit reads "
                              f"version {cls.VERSION}; {cls.REMEDY}", path=path)
        try:
            return cls.from_fields(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"a damaged {cls.KIND} ({type(exc).__name__}: {exc}); {cls.REMEDY}", path=path) from exc
