"""How PyTensor's numba backend converts one node: whether it falls back to object mode, or has no cache key.

Each node is converted with the same dispatcher the linker uses (``numba_funcify_and_cache_key``),
while calls to PyTensor's generic object-mode fallback are recorded (`record_generic_fallbacks`);
the returned kernels are scanned for ``numba.objmode`` blocks, and ops with inner graphs
(``Blockwise`` core ops, ``Elemwise`` scalar ops, ``Composite``, ``Scan``, ``OpFromGraph``) are
searched recursively (`analyze`), so a report names the innermost culprit.
"""

from __future__ import annotations

import dis
import sys
import threading
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    pass

Reason = Literal["object_mode", "uncacheable"]


_RECORD_LOCK = threading.RLock()


@contextmanager
def record_generic_fallbacks() -> Iterator[list[tuple[Any, Any]]]:
    """Record every call of PyTensor's ``generate_fallback_impl`` made inside the block.

    Dispatch modules import the function by name, so every module-level reference to it is
    swapped for a recording wrapper for the duration of the block (and restored afterwards).
    Modules are searched through their ``__dict__``, not ``getattr``: a module-level
    ``__getattr__`` imports on a miss (``pymc.plots`` imports arviz_plots and matplotlib, seconds
    of every compile worker spent on libraries it never uses).
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


def _funcify(op: Any, node: Any) -> tuple[Callable | None, str | None, list[Any], bool]:
    """Convert one node as the numba linker does.

    Returns ``(kernel, cache_key, ops_that_used_the_generic_fallback, conversion_failed)``.
    """
    from pytensor.link.numba.dispatch.basic import numba_funcify_and_cache_key

    with record_generic_fallbacks() as calls, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            kernel, key = numba_funcify_and_cache_key(op, node=node)
        except Exception:  # noqa: BLE001 - the linker itself would fail here: reported as uncacheable
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
        except Exception:  # noqa: BLE001 - a scalar op that types no node alone: the Elemwise is judged whole
            return []
        return [(scalar_node.op, scalar_node)]
    # Scan, OpFromGraph, Composite, ScalarLoop, ...: every node of the inner graph.
    fgraph = getattr(op, "fgraph", None)
    if fgraph is not None and hasattr(fgraph, "toposort"):
        return [(n.op, n) for n in fgraph.toposort()]
    return []


@dataclass(frozen=True)
class Finding:
    op: Any
    reason: Reason
    inside: tuple[str, ...]


def analyze(op: Any, node: Any, inside: tuple[str, ...], depth: int = 0) -> list[Finding]:
    kernel, key, generic_ops, failed = _funcify(op, node)
    findings: list[Finding] = []
    seen_ops: set[str] = set()

    # 1. PyTensor's generic fallback was used somewhere while converting this node.
    for fallback_op in generic_ops:
        if str(fallback_op) in seen_ops:
            continue
        seen_ops.add(str(fallback_op))
        nested = () if fallback_op is op else (*inside, str(op))
        findings.append(Finding(fallback_op, "object_mode", inside if fallback_op is op else nested))
    # 2. The kernel itself contains an explicit objmode block.
    if not generic_ops and kernel is not None and _kernel_uses_objmode(kernel):
        findings.append(Finding(op, "object_mode", inside))
    if findings:
        return findings
    if key is not None and not failed:
        return []
    # 3. No cache key: find the innermost culprit.
    if depth < 8:
        for inner_op, inner_node in _inner_nodes(op, node):
            findings.extend(analyze(inner_op, inner_node, (*inside, str(op)), depth + 1))
    if not findings:
        findings.append(Finding(op, "uncacheable", inside))
    return findings
