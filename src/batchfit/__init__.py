"""batchfit: fit one PyMC model structure to many datasets, compiling once.

The entry points below are imported on first use (``batchfit.load_dataset``), so importing
batchfit stays cheap for the command line and the Snakefile (no PyMC, no xarray).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchfit.compat.python import stop_pathlib_interning

if TYPE_CHECKING:
    from batchfit.notebook import build_model, load_dataset, predict
    from batchfit.outputs.results import Results, open_results

__version__ = "0.1.0"

# Every batchfit process (jobs, workers, the Snakefile's) goes through thousands of file names,
# which CPython 3.12.0-3.12.5 would keep in memory for good (`compat.stop_pathlib_interning`).
stop_pathlib_interning()

# name -> module that defines it
_LAZY = {"load_dataset": "batchfit.notebook", "build_model": "batchfit.notebook", "predict": "batchfit.notebook",
         "workflow_snakefile": "batchfit.project", "open_results": "batchfit.outputs.results",
         "Results": "batchfit.outputs.results"}
__all__ = ["Results", "__version__", "build_model", "load_dataset", "open_results", "predict", "workflow_snakefile"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'batchfit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
