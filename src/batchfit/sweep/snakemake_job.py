"""What every rule script does first: its config from Snakemake's, and batchfit's log in the rule's log file."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from batchfit.config import Config, check_model_file, config_from_dict
from batchfit.errors import BatchfitError
from batchfit.numba_ops.cputarget import apply_cpu_target
from batchfit.sweep.plan import compile_stamp_path
from batchfit.variants import configs_of, variant_configs

log = logging.getLogger("batchfit")


def snakemake_config(config: Mapping[str, Any], source: str, variant: str | None = None) -> Config:
    """A Config from Snakemake's config dict, checked as `load_config` checks a config file; with
    ``variant`` (a job's ``{variant}`` wildcard), that variant's own (`batchfit.variants`).

    ``source`` names its files, so every error names the key and the file to fix. Also sets the
    CPU target numba compiles for (`batchfit.numba_ops.cputarget`), which must precede loading numba.
    """
    checked = config_from_dict(dict(config), source=source)
    check_model_file(checked)
    apply_cpu_target(checked.cache.cpu_target, source)
    return checked if variant is None else variant_configs(checked)[variant]


def stamp_config(config: Config, stamp: str) -> Config:
    """The config (a variant's, in a sweep of variants, or the sweep's own for SBC) whose compile stamp is named
    ``stamp``: what a compile job compiles. Variants sharing a model and its parameters share one stamp, one compile."""
    for candidate in [*configs_of(config).values(), config]:
        if compile_stamp_path(candidate).stem == stamp:
            return candidate
    raise BatchfitError(f"no config of the sweep ({config.source}) has the compile stamp {stamp}")


@contextlib.contextmanager
def log_to(path: str | Path | None) -> Iterator[None]:
    """Send batchfit's log (and warnings) to a rule's log file for the duration of a job."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    previous = log.level
    log.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    except BatchfitError as exc:
        log.error("%s", exc)
        raise
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        log.setLevel(previous)
        handler.close()
