"""``batchfit check``: everything that can be known to be wrong before any compiling or sampling.

It loads and validates every dataset against the reference model's requirements (each problem
names the dataset, file and column), and lists the operations of the sampler functions that
would run in numba's object mode or could not be disk-cached, with the model variable they
come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchfit.config import Config
from batchfit.data import check_dataset, discover_datasets, load_dataset
from batchfit.errors import BatchfitError, DatasetError


@dataclass
class CheckReport:
    """Problems found by ``check_model``."""

    reference: str
    dataset_problems: dict[str, str] = field(default_factory=dict)
    fallbacks: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.dataset_problems and not self.fallbacks

    def lines(self) -> list[str]:
        """Human-readable findings, one per line."""
        out = [f"reference dataset: {self.reference}"]
        out += [f"  {problem}" for problem in self.dataset_problems.values()]
        out += [f"  not fully compiled: {fallback}" for fallback in self.fallbacks]
        out.append("check: ok" if self.ok else
                   f"check: {len(self.dataset_problems)} dataset problem(s), {len(self.fallbacks)} compile problem(s)")
        return out


def check_model(config: Config, *, datasets: bool = True) -> CheckReport:
    """Validate datasets (optionally) and find object-mode or uncacheable ops in the sampler functions."""
    from batchfit.cache import open_cache
    from batchfit.fit import reference_model
    from batchfit.graphs import compile_sampler_functions
    from batchfit.nopython import fallbacks_in_function

    # Before compiling anything: refuse an untrusted cache, and compile into the config's cache.
    open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    unusable: dict[str, DatasetError] = {}
    paths = discover_datasets(config, problems=unusable if datasets else None)
    ref = reference_model(config, paths)
    report = CheckReport(ref.dataset.id)
    report.dataset_problems.update({name: str(exc) for name, exc in unusable.items()})
    if datasets:
        for dataset_id, path in paths.items():
            try:
                check_dataset(load_dataset(dataset_id, path, ref.coding), ref.requirements)
            except BatchfitError as exc:
                report.dataset_problems[dataset_id] = str(exc)
    _, logp_fn, expand_fn = compile_sampler_functions(ref.model)
    names = list(ref.model.named_vars)
    seen = set()
    for fn in (logp_fn, expand_fn):
        for fallback in fallbacks_in_function(fn, variable_names=names):
            if str(fallback) not in seen:
                seen.add(str(fallback))
                report.fallbacks.append(fallback)
    return report
