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
        self.message = message
        self.dataset = dataset
        self.path = path
        self.column = column
        named = column is None or f"column '{column}'" in message  # most messages name their column
        self.reason = message if named else f"column '{column}': {message}"

    def naming(self, path: str | Path | None) -> DatasetError:
        """The same error naming another file (if it names one): the sweep's, for a copy staged for a
        job without a shared filesystem (`batchfit.fitting.job_inputs`), which the user never sees."""
        if self.path is None or path is None:
            return self
        return DatasetError(self.message, dataset=self.dataset, path=path, column=self.column)


class RecordError(BatchfitError):
    """A record batchfit wrote (a plan, manifest, failure record, compile stamp, ...) cannot be read: damaged, or
    of another format or version. The message names the file and what to do."""

    def __init__(self, message: str, *, path: str | Path):
        super().__init__(f"record {path}: {message}")
        self.path = path


class ModelContractError(BatchfitError):
    """The model file breaks the batchfit contract (see docs/model.md, 'The contract')."""


class ModelCodeError(ModelContractError):
    """The user's model code (``build_model``, ``simulate``) raised (`batchfit.model.user_traceback`).

    The message is one line ending in where the model's code failed (``... at model.py:14``);
    `reason` is that line without the dataset, to group the datasets that fail alike;
    `user_traceback` shows the model's own frames with their source lines, `full_traceback` every
    frame (for the log). The original exception is the ``__cause__``.
    """

    def __init__(self, message: str, *, reason: str, user_traceback: str, full_traceback: str, location: str = ""):
        super().__init__(message)
        self.reason = reason
        self.user_traceback = user_traceback
        self.full_traceback = full_traceback
        self.location = location


class CacheError(BatchfitError):
    """The compiled-function cache directory cannot be used safely."""


class CachedPathUnsupported(ModelContractError):
    """The model uses what batchfit's cached path documents it cannot take (a shared variable that
    is not ``pm.Data``, an operation numba runs in object mode or cannot cache, ...).

    The one failure of the cached path that falls back to nutpie's own compile, which is what
    ``pm.sample(nuts_sampler="nutpie")`` runs: every other exception there is batchfit's bug and
    fails the dataset with its traceback.
    """


class SamplerFailure(BatchfitError):
    """nutpie failed on a model: its sampler while sampling (no finite starting point, ...), or its
    own ``compile_pymc_model``: what ``pm.sample(nuts_sampler="nutpie")`` meets too. On the cached
    path the dataset is sampled again through nutpie's own compile, which says whether
    ``pm.sample`` fails on it as well."""


def is_expected(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure batchfit expects of a model, a dataset or the machine (its own
    errors, which say what to fix, and OS errors such as a full disk), rather than a bug of its own,
    which is logged at ERROR and recorded with its whole traceback."""
    return isinstance(exc, (BatchfitError, OSError))


def reason_of(exc: BaseException, dataset: str | None = None, path: str | Path | None = None) -> str:
    """What went wrong, in one line that does not name the dataset: alike for every dataset that fails
    alike, so that those can be reported together (`batchfit.common.grouping`)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return " ".join(reason.split())
    return without_dataset(one_line(exc), dataset, path)


def without_dataset(text: str, dataset: str | None, path: str | Path | None) -> str:
    """``text`` without the mentions of one dataset and its file that batchfit's messages make."""
    if path is not None:
        text = text.replace(f" (file {path})", "").replace(f" ({path})", "").replace(f"file {path}", "its file")
    if dataset is not None:
        text = text.replace(f" for dataset '{dataset}'", "").replace(f"dataset '{dataset}'", "the dataset")
    return text


def one_line(exc: BaseException) -> str:
    """An exception as one line, without the native stack trace nutpie appends to its errors."""
    text = str(exc).split("Stack backtrace:")[0]
    return " ".join(text.split()) or type(exc).__name__
