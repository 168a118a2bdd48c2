"""The simulated sweep of an SBC run: where it lives, its template dataset, its config and coding."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchfit.common.atomic import atomic_path
from batchfit.config import Config
from batchfit.data.coding import sweep_coding
from batchfit.data.dataset import Dataset
from batchfit.data.discovery import discover_datasets
from batchfit.data.reader import DatasetReader
from batchfit.errors import BatchfitError, ConfigError
from batchfit.settings import ColumnSettings, RowRules, TableSource

log = logging.getLogger("batchfit")

SIM_PREFIX = "sim-"
VALUES_KEY = "dataset"  # the key column of the simulated sweep's side table of per-dataset values
RANKS_GROUP = "prior_sbc"  # the group simuk writes and arviz_plots.plot_ecdf_pit reads


def simulation_ids(n: int) -> list[str]:
    """Ids of the first ``n`` simulations; zero-padded so that id order is index order."""
    return [f"{SIM_PREFIX}{i:05d}" for i in range(n)]


def template(config: Config) -> tuple[str, Path]:
    """The template dataset's id and file: ``sbc.template``, or the first dataset by id."""
    datasets = discover_datasets(config.data_sources)
    wanted = config.sbc.template or next(iter(datasets))
    if wanted not in datasets:
        raise ConfigError(f"dataset {wanted!r} is not among the config's datasets "
                          f"(e.g. {', '.join(list(datasets)[:5])})", key="sbc.template", source=config.source)
    return wanted, datasets[wanted]


def data_paths(config: Config) -> dict[str, Path]:
    """The simulated data file of each of the first ``sbc.n_simulations`` simulations: CSV for a table's
    template (a file's or a group's), NetCDF for a NetCDF template."""
    path = template(config)[1]
    suffix = ".nc" if not path.is_dir() and path.suffix.lower() in (".nc", ".nc4", ".netcdf") else ".csv"
    root = config.layout.sbc.simulated_data
    return {sim: root / f"{sim}{suffix}" for sim in simulation_ids(config.sbc.n_simulations)}


def sbc_config(config: Config) -> Config:
    """The sweep of the simulated datasets: same model, sampler, cache and outputs; its own results.

    Its ``columns`` list, for each text column of the template, the levels the simulator coded
    it with (recorded by `simulate`), so every job of it, in any process, gives each simulated
    file the template's codes and ``data.coords``. The simulated files must exist (see
    `simulate`): `discover_datasets` checks them. ``on_error`` is always ``continue``: a failed
    fit is an SBC result to count, not a reason to stop.
    """
    # A column without any label in the template (empty) has no list to give: coded within each
    # simulated file, it is as empty there, so it gets no levels either, as in the template.
    columns = {name: ColumnSettings(levels=tuple(labels), order="listed") if labels else ColumnSettings(scope="dataset")
               for name, labels in recorded_levels(config).items()}
    # The simulated files hold the template's rows as the model saw them (the row rules applied), and its
    # per-dataset values come as a side table of every simulation's (`simulated_values`).
    values = (TableSource(config.layout.sbc.simulated_values, (VALUES_KEY,)),) if config.values else ()
    return dataclasses.replace(
        config, datasets=tuple(str(p) for p in data_paths(config).values()),
        results_dir=config.layout.sbc.root, on_error="continue", columns=columns, rows=RowRules(), values=values)


def template_levels(config: Config) -> tuple[Dataset, dict[str, list[str]]]:
    """The template loaded as the sweep codes it, and the labels of each of its text columns in code order.

    A column coded for the whole sweep (the default) has every label of the sweep, those the
    template lacks included; one with ``scope: dataset`` has the template's own labels.
    """

    template_id, _ = template(config)
    reader = template_reader(config)
    dataset = reader.load(template_id)
    return dataset, {name: list(dataset.coords[name]) for name in reader.coding.for_dataset(template_id)}


def template_reader(config: Config) -> DatasetReader:
    """The sweep's reader, to load the template as the sweep's fits load it."""
    from batchfit.fitting.fitter import sweep_reader

    return sweep_reader(config, wanted=[template(config)[0]])


def template_sweep_coding(config: Config) -> dict[str, Any]:
    """How the sweep codes the template's text columns (`batchfit.data.labels.Coding.for_dataset`).

    Read from the label registry without loading the template: it changes whenever the
    template's levels (`template_levels`) may, so Snakemake's simulation checkpoint watches it.
    """

    template_id, _ = template(config)
    sources = config.data_sources
    return sweep_coding(sources, discover_datasets(sources)).for_dataset(template_id)


def recorded_levels(config: Config) -> dict[str, list[str]]:
    """The levels of each text column of the template the simulations were drawn with (see `simulate`)."""
    path = config.layout.sbc.template_coding
    try:
        return json.loads(path.read_text())["columns"]
    except FileNotFoundError:
        raise BatchfitError(f"sbc: {path} does not exist; simulate first (batchfit sbc or snakemake sbc)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BatchfitError(f"sbc: cannot read {path} ({exc}); delete it and simulate again") from None


def record_levels(config: Config, template_id: str, levels: Mapping[str, list[str]]) -> None:
    """Record the template's levels for `sbc_config`, unless the record already says so."""
    path = config.layout.sbc.template_coding
    record = {"template": template_id, "columns": dict(levels)}
    try:
        if json.loads(path.read_text()) == record:
            return
    except (OSError, ValueError):
        pass  # none yet, or damaged: written now
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=1))
