"""The forward (posterior predictive) function of a structure, compiled once into the shared cache.

``pm.sample_posterior_predictive`` compiles PyMC's forward function (``compile_forward_sampling_function``)
for each call and calls it once per draw from Python. batchfit compiles the same function once per
structure and plan (`batchfit.predictions.forward_plan`), and a generated numba loop calls the graph's own
numba function for every draw: the loop takes the draws of each input variable stacked (chain-major,
as PyMC walks them), the data containers and dimension lengths, and the random generators, and
returns each computed output stacked the same way. Nothing dataset-specific is compiled in (lengths
are read at run time), so one entry serves every dataset of the structure, a longer grid included.

The loop is cached by numba under the entry's key, like the sampler's callbacks
(`batchfit.compile.callbacks`), and loaded without compiling: its machine code holds the graph's.
Each random generator is reseeded per dataset as PyMC's ``compile(..., random_seed=seed)`` reseeds
them (``pymc.pytensorf.reseed_rngs``, in the order PyMC collects their updates) and passed on from
draw to draw as PyTensor's function passes its updated generator: the draws are the ones
``pm.sample_posterior_predictive(..., random_seed=seed)`` gives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfit import numba_ops
from batchfit.cache.heal import retry_after_healing
from batchfit.cache.store import CacheDir, CorruptEntry, Fetched, get_or_build
from batchfit.compat.numba import register_cache_locator
from batchfit.compat.pytensor import graph_function
from batchfit.compile.callbacks import Slot, missing_inner
from batchfit.compile.graphs import slot_of
from batchfit.errors import CachedPathUnsupported
from batchfit.numba_ops.nopython import record_generic_fallbacks
from batchfit.predictions.forward_plan import ForwardPlan

_NAME = "batchfit_forward"  # the loop's name: numba's cache files are named after it and the key


@dataclass(frozen=True)
class Output:
    """One computed output of the forward function: its name, rank (without the draws) and dtype."""

    name: str
    ndim: int
    dtype: str


@dataclass(frozen=True)
class ForwardSpec:
    """The compiled forward function's arguments and results, in the graph function's order.

    ``inputs``: each a `Slot` of kind ``param`` (a trace variable, one value per draw), ``data``, ``dim``
    or ``rng``. ``seeded``: the positions of the random generators among ``inputs``, in the order PyMC
    reseeds them. ``updates``: (result index, input position) of each generator the function returns
    updated, which the next draw takes.
    """

    inputs: tuple[Slot, ...]
    outputs: tuple[Output, ...]
    seeded: tuple[int, ...]
    updates: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [dataclasses.asdict(s) for s in self.inputs],
                "outputs": [dataclasses.asdict(o) for o in self.outputs],
                "seeded": list(self.seeded), "updates": [list(u) for u in self.updates]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ForwardSpec:
        return cls(tuple(Slot(**s) for s in data["inputs"]), tuple(Output(**o) for o in data["outputs"]),
                   tuple(data["seeded"]), tuple(tuple(u) for u in data["updates"]))


def forward_source(spec: ForwardSpec) -> str:
    """Python source of the loop over draws (see module docstring); ``n`` is the number of draws.

    A scalar trace variable's draw is passed as a 0-d array (a one-element view reshaped), as
    PyTensor's function receives it; a scalar output is stored by value.
    """
    args = [f"a{k}" for k in range(len(spec.inputs))]
    reads = [(f"a{k}[i:i + 1].reshape(())" if slot.ndim == 0 else f"a{k}[i]") if slot.kind == "param" else f"a{k}"
             for k, slot in enumerate(spec.inputs)]
    call = f"r = inner({', '.join(reads)})"
    stores = [f"o{j}[i] = r[{j}][()]" if out.ndim == 0 else f"o{j}[i] = r[{j}]" for j, out in enumerate(spec.outputs)]
    passes = [f"a{k} = r[{j}]" for j, k in spec.updates]
    lines = [f"def {_NAME}(n, {', '.join(args)}):", "    i = 0", f"    {call}"]
    lines += [f"    o{j} = np.empty((n,) + r[{j}].shape, r[{j}].dtype)" for j in range(len(spec.outputs))]
    lines += [f"    {line}" for line in [*stores, *passes]]
    lines += ["    for i in range(1, n):", f"        {call}", *(f"        {line}" for line in [*stores, *passes])]
    lines.append(f"    return ({''.join(f'o{j}, ' for j in range(len(spec.outputs)))})")
    return "\n".join(lines) + "\n"


def argument_types(spec: ForwardSpec) -> tuple[Any, ...]:
    """The loop's numba argument types: the number of draws, then each input (C-contiguous, writeable)."""
    import numba
    from numba.core import types

    rng = numba.typeof(np.random.default_rng(0))

    def of(slot: Slot) -> Any:
        if slot.kind == "rng":
            return rng
        return types.Array(numba.from_dtype(np.dtype(slot.dtype)), slot.ndim + (slot.kind == "param"), "C")

    return (types.int64, *map(of, spec.inputs))


def make_loop(spec: ForwardSpec, key: str, cache: CacheDir, inner: Callable) -> Any:
    """The numba loop for ``spec``, compiled around ``inner`` (the graph's function), or with `missing_inner`
    loaded from numba's cache (which fails instead of compiling when the cache lacks it)."""
    import numba

    env: dict[str, Any] = {"__name__": __name__, "np": np, "inner": inner}
    exec(compile(forward_source(spec), _NAME, "exec"), env)
    py_func = env[_NAME]
    register_cache_locator(py_func, key, cache.numba_dir)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Cannot cache compiled function.*")
        return numba.njit(argument_types(spec), cache=True)(py_func)


def forward_key(plan: ForwardPlan) -> str:
    """The content address of a plan's compiled forward function."""
    return hashlib.sha256(json.dumps(plan.key_parts(), sort_keys=True).encode()).hexdigest()[:40]


@dataclass(frozen=True)
class ForwardFunction:
    """A loaded forward function: draw the outputs for one dataset's draws, data and seed."""

    key: str
    spec: ForwardSpec
    loop: Any

    def draw(self, model: Any, draws: Mapping[str, np.ndarray], n_draws: int, seed: int) -> dict[str, np.ndarray]:
        """Each computed output, shaped (draw, ...), for the trace variables' ``draws`` (each shaped
        (draw, ...), chain-major), ``model``'s data and dimension lengths, and generators seeded by ``seed``."""
        generators = iter(seeded_generators(seed, len(self.spec.seeded)))
        rngs = {position: next(generators) for position in self.spec.seeded}
        values = []
        for k, slot in enumerate(self.spec.inputs):
            if slot.kind == "rng":
                values.append(rngs[k])
                continue
            if slot.kind == "param":
                value = draws[slot.name]
            else:
                shared = model.dim_lengths[slot.name] if slot.kind == "dim" else model[slot.name]
                value = shared.get_value(borrow=True)
            values.append(np.require(value, dtype=slot.dtype, requirements=["C", "W"]))
        results = self.loop(n_draws, *values)
        return {out.name: value for out, value in zip(self.spec.outputs, results, strict=True)}


def seeded_generators(seed: int, count: int) -> list[np.random.Generator]:
    """``count`` generators as ``pymc.pytensorf.reseed_rngs(rngs, seed)`` seeds PyMC's compiled function's."""
    import pytensor
    from pymc.pytensorf import reseed_rngs

    shared = [pytensor.shared(np.random.default_rng()) for _ in range(count)]
    reseed_rngs(shared, seed)
    return [var.get_value(borrow=True) for var in shared]


def forward_function(plan: ForwardPlan, cache: CacheDir, *, lock_timeout: float) -> Fetched[ForwardFunction]:
    """The compiled forward function of ``plan``: loaded from the cache, or compiled into it first.

    `CachedPathUnsupported` when the function cannot be cached (an operation numba runs in object
    mode, a shared variable that is no ``pm.Data``): the caller predicts through PyMC's own route.
    """
    key = forward_key(plan)

    def load(entry: dict[str, Any]) -> ForwardFunction:
        spec = ForwardSpec.from_json(entry["spec"])
        try:
            return ForwardFunction(key, spec, make_loop(spec, key, cache, missing_inner))
        except Exception as exc:  # absent from numba's index (it then tries to compile), or a damaged file
            raise CorruptEntry(f"numba could not load it ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                               ) from exc

    def build() -> dict[str, Any]:
        return retry_after_healing(cache, f"compiling forward function {key[:12]}",
                                   lambda: {"spec": build_forward(plan, cache, key).to_json()})

    return get_or_build(cache, key, load=load, build=build, lock_timeout=lock_timeout)


def build_forward(plan: ForwardPlan, cache: CacheDir, key: str) -> ForwardSpec:
    """Compile the plan's forward function with PyMC's ``compile_forward_sampling_function`` (the
    arguments ``sample_posterior_predictive`` passes it) and its loop into the cache; return its spec."""
    from pymc.pytensorf import collect_default_updates
    from pymc.sampling.forward import compile_forward_sampling_function
    from pytensor.tensor.random.type import RandomType

    numba_ops.register()  # the numba implementations the sampler's entries use too

    model = plan.model
    with record_generic_fallbacks() as fallbacks:
        fn, _ = compile_forward_sampling_function(
            outputs=plan.evaluated, vars_in_trace=plan.vars_in_trace, basic_rvs=model.basic_RVs,
            constant_data=plan.constant_data, volatile_vars=set(), freeze_vars=plan.frozen, model=model,
            mode="NUMBA", allow_input_downcast=True, accept_inplace=True)
    if fallbacks:
        ops = ", ".join(sorted({type(op).__name__ for op, _ in fallbacks}))
        raise CachedPathUnsupported(f"the forward function uses an operation with no numba implementation ({ops})")
    graph = fn.maker.fgraph
    explicit = [i.variable for i in fn.maker.inputs if not i.implicit]
    order = list(collect_default_updates(inputs=explicit, outputs=plan.evaluated))  # as PyMC reseeds them
    inputs = []
    for k, var in enumerate(i.variable for i in fn.maker.inputs):  # the model's own, in the graph's order
        if isinstance(var.type, RandomType):
            inputs.append(Slot("rng", f"rng{k}", 0, "object"))
        elif k < len(explicit):
            inputs.append(Slot("param", var.name, var.type.ndim, var.type.dtype))
        else:
            inputs.append(slot_of(var, model))  # raises CachedPathUnsupported for other shared variables
    rng_positions = [k for k, s in enumerate(inputs) if s.kind == "rng"]
    shared = {fn.maker.inputs[k].variable: k for k in rng_positions}
    if sorted(shared.get(v, -1) for v in order) != rng_positions:
        raise CachedPathUnsupported("the forward function's random generators are not the ones PyMC reseeds")
    n_out = len(plan.evaluated)
    updates = tuple(sorted((int(out), int(inp)) for out, inp in graph.update_mapping.items()))
    spec = ForwardSpec(tuple(inputs), tuple(Output(v.name, v.type.ndim, v.type.dtype) for v in graph.outputs[:n_out]),
                       tuple(shared[v] for v in order), updates)
    make_loop(spec, key, cache, graph_function(fn.vm.jit_fn))
    if not list(cache.numba_dir.glob(f"{_NAME}*-{key}.*.nbc")):
        raise CachedPathUnsupported("numba could not cache the forward function's loop")
    return spec

