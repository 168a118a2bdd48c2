"""The config's JSON Schema (``workflow/schemas/config.schema.yaml``) and its violations in words.

The schema is the single source of the allowed keys, their types, ranges and defaults;
Snakemake's ``validate`` reads the same file. `validated` fills the defaults and turns every
violation into one `ConfigError` naming the key (with a did-you-mean for a misspelled one).
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.resources
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jsonschema
import yaml

from batchfit.errors import ConfigError


def validated(data: Any, source: str) -> dict[str, Any]:
    """A copy of ``data`` with the schema's defaults filled in; every violation in one `ConfigError`."""
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
    messages = list(dict.fromkeys(m for error in problems for m in _explain(error)))  # one line per distinct problem
    reported = {key for key, _ in messages}
    messages.extend(m for m in _unrepresentable_numbers(filled, "") if m[0] not in reported)
    if messages:
        (key, first), *others = messages
        # repr: a key may hold a newline or quote, and the message must stay one line
        text = first + "".join(f"; also key {k!r}: {m}" for k, m in others)
        raise ConfigError(text, key=key, source=source)
    return filled


# config/README.md's block of defaults: the width its lines wrap at.
_DEFAULTS_WIDTH = 112


def defaults_yaml() -> str:
    """Every top-level key with its default as YAML, a key a line (wrapped; a required key with the schema's example):
    config/README.md's block of defaults and `batchfit defaults`, generated so that no default is spelled twice."""
    lines = []
    for name, spec in config_schema()["properties"].items():
        value = spec["default"] if "default" in spec else spec["examples"][0]
        flow = yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=math.inf).strip()[1:-1]
        lines += _wrapped(f"{name}: ", flow.split(", "))
    return "\n".join(lines) + "\n"


def _wrapped(head: str, items: list[str]) -> list[str]:
    """``head`` and the flow items joined by ", ", in lines of at most `_DEFAULTS_WIDTH` where items allow;
    continued lines indented past the flow's opening bracket."""
    lines, line = [], head + items[0]
    for item in items[1:]:
        if len(line) + 2 + len(item) > _DEFAULTS_WIDTH:
            lines.append(line + ",")
            line = " " * (len(head) + 1) + item
        else:
            line += ", " + item
    return [*lines, line]


@functools.cache
def config_schema() -> dict[str, Any]:
    """The packaged JSON Schema of the config: the workflow's, which its Snakemake `validate` reads."""
    schema = importlib.resources.files("batchfit").joinpath("workflow", "schemas", "config.schema.yaml")
    return yaml.load(schema.read_text("utf-8"), Loader=_SCHEMA_LOADER)


# Every job of a sweep reads the schema once, before its work: libyaml's safe loader (the C extension PyYAML's
# wheels ship) reads it in a fraction of the pure-Python loader's time, to the same value (tests/unit/test_config.py).
# The pure-Python one where PyYAML was built without libyaml. A user's config keeps yaml.safe_load: its
# errors' marks are the ones users know.
_SCHEMA_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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
    elif kind == "pattern":  # words some number settings take instead of a number: batch_size 'auto'
        numbers = [_TYPE_NAMES[n] for n in error.schema.get("type", []) if n != "string"]
        words = [repr(word) for word in expected.strip("^$").strip("()").split("|")]
        yield key, f"must be {' or '.join([*numbers, *words])}, got {_describe(value)}"
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
    elif kind == "anyOf" and error.context:
        yield from _explain_alternative(error)
    elif kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        other_names = error.schema.get("x-other-names", {})
        for name in value:
            if name not in allowed:
                yield _child(key, name), _unknown_key(name, allowed, other_names.get(name))
    else:
        yield key, error.message


def _explain_alternative(error: jsonschema.ValidationError) -> Iterator[tuple[str, str]]:
    """A value that fits none of an ``anyOf``'s alternatives: the violations of the alternative of its
    own type (a mapping's of the mapping alternative), else what any alternative would take."""
    by_branch: dict[int, list[jsonschema.ValidationError]] = {}
    for sub in error.context or ():
        by_branch.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
    typed = [subs for subs in by_branch.values()
             if not any(sub.validator == "type" and not sub.relative_path for sub in subs)]
    if len(typed) == 1:
        for sub in typed[0]:
            yield from _explain(sub)
        return
    names = [name for subs in by_branch.values() for sub in subs if sub.validator == "type" and not sub.relative_path
             for name in ([sub.validator_value] if isinstance(sub.validator_value, str) else sub.validator_value)]
    key = _key_path(error.absolute_path)
    yield key, (f"must be {' or '.join(_TYPE_NAMES.get(n, n) for n in dict.fromkeys(names))}, "
                f"got {_describe(error.instance)}")


def _unknown_key(name: object, allowed: list[str], hint: str | None = None) -> str:
    """Message for an unknown key: the schema's ``hint`` for it (``x-other-names``: where a setting
    pm.sample or nutpie names so is found here), else a did-you-mean suggestion when one is close."""
    message = f"unknown key {name!r}"
    close = difflib.get_close_matches(str(name), allowed, n=1)
    if hint:
        message += f"; {' '.join(hint.split())}"
    elif close:
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
