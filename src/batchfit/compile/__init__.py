"""A model structure compiled once into the cache: graphs, content keys, nutpie's callbacks, the workers.

Nothing here may import numba or PyTensor at module level: a compile worker imports this
package before it is told the environment those libraries read once (`batchfit.compile.worker_process`).
"""
