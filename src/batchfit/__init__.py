"""batchfit: fit one PyMC model structure to many datasets, compiling once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchfit.results import Results, open_results

__version__ = "0.1.0"
__all__ = ["Results", "__version__", "open_results"]


def __getattr__(name: str) -> Any:
    """`open_results` and `Results` are imported on first use: importing batchfit stays cheap (no xarray)."""
    if name in ("open_results", "Results"):
        from batchfit import results

        return getattr(results, name)
    raise AttributeError(f"module 'batchfit' has no attribute {name!r}")
