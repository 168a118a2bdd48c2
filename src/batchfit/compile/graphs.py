"""The graphs batchfit compiles for a model, their content address, and their compilation.

The free parameters are the compiled functions' inputs, each an array of its own rank whose
lengths are read at run time, so one compile serves every dataset of a structure whatever its
lengths; the callbacks cut them out of nutpie's flat vector (see :mod:`batchfit.compile.callbacks`).
Data enter as shared variables, each a slot of the callbacks' user-data record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchfit import numba_ops
from batchfit.compile.callbacks import Slot, WrapperSpec, wrapper_source
from batchfit.compile.fingerprint import environment_fingerprint, graph_fingerprint, structure_of
from batchfit.errors import CachedPathUnsupported, ModelContractError


def slot_of(var: Any, model: Any) -> Slot:
    """Classify a shared input of the compiled functions as data or a dimension length."""
    for name, length in model.dim_lengths.items():
        if length is var:
            return Slot("dim", name, var.type.ndim, var.type.dtype)
    if var.name in model.named_vars and model.named_vars[var.name] is var:
        return Slot("data", var.name, var.type.ndim, var.type.dtype)
    raise CachedPathUnsupported(
        f"the model reads the shared variable '{var.name}', which is neither a pm.Data container "
        "nor a dimension length: batchfit cannot swap it between datasets. Wrap the array in "
        f"pm.Data('{var.name}', data['{var.name}'])."
    )


def slot_variable(slot: Slot, model: Any) -> Any:
    """The model's shared variable for a slot."""
    try:
        return model.dim_lengths[slot.name] if slot.kind == "dim" else model.named_vars[slot.name]
    except KeyError:
        raise ModelContractError(
            f"the model has no {'dimension' if slot.kind == 'dim' else 'pm.Data container'} "
            f"'{slot.name}' although models of this structure do"
        ) from None


@dataclass(frozen=True, eq=False)
class SamplerGraphs:
    """The graphs batchfit compiles for a model, and the callback spec they imply.

    Built before compiling, so that the cache key covers exactly what is compiled: the log
    density, the expansion and the generated callback source. The gradient is derived from the
    log density by PyTensor (whose version is in the key), so it is built only for compiling.
    """

    inputs: tuple[Any, ...]  # the free parameters' value variables, in nutpie's order
    logp: Any
    expanded: Any
    spec: WrapperSpec

    @classmethod
    def of(cls, model: Any) -> SamplerGraphs:
        """Graphs of nutpie's two callbacks, with the value variables as inputs.

        The generated callbacks cut each parameter out of nutpie's flat vector as an array of
        the value variable's rank, with the lengths the record gives (see
        :mod:`batchfit.compile.callbacks`): a dataset with more groups needs no new compile. Cutting
        there rather than in the graph keeps the graphs to what PyMC builds: cut in PyTensor, with
        the shape arithmetic and checks that come with it, the two functions take numba markedly
        longer to compile.
        """
        import pytensor.tensor as pt

        values = tuple(model.rvs_to_values[rv] for rv in model.free_RVs)
        logp = model.logp()
        remaining = [v for v in model.unobserved_value_vars if v not in values]
        expanded = pt.concatenate([*(v.ravel() for v in values),
                                   *(pt.as_tensor(v, allow_xtensor_conversion=True).ravel() for v in remaining)])
        expanded = expanded.astype("float64")
        params = tuple(Slot("param", v.name, v.type.ndim, v.type.dtype) for v in values)
        spec = WrapperSpec(
            logp=(*params, *(slot_of(v, model) for v in _shared_inputs(values, [logp]))),
            expand=(*params, *(slot_of(v, model) for v in _shared_inputs(values, [expanded]))),
        )
        return cls(values, logp, expanded, spec)

    def logp_and_gradient(self) -> list[Any]:
        """The logp callback's outputs: the log density and its gradient as one flat vector."""
        import pytensor.tensor as pt

        grads = pt.grad(self.logp, list(self.inputs)) if self.inputs else []
        grad = pt.concatenate([g.ravel() for g in grads]) if grads else pt.zeros((0,))
        return [self.logp, grad.astype("float64")]

    def fingerprint(self) -> str:
        """Content address of the compiled graphs and of the callback source generated for them."""
        parts = [graph_fingerprint([self.logp, self.expanded], self.inputs),
                 wrapper_source(self.spec, "logp"), wrapper_source(self.spec, "expand")]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _shared_inputs(inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """The shared variables a compiled function of ``outputs`` reads, in its argument order.

    PyTensor's ``pytensor.function`` collects them with ``rebuild_collect_shared`` (public in
    ``pytensor.compile.rebuild``), so the callbacks' argument order is known before compiling;
    ``compile_sampler_functions`` checks it against the compiled functions.
    """
    from pytensor.compile.rebuild import rebuild_collect_shared

    _, _, (_, _, _, shared) = rebuild_collect_shared(list(outputs), list(inputs), copy_inputs_over=True)
    return shared


CALLBACKS = ("logp", "expand")  # nutpie's two callbacks, in the order an entry's manifest lists them


def compile_sampler_functions(model: Any, graphs: SamplerGraphs | None = None,
                              kinds: Sequence[str] = CALLBACKS) -> tuple[WrapperSpec, dict[str, Any]]:
    """Compile the graphs of the callbacks ``kinds`` with PyTensor's numba backend; the spec lists their inputs.

    Only the kinds asked for: PyTensor's rewrites of a graph take a compile worker up to 1-2 s, and
    each of the two workers compiles one callback (`batchfit.compile.worker_pool.PARTS`).
    """
    from pymc.pytensorf import compile as compile_pymc

    numba_ops.register()  # the ops PyMC's graphs hold that PyTensor's numba backend lacks

    graphs = graphs or SamplerGraphs.of(model)
    outputs = {"logp": graphs.logp_and_gradient, "expand": lambda: [graphs.expanded]}
    with model:
        functions = {kind: compile_pymc(list(graphs.inputs), outputs[kind](), mode="NUMBA", on_unused_input="ignore")
                     for kind in kinds}
    n_params = len(graphs.inputs)
    for kind, fn in functions.items():
        predicted = getattr(graphs.spec, kind)
        compiled = (*predicted[:n_params], *(slot_of(v, model) for v in fn.get_shared()))
        if compiled != predicted:  # the key covered the predicted callback source: it must be the real one
            raise RuntimeError(f"PyTensor ordered the {kind} function's data inputs unexpectedly: "
                               f"{compiled} != {predicted}")
    return graphs.spec, functions


def sampler_key(model: Any, graphs: SamplerGraphs | None = None) -> str:
    """Content address of a model's compiled callbacks.

    It covers the generative graph (the posterior predictive and initial points are compiled
    from it), the graphs compiled into the callbacks with their generated source, and the
    environment (library versions, flags, CPU, batchfit's code).
    """
    graphs = graphs or SamplerGraphs.of(model)
    # structure_of: the structure registry and CompiledModel ask for the same fingerprint.
    parts = (structure_of(model), graphs.fingerprint(), environment_fingerprint())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]
