"""The ``sampler`` settings on each path: how they reach nutpie or ``pm.sample``, and which a path cannot honour.

A dataset's model is sampled by nutpie (batchfit's cached callbacks, or nutpie's own compile) or, with
discrete free variables, by ``pm.sample`` with PyMC's own step methods (`batchfit.compile.structures`).
Settings reach them as ``pm.sample`` passes its own: nutpie gets ``maxdepth`` for ``max_treedepth``,
``save_warmup`` for ``discard_tuned_samples`` and its own settings by name; its chains start at PyMC's
initial point with ``initvals`` and ``jitter_rvs`` (`batchfit.compile.sampler.StartPoint`, as
``compile_pymc_model`` takes them). ``pm.sample`` gets ``initvals``, ``discard_tuned_samples``, the
``step`` methods, and ``target_accept``/``max_treedepth`` for its NUTS step.

A setting away from its default that a path cannot honour (nutpie's adaptation on pm.sample's path,
``step`` on nutpie's) is a problem (`settings_problems`), as are names that are no free variable of the
model, start values that do not fit it, and step methods that cannot sample their variables: the
compile stage refuses the reference's structure with it, ``batchfit check`` lists it per structure,
a fit job fails the datasets of another structure with it. None of these settings changes compiled
code: the cache key never depends on them (`batchfit.compile.fingerprint`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfit.compat.pymc import step_competences
from batchfit.compile.sampler import StartPoint
from batchfit.compile.structures import CACHED, NUTPIE, PYMC
from batchfit.model.python_mode import python_mode
from batchfit.schema import config_schema
from batchfit.settings import SamplerSettings

# nutpie's own settings: `nutpie_options` passes them, pm.sample's own step methods have none of them.
# How each path samples, for messages naming the path that cannot take a setting.
PATH_WORDS = {CACHED: "on batchfit's cached path (nutpie samples it)",
              NUTPIE: "through nutpie's own compile (nutpie samples it)",
              PYMC: "by pm.sample with PyMC's own step methods (it has discrete free variables)"}
NUTPIE_SETTINGS = ("adaptation", "mass_matrix_eigval_cutoff", "mass_matrix_gamma", "mass_matrix_switch_freq",
                   "early_window_switch_freq", "store_divergences", "store_unconstrained", "store_gradient",
                   "store_mass_matrix")
# nutpie's settings passed only when set (None: nutpie's default, which depends on the adaptation).
_NUTPIE_WHEN_SET = ("mass_matrix_eigval_cutoff", "mass_matrix_gamma", "mass_matrix_switch_freq",
                    "early_window_switch_freq")
# The NUTS step's: on pm.sample's path they need a NUTS step.
NUTS_SETTINGS = ("target_accept", "max_treedepth")


@dataclass(frozen=True)
class SettingProblem:
    """A sampler setting a model's path cannot honour, or that does not fit the model: its key and why."""

    key: str
    message: str


@functools.cache
def default_settings() -> dict[str, Any]:
    """The sampler settings a config without any gets (the schema's defaults)."""
    return {name: spec["default"] for name, spec in config_schema()["properties"]["sampler"]["properties"].items()}


def changed_settings(settings: SamplerSettings) -> list[str]:
    """The names of the sampler settings away from their defaults, in the schema's order."""
    plain = _plain(settings)
    return [name for name, default in default_settings().items() if plain[name] != default]


def start_point(settings: SamplerSettings) -> StartPoint:
    """Where nutpie's chains start: ``initvals`` and ``jitter_rvs``."""
    return StartPoint(dict(settings.initvals), settings.jitter_rvs)


def nutpie_options(settings: SamplerSettings) -> dict[str, Any]:
    """Keyword arguments of ``nutpie.sample`` for the settings beyond draws, tune, chains and seed,
    as ``pm.sample(nuts_sampler="nutpie")`` passes its own (``maxdepth`` for ``max_treedepth``,
    ``save_warmup`` for ``discard_tuned_samples``)."""
    options = {"target_accept": settings.target_accept, "maxdepth": settings.max_treedepth,
               "save_warmup": not settings.discard_tuned_samples}
    for name in NUTPIE_SETTINGS:
        value = getattr(settings, name)
        if value is not None or name not in _NUTPIE_WHEN_SET:
            options[name] = value
    return options


def pymc_options(settings: SamplerSettings, model: Any) -> dict[str, Any]:
    """Keyword arguments of ``pm.sample`` (PyMC's own step methods) for the settings beyond draws, tune,
    chains and seed: ``initvals``, ``discard_tuned_samples``, the ``step`` methods (one instance per
    method, for its variables), and ``target_accept``/``max_treedepth`` for NUTS, given to a NUTS (or
    HMC) step ``step`` names, or as ``nuts={...}`` for the one pm.sample assigns itself."""
    from pymc.step_methods import HamiltonianMC

    classes = _step_classes()
    nuts = {"target_accept": settings.target_accept, "max_treedepth": settings.max_treedepth}
    steps = []
    for method, names in _by_method(settings.step).items():
        cls = classes[method]
        kwargs = nuts if cls is classes["nuts"] else \
            {"target_accept": settings.target_accept} if issubclass(cls, HamiltonianMC) else {}
        steps.append(cls(vars=[model[name] for name in names], model=model, **kwargs))
    options: dict[str, Any] = {"initvals": start_point(settings).overrides(),
                               "discard_tuned_samples": settings.discard_tuned_samples}
    if steps:
        options["step"] = steps
    if classes["nuts"] in _assigned_methods(settings, model).values():  # pm.sample refuses settings of an unused one
        options["nuts"] = nuts
    return options


def settings_problems(settings: SamplerSettings, path: str, model: Any) -> list[SettingProblem]:
    """What of ``settings`` the ``path`` of ``model`` (a structure's) cannot honour, and what does not fit
    the model: names that are no free variable, start values of another shape or outside the support,
    step methods that cannot sample their variables. Empty when every setting reaches the sampler."""
    changed = changed_settings(settings)
    problems = []
    free = {rv.name for rv in model.free_RVs}
    if path == PYMC:
        problems += [SettingProblem(f"sampler.{name}", f"{name} is nutpie's setting, which pm.sample's own step "
                                    "methods do not have") for name in NUTPIE_SETTINGS if name in changed]
        if settings.jitter_rvs:
            problems.append(SettingProblem("sampler.jitter_rvs", "pm.sample jitters no start when it combines "
                                           "step methods (only 'jitter_rvs: []' holds there)"))
        problems += _step_problems(settings, model, free)
        if not problems and not _uses_nuts(settings, model):
            problems += [SettingProblem(f"sampler.{name}", f"{name} is a setting of NUTS, which pm.sample uses "
                                        "for no variable of this model") for name in NUTS_SETTINGS if name in changed]
    else:
        if settings.step:
            problems.append(SettingProblem("sampler.step", "step chooses PyMC's step methods, for a model with "
                                           "discrete free variables; this model's are all continuous and nutpie "
                                           "samples them"))
        for name in settings.jitter_rvs or ():
            if name not in free:
                problems.append(SettingProblem("sampler.jitter_rvs", f"{name!r} is no free variable of the model "
                                               f"(free: {', '.join(sorted(free))})"))
    if not any(problem.key == "sampler.jitter_rvs" for problem in problems):  # the start needs them
        problems += _start_problems(settings, path, model, free)
    return problems


def problems_line(problems: list[SettingProblem]) -> str:
    """The problems as one line."""
    return "; ".join(f"{problem.key}: {problem.message}" for problem in problems)


def _start_problems(settings: SamplerSettings, path: str, model: Any, free: set[str]) -> list[SettingProblem]:
    """``initvals`` that name no free variable, or give a start of another shape or off the support."""
    values = {model.rvs_to_values[rv].name: rv.name for rv in model.free_RVs}
    unknown = [name for name in settings.initvals if name not in free and name not in values]
    transformed = [name for name, rv in values.items() if name != rv]
    problems = [SettingProblem(f"sampler.initvals.{name}", f"{name!r} is no free variable of the model (free: "
                               f"{', '.join(sorted(free))}" + (f"; a transformed name such as {transformed[0]!r} "
                                                               "takes an unconstrained value)" if transformed else ")"))
                for name in unknown]
    if problems or not settings.initvals:
        return problems
    shapes = {**_shapes(model, transformed=False), **_shapes(model, transformed=True)}
    for name, value in settings.initvals.items():
        if not isinstance(value, str) and np.shape(value) != shapes[name]:
            problems.append(SettingProblem(f"sampler.initvals.{name}", f"gives a start of shape {np.shape(value)}, "
                                           f"but {name} has shape {shapes[name]}"))
    if problems:
        return problems
    # On pm.sample's path nothing is jittered (`pymc_options`); nutpie jitters as jitter_rvs says.
    start = start_point(settings) if path != PYMC else StartPoint(dict(settings.initvals), ())
    try:
        point = start.point_function(model)(0)
    except Exception as exc:  # noqa: BLE001 - PyMC's own words about the value: type, strategy
        return [SettingProblem("sampler.initvals", f"PyMC cannot start the model there: {' '.join(str(exc).split())}")]
    for name, value in point.items():
        rv = values[name]
        given = [key for key in (rv, name) if key in settings.initvals]
        if given and not np.all(np.isfinite(value)):
            problems.append(SettingProblem(f"sampler.initvals.{given[0]}", f"is outside the support of {rv} (its "
                                           "start on the unconstrained space is not finite)"))
    return problems


def _shapes(model: Any, *, transformed: bool) -> dict[str, tuple[int, ...]]:
    """The shape of each free variable's start, by its name (``transformed``: by its value variable's name,
    on the unconstrained space)."""
    from pymc.initial_point import make_initial_point_fn

    with python_mode():
        point = make_initial_point_fn(model=model, jitter_rvs=set(), return_transformed=transformed)(0)
    return {name: np.shape(value) for name, value in point.items()}


def _step_problems(settings: SamplerSettings, model: Any, free: set[str]) -> list[SettingProblem]:
    """``step`` entries that name no free variable, or a method PyMC's competence rules out for it."""
    problems = []
    named = [name for name in settings.step if name in free]
    competences = step_competences(model, list(_step_classes().values())) if named else {}
    for name, method in settings.step.items():
        key = f"sampler.step.{name}"
        if name not in free:
            problems.append(SettingProblem(key, f"{name!r} is no free variable of the model (free: "
                                           f"{', '.join(sorted(free))})"))
        elif not competences[name][_step_classes()[method]]:
            problems.append(SettingProblem(key, f"PyMC's {method} cannot sample {name} (its competence for "
                                           f"the variable, of type {model[name].type}, is INCOMPATIBLE)"))
    return problems


def _uses_nuts(settings: SamplerSettings, model: Any) -> bool:
    """Whether pm.sample samples a variable of ``model`` with NUTS under ``step``: named so, or assigned
    by pm.sample itself."""
    return "nuts" in settings.step.values() or _step_classes()["nuts"] in _assigned_methods(settings, model).values()


def _assigned_methods(settings: SamplerSettings, model: Any) -> dict[str, type]:
    """The step method pm.sample assigns itself to each free variable ``step`` does not name, by name."""
    from pymc.step_methods import STEP_METHODS

    rest = [rv.name for rv in model.free_RVs if rv.name not in settings.step]
    if not rest:
        return {}
    competences = step_competences(model, STEP_METHODS)
    # the first of the methods among equals, as assign_step_methods' max() picks
    return {name: max(STEP_METHODS, key=competences[name].__getitem__) for name in rest}


@functools.cache
def _step_classes() -> dict[str, type]:
    """PyMC's step methods by the name pm.sample gives them (``step_method.name``)."""
    import pymc as pm
    from pymc.step_methods import STEP_METHODS

    return {cls.name: cls for cls in (*STEP_METHODS, pm.DEMetropolis, pm.DEMetropolisZ)}


def _by_method(step: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, method in step.items():
        grouped.setdefault(method, []).append(name)
    return grouped


def _plain(settings: SamplerSettings) -> dict[str, Any]:
    import dataclasses

    plain = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    plain["initvals"], plain["step"] = dict(settings.initvals), dict(settings.step)
    plain["jitter_rvs"] = None if settings.jitter_rvs is None else list(settings.jitter_rvs)
    return plain
