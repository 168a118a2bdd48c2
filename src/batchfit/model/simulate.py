"""Synthetic datasets from a model file's ``simulate(rng, index)``, for examples and benchmarks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from batchfit.common.atomic import atomic_path
from batchfit.errors import ModelContractError
from batchfit.model.model_file import load_model_file, use_model_folder
from batchfit.model.user_traceback import model_code_error


def simulate_datasets(
    model_file: Path, out_dir: Path, n: int, *, seed: int = 2026, prefix: str = "dataset"
) -> list[Path]:
    """Write ``n`` CSV datasets ``{prefix}_{i:03d}.csv``; dataset i depends only on (seed, i)."""
    module = load_model_file(model_file)
    simulate = getattr(module, "simulate", None)
    if not callable(simulate):
        raise ModelContractError(f"model file {model_file} defines no simulate(rng, index) function")
    paths = []
    for i in range(n):
        use_model_folder(module)
        try:
            frame = simulate(np.random.default_rng([seed, i]), i)
        except Exception as exc:
            raise model_code_error(exc, Path(model_file),
                                   f"simulate(rng, {i}) of model file {model_file} failed") from exc
        path = Path(out_dir) / f"{prefix}_{i:03d}.csv"
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, index=False)
        paths.append(path)
    return paths
