"""Find the parts of a numba-compiled PyTensor graph that do not run fully compiled or cannot be cached.

PyTensor's numba backend converts every node of the *rewritten* graph with the
``numba_funcify_and_cache_key`` dispatcher. Two things can silently go wrong:

``object_mode``
    No numba implementation exists for the op (or the registered one gives up for this
    node), and PyTensor wraps the op's Python ``perform`` in ``numba.objmode``. The graph
    still runs, at Python speed, and it cannot be cached on disk.
``uncacheable``
    The op compiles in nopython mode but its dispatcher returns no cache key, so the whole
    compiled function is recompiled in every fresh process.

The checks here are structural, not based on warning text: each node is converted with the
same dispatcher the linker uses, while calls to PyTensor's generic object-mode fallback are
recorded, the returned kernels are scanned for ``numba.objmode`` blocks, and the cache key is
inspected. Ops with inner graphs (``Blockwise`` core ops, ``Elemwise`` scalar ops,
``Composite``, ``Scan``, ``OpFromGraph``) are searched recursively so the report names the
innermost culprit.

Public API
----------
``Fallback``
    One finding: ``op``, ``reason``, ``variable`` (nearest named variable), ``inside``.
``fallbacks_in_function(fn, *, variable_names=None)``
    Inspect an already compiled ``pytensor.function`` (``mode="NUMBA"``).
``find_fallbacks(outputs, inputs=None, *, variable_names=None, mode="NUMBA")``
    Compile graphs with the numba backend, then inspect them.
``fallbacks_in_fgraph(fgraph, *, variable_names=None)``
    Inspect a FunctionGraph that was already rewritten for numba.
``model_fallbacks(model, *, jacobian=True)``
    The model's joint logp and its gradient w.r.t. the value variables, as nutpie and
    PyMC compile them, named with the model's variable names.
``record_generic_fallbacks()``
    A context manager listing the ``(op, node)`` pairs PyTensor sent to object mode while
    compiling inside it (no extra compile: the compile stage uses it on its own functions).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm
    from pytensor.compile.function.types import Function
    from pytensor.graph.basic import Apply, Variable
    from pytensor.graph.fg import FunctionGraph

from batchfit.numba_ops.node_analysis import Reason, analyze, record_generic_fallbacks

__all__ = [
    "Fallback",
    "fallbacks_in_fgraph",
    "fallbacks_in_function",
    "find_fallbacks",
    "model_fallbacks",
    "record_generic_fallbacks",
]


_EXPLANATION: dict[str, str] = {
    "object_mode": "runs in numba object mode (Python speed, not disk-cacheable)",
    "uncacheable": "compiles in nopython mode but has no cache key (recompiled in every process)",
}


@dataclass(frozen=True)
class Fallback:
    """One op of a numba-compiled graph that falls back to object mode or cannot be cached.

    Attributes
    ----------
    op
        ``str()`` of the offending op (the innermost one, when it sits in an inner graph).
    reason
        ``"object_mode"`` or ``"uncacheable"``.
    variable
        Name of the nearest named variable around the node in the compiled graph (searched
        both towards the outputs and towards the inputs, downstream first on ties), or None.
    inside
        The enclosing ops, outermost first, when ``op`` lives in an inner graph (e.g. the
        ``Blockwise`` whose core op it is). Empty for top-level nodes.
    """

    op: str
    reason: Reason
    variable: str | None = None
    inside: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f" near variable '{self.variable}'" if self.variable else ""
        within = f" (inside {' > '.join(self.inside)})" if self.inside else ""
        return f"{self.op}{within}{where}: {_EXPLANATION[self.reason]}"


def _normalise_names(
    variable_names: Mapping[str, str] | Iterable[str] | None,
) -> Callable[[str | None], str | None]:
    if variable_names is None:
        return lambda name: name or None
    if isinstance(variable_names, Mapping):
        mapping = dict(variable_names)
        return lambda name: mapping.get(name) if name else None
    allowed = set(variable_names)
    return lambda name: name if name in allowed else None


def _nearest_name(fgraph: FunctionGraph, node: Apply, resolve: Callable[[str | None], str | None]) -> str | None:
    """Breadth-first search both ways from ``node``; downstream wins at equal distance."""
    down: deque[Variable] = deque(node.outputs)
    up: deque[Variable] = deque(node.inputs)
    seen: set[int] = {id(v) for v in (*node.outputs, *node.inputs)}
    clients = fgraph.clients
    while down or up:
        for frontier, downstream in ((down, True), (up, False)):
            level = len(frontier)
            for _ in range(level):
                var = frontier.popleft()
                name = resolve(getattr(var, "name", None))
                if name:
                    return name
                if downstream:
                    neighbours = [
                        out
                        for client, _i in clients.get(var, ())
                        if hasattr(client, "outputs")
                        for out in client.outputs
                    ]
                else:
                    neighbours = list(var.owner.inputs) if var.owner is not None else []
                for nxt in neighbours:
                    if id(nxt) not in seen:
                        seen.add(id(nxt))
                        frontier.append(nxt)
    return None


def _large_constant_findings(fgraph: FunctionGraph) -> list[tuple[Any, Fallback]]:
    """Constants numba can only embed as dynamic globals make the whole function uncacheable."""
    import numpy as np
    from pytensor.graph.basic import Constant
    from pytensor.link.numba.dispatch.basic import NUMBA_CONSTANT_SIZE_LIMIT

    out = []
    for node in fgraph.toposort():
        for inp in node.inputs:
            if isinstance(inp, Constant) and isinstance(inp.data, np.ndarray):
                if inp.data.nbytes > NUMBA_CONSTANT_SIZE_LIMIT:
                    out.append((node, f"Constant{inp.data.shape}"))
    return out


def fallbacks_in_fgraph(
    fgraph: FunctionGraph,
    *,
    variable_names: Mapping[str, str] | Iterable[str] | None = None,
) -> list[Fallback]:
    """List the object-mode and uncacheable ops of a FunctionGraph rewritten for numba.

    ``variable_names`` restricts which variable names may be reported: an iterable of
    allowed names, or a mapping from graph names to display names (e.g. a value
    variable's name to its random variable's name). By default any name is used.
    """
    resolve = _normalise_names(variable_names)
    results: list[Fallback] = []
    seen: set[tuple[str, str, str | None, tuple[str, ...]]] = set()

    def add(fb: Fallback) -> None:
        k = (fb.op, fb.reason, fb.variable, fb.inside)
        if k not in seen:
            seen.add(k)
            results.append(fb)

    for node in fgraph.toposort():
        findings = analyze(node.op, node, ())
        if findings:
            name = _nearest_name(fgraph, node, resolve)
            for f in findings:
                add(Fallback(str(f.op), f.reason, name, f.inside))
    for node, what in _large_constant_findings(fgraph):
        add(Fallback(what, "uncacheable", _nearest_name(fgraph, node, resolve), (str(node.op),)))
    return results


def fallbacks_in_function(
    fn: Function,
    *,
    variable_names: Mapping[str, str] | Iterable[str] | None = None,
) -> list[Fallback]:
    """List the object-mode and uncacheable ops of a compiled ``pytensor.function``.

    The function must have been compiled with the numba backend (``mode="NUMBA"``): the
    analysis reads its rewritten graph, ``fn.maker.fgraph``.
    """
    from pytensor.link.numba.linker import NumbaLinker

    linker = getattr(fn.maker, "linker", None)
    if not isinstance(linker, NumbaLinker):
        raise TypeError(
            f"fallbacks_in_function needs a function compiled with mode='NUMBA', got linker {type(linker).__name__}"
        )
    return fallbacks_in_fgraph(fn.maker.fgraph, variable_names=variable_names)


def find_fallbacks(
    outputs: Variable | Sequence[Variable],
    inputs: Sequence[Variable] | None = None,
    *,
    variable_names: Mapping[str, str] | Iterable[str] | None = None,
    mode: Any = "NUMBA",
) -> list[Fallback]:
    """Compile ``outputs`` (as functions of ``inputs``) with the numba backend and list the
    ops that run in object mode or cannot be disk-cached.

    ``inputs`` defaults to the graph's explicit (non-constant, non-shared) root variables.
    Compilation is lazy in numba, so this rewrites and converts the graph but does not JIT it.
    """
    import pytensor
    from pytensor.graph.basic import Variable as _Variable
    from pytensor.graph.traversal import explicit_graph_inputs

    outs = [outputs] if isinstance(outputs, _Variable) else list(outputs)
    if inputs is None:
        inputs = list(explicit_graph_inputs(outs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = pytensor.function(list(inputs), outs, mode=mode, on_unused_input="ignore")
    return fallbacks_in_function(fn, variable_names=variable_names)


def model_graphs(model: pm.Model, *, jacobian: bool = True) -> tuple[list[Variable], list[Variable]]:
    """``([logp, *dlogp], value_vars)``: the joint log density and its gradient w.r.t. every
    continuous value variable, as PyMC and nutpie sample them."""
    import pytensor

    value_vars = list(model.continuous_value_vars)
    logp = model.logp(jacobian=jacobian)
    grads = pytensor.grad(logp, value_vars) if value_vars else []
    return [logp, *grads], value_vars


def model_variable_names(model: pm.Model) -> dict[str, str]:
    """Map graph names (random, value, deterministic and logp-term names) to model names."""
    names: dict[str, str] = {}
    for name in model.named_vars:
        names[name] = name
        names[f"{name}_logprob"] = name
    for rv, value in model.rvs_to_values.items():
        if rv.name and value.name:
            names[value.name] = rv.name
            names[f"{value.name}_logprob"] = rv.name
    return names


def model_fallbacks(model: pm.Model, *, jacobian: bool = True) -> list[Fallback]:
    """Fallbacks of a PyMC model's logp and logp gradient compiled with ``mode="NUMBA"``."""
    outputs, inputs = model_graphs(model, jacobian=jacobian)
    return find_fallbacks(outputs, inputs, variable_names=model_variable_names(model))
