"""The config's sections as typed, immutable settings: the sampler's, the outputs', the report's, the
predictions', the comparisons', a dataset source's and a column's; and the few settings the data stage takes
(`DataSettings`, `DataSources`), so that it depends on them rather than on the whole config.

`batchfit.config` builds them from a validated config file; the defaults are the schema's
(``config.schema.yaml``), so a dataclass's own defaults only serve code that builds one by hand (and a
test checks them against the schema's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchfit.layout import ResultsLayout

AUTO = "auto"  # batch_size: chosen from the sweep (`batchfit.sweep.plan.batch_size`)


@dataclass(frozen=True)
class SamplerSettings:
    """The sampler's settings for every dataset, under PyMC's names where PyMC has one, nutpie's otherwise.

    Which path honours which setting, and how each reaches nutpie or ``pm.sample``:
    `batchfit.fitting.sampler_settings`. Every one is part of each fit's provenance digest, none of
    the compiled model's cache key. The defaults are the schema's (``config.schema.yaml``).
    """

    draws: int
    tune: int
    chains: int
    target_accept: float
    seed: int
    max_treedepth: int = 10
    adaptation: str = "diag"
    mass_matrix_eigval_cutoff: float | None = None
    mass_matrix_gamma: float | None = None
    mass_matrix_switch_freq: int | None = None
    early_window_switch_freq: int | None = None
    store_divergences: bool = False
    store_unconstrained: bool = False
    store_gradient: bool = False
    store_mass_matrix: bool = False
    initvals: Mapping[str, Any] = field(default_factory=dict, hash=False)
    jitter_rvs: tuple[str, ...] | None = None
    discard_tuned_samples: bool = True
    step: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class OutputSettings:
    """What each fit file holds: optional groups, and which posterior variables are kept.

    Everything here shapes the fit file, so it is part of every fit's provenance digest.
    `var_names`/`filter_vars` select posterior variables as ArviZ does (None: every free
    parameter and deterministic), see `batchfit.model.variables.select_vars`.
    """

    log_likelihood: bool  # the schema's null (the default) is resolved by `_build`: on with variants
    posterior_predictive: bool
    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    sensitivity: bool = False  # each fit keeps its log_prior too, for power-scaling sensitivity (psense)


@dataclass(frozen=True)
class HealthSettings:
    """Thresholds a fit must meet to count as healthy, and the variables they are checked on.

    `var_names` None: the free parameters. Read by collect only, so not in the provenance digest.
    """

    max_r_hat: float
    min_ess_bulk: float
    max_divergences: int
    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    min_ess_tail: float = 400.0
    max_treedepth_fraction: float = 0.0
    min_bfmi: float = 0.3
    min_rows: int | None = None  # fewer rows make a fitted dataset a warning; None: not checked


@dataclass(frozen=True)
class SummarySettings:
    """Which kept variables summary.csv and posteriors.nc hold, and the credible interval.

    `var_names` None: all but observation-sized deterministics. `ci_prob` and `ci_kind` None:
    ArviZ's ``stats.ci_prob`` and ``stats.ci_kind``, so summary.csv's interval is the one users get
    from ArviZ. Read by collect only, so not in the provenance digest: changing them
    refits nothing.
    """

    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    ci_prob: float | None = None
    ci_kind: str | None = None

    @property
    def interval_prob(self) -> float:
        """The interval's probability: `ci_prob`, else ArviZ's ``stats.ci_prob`` (0.89 by default)."""
        from arviz_base import rcParams

        return rcParams["stats.ci_prob"] if self.ci_prob is None else self.ci_prob

    @property
    def interval_kind(self) -> str:
        """The interval's kind, ``"hdi"`` or ``"eti"``: `ci_kind`, else ArviZ's ``stats.ci_kind``."""
        from arviz_base import rcParams

        return str(rcParams["stats.ci_kind"]) if self.ci_kind is None else self.ci_kind


@dataclass(frozen=True)
class ReportSettings:
    """What the sweep report's forest plots show (the `plots` rule; `report.*` in the config).

    `var_names` None: the scalar deterministics, or the scalar free parameters, or the vector ones, or the
    vector deterministics (`batchfit.outputs.plots.default_forest_variables`). Variables are chosen among
    those posteriors.nc holds (`summary.var_names`). A variable with more than `max_rows` rows (datasets, or dataset
    x element) is drawn as a summary view, its intervals sorted by mean, without a label per row.
    Read by the plots rule only, so not in the provenance digest: changing it refits nothing.
    """

    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    max_rows: int = 50
    datasets: tuple[str, ...] = ()  # whose predicted curves are drawn, beside the first `first_datasets`
    first_datasets: int = 4


@dataclass(frozen=True)
class PredictSettings:
    """Predictions on new inputs from every fit (`batchfit.predictions`; config key `predict`, docs/predictions.md).

    The new inputs come from one of `data` (files or table groups matched to datasets by id), `grid` (the same rows for
    every dataset, by column: ``{start, stop, num}`` or a list of values) or `horizon` (steps the model
    file's ``extend(data, horizon)`` adds); none: no predictions. `var_names`/`filter_vars` select the
    predicted variables (None: every observed variable and deterministic). All but `x` (the report's x
    axis) are part of each prediction's provenance digest, none of any fit's.
    """

    data: tuple[str | TableSource, ...] | None = None
    grid: Mapping[str, Any] | None = field(default=None, hash=False)
    horizon: int | None = None
    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    seed: int = 2026
    x: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether the sweep predicts: one of `data`, `grid` or `horizon` is given."""
        return self.data is not None or self.grid is not None or self.horizon is not None

    @property
    def source(self) -> str:
        """Which form gives the new inputs: "data", "grid" or "horizon"."""
        return "data" if self.data is not None else "grid" if self.grid is not None else "horizon"


@dataclass(frozen=True)
class CacheSettings:
    """Behaviour of the compiled-model cache."""

    lock_timeout: float
    trust_shared: bool
    cpu_target: str = "host"


@dataclass(frozen=True)
class ColumnSettings:
    """One column's settings (config key `columns.<name>`): how a label column's text becomes codes, or a
    numeric column's bounds.

    `levels` lists the labels in code order (then `order` is "listed"); otherwise the labels
    come from the data in `order` ("sorted" or "appearance"). `scope` "dataset" codes the
    column separately in each dataset instead of once for the sweep. A column given only
    `min`/`max` is numeric (`label` false): a value outside them fails its dataset.
    """

    levels: tuple[str, ...] | None = None
    order: str = "sorted"
    scope: str = "sweep"
    min: float | None = None
    max: float | None = None
    label: bool = True  # listed as a label column (not only with bounds)


@dataclass(frozen=True)
class TableSource:
    """A table split by key columns (config keys `datasets` and `values`): one dataset, or one row of
    per-dataset values, per value of the keys `by`. `table`: a CSV or Parquet file, or a directory of
    Parquet files."""

    table: Path
    by: tuple[str, ...]


@dataclass(frozen=True)
class RowRules:
    """The rows a model must not see (config key `rows`): those where `where` (pandas' query syntax) does
    not hold, then those missing a value in a `drop_missing` column."""

    where: str | None = None
    drop_missing: tuple[str, ...] = ()


NO_RULES = RowRules()  # every row kept


@dataclass(frozen=True)
class DataSettings:
    """What reading a dataset takes from the config: the row rules, the columns' settings (their bounds), the
    side tables of per-dataset values and build_model's parameters (each number among them a 0-d value)."""

    rows: RowRules = RowRules()
    columns: Mapping[str, ColumnSettings] = field(default_factory=dict)
    values: tuple[TableSource, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataSources:
    """What finding a sweep's datasets and coding their text columns take from the config (its
    ``data_sources``): the sources of the config keys `datasets` and `predict.data`, the data settings (the
    row rules and columns the tables are scanned with), the results where the scans and the label registry
    are kept, the timeout of the registry's lock (`cache.lock_timeout`), and the config file messages name."""

    datasets: tuple[str | TableSource, ...]
    predict_data: tuple[str | TableSource, ...]
    settings: DataSettings
    results: ResultsLayout
    lock_timeout: float
    source: str


@dataclass(frozen=True)
class SBCSettings:
    """Simulation-based calibration (`batchfit sbc`, `snakemake sbc`), see `batchfit.sweep.sbc`.

    `template` None: the first dataset by id. `simulator` None: the model file itself
    generates the data; otherwise a model file whose ``build_model`` is the generating process.
    `envelope_prob`: probability that a correct model's ranks pass (every element together).
    Read by the SBC stages only, so not in any fit's provenance digest.
    """

    n_simulations: int = 100
    template: str | None = None
    seed: int = 2026
    thin: int = 10
    simulator: Path | None = None
    envelope_prob: float = 0.95


@dataclass(frozen=True)
class KFoldSettings:
    """K-fold cross-validation's settings (`compare.kfold`)."""

    k: int = 10
    stratify_by: str | None = None
    datasets: str = "unreliable"  # or "all": every dataset, not only those where PSIS-LOO is unreliable
    seed: int = 271


@dataclass(frozen=True)
class CompareSettings:
    """How the compare rule estimates each fit's expected log predictive density (`compare.*`):
    PSIS-LOO, refits without each observation PSIS cannot estimate (``reloo``), K-fold, or ``auto``
    (`batchfit.sweep.refit_plan`). Read by the refits and the compare rule only: in no fit's digest.
    """

    method: str = "auto"
    max_reloo: int = 5
    kfold: KFoldSettings = field(default_factory=KFoldSettings)


def plain(value: Any) -> Any:
    """A config value as a config file writes it: sections as mappings, paths as text, tuples as lists."""
    if isinstance(value, ColumnSettings):  # its levels fix the order: the file lists only them
        bounds = {name: bound for name in ("min", "max") if (bound := getattr(value, name)) is not None}
        if not value.label:
            return bounds
        return {"levels": list(value.levels)} if value.levels is not None else {"order": value.order,
                                                                               "scope": value.scope}
    if dataclasses.is_dataclass(value):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value
