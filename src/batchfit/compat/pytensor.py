"""PyTensor's numba linker: the compiled graph's own function, and a node's cached numba function.

Written against pytensor 3.3 (``pytensor/link/numba/linker.py``, ``dispatch/basic.py``). A compiled
function's ``vm.jit_fn`` is PyTensor's *final* function: ``numba_njit(wrapper.py_func,
final_function=True)`` of the cache wrapper ``def numba_funcified_fgraph(*args): return
jitable_func(*args)`` that ``numba_funcify_ensure_cache`` builds around the graph's function. Each
node's function is built by the same ``numba_funcify_ensure_cache`` and cached by numba in
PyTensor's compile directory under PyTensor's key for the node's op.
"""

from __future__ import annotations

from typing import Any


def graph_function(jit_fn: Any) -> Any:
    """The numba dispatcher of the graph itself inside PyTensor's final function ``jit_fn``.

    A numba function called from another compiles (and links, optimises and emits machine code)
    once more per level: the final function is a trampoline with a CPython and a cfunc wrapper
    that a batchfit callback never uses, so calling the graph's function directly skips a whole
    level of every cold compile. When PyTensor built no cache wrapper (a graph with no cache key,
    or over 1000 inputs), ``jit_fn`` is the graph's function itself.
    """
    inner = jit_fn.py_func.__globals__.get("jitable_func")
    return inner if hasattr(inner, "get_call_template") else jit_fn


def node_function(node: Any) -> tuple[Any, str] | None:
    """The numba dispatcher PyTensor's linker makes for ``node`` and PyTensor's cache key for it
    (None if PyTensor does not cache it).

    Compiling it for the argument types the graph's function passes fills PyTensor's numba cache
    with the very entry that function's compile then loads instead of compiling.
    """
    from pytensor.link.numba.dispatch.basic import numba_funcify_ensure_cache

    function, key = numba_funcify_ensure_cache(node.op, node=node, storage_map={})
    return None if key is None else (function, key)


def input_type(variable: Any) -> Any:
    """The numba type of ``variable`` where the graph's function reads it: a constant is a global
    (read-only when an array); a view of another array (``view_map``, as DimShuffle's) any layout,
    and so an in-place result written into one; anything else C-contiguous, as PyTensor's node
    functions return it."""
    import numba
    from pytensor.graph.basic import Constant
    from pytensor.link.numba.dispatch.basic import get_numba_type, numba_typify

    if isinstance(variable, Constant):
        found = numba.typeof(numba_typify(variable.data, variable=variable))
        return found.copy(readonly=True) if isinstance(found, numba.types.Array) else found
    return get_numba_type(variable.type, layout=_layout(variable))


def _layout(variable: Any) -> str:
    """"A" for a view of another array, or an in-place result written into one; otherwise "C"."""
    node = variable.owner
    if node is None:
        return "C"
    index = node.outputs.index(variable)
    if index in (getattr(node.op, "view_map", None) or {}):
        return "A"
    destroyed = (getattr(node.op, "destroy_map", None) or {}).get(index)
    return _layout(node.inputs[destroyed[0]]) if destroyed else "C"


def compile_or_load(function: Any, argument_types: tuple[Any, ...]) -> bool:
    """Have numba compile ``function`` (a dispatcher) for ``argument_types``, or load it from its
    cache; True if loaded. Typing a call is the path numba itself takes (``get_call_template``),
    and ``Dispatcher.stats`` counts its cache's hits."""
    function.get_call_template(argument_types, {})
    return sum(function.stats.cache_hits.values()) > 0


def lacks_numba_implementation(op: Any) -> bool:
    """Whether PyTensor's numba backend has nothing registered for ``op``'s type, so that converting
    a node of it ends in the generic object-mode fallback (``generate_fallback_impl``).

    The three dispatchers ``numba_funcify_and_cache_key`` tries in turn (``dispatch/basic.py``) are
    ``functools.singledispatch`` functions whose base case (``object``) leads there; a type that
    resolves to the base in all three has no numba implementation. Only a quick hint, read before
    PyTensor's rewrites (`batchfit.compile.entry.refuse_object_mode_early`).
    """
    from pytensor.link.numba.dispatch import basic

    dispatchers = (basic.numba_funcify_and_cache_key, basic.numba_funcify_default_op_cache_key, basic.numba_funcify)
    return all(d.dispatch(type(op)) is d.dispatch(object) for d in dispatchers)
