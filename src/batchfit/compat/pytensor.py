"""PyTensor's numba linker: the compiled graph's own function, and a node's cached numba function.

Written against pytensor 3.3 (``pytensor/link/numba/linker.py``, ``dispatch/basic.py``). A compiled
function's ``vm.jit_fn`` is PyTensor's *final* function: ``numba_njit(wrapper.py_func,
final_function=True)`` of the cache wrapper ``def numba_funcified_fgraph(*args): return
jitable_func(*args)`` that ``numba_funcify_ensure_cache`` builds around the graph's function. Each
node's function is built by the same ``numba_funcify_ensure_cache`` and cached by numba in
PyTensor's compile directory under PyTensor's key for the node's op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


class ArgumentTypes:
    """The numba types of the arguments the graph's function passes each node function of a graph.

    Its inputs are C-contiguous arrays (the callbacks pass them so, `batchfit.compile.callbacks`), a
    constant a global (read-only when an array); a node's result is what its function returns. A
    node that works in place (``destroy_map``) returns the argument it wrote into; one that reads
    only C-contiguous arrays and returns no view of them returns fresh C-contiguous arrays, but for
    a ``FusedElemwise``, whose reductions it returns squeezed (any layout). Other results are not
    guessed: a view (``view_map``: DimShuffle, Subtensor, ...), a ``FusedElemwise``'s results or
    one computed from a view can be C, F or any layout, so that node's function is compiled (or
    loaded) for its own argument types and its result type read off numba's compile result
    (`result_type`). The nodes a node reads from are thus compiled first where their results'
    layouts are not known.
    """

    def __init__(self) -> None:
        self._types: dict[Any, Any] = {}
        self._functions: dict[Any, tuple[Any, str | None]] = {}

    def function(self, node: Any) -> tuple[Any, str | None]:
        """The numba dispatcher PyTensor's linker makes for ``node`` (the same object each time), and
        PyTensor's cache key for it (None if PyTensor does not cache it). Compiled for the argument
        types the graph's function passes (`of`), it is the very cache entry that function's compile
        then loads instead of compiling."""
        from pytensor.link.numba.dispatch.basic import numba_funcify_ensure_cache

        if node not in self._functions:
            self._functions[node] = numba_funcify_ensure_cache(node.op, node=node, storage_map={})
        return self._functions[node]

    def of(self, node: Any) -> tuple[Any, ...]:
        """The argument types of ``node``'s function where the graph's function calls it."""
        return tuple(self._type_of(v) for v in node.inputs)

    def _type_of(self, variable: Any) -> Any:
        """Depth first without recursion: a chain of nodes may be longer than Python's stack allows."""
        pending = [variable]
        while pending:
            current = pending[-1]
            if current in self._types:
                pending.pop()
                continue
            missing = [v for v in self._reads(current) if v not in self._types]
            if missing:
                pending += missing
                continue
            self._types[current] = self._find(current)
            pending.pop()
        return self._types[variable]

    @staticmethod
    def _reads(variable: Any) -> list[Any]:
        """The variables whose types decide ``variable``'s."""
        from pytensor.graph.basic import Constant

        node = variable.owner
        if node is None or isinstance(variable, Constant):
            return []
        destroyed = (getattr(node.op, "destroy_map", None) or {}).get(node.outputs.index(variable))
        return [node.inputs[destroyed[0]]] if destroyed else list(node.inputs)

    def _find(self, variable: Any) -> Any:
        import numba
        from numba.core.errors import NumbaError
        from pytensor.graph.basic import Constant
        from pytensor.link.numba.dispatch.basic import get_numba_type, numba_typify
        from pytensor.tensor.rewriting.fused_elemwise import FusedElemwise

        if isinstance(variable, Constant):
            found = numba.typeof(numba_typify(variable.data, variable=variable))
            return found.copy(readonly=True) if isinstance(found, numba.types.Array) else found
        node = variable.owner
        if node is None:
            return get_numba_type(variable.type, layout="C")
        index = node.outputs.index(variable)
        destroyed = (getattr(node.op, "destroy_map", None) or {}).get(index)
        if destroyed:
            return self._types[node.inputs[destroyed[0]]]
        arguments = self.of(node)
        fresh = index not in (getattr(node.op, "view_map", None) or {}) and not isinstance(node.op, FusedElemwise)
        if fresh and all(not isinstance(t, numba.types.Array) or t.layout == "C" for t in arguments):
            return get_numba_type(variable.type, layout="C")
        try:
            returned = result_type(self.function(node)[0], arguments)
        except NumbaError:  # the log density's own compile judges it; here a guess is enough
            return get_numba_type(variable.type, layout="A")
        return returned.types[index] if isinstance(returned, numba.types.BaseTuple) else returned


def cache_key_of(function: Any) -> str | None:
    """The key PyTensor's numba cache files ``function`` (a node's dispatcher) under, or None.

    PyTensor registers each function it generates for caching in ``pytensor.link.numba.cache``'s
    ``CACHED_SRC_FUNCTIONS`` (its cache locator's disambiguator), nested ones included.
    """
    from pytensor.link.numba.cache import CACHED_SRC_FUNCTIONS

    return CACHED_SRC_FUNCTIONS.get(function.py_func)


def cached_by_pytensor(py_func: Any) -> bool:
    """Whether ``py_func`` is a function PyTensor generated and caches (`cache_key_of`): a node's."""
    from pytensor.link.numba.cache import CACHED_SRC_FUNCTIONS

    return py_func in CACHED_SRC_FUNCTIONS


@contextlib.contextmanager
def cache_keys_compiled() -> Iterator[set[str]]:
    """The cache keys (`cache_key_of`) of the functions numba compiles in this process inside the
    block, at any depth: a node function nested in another's compile is written to the cache too."""
    from numba.core import event

    keys: set[str] = set()

    class Compiled(event.Listener):
        def on_start(self, ev: Any) -> None:
            pass

        def on_end(self, ev: Any) -> None:
            key = cache_key_of(ev.data["dispatcher"])
            if key is not None:
                keys.add(key)

    with event.install_listener("numba:compile", Compiled()):
        yield keys


def compile_or_load(function: Any, argument_types: tuple[Any, ...]) -> bool:
    """Have numba compile ``function`` (a dispatcher) for ``argument_types``, or load it from its
    cache; True if loaded. Typing a call is the path numba itself takes (``get_call_template``),
    and ``Dispatcher.stats`` counts its cache's hits."""
    function.get_call_template(argument_types, {})
    return sum(function.stats.cache_hits.values()) > 0


def result_type(function: Any, argument_types: tuple[Any, ...]) -> Any:
    """The numba type ``function`` (a dispatcher) returns for ``argument_types``, compiling or loading
    it first: the return type of the overload numba's own call typing picks (``get_call_template``,
    ``Dispatcher.overloads``)."""
    _, _, args, _ = function.get_call_template(argument_types, {})
    return function.overloads[tuple(args)].signature.return_type


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
