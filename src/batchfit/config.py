"""Load and validate a batchfit config file into a typed, immutable `Config`.

The packaged JSON Schema (`config.schema.yaml`) is the single source of the allowed keys,
their types, ranges and defaults; Snakemake validates against the same file. This module
turns schema violations into `ConfigError`s that name the key and the config file.

Relative paths in a config are relative to the current working directory (the directory
Snakemake or the batchfit command runs in), not to the config file.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchfit.errors import ConfigError, one_line
from batchfit.layout import ResultsLayout
from batchfit.schema import validated
from batchfit.settings import (
    CacheSettings,
    ColumnSettings,
    CompareSettings,
    DataSettings,
    DataSources,
    HealthSettings,
    OutputSettings,
    PredictSettings,
    ReportSettings,
    RowRules,
    SamplerSettings,
    SBCSettings,
    SummarySettings,
    TableSource,
    plain,
)

DICT_SOURCE = "<dict>"
@dataclass(frozen=True)
class Config:
    """A validated batchfit config; `source` is the config file (or "<dict>") for messages."""

    model: Path
    datasets: tuple[str | TableSource, ...]  # file patterns and tables split by key columns
    sampler: SamplerSettings
    batch_size: int | str  # a number of datasets, or AUTO (see `batchfit.sweep.plan.batch_size`)
    cache_dir: Path
    results_dir: Path
    on_error: str
    outputs: OutputSettings
    health: HealthSettings
    max_structures: int
    cache: CacheSettings
    source: str
    columns: Mapping[str, ColumnSettings] = field(default_factory=dict, hash=False)
    rows: RowRules = field(default_factory=RowRules)
    values: tuple[TableSource, ...] = ()  # side tables of per-dataset values
    summary: SummarySettings = field(default_factory=SummarySettings)
    sbc: SBCSettings = field(default_factory=SBCSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    predict: PredictSettings = field(default_factory=PredictSettings)  # not `enabled`: no predictions
    compare: CompareSettings = field(default_factory=CompareSettings)
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)  # build_model's keyword parameters
    # A sweep of variants (`batchfit.variants`): the raw overrides by id and the grid, as the file has them.
    variants: Mapping[str, Any] = field(default_factory=dict, hash=False)
    grid: Mapping[str, Any] = field(default_factory=dict, hash=False)
    variant: str | None = None  # the id of a variant's own Config (`batchfit.variants.variant_configs`)

    @property
    def layout(self) -> ResultsLayout:
        """Every path under `results_dir` (`batchfit.layout`)."""
        return ResultsLayout(self.results_dir)

    @property
    def data_sources(self) -> DataSources:
        """The few settings finding, coding and reading the sweep's datasets take (`batchfit.data`)."""
        settings = DataSettings(self.rows, dict(self.columns), tuple(self.values), dict(self.params))
        return DataSources(tuple(self.datasets), tuple(self.predict.data or ()), settings, self.layout,
                           self.cache.lock_timeout, self.source)

    def sampler_dict(self) -> dict[str, Any]:
        """Sampler settings as a plain dict, recorded as attributes in the outputs."""
        return plain(self.sampler)


def load_config(path: str | Path) -> Config:
    """Read, validate and fill defaults of a YAML config file; check the model file exists."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the config file: {_reason(exc)}", source=source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_reason(exc), source=source) from None
    if data is None:
        raise ConfigError("the config file is empty; it needs at least 'model' and 'datasets'", source=source)
    config = config_from_dict(data, source=source)
    check_model_file(config)
    return config


def check_model_file(config: Config) -> None:
    """The model file must exist, be Python and define ``build_model`` at its top level.

    Checked without importing the file (no user code runs, nothing heavy is imported), so
    `load_config` and Snakemake's dry run report a wrong `model` before any work starts.
    """
    model = config.model
    if not model.is_file():
        state = "is not a file" if model.exists() else "does not exist"
        raise ConfigError(
            f"model file '{model}' {state} (relative paths are resolved against the "
            f"current directory {Path.cwd()})",
            key="model",
            source=config.source,
        )
    try:
        tree = ast.parse(model.read_bytes(), filename=str(model))
    except (OSError, ValueError, SyntaxError) as exc:
        where = f" at line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        reason = exc.msg if isinstance(exc, SyntaxError) else _reason(exc)
        raise ConfigError(
            f"model file '{model}' cannot be read as Python{where}: {reason}", key="model", source=config.source
        ) from None
    if not _may_define(tree.body, "build_model"):
        raise ConfigError(
            f"model file '{model}' defines no function build_model(data); batchfit calls it with "
            "each dataset and expects a pm.Model back (see batchfit's docs/model.md)",
            key="model",
            source=config.source,
        )


def _may_define(body: list[ast.stmt], name: str) -> bool:
    """Whether module-level statements (outside functions and classes) can bind `name`."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name:
                    return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for target in targets for t in ast.walk(target)):
                return True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        else:  # if / try / with / for blocks at module level
            nested = [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            if _may_define(nested + handlers, name):
                return True
            if any(isinstance(n, ast.NamedExpr) and n.target.id == name for n in ast.walk(node)):
                return True
    return False


def config_from_dict(data: Mapping[str, Any], source: str = DICT_SOURCE) -> Config:
    """Validate a config mapping against the schema, fill defaults, and build a `Config`.

    The input is not modified. Does not touch the file system (see `load_config`).
    """
    return _build(validated(data, source), source)


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as JSON-able plain data, as a config file writes it; `config_from_dict` of it gives
    an equal `Config`. Derived from the dataclasses: a new setting needs no line here."""
    return {name: value for name, value in plain(config).items() if name not in ("source", "variant")}


def _build(d: dict[str, Any], source: str) -> Config:
    """Turn a validated, default-filled mapping into a `Config`, each section into its dataclass."""
    columns = {str(name): _column(str(name), spec, source) for name, spec in d["columns"].items()}
    d["datasets"] = [entry if isinstance(entry, str) else _table(entry) for entry in d["datasets"]]
    d["values"] = [_table(entry) for entry in ([d["values"]] if isinstance(d["values"], Mapping) else d["values"])]
    if d["predict"]["data"] is not None:  # one source or a list of them, as datasets
        data = d["predict"]["data"]
        d["predict"]["data"] = [entry if isinstance(entry, str) else _table(entry)
                                for entry in (data if isinstance(data, list) else [data])]
    if d["outputs"]["log_likelihood"] is None:  # the compare rule of a sweep of variants needs it
        d["outputs"]["log_likelihood"] = bool(d["variants"] or d["grid"])
    config = _section(Config, {**d, "source": source, "columns": columns})
    _check_sampler(config.sampler, source)
    _check_predict(config.predict, source)
    _check_where(config.rows.where, source)
    if config.outputs.sensitivity and not config.outputs.log_likelihood:
        raise ConfigError("power-scaling sensitivity scales the likelihood too, so it needs each fit's "
                          "log-likelihood: set outputs.log_likelihood: true", key="outputs.sensitivity", source=source)
    return config


def _check_predict(predict: PredictSettings, source: str) -> None:
    """At most one source of new inputs (none: no predictions)."""
    given = [name for name in ("data", "grid", "horizon") if getattr(predict, name) is not None]
    if len(given) > 1:
        raise ConfigError(f"give the new inputs by one of data (files per dataset), grid (the same rows for every "
                          f"dataset) or horizon, not {' and '.join(given)}", key="predict", source=source)


def _check_where(where: str | None, source: str) -> None:
    """A `rows.where` that is no expression at all fails before any data is read (which columns it names is
    checked against each dataset's, `batchfit.data.rows`). pandas' query syntax is Python's, with backticks
    around a column name that is no identifier."""
    if where is None:
        return
    try:
        ast.parse(re.sub(r"`[^`]*`", "_", where), mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"{where!r} is no expression pandas' query can evaluate ({exc.msg}, at character "
                          f"{exc.offset}); write it as in DataFrame.query, e.g. \"EVID == 0 and TIME >= 0\"",
                          key="rows.where", source=source) from None


# nutpie settings of its low-rank adaptation alone: nutpie refuses them with another adaptation.
_LOW_RANK_ONLY = ("mass_matrix_eigval_cutoff", "mass_matrix_gamma")


def _check_sampler(sampler: SamplerSettings, source: str) -> None:
    """Sampler settings that contradict each other, whatever the model (what a model's path cannot
    honour is found once the model is built: `batchfit.fitting.sampler_settings.settings_problems`)."""
    for name in _LOW_RANK_ONLY:
        if getattr(sampler, name) is not None and sampler.adaptation != "low_rank":
            raise ConfigError(f"{name} tunes nutpie's low-rank adaptation, but adaptation is "
                              f"{sampler.adaptation!r}: set adaptation: low_rank, or remove {name}",
                              key=f"sampler.{name}", source=source)


def _section(cls: type, data: Mapping[str, Any]) -> Any:
    """The dataclass ``cls`` from the keys of ``data`` it has, each value as its field's type says."""
    hints = typing.get_type_hints(cls)
    return cls(**{field.name: _typed(hints[field.name], data[field.name])
                  for field in dataclasses.fields(cls) if field.name in data})


def _typed(hint: Any, value: Any) -> Any:
    """``value`` (validated by the schema) as the type ``hint`` names: numbers as int or float (YAML
    may give 1000.0 for an int, 1 for a float), paths as Path, lists as tuples, sections as dataclasses."""
    if value is None or isinstance(value, ColumnSettings | TableSource):
        return value
    options = [option for option in typing.get_args(hint) if option is not type(None)] \
        if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint]
    for option in options:
        if dataclasses.is_dataclass(option):
            return _section(option, value)
        if option is Path:
            return Path(value)
        if typing.get_origin(option) is tuple:
            return (value,) if isinstance(value, str) else tuple(value)  # a single name, as in ArviZ
        if option is str and isinstance(value, str):
            return value
        if option in (int, float) and isinstance(value, int | float) and not isinstance(value, bool):
            return option(value)
        if option is bool and isinstance(value, bool):
            return value
        if typing.get_origin(option) in (Mapping, dict) or option is typing.Any:
            return value
    raise TypeError(f"config value {value!r} is none of {hint}")  # the schema lets through nothing else


def _table(entry: Mapping[str, Any]) -> TableSource:
    """A validated table entry: ``by`` one name or a list of them."""
    by = entry["by"]
    return TableSource(Path(entry["table"]), (by,) if isinstance(by, str) else tuple(by))


_LABEL_KEYS = ("levels", "order", "scope")


def _column(name: str, spec: Mapping[str, Any], source: str) -> ColumnSettings:
    """One validated `columns` entry; an explicit list fixes the order and the scope; bounds make a numeric column."""
    bounds = {bound: float(spec[bound]) for bound in ("min", "max") if bound in spec}
    if bounds:
        labelled = [key for key in _LABEL_KEYS if key in spec]
        if labelled:
            raise ConfigError(f"'{labelled[0]}' codes a label column, and min/max bound a numeric one; a column is "
                              "one or the other: remove one of them", key=f"columns.{name}.{labelled[0]}",
                              source=source)
        if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
            raise ConfigError(f"min {bounds['min']:g} is above max {bounds['max']:g}", key=f"columns.{name}.min",
                              source=source)
        return ColumnSettings(min=bounds.get("min"), max=bounds.get("max"), label=False)
    if "levels" in spec:
        for other in ("order", "scope"):
            if other in spec:
                raise ConfigError(
                    f"'{other}' cannot be combined with 'levels' (the list fixes the order of the "
                    "codes for the whole sweep); remove one of them",
                    key=f"columns.{name}.{other}", source=source,
                )
        return ColumnSettings(levels=tuple(spec["levels"]), order="listed")
    return ColumnSettings(**{key: spec[key] for key in ("order", "scope") if key in spec})


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """One-line description of a YAML syntax error with its line number."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"invalid YAML{where}: {problem}"


def _reason(exc: BaseException) -> str:
    """The reason of an OS error without its file name (the message names the file), else `one_line`."""
    return getattr(exc, "strerror", None) or one_line(exc)
