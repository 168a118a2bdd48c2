"""Numba implementations that keep batched linear algebra fully compiled and disk-cacheable.

Importing this module registers the implementations with PyTensor's numba dispatcher.
Registration is idempotent: importing (or calling :func:`register`) again changes nothing.

What is registered, and why
---------------------------
``Blockwise`` whose core output shape is not known ahead of time
    PyTensor's numba backend only compiles ``BlockwiseWithCoreShape``: the numba rewrite
    ``introduce_explicit_core_shape_blockwise`` wraps every ``Blockwise`` with a graph of
    its core output shape so the outputs can be preallocated. When that shape graph cannot
    be built (it would itself need a ``Blockwise``, e.g. the ``OpFromGraph``-based
    ``AllocDiag`` that appears in gradients of batched ``cho_solve``/``cholesky``; the
    failure depends on rewrite order and is not reproducible run to run), the plain
    ``Blockwise`` node is left in the graph and PyTensor runs its ``perform`` in numba
    object mode: Python speed, and the whole function can no longer be cached.

    :func:`numba_funcify_Blockwise_dynamic_core_shape` compiles such nodes in nopython
    mode instead: the core kernel is called for the first batch element, its result gives
    the core output shapes, the outputs are allocated and the loop fills them. Batch
    dimensions follow ``Blockwise`` semantics (statically broadcastable dimensions are
    broadcast, others must match exactly). The cache key combines the core op's key with
    everything the generated code depends on (signature, batch broadcast patterns, output
    dtypes, destroy map), so the function is cached on disk like any other.

    When the core kernel writes into preallocated outputs (``handles_out``), the output
    shapes are needed before the first call and PyTensor's object-mode fallback is kept.

Small-matrix kernels (``Cholesky``, ``SolveTriangular`` …) are *not* replaced: PyTensor's
LAPACK-backed numba kernels already compile and cache, and run inside the one nopython
function (PyTensor's C backend, by contrast, runs every ``Blockwise`` as a Python loop over
the batch).

The code here is written against PyTensor 3.3's public dispatch API
(``register_funcify_and_cache_key``, ``numba_funcify_and_cache_key``) so it can move
upstream unchanged.
"""

from __future__ import annotations

from hashlib import sha256
from typing import Any

import numpy as np
from numba.core import types as nb_types
from numba.extending import overload
from pytensor.link.numba.cache import compile_numba_function_src
from pytensor.link.numba.dispatch import basic as numba_basic
from pytensor.link.numba.dispatch.basic import (
    generate_fallback_impl,
    numba_funcify_and_cache_key,
    register_funcify_and_cache_key,
)
from pytensor.tensor.blockwise import Blockwise

__all__ = ["numba_funcify_Blockwise_dynamic_core_shape", "register"]

#: Bump when the generated code changes, to invalidate on-disk caches.
BLOCKWISE_DYNAMIC_CACHE_VERSION = 1


# --------------------------------------------------------------------------------------------
# Helpers callable from generated code (typed per call site, so they work for scalar and
# 0-d array core results alike)
# --------------------------------------------------------------------------------------------


def _core_shape(x):  # pragma: no cover - only called in compiled code
    raise NotImplementedError("numba-only helper")


@overload(_core_shape, jit_options={"cache": True})
def _ov_core_shape(x):
    if isinstance(x, nb_types.Array):
        return lambda x: x.shape
    if isinstance(x, nb_types.Number | nb_types.Boolean):
        return lambda x: ()
    return None


def _core_value(x):  # pragma: no cover - only called in compiled code
    raise NotImplementedError("numba-only helper")


@overload(_core_value, jit_options={"cache": True})
def _ov_core_value(x):
    """A value that can be stored into ``out[batch_idx]``: scalars for 0-d results."""
    if isinstance(x, nb_types.Array) and x.ndim == 0:
        return lambda x: x[()]
    if isinstance(x, nb_types.Array | nb_types.Number | nb_types.Boolean):
        return lambda x: x
    return None


# --------------------------------------------------------------------------------------------
# Code generation for a Blockwise without a known core output shape
# --------------------------------------------------------------------------------------------


def _blockwise_dynamic_src(
    nin: int,
    nout: int,
    batch_ndim: int,
    input_batch_bc: tuple[tuple[bool, ...], ...],
) -> str:
    """Source of ``blockwise_dynamic(i0, ..., i{nin-1})`` for the given batch structure.

    The generated function depends only on the arguments (plus ``core_fn`` and the output
    dtypes ``dtype{k}`` provided as globals), which is what the cache key records.
    """
    ins = [f"i{j}" for j in range(nin)]
    lines = [f"def blockwise_dynamic({', '.join(ins)}):"]
    add = lines.append

    # Batch sizes: the first non-broadcastable input defines a dimension, the others must match.
    for d in range(batch_ndim):
        owners = [j for j in range(nin) if not input_batch_bc[j][d]]
        if not owners:
            add(f"    n{d} = 1")
            continue
        first, *rest = owners
        add(f"    n{d} = i{first}.shape[{d}]")
        for j in rest:
            add(f"    if i{j}.shape[{d}] != n{d}:")
            add(
                f"        raise ValueError('Blockwise: batch dimension {d} of input {j} does "
                f"not match input {first} (runtime broadcasting is not allowed)')"
            )
    sizes = [f"n{d}" for d in range(batch_ndim)]
    batch_shape = "(" + "".join(f"{s}, " for s in sizes) + ")"

    def core_args(idx: list[str]) -> str:
        args = []
        for j in range(nin):
            if batch_ndim == 0:
                args.append(f"i{j}")
                continue
            sub = ", ".join("0" if input_batch_bc[j][d] else idx[d] for d in range(batch_ndim))
            args.append(f"i{j}[{sub}]")
        return ", ".join(args)

    res = [f"r{k}" for k in range(nout)]
    unpack = f"{res[0]} = res" if nout == 1 else f"{', '.join(res)} = res"

    if batch_ndim == 0:
        add(f"    res = core_fn({core_args([])})")
        add(f"    {unpack}")
        outs = [f"np.asarray({r}, dtype=dtype{k})" for k, r in enumerate(res)]
        add(f"    return {outs[0]}" if nout == 1 else f"    return ({', '.join(outs)},)")
        return "\n".join(lines) + "\n"

    # Evaluate the first batch element (all-zero index) to learn the core output shapes.
    add(f"    total = {' * '.join(sizes)}")
    add("    if total == 0:")
    # Empty batch: evaluate the core op once on zeros of the core input shapes.
    zeros = ", ".join(f"np.zeros(i{j}.shape[{batch_ndim}:], dtype=i{j}.dtype)" for j in range(nin))
    add(f"        res = core_fn({zeros})")
    add(f"        {unpack}")
    for k in range(nout):
        add(f"        o{k} = np.empty({batch_shape} + _core_shape(r{k}), dtype=dtype{k})")
    add(f"        return {'o0' if nout == 1 else '(' + ', '.join(f'o{k}' for k in range(nout)) + ',)'}")
    zero_idx = ["0"] * batch_ndim
    add(f"    res = core_fn({core_args(zero_idx)})")
    add(f"    {unpack}")
    for k in range(nout):
        add(f"    o{k} = np.empty({batch_shape} + _core_shape(r{k}), dtype=dtype{k})")
        add(f"    o{k}[{', '.join(zero_idx)}] = _core_value(r{k})")
    add("    first = True")
    idx = [f"b{d}" for d in range(batch_ndim)]
    indent = "    "
    for d in range(batch_ndim):
        add(f"{indent}for b{d} in range(n{d}):")
        indent += "    "
    add(f"{indent}if first:")
    add(f"{indent}    first = False")
    add(f"{indent}    continue")
    add(f"{indent}res = core_fn({core_args(idx)})")
    add(f"{indent}{unpack}")
    for k in range(nout):
        shapes_match = f"_core_shape(r{k}) != o{k}.shape[{batch_ndim}:]"
        add(f"{indent}if {shapes_match}:")
        add(f"{indent}    raise ValueError('Blockwise: core output {k} changed shape across the batch')")
        add(f"{indent}o{k}[{', '.join(idx)}] = _core_value(r{k})")
    add(f"    return {'o0' if nout == 1 else '(' + ', '.join(f'o{k}' for k in range(nout)) + ',)'}")
    return "\n".join(lines) + "\n"


@register_funcify_and_cache_key(Blockwise)
def numba_funcify_Blockwise_dynamic_core_shape(op: Blockwise, node, **kwargs):
    """Numba kernel for a ``Blockwise`` node whose core output shape is not known in advance.

    PyTensor compiles ``BlockwiseWithCoreShape`` (a different class) itself; this only
    handles plain ``Blockwise`` nodes that the core-shape rewrite could not wrap.
    """
    nin = len(node.inputs)
    nout = len(node.outputs)
    batch_ndim = op.batch_ndim(node)

    core_node = op._create_dummy_core_node(list(node.inputs), propagate_unbatched_core_inputs=True)
    core_fn, core_key = numba_funcify_and_cache_key(op.core_op, node=core_node, **kwargs)
    if getattr(core_fn, "handles_out", False):
        # The core kernel writes into preallocated outputs, whose shapes are unknown here.
        return generate_fallback_impl(op, node=node, **kwargs), None

    input_batch_bc = tuple(tuple(inp.type.broadcastable[:batch_ndim]) for inp in node.inputs)
    output_dtypes = tuple(out.type.dtype for out in node.outputs)

    src = _blockwise_dynamic_src(nin, nout, batch_ndim, input_batch_bc)
    global_env: dict[str, Any] = {
        "np": np,
        "core_fn": core_fn,
        "_core_shape": _core_shape,
        "_core_value": _core_value,
    }
    for k, dtype in enumerate(output_dtypes):
        global_env[f"dtype{k}"] = np.dtype(dtype).type
    fn = compile_numba_function_src(src, "blockwise_dynamic", global_env=global_env)

    if core_key is None:
        key = None
    else:
        key = sha256(
            repr(
                (
                    "batchfit.numba_ops.linalg.Blockwise[dynamic core shape]",
                    BLOCKWISE_DYNAMIC_CACHE_VERSION,
                    str(type(op)),
                    op.signature,
                    tuple(sorted(op.destroy_map.items())),
                    input_batch_bc,
                    output_dtypes,
                    core_key,
                )
            ).encode()
        ).hexdigest()
    return numba_basic.numba_njit(fn), key


def register() -> None:
    """Make sure the implementations above are registered (idempotent).

    Registration happens at import time through the decorators; this re-asserts it, e.g.
    after another library registered a different ``Blockwise`` implementation.
    """
    from pytensor.link.numba.dispatch.basic import numba_funcify

    if numba_funcify_and_cache_key.dispatch(Blockwise) is not numba_funcify_Blockwise_dynamic_core_shape:
        register_funcify_and_cache_key(Blockwise)(numba_funcify_Blockwise_dynamic_core_shape)
    assert numba_funcify.dispatch(Blockwise) is not numba_funcify.dispatch(object)
