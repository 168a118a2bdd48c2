"""Error types whose messages tell the user what to fix, naming the config key, dataset or column."""

from __future__ import annotations

from pathlib import Path


class BatchfitError(Exception):
    """Base class: every error batchfit raises on bad input is one of these."""


class ConfigError(BatchfitError):
    """A config file or value is invalid. The message names the key and the config file."""

    def __init__(self, message: str, *, key: str | None = None, source: str | Path | None = None):
        where = []
        if key:
            where.append(f"key '{key}'")
        if source:
            where.append(f"in {source}")
        prefix = f"config error ({', '.join(where)}): " if where else "config error: "
        super().__init__(prefix + message)
        self.key = key
        self.source = source


class DatasetError(BatchfitError):
    """A dataset cannot be used. The message names the dataset, its file and the column."""

    def __init__(
        self,
        message: str,
        *,
        dataset: str | None = None,
        path: str | Path | None = None,
        column: str | None = None,
    ):
        where = []
        if dataset is not None:
            where.append(f"dataset '{dataset}'")
        if path is not None:
            where.append(f"file {path}")
        if column is not None:
            where.append(f"column '{column}'")
        prefix = f"dataset error ({', '.join(where)}): " if where else "dataset error: "
        super().__init__(prefix + message)
        self.dataset = dataset
        self.path = path
        self.column = column


class ModelContractError(BatchfitError):
    """The model file breaks the batchfit contract (see README, 'Writing a model')."""


class CacheError(BatchfitError):
    """The compiled-function cache directory cannot be used safely."""


def one_line(exc: BaseException) -> str:
    """An exception as one line, without the native stack trace nutpie appends to its errors."""
    text = str(exc).split("Stack backtrace:")[0]
    return " ".join(text.split()) or type(exc).__name__
