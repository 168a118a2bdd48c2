"""Load and validate a batchfit config file into a typed, immutable `Config`.

The packaged JSON Schema (`config.schema.yaml`) is the single source of the allowed keys,
their types, ranges and defaults; Snakemake validates against the same file. This module
turns schema violations into `ConfigError`s that name the key and the config file.

Relative paths in a config are relative to the current working directory (the directory
Snakemake or the batchfit command runs in), not to the config file.
"""

from __future__ import annotations

import ast
import copy
import difflib
import functools
import importlib.resources
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from batchfit.errors import ConfigError, one_line
from batchfit.layout import ResultsLayout

DICT_SOURCE = "<dict>"
AUTO = "auto"  # batch_size: chosen from the sweep (`batchfit.sweep.plan.batch_size`)


@dataclass(frozen=True)
class SamplerSettings:
    """NUTS settings used for every dataset."""

    draws: int
    tune: int
    chains: int
    target_accept: float
    seed: int


@dataclass(frozen=True)
class OutputSettings:
    """What each fit file holds: optional groups, and which posterior variables are kept.

    Everything here shapes the fit file, so it is part of every fit's provenance digest.
    `var_names`/`filter_vars` select posterior variables as ArviZ does (None: every free
    parameter and deterministic), see `batchfit.model.variables.select_vars`.
    """

    log_likelihood: bool
    posterior_predictive: bool
    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None


@dataclass(frozen=True)
class HealthSettings:
    """Thresholds a fit must meet to count as healthy, and the variables they are checked on.

    `var_names` None: the free parameters. Read by collect only, so not in the provenance digest.
    """

    max_r_hat: float
    min_ess_bulk: float
    max_divergences: int
    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None


@dataclass(frozen=True)
class SummarySettings:
    """Which kept variables summary.csv and posteriors.nc hold, and the credible interval.

    `var_names` None: all but observation-sized deterministics. `ci_prob` None: ArviZ's
    ``stats.ci_prob``. Read by collect only, so not in the provenance digest: changing them
    refits nothing.
    """

    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    ci_prob: float | None = None
    ci_kind: str = "hdi"

    @property
    def interval_prob(self) -> float:
        """The interval's probability: `ci_prob`, else ArviZ's ``stats.ci_prob`` (0.89 by default)."""
        from arviz_base import rcParams

        return rcParams["stats.ci_prob"] if self.ci_prob is None else self.ci_prob


@dataclass(frozen=True)
class ReportSettings:
    """What the sweep report's forest plots show (the `plots` rule; `report.*` in the config).

    `var_names` None: the scalar free parameters, or the vector ones, or the deterministics
    (`batchfit.outputs.plots.default_forest_variables`). Variables are chosen among those posteriors.nc
    holds (`summary.var_names`). A variable with more than `max_rows` rows (datasets, or dataset
    x element) is drawn as a summary view, its intervals sorted by mean, without a label per row.
    Read by the plots rule only, so not in the provenance digest: changing it refits nothing.
    """

    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    max_rows: int = 50


@dataclass(frozen=True)
class CacheSettings:
    """Behaviour of the compiled-model cache."""

    lock_timeout: float
    trust_shared: bool
    cpu_target: str = "host"


@dataclass(frozen=True)
class ColumnSettings:
    """How one text column's labels become codes (config key `columns.<name>`).

    `levels` lists the labels in code order (then `order` is "listed"); otherwise the labels
    come from the data in `order` ("sorted" or "appearance"). `scope` "dataset" codes the
    column separately in each dataset instead of once for the sweep.
    """

    levels: tuple[str, ...] | None = None
    order: str = "sorted"
    scope: str = "sweep"


@dataclass(frozen=True)
class SBCSettings:
    """Simulation-based calibration (`batchfit sbc`, `snakemake sbc`), see `batchfit.sweep.sbc`.

    `template` None: the first dataset by id. `simulator` None: the model file itself
    generates the data; otherwise a model file whose ``build_model`` is the generating process.
    `envelope_prob`: probability that a correct model's ranks pass (every element together).
    Read by the SBC stages only, so not in any fit's provenance digest.
    """

    n_simulations: int = 100
    template: str | None = None
    seed: int = 2026
    thin: int = 10
    simulator: Path | None = None
    envelope_prob: float = 0.95


@dataclass(frozen=True)
class Config:
    """A validated batchfit config; `source` is the config file (or "<dict>") for messages."""

    model: Path
    datasets: tuple[str, ...]
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
    summary: SummarySettings = field(default_factory=SummarySettings)
    sbc: SBCSettings = field(default_factory=SBCSettings)
    report: ReportSettings = field(default_factory=ReportSettings)

    @property
    def layout(self) -> ResultsLayout:
        """Every path under `results_dir` (`batchfit.layout`)."""
        return ResultsLayout(self.results_dir)

    def sampler_dict(self) -> dict[str, int | float]:
        """Sampler settings as a plain dict, recorded as attributes in the outputs."""
        s = self.sampler
        return {
            "draws": s.draws,
            "tune": s.tune,
            "chains": s.chains,
            "target_accept": s.target_accept,
            "seed": s.seed,
        }


@functools.cache
def config_schema() -> dict[str, Any]:
    """The packaged JSON Schema of the config (also used by Snakemake's `validate`)."""
    text = importlib.resources.files("batchfit").joinpath("config.schema.yaml").read_text("utf-8")
    return yaml.safe_load(text)


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
            "each dataset and expects a pm.Model back (see README, 'Writing a model')",
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
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the config must be a mapping of keys to values, got {_describe(data)}", source=source
        )
    filled = copy.deepcopy(dict(data))
    schema = config_schema()
    _fill_defaults(filled, schema)
    problems = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(filled),
        key=lambda e: (_key_path(e.absolute_path), e.validator),
    )
    messages = [m for error in problems for m in _explain(error)]
    reported = {key for key, _ in messages}
    messages.extend(m for m in _unrepresentable_numbers(filled, "") if m[0] not in reported)
    if messages:
        (key, first), *others = messages
        # repr: a key may hold a newline or quote, and the message must stay one line
        text = first + "".join(f"; also key {k!r}: {m}" for k, m in others)
        raise ConfigError(text, key=key, source=source)
    return _build(filled, source)


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as JSON-able plain data; `config_from_dict` of it gives an equal `Config`."""
    return {
        "model": str(config.model),
        "datasets": list(config.datasets),
        "sampler": config.sampler_dict(),
        "batch_size": config.batch_size,
        "cache_dir": str(config.cache_dir),
        "results_dir": str(config.results_dir),
        "on_error": config.on_error,
        "outputs": {
            "log_likelihood": config.outputs.log_likelihood,
            "posterior_predictive": config.outputs.posterior_predictive,
            **_selection_to_dict(config.outputs),
        },
        "health": {
            "max_r_hat": config.health.max_r_hat,
            "min_ess_bulk": config.health.min_ess_bulk,
            "max_divergences": config.health.max_divergences,
            **_selection_to_dict(config.health),
        },
        "summary": {
            **_selection_to_dict(config.summary),
            "ci_prob": config.summary.ci_prob,
            "ci_kind": config.summary.ci_kind,
        },
        "report": {**_selection_to_dict(config.report), "max_rows": config.report.max_rows},
        "max_structures": config.max_structures,
        "cache": {
            "lock_timeout": config.cache.lock_timeout,
            "trust_shared": config.cache.trust_shared,
            "cpu_target": config.cache.cpu_target,
        },
        "columns": {name: _column_to_dict(c) for name, c in config.columns.items()},
        "sbc": {
            "n_simulations": config.sbc.n_simulations,
            "template": config.sbc.template,
            "seed": config.sbc.seed,
            "thin": config.sbc.thin,
            "simulator": None if config.sbc.simulator is None else str(config.sbc.simulator),
            "envelope_prob": config.sbc.envelope_prob,
        },
    }


def _selection_to_dict(settings: OutputSettings | HealthSettings | SummarySettings | ReportSettings) -> dict[str, Any]:
    """The `var_names`/`filter_vars` keys of a section as written in a config file."""
    names = settings.var_names
    return {"var_names": None if names is None else list(names), "filter_vars": settings.filter_vars}


def _var_names(value: str | list[str] | None) -> tuple[str, ...] | None:
    """`var_names` as a tuple; a single name may be given as a string, as in ArviZ."""
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def _column_to_dict(column: ColumnSettings) -> dict[str, Any]:
    """One `columns` entry as written in a config file."""
    if column.levels is not None:
        return {"levels": list(column.levels)}
    return {"order": column.order, "scope": column.scope}


def _build(d: dict[str, Any], source: str) -> Config:
    """Turn a validated, default-filled mapping into a `Config`."""
    s, o, h, c, m, b, r = d["sampler"], d["outputs"], d["health"], d["cache"], d["summary"], d["sbc"], d["report"]
    return Config(
        model=Path(d["model"]),
        datasets=tuple(d["datasets"]),
        sampler=SamplerSettings(
            draws=int(s["draws"]),
            tune=int(s["tune"]),
            chains=int(s["chains"]),
            target_accept=float(s["target_accept"]),
            seed=int(s["seed"]),
        ),
        batch_size=d["batch_size"] if d["batch_size"] == AUTO else int(d["batch_size"]),
        cache_dir=Path(d["cache_dir"]),
        results_dir=Path(d["results_dir"]),
        on_error=d["on_error"],
        outputs=OutputSettings(
            log_likelihood=o["log_likelihood"], posterior_predictive=o["posterior_predictive"],
            var_names=_var_names(o["var_names"]), filter_vars=o["filter_vars"],
        ),
        health=HealthSettings(
            max_r_hat=float(h["max_r_hat"]),
            min_ess_bulk=float(h["min_ess_bulk"]),
            max_divergences=int(h["max_divergences"]),
            var_names=_var_names(h["var_names"]),
            filter_vars=h["filter_vars"],
        ),
        summary=SummarySettings(
            var_names=_var_names(m["var_names"]),
            filter_vars=m["filter_vars"],
            ci_prob=None if m["ci_prob"] is None else float(m["ci_prob"]),
            ci_kind=m["ci_kind"],
        ),
        report=ReportSettings(
            var_names=_var_names(r["var_names"]), filter_vars=r["filter_vars"], max_rows=int(r["max_rows"])
        ),
        max_structures=d["max_structures"],
        cache=CacheSettings(lock_timeout=float(c["lock_timeout"]), trust_shared=c["trust_shared"],
                            cpu_target=c["cpu_target"]),
        source=source,
        columns={str(name): _column(str(name), spec, source) for name, spec in d["columns"].items()},
        sbc=SBCSettings(
            n_simulations=int(b["n_simulations"]),
            template=b["template"],
            seed=int(b["seed"]),
            thin=int(b["thin"]),
            simulator=None if b["simulator"] is None else Path(b["simulator"]),
            envelope_prob=float(b["envelope_prob"]),
        ),
    )


def _column(name: str, spec: Mapping[str, Any], source: str) -> ColumnSettings:
    """One validated `columns` entry; an explicit list fixes the order and the scope."""
    if "levels" in spec:
        for other in ("order", "scope"):
            if other in spec:
                raise ConfigError(
                    f"'{other}' cannot be combined with 'levels' (the list fixes the order of the "
                    "codes for the whole sweep); remove one of them",
                    key=f"columns.{name}.{other}", source=source,
                )
        return ColumnSettings(levels=tuple(spec["levels"]), order="listed")
    return ColumnSettings(order=spec.get("order", "sorted"), scope=spec.get("scope", "sweep"))


def _fill_defaults(instance: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """Fill missing keys from schema defaults, at every level (as Snakemake's validate does)."""
    for name, sub in schema.get("properties", {}).items():
        if name not in instance and "default" in sub:
            instance[name] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(name), dict):
            _fill_defaults(instance[name], sub)


_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping of keys to values",
    "array": "a list",
    "null": "null",
}

_BOUNDS = {
    "minimum": ">=",
    "exclusiveMinimum": ">",
    "maximum": "<=",
    "exclusiveMaximum": "<",
}


def _explain(error: jsonschema.ValidationError) -> Iterator[tuple[str, str]]:
    """(key path, human message) pairs for one schema violation."""
    key = _key_path(error.absolute_path)
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "type":
        names = [expected] if isinstance(expected, str) else expected
        yield key, f"must be {' or '.join(_TYPE_NAMES.get(n, n) for n in names)}, got {_describe(value)}"
    elif kind in _BOUNDS:
        yield key, f"must be {_BOUNDS[kind]} {expected}, got {_describe(value)}"
    elif kind == "pattern":  # a word some number settings take instead of a number: batch_size 'auto'
        numbers = [_TYPE_NAMES[n] for n in error.schema.get("type", []) if n != "string"]
        word = repr(expected.strip("^$"))
        yield key, f"must be {' or '.join([*numbers, word])}, got {_describe(value)}"
    elif kind == "enum":
        allowed = ", ".join("null" if v is None else repr(v) for v in expected)
        yield key, f"must be one of {allowed}, got {_describe(value)}"
    elif kind == "minLength":
        yield key, "must not be empty"
    elif kind == "minItems":
        what = " (a file or glob pattern)" if key == "datasets" else ""
        yield key, f"must list at least {expected} entry{what}, got an empty list"
    elif kind == "required":
        for name in expected:
            if name not in value:
                yield _child(key, name), f"missing required key '{name}'"
    elif kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        for name in value:
            if name not in allowed:
                yield _child(key, name), _unknown_key(name, allowed)
    else:
        yield key, error.message


def _unknown_key(name: object, allowed: list[str]) -> str:
    """Message for an unknown key, with a did-you-mean suggestion when one is close."""
    message = f"unknown key {name!r}"
    close = difflib.get_close_matches(str(name), allowed, n=1)
    if close:
        message += f"; did you mean '{close[0]}'?"
    return message + f" (allowed here: {', '.join(allowed)})"


def _unrepresentable_numbers(value: object, key: str) -> Iterator[tuple[str, str]]:
    """Flag NaN, infinity and integers beyond float range, which JSON Schema lets through."""
    if isinstance(value, float) and not math.isfinite(value):
        yield key, f"must be a finite number, got {value}"
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        yield key, "is too large a number"
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _unrepresentable_numbers(v, _child(key, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _unrepresentable_numbers(v, f"{key}[{i}]")


def _key_path(path: Iterable[object]) -> str:
    """Dotted key path of a schema error as users write it: `sampler.draws`, `datasets[0]`."""
    text = ""
    for part in path:
        text = f"{text}[{part}]" if isinstance(part, int) else _child(text, part)
    return text


def _child(key: str, name: object) -> str:
    """The key path of mapping entry `name` under `key`."""
    return f"{key}.{name}" if key else str(name)


def _describe(value: object) -> str:
    """A short rendering of a config value for messages, e.g. 'abc', 3, a list."""
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """One-line description of a YAML syntax error with its line number."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"invalid YAML{where}: {problem}"


def _reason(exc: BaseException) -> str:
    """The reason of an OS error without its file name (the message names the file), else `one_line`."""
    return getattr(exc, "strerror", None) or one_line(exc)
