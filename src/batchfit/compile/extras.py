"""Optional fit outputs, compiled once per job: pointwise log-likelihood, log prior and posterior predictive draws.

Both functions are compiled from the reference model and read its ``pm.Data`` containers, into
which each dataset's values are loaded before sampling; so one compile serves the whole batch
and no value from a previous dataset can linger.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from batchfit import numba_ops
from batchfit.model.model_file import swappable_inputs
from batchfit.model.python_mode import python_mode
from batchfit.settings import OutputSettings

log = logging.getLogger("batchfit")


class ExtraGroups:
    """Compute the ``log_likelihood``, ``log_prior`` and ``posterior_predictive`` groups the config asks for."""

    def __init__(self, template: Any, outputs: OutputSettings):
        if outputs.log_likelihood or outputs.posterior_predictive or outputs.sensitivity:
            # The same numba implementations as the compile worker's; only then: a fit job that
            # computes none of these groups spares their import (SciPy's splines, PyTensor's linear algebra).
            numba_ops.register()

        self.template = template
        self._loglik = _loglik_function(template) if outputs.log_likelihood else None
        self._predict = _predictive_function(template) if outputs.posterior_predictive else None
        self._logprior = _logprior_function(template) if outputs.sensitivity else None
        # numba loads (or compiles) the machine code at the first call: make that happen here,
        # once, where a damaged cache file is healed and retried, not in every dataset's fit.
        functions = [f for f in (self._loglik, self._predict, self._logprior) if f is not None]
        if functions:
            point = _initial_point(template)
            for fn, names in functions:
                fn(*(point[name] for name in names))

    def compute(self, model: Any, tree: Any, seed: int) -> dict[str, Any]:
        """Groups for one sampled dataset (whose values are loaded in the template)."""
        groups = {}
        posterior = tree["posterior"].ds
        if self._loglik is not None:
            fn, names = self._loglik
            groups["log_likelihood"] = _per_draw(fn, names, posterior, model, self.template.observed_RVs)
        if self._logprior is not None:
            fn, names = self._logprior
            # its terms come in the order of its inputs, the free variables of a copy of the model
            groups["log_prior"] = _per_draw(fn, names, posterior, model, [self.template[n] for n in names])
        if self._predict is not None:
            from pymc.pytensorf import reseed_rngs
            from pytensor.tensor.random.type import RandomGeneratorType

            fn, names = self._predict
            rngs = [v for v in fn.get_shared() if isinstance(v.type, RandomGeneratorType)]
            reseed_rngs(rngs, seed)
            groups["posterior_predictive"] = _per_draw(fn, names, posterior, model, self.template.observed_RVs)
        return groups


def warm_extras(template: Any, outputs: OutputSettings) -> None:
    """Compile and run the optional functions ``outputs`` asks for once, into PyTensor's numba cache.

    Called by the compile worker: fit jobs then load these functions' machine code instead of
    JIT-compiling it in-process. Not yet bit-for-bit across jobs: the job that made the entry
    gets a pointwise log-likelihood that differs from every later job's in the last bits (same
    graph, same linker, both as close to scipy's values), while the draws agree exactly.
    Only those asked for: each costs about as much compiling as the sampler's own functions.
    A model whose posterior predictive cannot be compiled only fails when a config asks for it.
    """
    numba_ops.register()  # these functions' graphs hold the ops the sampler's do

    wanted = [make for make, on in ((_loglik_function, outputs.log_likelihood),
                                    (_predictive_function, outputs.posterior_predictive),
                                    (_logprior_function, outputs.sensitivity)) if on]
    if not wanted:
        return
    point = _initial_point(template)
    for make in wanted:
        try:
            fn, names = make(template)
            fn(*(point[name] for name in names))
        except Exception as exc:  # noqa: BLE001 - reported when a fit asks for this output
            log.info("not pre-compiling %s: %s", make.__name__.strip("_"), exc)


def _initial_point(template: Any) -> dict[str, np.ndarray]:
    """The template's initial values of the free variables (evaluated by PyTensor's Python backend:
    it is needed once, so it is not worth compiling)."""
    from pymc.initial_point import make_initial_point_fn

    with python_mode():
        return make_initial_point_fn(model=template, return_transformed=False)(0)


def _loglik_function(template: Any) -> tuple[Any, list[str]]:
    """Elementwise log density of each observed variable given constrained parameter values."""
    return _log_density_function(template, observed=True)


def _logprior_function(template: Any) -> tuple[Any, list[str]]:
    """Elementwise log prior density of each free variable at its constrained value (as pm.compute_log_prior)."""
    return _log_density_function(template, observed=False)


def _log_density_function(template: Any, *, observed: bool) -> tuple[Any, list[str]]:
    """Elementwise log density of the observed (or the free) variables given constrained parameter values."""
    import pytensor
    from pymc.model.transform.conditioning import remove_value_transforms
    from pytensor.compile.sharedvalue import SharedVariable

    untransformed = remove_value_transforms(template)
    inputs = [untransformed.rvs_to_values[rv] for rv in untransformed.free_RVs]
    # one variable at a time: logp(vars=..., sum=False) need not list its terms in the order of vars
    terms = [untransformed.logp(vars=[rv], sum=False)[0]
             for rv in (untransformed.observed_RVs if observed else untransformed.free_RVs)]
    # remove_value_transforms deep-copies the pm.Data containers and dimension lengths; read the
    # template's instead, into which each dataset is loaded (else every dataset would get the
    # reference dataset's log-likelihood).
    givens = [(var, template.named_vars[name]) for name, var in untransformed.named_vars.items()
              if isinstance(var, SharedVariable) and name in template.named_vars]
    givens += [(var, template.dim_lengths[name]) for name, var in untransformed.dim_lengths.items()
               if isinstance(var, SharedVariable)]
    fn = pytensor.function(inputs, terms, givens=givens, on_unused_input="ignore")
    return fn, [rv.name for rv in untransformed.free_RVs]


def _predictive_function(template: Any) -> tuple[Any, list[str]]:
    """Draws of the observed variables given the posterior values of the free variables."""
    from pymc.sampling.forward import compile_forward_sampling_function

    fn, _ = compile_forward_sampling_function(
        outputs=list(template.observed_RVs),
        vars_in_trace=[*template.free_RVs, *template.deterministics],
        basic_rvs=template.basic_RVs,
        freeze_vars=set(swappable_inputs(template)),
        random_seed=0,
    )
    return fn, [i.variable.name for i in fn.maker.inputs if not i.implicit]


def _per_draw(fn: Any, names: list[str], posterior: Any, model: Any, observed: list[Any]) -> Any:
    """Evaluate ``fn`` at every (chain, draw) of the posterior; an xarray Dataset of the results."""
    import xarray as xr

    n_chain, n_draw = posterior.sizes["chain"], posterior.sizes["draw"]
    values = {name: posterior[name].values for name in names}
    results: list[list[np.ndarray]] = [[] for _ in observed]
    for c in range(n_chain):
        for d in range(n_draw):
            outs = fn(*(values[name][c, d] for name in names))
            for store, out in zip(results, outs, strict=True):
                store.append(np.asarray(out))
    variables = {}
    for rv, store in zip(observed, results, strict=True):
        arr = np.stack(store).reshape(n_chain, n_draw, *store[0].shape)
        dims = model.named_vars_to_dims.get(rv.name) or tuple(f"{rv.name}_dim_{i}" for i in range(arr.ndim - 2))
        variables[rv.name] = (("chain", "draw", *dims), arr)
    coords = {"chain": posterior["chain"].values, "draw": posterior["draw"].values}
    return xr.Dataset(variables, coords=coords)
