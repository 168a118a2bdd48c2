"""``batchfit check``: everything the fit stage would run into, found before any sampling.

It loads every dataset and builds its model (cheap Python), as the fit stage does, and reports

* every dataset problem (file, column, row and value) and every model-contract problem;
* every dataset whose values are baked into its model as constants (all at once, each with its
  variable and a fix): it is fitted, but by a compile of its own;
* the structure buckets: which datasets build which model structure, and for datasets that
  differ from the reference, the variables and the constants that differ (a value computed
  from the data and baked in, such as ``np.log(y.mean())`` in a prior, shows up here);
* the path each structure will take: batchfit's cached callbacks, nutpie's own compile
  (with the reason: an op numba runs in object mode or cannot cache, a shared variable that is
  not ``pm.Data``, ...), found by building and compiling each structure's graphs as the
  compile stage does, or ``pm.sample``'s own step methods (discrete free variables);
* the sampler settings a structure's path cannot honour or its model does not fit
  (`batchfit.fitting.sampler_settings.settings_problems`): its datasets would fail.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchfit.cache.store import open_cache
from batchfit.common.grouping import group_by_reason, group_line
from batchfit.compile.fingerprint import graph_fingerprint, structure_of
from batchfit.compile.graphs import SamplerGraphs, compile_sampler_functions
from batchfit.compile.structures import CACHED, NUTPIE, PYMC, pymc_path_reason
from batchfit.config import Config
from batchfit.data.dataset import Dataset, coerce_for_model
from batchfit.data.discovery import discover_datasets
from batchfit.data.reader import DatasetReader
from batchfit.errors import BatchfitError, CachedPathUnsupported, ModelCodeError, one_line, reason_of
from batchfit.fitting.fitter import reference_model, sweep_reader
from batchfit.fitting.groups import kept_variables
from batchfit.fitting.sampler_settings import SettingProblem, settings_problems
from batchfit.model.model_file import baked_values, build_model, data_containers, load_model_file, requirements
from batchfit.model.variables import variable_roles
from batchfit.numba_ops.nopython import fallbacks_in_function

_PATHS = {CACHED: "batchfit cached callbacks", NUTPIE: "nutpie's own compile (slower)",
          PYMC: "pm.sample's own step methods (much slower)"}


@dataclass
class Bucket:
    """Datasets that build one model structure, and the path that structure takes."""

    id: str
    datasets: list[str] = field(default_factory=list)
    path: str = CACHED
    reasons: list[str] = field(default_factory=list)  # why a slower path, one per finding
    differences: list[str] = field(default_factory=list)  # how it differs from the reference's
    settings: list[SettingProblem] = field(default_factory=list)  # sampler settings its path cannot honour

    def lines(self) -> list[str]:
        head = (f"structure {self.id[:12]}: {len(self.datasets)} dataset(s) ({_ids(self.datasets)}), "
                f"{_PATHS[self.path]}")
        return [head, *(f"    differs: {d}" for d in self.differences),
                *(f"    not fully compiled: {r}" for r in self.reasons),
                *(f"    sampler setting {p.key} cannot be honoured on this path, its datasets would fail: {p.message}"
                  for p in self.settings)]


@dataclass
class CheckReport:
    """What ``check_model`` found."""

    reference: str
    dataset_problems: dict[str, str] = field(default_factory=dict)  # dataset -> its error's message
    problem_reasons: dict[str, str] = field(default_factory=dict)  # dataset -> the error without the dataset
    tracebacks: dict[str, str] = field(default_factory=dict)  # reason -> the model's own traceback (model errors)
    renamed: dict[str, str] = field(default_factory=dict)  # dataset -> why its id is not its file's name
    own_compiles: dict[str, str] = field(default_factory=dict)  # datasets with values baked in: what and the fix
    buckets: dict[str, Bucket] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # sweep-wide ones (too many structures, ...)
    params: list[str] = field(default_factory=list)  # how each of build_model's parameters enters the model
    unbuilt: int = 0  # datasets whose data were checked but whose model was not built (a large sweep's)

    @property
    def ok(self) -> bool:
        """No dataset would fail and every dataset takes batchfit's fast path."""
        return (not self.dataset_problems and not self.own_compiles and not self.problems
                and all(b.path == CACHED and not b.settings for b in self.buckets.values()))

    @property
    def fallbacks(self) -> list[str]:
        """Every reason a structure takes a slower path (nutpie's own compile, or pm.sample's)."""
        return [reason for bucket in self.buckets.values() for reason in bucket.reasons]

    def add_problem(self, dataset_id: str, exc: BatchfitError, path: Any = None) -> None:
        """Record why a dataset would fail; datasets failing alike are reported together (`lines`)."""
        self.dataset_problems[dataset_id] = str(exc)
        reason = reason_of(exc, dataset_id, path)
        self.problem_reasons[dataset_id] = reason
        if isinstance(exc, ModelCodeError):
            self.tracebacks.setdefault(reason, exc.user_traceback)

    def problem_lines(self) -> list[str]:
        """One line per distinct problem (a dataset's own message when it alone has it), each model error
        followed by the model's own traceback."""
        out = []
        for reason, ids in group_by_reason(self.problem_reasons):
            out.append(self.dataset_problems[ids[0]] if len(ids) == 1 else group_line(reason, ids))
            if reason in self.tracebacks:
                out += [f"    {line}" for line in self.tracebacks[reason].rstrip("\n").splitlines()]
        return out

    def lines(self) -> list[str]:
        """Human-readable findings, one per line (a traceback's lines follow its problem, indented)."""
        out = [f"reference dataset: {self.reference}"]
        out += [f"  {line}" for line in self.problem_lines()]
        out += [f"  dataset '{d}': {why}" for d, why in self.renamed.items()]
        out += [f"  {baked}; it is fitted by nutpie's own compile for it alone (slower)"
                for baked in self.own_compiles.values()]
        for bucket in self.buckets.values():
            out += [f"  {line}" for line in bucket.lines()]
        out += [f"  {problem}" for problem in self.problems]
        out += [f"  {line}" for line in self.params]
        if self.unbuilt:
            built = sum(len(bucket.datasets) for bucket in self.buckets.values())
            out.append(f"  models built for {built} of {built + self.unbuilt + len(self.own_compiles)} dataset(s) "
                       f"with data that pass (one per distinct shape of the data and a sample of {_SAMPLE}); every "
                       "dataset's data were checked; batchfit check --all builds every model")
        slow = sum(bucket.path != CACHED for bucket in self.buckets.values())
        distinct = len(set(self.problem_reasons.values()))
        unhonoured = sum(bool(bucket.settings) for bucket in self.buckets.values())
        out.append("check: ok" if self.ok else
                   f"check: {len(self.dataset_problems)} dataset(s) with {distinct} distinct problem(s), "
                   f"{len(self.problems)} sweep problem(s), "
                   f"{slow} structure(s) on a slower path, {len(self.own_compiles)} dataset(s) with a "
                   "compile of their own" + (f", {unhonoured} structure(s) whose path cannot take a sampler setting"
                                             if unhonoured else ""))
        return out


def check_model(config: Config, *, datasets: bool = True, every_model: bool = False) -> CheckReport:
    """Load every dataset (or only the reference) and build its model, bucket the structures, find each one's path.

    Past `BUILD_ALL_UP_TO` datasets every dataset's data are checked, but models are built for one dataset
    per distinct shape and a sample (`CheckReport.unbuilt` counts the others); ``every_model`` builds all.
    """

    # Before compiling anything: refuse an untrusted cache, and compile into the config's cache.
    open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    renamed: dict[str, str] = {}
    paths = discover_datasets(config.data_sources, renamed=renamed)
    reader = sweep_reader(config, paths)
    try:
        ref = reference_model(config, reader)
    except BatchfitError:  # no dataset builds: say why for each of them
        return _unbuildable(config, reader, renamed)
    report = CheckReport(ref.dataset.id, renamed=renamed,
                         params=param_lines(config.params, ref.model) + value_lines(config, ref.dataset, ref.model))
    try:
        kept_variables(config, variable_roles(ref.model))
    except BatchfitError as exc:
        report.problems.append(str(exc))
    module = load_model_file(config.model)
    representatives: dict[str, Any] = {}
    sample = _sample(paths) if len(paths) > BUILD_ALL_UP_TO and not every_model else None
    shapes: set[Any] = set()
    for dataset_id, path in (paths.items() if datasets else [(ref.dataset.id, ref.dataset.path)]):
        try:
            dataset = reader.load(dataset_id)
            dataset = dataclasses.replace(dataset, arrays={**dataset.arrays,
                                                           **coerce_for_model(dataset, ref.requirements)})
            if sample is not None and not _first_of_its_shape(dataset, shapes) and dataset_id not in sample:
                report.unbuilt += 1
                continue
            model = build_model(module, dataset, config.params)
        except BatchfitError as exc:
            report.add_problem(dataset_id, exc, path)
            continue
        baked = baked_values(model, dataset)
        if baked:
            report.own_compiles[dataset_id] = baked
            continue
        structure = structure_of(model)
        if structure not in report.buckets:
            report.buckets[structure] = Bucket(structure)
            representatives[structure] = model
        report.buckets[structure].datasets.append(dataset_id)
    reference_structure = structure_of(ref.model)
    for structure, bucket in report.buckets.items():
        if structure != reference_structure:
            bucket.differences = structure_differences(ref.model, representatives[structure])
        needs_pymc = pymc_path_reason(representatives[structure])
        if needs_pymc:
            bucket.path, bucket.reasons = PYMC, [needs_pymc]
        else:
            bucket.reasons = fast_path_problems(representatives[structure])
            bucket.path = NUTPIE if bucket.reasons else CACHED
        bucket.settings = settings_problems(config.sampler, bucket.path, representatives[structure])
    if len(report.buckets) > config.max_structures:
        report.problems.append(
            f"the datasets build {len(report.buckets)} model structures, more than max_structures: "
            f"{config.max_structures}; the fit stage fails the datasets past it. A structure changes with "
            "the data when build_model takes a size from the data as a Python int or bakes a value computed "
            "from the data into the model (see 'differs' above): use dims= and pm.Data instead.")
    return report


# Up to this many datasets, check builds every dataset's model; beyond, it builds one per distinct shape of the
# data and a sample of `_SAMPLE` (building a model takes milliseconds: 100,000 of them would take minutes).
BUILD_ALL_UP_TO = 2000
_SAMPLE = 200


def _sample(paths: Mapping[str, Any]) -> set[str]:
    """`_SAMPLE` datasets chosen by a digest of their ids: the same every time, spread over the sweep."""
    return set(sorted(paths, key=lambda d: hashlib.sha256(d.encode()).digest())[:_SAMPLE])


def _first_of_its_shape(dataset: Dataset, seen: set[Any]) -> bool:
    """Whether no dataset seen before had the same shapes of arrays and labels (recording this one's)."""
    shape = (tuple(sorted((name, array.shape) for name, array in dataset.arrays.items())),
             tuple(sorted((name, len(labels)) for name, labels in dataset.coords.items())))
    if shape in seen:
        return False
    seen.add(shape)
    return True


def param_lines(params: Mapping[str, Any], model: Any) -> list[str]:
    """How each of build_model's parameters enters the reference model: a pm.Data of its name (its values
    share one compile) or, otherwise, a constant of the graph (a structure, and a compile, per value)."""
    containers = data_containers(model)
    return [f"param {name} = {value!r}: " + (
        f"enters as pm.Data '{name}', so every value shares one compile" if name in containers else
        "no pm.Data: a value that changes the model's graph is a structure of its own, compiled once"
        + (f" (a number enters as pm.Data('{name}', data['{name}']) to share one compile; docs/variants.md)"
           if isinstance(value, int | float) and not isinstance(value, bool) else ""))
        for name, value in params.items()]


def value_lines(config: Config, dataset: Dataset, model: Any) -> list[str]:
    """How each per-dataset value enters the reference model: a side table's values (config key values) and the
    columns its pm.Data hold as one value per dataset (``data.scalar``)."""
    containers = data_containers(model)
    params = set(config.params)
    lines = []
    for name, array in dataset.arrays.items():
        if name in params:
            continue
        held = containers.get(name)
        if array.ndim == 0:
            where = "a side-table value"
        elif held is not None and np.ndim(held.get_value()) == 0:
            where = "a column of one value per dataset (data.scalar)"
        else:
            continue
        lines.append(f"value {name} ({where}): " + (
            f"enters as pm.Data '{name}', so every value shares one compile" if held is not None else
            f"no pm.Data of its name: used as a Python number it is a constant of the graph, a structure (and a "
            f"compile) per value; enter it as pm.Data('{name}', data.scalar('{name}'))"))
    return lines


def _unbuildable(config: Config, reader: DatasetReader, renamed: dict[str, str]) -> CheckReport:
    """The report when no dataset can be built into a model: each dataset's own reason."""

    report = CheckReport("(none: no dataset builds a model)", renamed=renamed)
    module = load_model_file(config.model)
    for dataset_id, path in reader.index.items():
        try:
            build_model(module, reader.load(dataset_id), config.params)
        except BatchfitError as exc:
            report.add_problem(dataset_id, exc, path)
    return report


def fast_path_problems(model: Any) -> list[str]:
    """Why batchfit's cached callbacks cannot take ``model`` (empty if they can).

    Builds and compiles the structure's graphs in this process, as the compile stage does: an
    op left in numba's object mode or one that cannot be disk-cached, or a graph batchfit
    cannot turn into callbacks (a shared variable that is not ``pm.Data``).
    """

    try:
        graphs = SamplerGraphs.of(model)
        _, functions = compile_sampler_functions(model, graphs)
    except CachedPathUnsupported as exc:
        return [one_line(exc)]
    names = list(model.named_vars)
    found = [str(f) for fn in functions.values() for f in fallbacks_in_function(fn, variable_names=names)]
    return list(dict.fromkeys(found))


def structure_differences(reference: Any, model: Any) -> list[str]:
    """How ``model``'s structure differs from the reference's: variables, data types, constants."""

    out = []
    ref_reqs, reqs = requirements(reference), requirements(model)
    for name in sorted(set(ref_reqs) | set(reqs)):
        if ref_reqs.get(name) != reqs.get(name):
            out.append(f"pm.Data '{name}': {_req(reqs.get(name))} here, {_req(ref_reqs.get(name))} in the reference")
    ref_vars, variables = _named_outputs(reference), _named_outputs(model)
    for name in sorted(set(ref_vars) ^ set(variables)):
        out.append(f"variable '{name}' exists only {'here' if name in variables else 'in the reference'}")
    for name in sorted(set(ref_vars) & set(variables)):
        if graph_fingerprint([ref_vars[name]]) != graph_fingerprint([variables[name]]):
            constants = _differing_constants(ref_vars[name], variables[name])
            out.append(f"variable '{name}': " + (", ".join(constants) if constants else "its graph differs"))
    return out or ["the dispatched log density (e.g. a pm.CustomDist logp closing over a value from the data)"]


def _named_outputs(model: Any) -> dict[str, Any]:
    outputs = {v.name: v for v in [*model.free_RVs, *model.observed_RVs, *model.deterministics, *model.potentials]}
    outputs.update({f"{rv.name} (observed value)": model.rvs_to_values[rv] for rv in model.observed_RVs})
    return outputs


def _differing_constants(a: Any, b: Any) -> list[str]:
    """Constants at the same place in two graphs of one shape that hold different values."""
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import graph_inputs

    consts_a = [v for v in graph_inputs([a]) if isinstance(v, Constant)]
    consts_b = [v for v in graph_inputs([b]) if isinstance(v, Constant)]
    if len(consts_a) != len(consts_b):
        return []
    found = []
    for x, y in zip(consts_a, consts_b, strict=True):
        vx, vy = np.asarray(x.data), np.asarray(y.data)
        if vx.shape != vy.shape or _unequal(vx, vy).any():
            found.append(f"a constant is {_contrast(vy, vx)} "
                         "(a value computed from the data: pass it through pm.Data, e.g. pm.Data(name, "
                         "data.scalar(name)) for a value per dataset, or a size: use dims=)")
    return found


# Arrays up to this many entries are shown whole in a structure difference.
_SHOWN_ENTRIES = 8


def _contrast(here: np.ndarray, reference: np.ndarray) -> str:
    """``"<here> here but <reference> in the reference"`` for two constants that differ, naming what
    differs: the shapes when they differ, else the values (whole for a short array, else the first
    differing entry), so that two arrays of one shape never read alike."""
    if here.shape != reference.shape:
        return f"{_short(here)} here but {_short(reference)} in the reference"
    if here.size <= _SHOWN_ENTRIES:
        return f"{_values(here)} here but {_values(reference)} in the reference"
    differing = np.argwhere(_unequal(here, reference))
    index = tuple(int(i) for i in differing[0])
    return (f"an array of shape {here.shape} holding {here[index].item()!r} at {list(index)} here but "
            f"{reference[index].item()!r} in the reference ({len(differing)} of its {here.size} entries differ)")


def _short(value: np.ndarray) -> str:
    return repr(value.item()) if value.ndim == 0 else f"an array of shape {value.shape}"


def _values(value: np.ndarray) -> str:
    return repr(value.item()) if value.ndim == 0 else np.array2string(value, separator=", ")


def _unequal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Entries that differ (two NaNs are alike)."""
    differ = a != b
    if np.issubdtype(a.dtype, np.inexact) and np.issubdtype(b.dtype, np.inexact):
        differ &= ~(np.isnan(a) & np.isnan(b))
    return differ


def _req(req: Any) -> str:
    return "absent" if req is None else f"rank {req.ndim}, {req.dtype}"


def _ids(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (f", ... ({len(ids) - 5} more)" if len(ids) > 5 else "")
