"""The log density's node functions, compiled ahead from its last node back by the other worker.

A cold compile waits for the worker compiling the log density's callback: numba compiles the
function of each node of PyTensor's graph in turn, from the first (most of that worker's time),
then the graph's own function and the callback around it. PyTensor caches every node's function
in its compile directory, which both workers share (`batchfit.cache.store.open_cache`). So the
other worker, before compiling anything of its own part, compiles the log density's node functions
from the last node back; the log density's worker then loads those instead of compiling them. The
two meet in the middle: the walk back stops at the first node the log density's worker has already
written (a hit in numba's cache that this worker did not write), so it delays the job by at most
the node it is compiling. The other worker's own callback comes after the walk, beside the log
density's worker's last step (the graph's function and callback, which no walk can take).

The argument types must be the ones the graph's function passes, or the entry is not the one it
loads (numba keys its cache by them): its inputs are C-contiguous arrays (what the callbacks pass,
`batchfit.compile.callbacks`), a constant a read-only global, a node's result C-contiguous but
for views (`batchfit.compat.pytensor.input_type`). Where numba types one otherwise, that node is
compiled twice, never wrongly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from batchfit.compat.pytensor import compile_or_load, input_type, node_function

log = logging.getLogger("batchfit")


def compile_back_to_meet(fgraph: Any, other_done: Callable[[], bool]) -> int:
    """Compile the functions of ``fgraph``'s nodes from the last one back into PyTensor's numba cache,
    until one is found there that only the other worker can have written; return how many were compiled.

    This process must have compiled nothing before (a hit on a node function it wrote would pass
    for the other worker's). A node whose key an earlier node of ``fgraph`` shares (PyTensor keys
    a node by its op) may be in the cache by the other worker's compile of that earlier node,
    before it got anywhere near: a hit there says nothing, and the walk goes on.
    ``other_done``: whether the other worker has finished, checked before each node (where numba
    typed a node otherwise, no hit ever comes: the walk must not outlast the other worker).
    """
    from numba.core.errors import NumbaError

    own: set[str] = set()
    order = [(node, found) for node in fgraph.toposort() if (found := node_function(node)) is not None]
    first = {}
    for position, (_, (_, key)) in enumerate(order):
        first.setdefault(key, position)
    compiled = 0
    for position in reversed(range(len(order))):
        if other_done():
            break
        node, (function, key) = order[position]
        try:
            loaded = compile_or_load(function, tuple(input_type(v) for v in node.inputs))
        except NumbaError as exc:
            # Types numba cannot take, or a node numba cannot compile at all: either way the log
            # density's own compile judges (`batchfit.compile.entry.numba_failure_of_the_model`).
            log.debug("compiling %s ahead failed: %s", node, exc)
            continue
        if loaded and key not in own and first[key] == position:
            break  # the log density's worker got here
        own.add(key)
        compiled += not loaded
    return compiled
