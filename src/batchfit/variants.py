"""A sweep of variants: one config's ``variants:`` and ``grid:`` expanded into a full `Config` per variant.

Each variant is the base config with its overrides deep-merged onto it and ``results_dir/<id>/`` as its
own results directory, so everything a sweep does (plan, compile, fit, collect, status, provenance)
runs per variant unchanged; ``cache_dir`` stays shared, so structures two variants share compile once.
A grid's ids follow Snakemake's ``Paramspace``: ``name~value``, joined by ``_``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchfit.config import Config, check_model_file, config_from_dict, config_to_dict
from batchfit.errors import ConfigError
from batchfit.layout import RESERVED_NAMES

# Keys every variant shares: the datasets it is compared on (their sources, rows and per-dataset values), where
# results and the cache go, the sweep itself and how its variants are compared.
SHARED_KEYS = ("datasets", "rows", "values", "results_dir", "cache_dir", "variants", "grid", "sbc", "compare")
PARAM_SEP, GRID_SEP = "~", "_"  # Paramspace's param_sep and filename_sep
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~+=-]*")


def variant_overrides(config: Config) -> dict[str, dict[str, Any]]:
    """Every variant's overrides by id ({} for a sweep without variants): ``variants`` x ``grid`` points."""
    named = {str(v): dict(overrides) for v, overrides in config.variants.items()}
    for variant, overrides in named.items():
        _check_id(variant, f"variants.{variant}", config.source)
        for key in overrides:
            if key in SHARED_KEYS:
                raise ConfigError(f"a variant cannot override {key!r}: every variant of a sweep shares it "
                                  f"(shared: {', '.join(SHARED_KEYS)})", key=f"variants.{variant}.{key}",
                                  source=config.source)
    points = _grid_points(config)
    if not points:
        return named
    if not named:
        return points
    return {f"{v}{GRID_SEP}{g}": _merged(overrides, point) for v, overrides in named.items()
            for g, point in points.items()}


def variant_configs(config: Config) -> dict[str, Config]:
    """Each variant's full `Config`, by id, in the order the file lists them ({} without variants).

    A value a variant sets wrongly is a `ConfigError` naming ``variants.<id>.<key>`` (or the grid's key).
    """
    overrides = variant_overrides(config)
    base = {k: v for k, v in config_to_dict(config).items() if k not in ("variants", "grid")}
    configs = {}
    for variant, override in overrides.items():
        merged = _merged(base, override)
        merged["results_dir"] = str(Path(config.results_dir) / variant)
        try:
            configs[variant] = config_from_dict(merged, source=config.source)
        except ConfigError as exc:
            origin = "grid" if variant not in config.variants and config.grid else f"variants.{variant}"
            message = str(exc).split("): ", 1)[-1]
            raise ConfigError(message, key=f"{origin}.{exc.key}" if exc.key else origin,
                              source=config.source) from None
        configs[variant] = dataclasses.replace(configs[variant], variant=variant)
        if configs[variant].model != config.model:
            _check_model(configs[variant], variant)
    return configs


def one_variant(config: Config, variant: str | None) -> Config:
    """The config a command runs with: ``variant``'s own, or ``config`` itself for a sweep without variants.

    A sweep of variants needs the variant named (`configs_of` gives them all); an unknown one is an
    error listing the ids.
    """
    configs = variant_configs(config)
    if variant is None and not configs:
        return config
    if variant is None or variant not in configs:
        listed = ", ".join(configs) or "none: the config has no variants or grid"
        what = "this config sweeps variants: name one" if variant is None else f"no variant {variant!r}"
        raise ConfigError(f"{what} (its variants: {listed})", key="variants", source=config.source)
    return configs[variant]


def configs_of(config: Config) -> dict[str | None, Config]:
    """The configs a sweep fits: each variant's by id, or the config itself under None."""
    return dict(variant_configs(config)) or {None: config}


def _check_model(config: Config, variant: str) -> None:
    """A variant's own model file, checked as `batchfit.config.check_model_file` checks the sweep's."""
    try:
        check_model_file(config)
    except ConfigError as exc:
        raise ConfigError(str(exc).split("): ", 1)[-1], key=f"variants.{variant}.model", source=config.source) from None


def _grid_points(config: Config) -> dict[str, dict[str, Any]]:
    """The grid's combinations as nested overrides, by Paramspace-like id (``prior_scale~2.0_noise~t``)."""
    if not config.grid:
        return {}
    keys = [str(k) for k in config.grid]
    names = [k.rsplit(".", 1)[-1] for k in keys]
    names = [k if names.count(n) > 1 else n for k, n in zip(keys, names, strict=True)]  # ambiguous: the full key
    for key in keys:
        if key.split(".", 1)[0] in SHARED_KEYS:
            raise ConfigError(f"a grid cannot sweep {key!r}: every variant of a sweep shares it "
                              f"(shared: {', '.join(SHARED_KEYS)})", key=f"grid.{key}", source=config.source)
    points = {}
    for values in itertools.product(*(config.grid[k] for k in config.grid)):
        point: dict[str, Any] = {}
        for key, value in zip(keys, values, strict=True):
            point = _merged(point, _nested(key, value))
        variant = GRID_SEP.join(f"{n}{PARAM_SEP}{_text(k, v)}" for k, n, v in zip(keys, names, values, strict=True))
        _check_id(variant, "grid", config.source)
        if variant in points:
            raise ConfigError(f"two grid points get the same id {variant!r}; give distinct values",
                              key="grid", source=config.source)
        points[variant] = point
    return points


def _text(key: str, value: Any) -> str:
    """A grid value as it reads in an id: a model file by its name, others as written."""
    if key == "model":
        return Path(str(value)).stem
    return str(value).lower() if isinstance(value, bool) else str(value)


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    *parents, last = dotted.split(".")
    nested: dict[str, Any] = {last: value}
    for parent in reversed(parents):
        nested = {parent: nested}
    return nested


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` deep-merged onto a copy of ``base``: mappings key by key, other values replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _check_id(variant: str, key: str, source: str) -> None:
    if not _ID.fullmatch(variant):
        raise ConfigError(f"variant id {variant!r} is not usable as a folder name: letters, digits and . _ ~ + = - "
                          "only, starting with a letter or digit", key=key, source=source)
    if variant in RESERVED_NAMES:
        raise ConfigError(f"variant id {variant!r} is a name results_dir already uses for its own files "
                          f"({', '.join(sorted(RESERVED_NAMES))}); pick another", key=key, source=source)
