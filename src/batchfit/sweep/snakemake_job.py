"""What every rule script does first: its config from Snakemake's, and batchfit's log in the rule's log file."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from batchfit.compile.cputarget import apply_cpu_target
from batchfit.config import Config, check_model_file, config_from_dict
from batchfit.errors import BatchfitError

log = logging.getLogger("batchfit")


def snakemake_config(config: Mapping[str, Any], source: str) -> Config:
    """A Config from Snakemake's config dict, checked as `load_config` checks a config file.

    ``source`` names its files, so every error names the key and the file to fix. Also sets the
    CPU target numba compiles for (`batchfit.compile.cputarget`), which must precede loading numba.
    """
    checked = config_from_dict(dict(config), source=source)
    check_model_file(checked)
    apply_cpu_target(checked.cache.cpu_target, source)
    return checked


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
