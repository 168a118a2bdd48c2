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
loads (numba keys its cache by them), and a node function compiled for other types is work lost
beside the log density's worker, on a machine with two cores: `batchfit.compat.pytensor.ArgumentTypes`
finds them as numba will, compiling the views a node reads to learn their layouts (C, F or any),
which the log density's worker then loads too. Where numba still types one otherwise, that node is
compiled twice, never wrongly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from batchfit.compat.pytensor import ArgumentTypes, cache_key_of, cache_keys_compiled, compile_or_load

log = logging.getLogger("batchfit")


def compile_back_to_meet(fgraph: Any, other_done: Callable[[], bool]) -> int:
    """Compile the functions of ``fgraph``'s nodes from the last one back into PyTensor's numba cache,
    until one is found there that only the other worker can have written; return how many node
    functions this compiled (some before the node that reads them, `ArgumentTypes`).

    A hit on a function this process compiled (as a node's or inside another's compile) says
    nothing, nor does one on a node whose key an earlier node of ``fgraph`` shares (PyTensor keys a
    node by its op): the other worker's compile of that earlier node wrote it, before it got anywhere
    near. ``other_done``: whether the other worker has finished, checked before each node (where
    numba typed a node otherwise, no hit ever comes: the walk must not outlast the other worker).
    """
    from numba.core.errors import NumbaError

    types = ArgumentTypes()
    order = [(node, function) for node in fgraph.toposort() if cache_key_of(function := types.function(node)[0])]
    first: dict[str, int] = {}
    for position, (_, function) in enumerate(order):
        first.setdefault(cache_key_of(function), position)
    with cache_keys_compiled() as own:
        for position in reversed(range(len(order))):
            if other_done():
                break
            node, function = order[position]
            key = cache_key_of(function)
            try:
                loaded = compile_or_load(function, types.of(node))  # the views it reads first, to know their types
            except NumbaError as exc:
                # Types numba cannot take, or a node numba cannot compile at all: either way the log
                # density's own compile judges (`batchfit.compile.entry.numba_failure_of_the_model`).
                log.debug("compiling %s ahead failed: %s", node, exc)
                continue
            if loaded and key not in own and first[key] == position:
                break  # the log density's worker got here
    return len(own & first.keys())
