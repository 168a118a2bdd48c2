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

import dis
import sys
import threading
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm
    from pytensor.compile.function.types import Function
    from pytensor.graph.basic import Apply, Variable
    from pytensor.graph.fg import FunctionGraph

__all__ = [
    "Fallback",
    "fallbacks_in_fgraph",
    "fallbacks_in_function",
    "find_fallbacks",
    "model_fallbacks",
]

Reason = Literal["object_mode", "uncacheable"]

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


# --------------------------------------------------------------------------------------------
# Recording PyTensor's generic object-mode fallback
# --------------------------------------------------------------------------------------------

_RECORD_LOCK = threading.RLock()


@contextmanager
def record_generic_fallbacks() -> Iterator[list[tuple[Any, Any]]]:
    """Record every call of PyTensor's ``generate_fallback_impl`` made inside the block.

    Dispatch modules import the function by name, so every module-level reference to it is
    swapped for a recording wrapper for the duration of the block (and restored afterwards).
    Modules are searched through their ``__dict__``, not ``getattr``: a module-level
    ``__getattr__`` imports on a miss (``pymc.plots`` imports arviz_plots and matplotlib, which
    took 4 s of every compile worker).
    """
    from pytensor.link.numba.dispatch import basic as numba_basic

    original = numba_basic.generate_fallback_impl
    calls: list[tuple[Any, Any]] = []

    def recording_fallback(op, node=None, *args, **kwargs):
        calls.append((op, node))
        return original(op, node, *args, **kwargs)

    with _RECORD_LOCK:
        patched = [
            module
            for module in list(sys.modules.values())
            if isinstance(module, types.ModuleType) and vars(module).get("generate_fallback_impl") is original
        ]
        for module in patched:
            module.generate_fallback_impl = recording_fallback
        try:
            yield calls
        finally:
            for module in patched:
                module.generate_fallback_impl = original


# --------------------------------------------------------------------------------------------
# Scanning returned kernels for explicit `numba.objmode` blocks
# --------------------------------------------------------------------------------------------

# `with numba.objmode(ptr=types.intp)` is PyTensor's idiom to look up a LAPACK/cython
# function pointer once per process (see `_call_cached_ptr`); it is not an object-mode op.
_POINTER_LOOKUP_KWARGS = frozenset({"ptr"})


def _objmode_kwarg_sets(code: types.CodeType) -> list[frozenset[str]]:
    """Keyword names of each ``objmode(...)`` call in one code object (not nested ones)."""
    found: list[frozenset[str]] = []
    pending = False  # saw `objmode` loaded, waiting for its call
    kw_names: tuple[str, ...] = ()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_METHOD") and (ins.argval == "objmode"):
            pending, kw_names = True, ()
        elif pending and ins.opname == "KW_NAMES":
            kw_names = tuple(ins.argval) if isinstance(ins.argval, tuple) else ()
        elif pending and ins.opname == "LOAD_CONST" and isinstance(ins.argval, tuple):
            # Python 3.13+: CALL_KW takes the names from a preceding constant tuple
            if all(isinstance(v, str) for v in ins.argval):
                kw_names = ins.argval
        elif pending and ins.opname.startswith("CALL"):
            found.append(frozenset(kw_names))
            pending = False
    return found


def _code_uses_objmode(code: types.CodeType) -> bool:
    stack = [code]
    while stack:
        c = stack.pop()
        if "objmode" in c.co_names:
            for kwargs in _objmode_kwarg_sets(c):
                if not kwargs <= _POINTER_LOOKUP_KWARGS:
                    return True
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return False


def _kernel_uses_objmode(func: Any, max_depth: int = 4) -> bool:
    """Whether a funcified kernel (or a function it calls) holds a ``numba.objmode`` block.

    Follows python functions and numba dispatchers referenced as globals or closure cells.
    """
    seen: set[int] = set()
    queue: deque[tuple[Any, int]] = deque([(func, 0)])
    while queue:
        obj, depth = queue.popleft()
        py_func = getattr(obj, "py_func", obj)
        if not isinstance(py_func, types.FunctionType) or id(py_func) in seen:
            continue
        seen.add(id(py_func))
        code = py_func.__code__
        if _code_uses_objmode(code):
            return True
        if depth >= max_depth:
            continue
        referenced: list[Any] = []
        names: set[str] = set()
        stack = [code]
        while stack:
            c = stack.pop()
            names.update(c.co_names)
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        referenced.extend(py_func.__globals__[n] for n in names if n in py_func.__globals__)
        for cell in py_func.__closure__ or ():
            try:
                referenced.append(cell.cell_contents)
            except ValueError:  # empty cell
                pass
        for ref in referenced:
            if isinstance(ref, types.FunctionType) or hasattr(ref, "py_func"):
                queue.append((ref, depth + 1))
    return False


# --------------------------------------------------------------------------------------------
# Per-node analysis
# --------------------------------------------------------------------------------------------


def _funcify(op: Any, node: Any) -> tuple[Callable | None, str | None, list[Any], bool]:
    """Convert one node as the numba linker does.

    Returns ``(kernel, cache_key, ops_that_used_the_generic_fallback, conversion_failed)``.
    """
    from pytensor.link.numba.dispatch.basic import numba_funcify_and_cache_key

    with record_generic_fallbacks() as calls, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            kernel, key = numba_funcify_and_cache_key(op, node=node)
        except Exception:  # the linker itself would fail here; report as uncacheable
            return None, None, [op for op, _ in calls], True
    return kernel, key, [op for op, _ in calls], False


def _inner_nodes(op: Any, node: Any) -> list[tuple[Any, Any]]:
    """(op, node) pairs of the graphs nested in ``op`` that numba converts on its own."""
    from pytensor.scalar.basic import get_scalar_type
    from pytensor.tensor.blockwise import Blockwise, BlockwiseWithCoreShape
    from pytensor.tensor.elemwise import Elemwise

    if isinstance(op, BlockwiseWithCoreShape):
        [blockwise_node] = op.fgraph.apply_nodes
        blockwise_op = blockwise_node.op
        nin = len(blockwise_node.inputs)
        core = blockwise_op._create_dummy_core_node(node.inputs[:nin], propagate_unbatched_core_inputs=True)
        return [(core.op, core)]
    if isinstance(op, Blockwise):
        core = op._create_dummy_core_node(node.inputs, propagate_unbatched_core_inputs=True)
        return [(core.op, core)]
    if isinstance(op, Elemwise):
        scalar_inputs = [get_scalar_type(inp.type.dtype)() for inp in node.inputs]
        try:
            scalar_node = op.scalar_op.make_node(*scalar_inputs)
        except Exception:
            return []
        return [(scalar_node.op, scalar_node)]
    # Scan, OpFromGraph, Composite, ScalarLoop, ...: every node of the inner graph.
    fgraph = getattr(op, "fgraph", None)
    if fgraph is not None and hasattr(fgraph, "toposort"):
        return [(n.op, n) for n in fgraph.toposort()]
    return []


@dataclass(frozen=True)
class _Finding:
    op: Any
    reason: Reason
    inside: tuple[str, ...]


def _analyze(op: Any, node: Any, inside: tuple[str, ...], depth: int = 0) -> list[_Finding]:
    kernel, key, generic_ops, failed = _funcify(op, node)
    findings: list[_Finding] = []
    seen_ops: set[str] = set()

    # 1. PyTensor's generic fallback was used somewhere while converting this node.
    for fallback_op in generic_ops:
        if str(fallback_op) in seen_ops:
            continue
        seen_ops.add(str(fallback_op))
        nested = () if fallback_op is op else (*inside, str(op))
        findings.append(_Finding(fallback_op, "object_mode", inside if fallback_op is op else nested))
    # 2. The kernel itself contains an explicit objmode block.
    if not generic_ops and kernel is not None and _kernel_uses_objmode(kernel):
        findings.append(_Finding(op, "object_mode", inside))
    if findings:
        return findings
    if key is not None and not failed:
        return []
    # 3. No cache key: find the innermost culprit.
    if depth < 8:
        for inner_op, inner_node in _inner_nodes(op, node):
            findings.extend(_analyze(inner_op, inner_node, (*inside, str(op)), depth + 1))
    if not findings:
        findings.append(_Finding(op, "uncacheable", inside))
    return findings


# --------------------------------------------------------------------------------------------
# Naming: nearest named variable
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


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
        findings = _analyze(node.op, node, ())
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
