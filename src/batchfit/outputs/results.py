"""A finished sweep's results as ArviZ and pandas objects: `open_results`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import xarray as xr

from batchfit.config import Config, load_config
from batchfit.layout import ResultsLayout
from batchfit.outputs.combined import DATASET_DIM, DATASETS, POSTERIOR, dataset_posterior
from batchfit.variants import one_variant, variant_configs

# datasets.csv's integer columns, empty for a failed dataset: read as pandas' nullable integers, since
# as floats a 63-bit seed would not be the seed any more.
DATASET_INTEGERS = {"rows": "Int64", "dropped_where": "Int64", "dropped_missing": "Int64", "seed": "Int64",
                    "divergences": "Int64"}


@dataclass(frozen=True)
class Results:
    """posteriors.nc, summary.csv, datasets.csv and failures.csv of one sweep.

    `tree` is posteriors.nc opened lazily (`batchfit.outputs.combined`): hand it to ArviZ as it is
    (``az.summary(results.tree)``, ``azp.plot_forest(results.tree, var_names=["mu"])``: every
    dataset along the ``dataset`` dimension), or take one dataset with `dataset`. Close it with
    `close` or a ``with`` block.
    """

    tree: xr.DataTree
    summary: pd.DataFrame  # summary.csv: a row per dataset and parameter
    datasets: pd.DataFrame  # datasets.csv: a row per dataset (its file, rows, status, structure, diagnostics)
    failures: pd.DataFrame
    results_dir: Path

    @property
    def dataset_ids(self) -> list[str]:
        """The fitted datasets, in the sweep's order (failed ones are in `failures`)."""
        return [str(d) for d in self.tree[POSTERIOR][DATASET_DIM].values]

    def dataset(self, dataset_id: str) -> xr.DataTree:
        """One dataset's posterior as a DataTree ArviZ takes, without the padding of the stacked file.

        Its ``posterior`` equals that of ``fits/{id}.nc`` (the variables `summary.var_names`
        selects); its attributes are the fit's.
        """
        if dataset_id not in self.dataset_ids:
            raise KeyError(f"dataset {dataset_id!r} has no posterior in {ResultsLayout(self.results_dir).posteriors} "
                           f"(failed: {dataset_id in set(self.failures['dataset'])})")
        info = self.tree[DATASETS].to_dataset()
        posterior = dataset_posterior(self.tree[POSTERIOR].to_dataset(), info, dataset_id)
        row = info.sel({DATASET_DIM: dataset_id})
        attrs = {str(k): str(v.values) for k, v in row.data_vars.items() if v.dtype.kind in "OUS"}
        tree = xr.DataTree.from_dict({POSTERIOR: posterior}, name=dataset_id)
        tree.attrs = attrs
        return tree

    def close(self) -> None:
        self.tree.close()

    def __enter__(self) -> Results:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class VariantResults:
    """The results of every variant of a sweep of variants (`batchfit.variants`), stacked.

    `summary`, `datasets` and `failures` are the variants' tables one under the other, with a ``variant``
    column first; `tree` has a child per variant (its posteriors.nc); `comparison` is comparison.csv (None
    before the compare rule ran). One variant's `Results`: ``results.variants[id]``.
    """

    variants: dict[str, Results]
    comparison: pd.DataFrame | None
    results_dir: Path

    @property
    def tree(self) -> xr.DataTree:
        return xr.DataTree.from_dict({variant: r.tree for variant, r in self.variants.items()})

    @property
    def summary(self) -> pd.DataFrame:
        return self._stacked("summary")

    @property
    def datasets(self) -> pd.DataFrame:
        return self._stacked("datasets")

    @property
    def failures(self) -> pd.DataFrame:
        return self._stacked("failures")

    def dataset(self, dataset_id: str) -> xr.DataTree:
        """One dataset's posterior in each variant that fitted it, a child per variant (`Results.dataset`)."""
        return xr.DataTree.from_dict({variant: r.dataset(dataset_id) for variant, r in self.variants.items()
                                      if dataset_id in r.dataset_ids}, name=dataset_id)

    def _stacked(self, table: str) -> pd.DataFrame:
        return pd.concat([getattr(r, table).assign(variant=variant)[["variant", *getattr(r, table).columns]]
                          for variant, r in self.variants.items()], ignore_index=True)

    def close(self) -> None:
        for results in self.variants.values():
            results.close()

    def __enter__(self) -> VariantResults:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_results(config_or_path: Config | str | Path, variant: str | None = None) -> Results | VariantResults:
    """Open a sweep's results: a `Config`, a config file, or a results directory.

    posteriors.nc is opened lazily (its draws are read when used); summary.csv, datasets.csv and
    failures.csv are read into DataFrames (missing values as NaN, text as written). In a sweep of variants,
    ``variant``'s results, or with None every variant's, stacked (`VariantResults`).
    """
    if isinstance(config_or_path, Config) or not Path(config_or_path).is_dir():
        config = config_or_path if isinstance(config_or_path, Config) else load_config(config_or_path)
        if variant is None and variant_configs(config):
            return _stacked(config.layout, list(variant_configs(config)))
        return _open(one_variant(config, variant).layout)
    layout = ResultsLayout(Path(config_or_path))
    if variant is not None:
        return _open(layout.variant(variant))
    if not layout.posteriors.exists():  # a sweep of variants' results_dir: a folder per variant
        found = sorted(p.parent.name for p in layout.root.glob(f"*/{layout.posteriors.name}"))
        if found:
            return _stacked(layout, found)
    return _open(layout)


def _stacked(layout: ResultsLayout, variants: list[str]) -> VariantResults:
    comparison = pd.read_csv(layout.comparison) if layout.comparison.is_file() else None
    return VariantResults({variant: _open(layout.variant(variant)) for variant in variants}, comparison, layout.root)


def _open(layout: ResultsLayout) -> Results:
    missing = [path.name for path in (layout.posteriors, layout.summary, layout.datasets_csv, layout.failures_csv)
               if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{layout.root} has no {', '.join(missing)}: run collect first "
                                "(snakemake, or batchfit collect --config ...)")
    read = {"keep_default_na": False, "na_values": [""]}
    return Results(tree=xr.open_datatree(layout.posteriors),
                   summary=pd.read_csv(layout.summary, **read),
                   datasets=pd.read_csv(layout.datasets_csv, dtype=DATASET_INTEGERS, **read),
                   failures=pd.read_csv(layout.failures_csv, **read),
                   results_dir=layout.root)
