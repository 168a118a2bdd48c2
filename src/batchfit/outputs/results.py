"""A finished sweep's results as ArviZ and pandas objects: `open_results`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import xarray as xr

from batchfit.config import Config, load_config
from batchfit.layout import ResultsLayout
from batchfit.outputs.combined import DATASET_DIM, DATASETS, POSTERIOR, dataset_posterior

# datasets.csv's integer columns, empty for a failed dataset: read as pandas' nullable integers, since
# as floats a 63-bit seed would not be the seed any more.
DATASET_INTEGERS = {"rows": "Int64", "seed": "Int64", "divergences": "Int64"}


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


def open_results(config_or_path: Config | str | Path) -> Results:
    """Open a sweep's results: a `Config`, a config file, or a results directory.

    posteriors.nc is opened lazily (its draws are read when used); summary.csv, datasets.csv and
    failures.csv are read into DataFrames (missing values as NaN, text as written).
    """
    if isinstance(config_or_path, Config):
        layout = config_or_path.layout
    elif Path(config_or_path).is_dir():
        layout = ResultsLayout(Path(config_or_path))
    else:
        layout = load_config(config_or_path).layout
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
