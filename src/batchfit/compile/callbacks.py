"""nutpie's two C callbacks, generated as source and compiled (or loaded) by numba.

nutpie drives the sampler through ``logp`` (log density and gradient) and ``expand`` (the
draw's full set of variables). nutpie's own callbacks close over the data arrays and the
compiled PyTensor function, which numba refuses to cache. batchfit generates its own instead,
whose only inputs are nutpie's arguments and a *user-data record*: an int64 array holding the
number of parameters, the number of expanded values, for each free parameter its start in
nutpie's flat vector and its shape, and for each data input its address and shape. The
callbacks cut the parameters out of the flat vector as arrays of their own shapes and pass them,
with the data, to the compiled PyTensor function. Nothing dataset-specific is compiled in, so
the callbacks are cached by numba under a content key, and one compiled pair serves every
dataset of the same structure, whatever its lengths: datasets differ only in the record.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfit.cache.store import CacheDir
from batchfit.compat.numba import load_cached_cfunc, register_cache_locator

HEADER = 2  # record[0] = number of parameters, record[1] = number of expanded values


@dataclass(frozen=True)
class Slot:
    """One input of the compiled functions: a free parameter, a ``pm.Data`` container or a dimension length."""

    kind: str  # "param" (a free parameter's value, cut from nutpie's flat vector), "data" or "dim"
    name: str
    ndim: int
    dtype: str


@dataclass(frozen=True)
class WrapperSpec:
    """What the generated callbacks read from the user-data record, in the compiled argument order."""

    logp: tuple[Slot, ...]
    expand: tuple[Slot, ...]

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every slot once, in record order."""
        return tuple(dict.fromkeys((*self.logp, *self.expand)))

    def offsets(self) -> dict[Slot, int]:
        """Position of each slot in the record: a parameter's start in the flat vector, or a data
        input's address; its shape follows."""
        offsets, pos = {}, HEADER
        for slot in self.slots:
            offsets[slot] = pos
            pos += 1 + slot.ndim
        return offsets

    def record_length(self) -> int:
        return HEADER + sum(1 + s.ndim for s in self.slots)

    def to_json(self) -> dict[str, Any]:
        return {k: [dataclasses.asdict(s) for s in getattr(self, k)] for k in ("logp", "expand")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WrapperSpec:
        return cls(*(tuple(Slot(**s) for s in data[k]) for k in ("logp", "expand")))


def _slot_reads(slots: Sequence[Slot], offsets: dict[Slot, int]) -> tuple[str, list[str], str]:
    """The record's check, the source lines turning its entries into arrays, and the inner call's arguments.

    A parameter is a reshaped view of its stretch of ``x`` (a copy in its own dtype if that is
    not float64); a data input is an array at the recorded address. The check (a condition
    that holds when every parameter's stretch lies within ``x``, ``n`` long, and its shape
    has no negative length) is what makes those lines unable to raise: a reshape raises
    only when the stretch's length differs from its shape's size. Its terms are joined with
    ``&``, not ``and``: numba compiles each ``and`` as a branch of its own, which adds to every
    cold compile.
    """
    lines, bounds = [], []
    for i, slot in enumerate(slots):
        pos = offsets[slot]
        dims = [f"rec[{pos + 1 + d}]" for d in range(slot.ndim)]
        shape = "(" + "".join(f"{d}, " for d in dims) + ")"
        if slot.kind == "param":
            size = " * ".join(dims) or "1"
            cast = "" if slot.dtype == "float64" else f".astype({np.dtype(slot.dtype).name}_)"
            bounds += [f"rec[{pos}] >= 0", *(f"{d} >= 0" for d in dims), f"rec[{pos}] + {size} <= n"]
            lines.append(f"    a{i} = x[rec[{pos}]:rec[{pos}] + {size}]{cast}.reshape({shape})")
        else:
            lines.append(f"    a{i} = carray(as_ptr(rec[{pos}]), {shape}, {np.dtype(slot.dtype).name}_)")
    return " & ".join(f"({b})" for b in bounds) or "True", lines, ", ".join(f"a{i}" for i in range(len(slots)))


def wrapper_source(spec: WrapperSpec, kind: str) -> str:
    """Python source of the logp or expand callback for nutpie's C interface.

    Only the call of the compiled PyTensor function is in a ``try`` block (its errors, such as
    a failed shape check, are a rejected point, not a crash). numba compiles every call inside
    a ``try`` with its own exception paths, so a whole body inside one makes the logp
    callback's compile, the longest part of a cold compile, markedly longer. Nothing outside the
    block may raise, though: a numba cfunc that raises prints the error and returns 0, which
    nutpie takes for success. So the record is checked first (`_slot_reads`; a record that fails
    it is batchfit's bug, reported as a non-recoverable error like a wrong dimension), and the
    results are copied element by element after a length check, not by slice assignment
    (``out[:] = grad``), which can raise (and numba compiles its message's formatting, a large
    part of every cold compile). For the same reason the gradient is checked with
    ``math.isfinite`` while it is copied, not with ``np.all(np.isfinite(out))``, an array ufunc
    and a reduction numba compiles anew in every process, and the log density is stored as a
    number (``value[()]``) in a one-element view: storing the 0-d array itself in a 0-d view
    made numba compile ``np.take`` twice.
    """
    offsets = spec.offsets()
    valid, reads, args = _slot_reads(getattr(spec, kind), offsets)
    size = spec.record_length()
    if kind == "logp":
        head = [
            "def batchfit_logp(dim, x_, out_, logp_, rec_):",
            f"    rec = carray(rec_, ({size},), int64_)",
            "    n = rec[0]",
            f"    if dim != n or not ({valid}):",
            "        return -1",
            "    x = carray(x_, (n,))",
            "    out = carray(out_, (n,))",
            "    logp = carray(logp_, (1,))",
        ]
        tail = [
            "    try:",
            f"        value, grad = inner({args})",
            "    except Exception:",
            "        return 1",
            "    if grad.shape[0] != n:",
            "        return 1",
            "    logp[0] = value[()]",
            "    finite = True",
            "    for i in range(n):",
            "        g = grad[i]",
            "        out[i] = g",
            "        finite = finite and isfinite(g)",
            "    if not isfinite(logp[0]):",
            "        return 4",
            "    if not finite:",
            "        return 3",
            "    return 0",
        ]
    else:
        head = [
            "def batchfit_expand(dim, expanded, x_, out_, rec_):",
            f"    rec = carray(rec_, ({size},), int64_)",
            "    n = rec[0]",
            "    m = rec[1]",
            f"    if dim != n or expanded != m or not ({valid}):",
            "        return -1",
            "    x = carray(x_, (n,))",
            "    out = carray(out_, (m,))",
        ]
        tail = [
            "    try:",
            f"        (values,) = inner({args})",
            "    except Exception:",
            "        return -2",
            "    if values.shape[0] != m:",
            "        return -2",
            "    for i in range(m):",
            "        out[i] = values[i]",
            "    return 0",
        ]
    return "\n".join([*head, *reads, *tail]) + "\n"


@functools.cache
def _as_ptr_intrinsic() -> Any:
    """A numba intrinsic turning an integer address into a void pointer (built once, lazily)."""
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def as_ptr(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], cgutils.voidptr_t)

        return types.voidptr(address), codegen

    return as_ptr


def missing_inner(*args: Any) -> None:
    """Stands in for the PyTensor function when a callback should load from the cache.

    numba cannot compile a call to it, so a callback that misses the cache fails loudly
    instead of silently compiling: the caller then rebuilds the entry.
    """
    raise RuntimeError("batchfit callback was not found in the cache")


def make_callback(spec: WrapperSpec, kind: str, key: str, cache: CacheDir, inner: Callable) -> Any:
    """Create the numba cfunc for one callback, loading it from the cache when present."""
    import numba
    from numba.core import types

    source = wrapper_source(spec, kind)
    env: dict[str, Any] = {
        "__name__": __name__,
        "isfinite": math.isfinite,
        "carray": numba.carray,
        "as_ptr": _as_ptr_intrinsic(),
        "inner": inner,
        **{f"{np.dtype(s.dtype).name}_": np.dtype(s.dtype) for s in spec.slots},
        "int64_": np.dtype("int64"),
    }
    exec(compile(source, f"batchfit_{kind}", "exec"), env)
    py_func = env[f"batchfit_{kind}"]
    register_cache_locator(py_func, key, cache.numba_dir)
    f64 = types.CPointer(types.double)
    if kind == "logp":
        sig = types.int64(types.uint64, f64, f64, f64, types.voidptr)
    else:
        sig = types.int64(types.uint64, types.uint64, f64, f64, types.voidptr)
    if inner is missing_inner:
        return load_cached_cfunc(py_func, sig)
    return numba.cfunc(sig, cache=True)(py_func)
