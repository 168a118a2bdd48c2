"""Where everything of a sweep lives under its ``results_dir``: the one place its paths are spelled.

The library, the command line and the Snakemake rules all ask a `ResultsLayout` (a Config's
``layout``) for a path; nothing else joins names onto ``results_dir``. An SBC run is a sweep of
its own under ``results_dir/sbc`` (`ResultsLayout.sbc`), which adds the files only SBC writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SUMMARY_CSV = "summary.csv"
POSTERIORS_NC = "posteriors.nc"
FAILURES_CSV = "failures.csv"
DATASETS_CSV = "datasets.csv"
COMPARISON_CSV = "comparison.csv"
SENSITIVITY_CSV = "sensitivity.csv"
PREDICTIONS_CSV = "predictions.csv"
PREDICTION_FAILURES_CSV = "prediction_failures.csv"
# What a results_dir holds at its top level: a sweep of variants puts each variant's beside them
# (`variant`), so no variant may take one of these names.
RESERVED_NAMES = frozenset({"fits", "failures", "batches", "logs", "benchmarks", "plan.json", "coding.json",
                            "data_sha256.json", "tables", "register", "summaries", "orphaned", "plots", "report", "sbc",
                            "status.txt", "refits", "predictions", "predict_plan.json", "predict_status.txt",
                            PREDICTIONS_CSV, PREDICTION_FAILURES_CSV, SUMMARY_CSV, POSTERIORS_NC, FAILURES_CSV,
                            DATASETS_CSV, COMPARISON_CSV, SENSITIVITY_CSV})


@dataclass(frozen=True)
class ResultsLayout:
    """The paths of one sweep's outputs, under ``root`` (its ``results_dir``)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # --- one dataset's files
    @property
    def fits(self) -> Path:
        return self.root / "fits"

    def fit(self, dataset_id: str) -> Path:
        """A dataset's posterior (NetCDF, an ArviZ DataTree)."""
        return self.fits / f"{dataset_id}.nc"

    def sidecar(self, dataset_id: str) -> Path:
        """The small JSON beside a fit that records its provenance digest (read by the plan)."""
        return self.fits / f"{dataset_id}.json"

    @property
    def fit_register(self) -> Path:
        """Every dataset's fit digest or failure, in one file (`batchfit.fitting.fit_register`)."""
        return self.root / "register" / "fits.json"

    @property
    def touched(self) -> Path:
        """The lists of datasets whose files a process is about to change (`batchfit.fitting.fit_register`)."""
        return self.root / "register" / "touched"

    @property
    def failures(self) -> Path:
        return self.root / "failures"

    def failure(self, dataset_id: str) -> Path:
        """A failed dataset's record: stage, error and message (collected into failures.csv)."""
        return self.failures / f"{dataset_id}.json"

    # --- one batch's (a fit job's) files
    @property
    def batches(self) -> Path:
        return self.root / "batches"

    def batch_manifest(self, batch_id: str) -> Path:
        """A fit job's declared output: each dataset's outcome."""
        return self.batches / f"{batch_id}.json"

    def staged_inputs(self, batch_id: str) -> Path:
        """Without a shared filesystem: the directory of what a fit job reads (`batchfit.fitting.job_inputs`)."""
        return self.batches / "staged" / batch_id

    def batch_outputs(self, batch_id: str) -> Path:
        """Without a shared filesystem: a fit job's one output, a results directory of its own that
        collect adopts into this one (`batchfit.outputs.adopt`)."""
        return self.batches / "outputs" / batch_id

    @property
    def fit_logs(self) -> Path:
        return self.logs / "fit"

    def fit_log(self, batch_id: str) -> Path:
        """A fit job's log: its header lists the batch's datasets."""
        return self.fit_logs / f"{batch_id}.log"

    # --- the sweep's
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, rule: str) -> Path:
        """The log file of a rule run once per sweep (compile, collect, plots, ...)."""
        return self.logs / f"{rule}.log"

    def benchmark(self, rule: str) -> Path:
        """Snakemake's ``benchmark:`` file of a rule (``fit/{batch}`` for a fit job)."""
        return self.root / "benchmarks" / f"{rule}.tsv"

    @property
    def plan(self) -> Path:
        """The plan the sweep's main process records for its jobs (`batchfit.sweep.plan`)."""
        return self.root / "plan.json"

    @property
    def coding_registry(self) -> Path:
        """The append-only codes of text columns (`batchfit.data.coding`)."""
        return self.root / "coding.json"

    @property
    def table_scans(self) -> Path:
        """The scans of the sweep's tables: their groups, digests and column kinds (`batchfit.data.tables`)."""
        return self.root / "tables"

    @property
    def data_digests(self) -> Path:
        """The cache of data files' sha256 (`batchfit.fitting.provenance`)."""
        return self.root / "data_sha256.json"

    @property
    def posteriors(self) -> Path:
        return self.root / POSTERIORS_NC

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_CSV

    @property
    def failures_csv(self) -> Path:
        return self.root / FAILURES_CSV

    @property
    def summaries(self) -> Path:
        """collect's cache of each fit's summary rows (`batchfit.outputs.summary_cache`)."""
        return self.root / "summaries"

    @property
    def status_verdict(self) -> Path:
        """The status rule's output: the run's verdict, which the workflow's ``onsuccess`` prints last
        (`batchfit.sweep.verdict.end_of_run`)."""
        return self.root / "status.txt"

    @property
    def datasets_csv(self) -> Path:
        """One row per dataset: its file, size, status, structure, seed and diagnostics (`batchfit.outputs.health`)."""
        return self.root / DATASETS_CSV

    @property
    def orphaned(self) -> Path:
        """Where the outputs of datasets that left the sweep are moved (`batchfit.outputs.orphans`)."""
        return self.root / "orphaned"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def health_plot(self) -> Path:
        return self.plots / "health.png"

    @property
    def forest_plots(self) -> Path:
        return self.plots / "forest"

    @property
    def sbc_plots_in_report(self) -> Path:
        """An SBC run's plots copied beside the others, for Snakemake's report."""
        return self.plots / "sbc"

    @property
    def report_pages(self) -> Path:
        """The HTML pages of Snakemake's report (`batchfit.outputs.report`)."""
        return self.root / "report"

    # --- predictions on new inputs (`batchfit.predictions`): per dataset, per predict job, and the sweep's
    @property
    def predictions(self) -> Path:
        return self.root / "predictions"

    def prediction(self, dataset_id: str) -> Path:
        """A dataset's predictions (NetCDF, ArviZ groups ``predictions`` and ``predictions_constant_data``)."""
        return self.predictions / f"{dataset_id}.nc"

    def prediction_sidecar(self, dataset_id: str) -> Path:
        """The small JSON beside a prediction that records its provenance digest (read by the plan)."""
        return self.predictions / f"{dataset_id}.json"

    def prediction_rows(self, dataset_id: str) -> Path:
        """A dataset's rows of predictions.csv, written with its predictions."""
        return self.predictions / f"{dataset_id}.csv"

    def prediction_failure(self, dataset_id: str) -> Path:
        """A dataset whose prediction failed: its record (collected into prediction_failures.csv)."""
        return self.predictions / "failed" / f"{dataset_id}.json"

    @property
    def predict_plan(self) -> Path:
        """The predict batches the sweep's main process records for its jobs (`batchfit.sweep.predict_plan`)."""
        return self.root / "predict_plan.json"

    @property
    def predict_manifests(self) -> Path:
        return self.predictions / "batches"

    def predict_manifest(self, batch_id: str) -> Path:
        """A predict job's declared output: each dataset's outcome."""
        return self.predict_manifests / f"{batch_id}.json"

    def predict_log(self, batch_id: str) -> Path:
        return self.logs / "predict" / f"{batch_id}.log"

    def staged_predict_inputs(self, batch_id: str) -> Path:
        """Without a shared filesystem: what a predict job reads (`batchfit.predictions.staging`)."""
        return self.predictions / "staged" / batch_id

    def predict_outputs(self, batch_id: str) -> Path:
        """Without a shared filesystem: a predict job's own results directory, which collect_predictions adopts."""
        return self.predictions / "outputs" / batch_id

    @property
    def predictions_csv(self) -> Path:
        """A row per dataset, predicted variable and new row: the inputs, mean, sd and interval."""
        return self.root / PREDICTIONS_CSV

    @property
    def prediction_failures_csv(self) -> Path:
        return self.root / PREDICTION_FAILURES_CSV

    @property
    def prediction_verdict(self) -> Path:
        """collect_predictions' verdict: the failed predictions, which the workflow's ``onsuccess`` prints last."""
        return self.root / "predict_status.txt"

    @property
    def prediction_plots(self) -> Path:
        """The report's predicted curves, a PNG per dataset drawn."""
        return self.plots / "predictions"

    # --- a sweep of variants: each variant a sweep of its own under its id, compared at the top
    def variant(self, variant_id: str) -> ResultsLayout:
        """A variant's layout (its ``results_dir``; `batchfit.variants`)."""
        return ResultsLayout(self.root / variant_id)

    @property
    def comparison(self) -> Path:
        """The compare rule's table: PSIS-LOO of every variant per dataset (`batchfit.outputs.compare`)."""
        return self.root / COMPARISON_CSV

    # --- the exact comparisons: refits without some rows (`batchfit.fitting.refits`)
    @property
    def refits(self) -> Path:
        """A sweep's refit plan; a variant's refits: their results and batch manifests."""
        return self.root / "refits"

    @property
    def refit_plan(self) -> Path:
        """The refits the compare rule needs, in batches (`batchfit.sweep.refit_plan`)."""
        return self.refits / "plan.json"

    def refit_manifest(self, batch_id: str) -> Path:
        """A refit job's declared output (in its variant's layout): each refit's outcome."""
        return self.refits / "batches" / f"{batch_id}.json"

    def refit_log(self, batch_id: str) -> Path:
        return self.logs / "refit" / f"{batch_id}.log"

    def refit(self, dataset_id: str, refit_id: str) -> Path:
        """One refit's result: the held-out rows' pointwise log-likelihood under its draws."""
        return self.refits / "fits" / dataset_id / f"{refit_id}.nc"

    @property
    def sensitivity(self) -> Path:
        """Prior sensitivity of every fit, summarised across datasets (`batchfit.outputs.sensitivity`)."""
        return self.root / SENSITIVITY_CSV

    # --- an SBC run: a sweep of its own under sbc/, with what only SBC writes
    @property
    def sbc(self) -> ResultsLayout:
        """The simulated sweep's layout (its ``results_dir``)."""
        return ResultsLayout(self.root / "sbc")

    @property
    def simulations(self) -> Path:
        """The SBC checkpoint's output, listing the simulations drawn."""
        return self.root / "simulations.json"

    @property
    def simulated_data(self) -> Path:
        return self.root / "data"

    def truth(self, simulation_id: str) -> Path:
        """A simulation's true parameter values."""
        return self.root / "truth" / f"{simulation_id}.json"

    @property
    def simulated_values(self) -> Path:
        """The template's per-dataset values (a side table's) for every simulation: a side table of the simulated
        sweep (`batchfit.sweep.sbc.sweep.sbc_config`)."""
        return self.root / "values.csv"

    @property
    def template_coding(self) -> Path:
        """The template's coding the simulator used, which every simulated fit codes with."""
        return self.root / "template_coding.json"

    @property
    def ranks_csv(self) -> Path:
        return self.root / "ranks.csv"

    @property
    def ranks_nc(self) -> Path:
        return self.root / "ranks.nc"

    @property
    def uniformity(self) -> Path:
        return self.root / "uniformity.csv"

    @property
    def verdict(self) -> Path:
        return self.root / "verdict.txt"

    @property
    def failed_simulations(self) -> Path:
        return self.root / "failed_simulations.csv"
