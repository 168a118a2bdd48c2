"""A numba implementation of PyMC's ``SplineWrapper``, the op behind ``pm.Interpolated``.

PyMC's op evaluates a fitted scipy spline in Python (its ``perform``), which PyTensor's numba
backend runs in object mode: batchfit's cached callbacks cannot call that, so every model with a
``pm.Interpolated`` went through nutpie's own compile in every process. The spline is a constant
of the op: its knots, coefficients and degree (`batchfit.compat.scipy.spline_tck`) and its
extrapolation mode (``ext``) are frozen into the kernel, which evaluates it as
``scipy.interpolate.splev`` does (FITPACK's ``splev`` and ``fpbspl``: the same knot interval, the
same recursion, the four ``ext`` modes), and their digest is the cache key. The op's gradient is
another ``SplineWrapper`` (of the spline's derivative), compiled the same way. A ``SplineWrapper``
around any other callable (its ``perform`` only calls it) stays in object mode, as PyTensor leaves it.

Importing this module registers the implementation with PyTensor's numba dispatcher.
"""

from __future__ import annotations

from hashlib import sha256
from typing import Any

import numpy as np
from pymc.distributions.dist_math import SplineWrapper
from pytensor.link.numba.dispatch import basic as numba_basic
from pytensor.link.numba.dispatch.basic import generate_fallback_impl, register_funcify_and_cache_key
from scipy.interpolate import UnivariateSpline

from batchfit.compat.scipy import spline_tck

#: Bump when the generated kernel changes, to invalidate on-disk caches.
SPLINE_CACHE_VERSION = 1

#: scipy's ``ext`` modes outside the knots' range: extrapolate, zero, raise, the boundary value.
EXTRAPOLATE, ZEROS, RAISE, CONST = 0, 1, 2, 3


@register_funcify_and_cache_key(SplineWrapper)
def numba_funcify_SplineWrapper(op: SplineWrapper, node: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """The spline evaluated elementwise in nopython mode, and its cache key."""
    if not isinstance(op.spline, UnivariateSpline):
        return generate_fallback_impl(op, node=node, **kwargs), None
    t, c, k = spline_tck(op.spline)
    ext = int(op.spline.ext)
    out_dtype = np.dtype(node.outputs[0].type.dtype)
    n = t.shape[0]
    low, high = t[k], t[n - k - 1]

    @numba_basic.numba_njit
    def spline(x):
        flat = x.ravel()
        out = np.empty(flat.shape[0], dtype=out_dtype)
        h = np.empty(k + 1)  # fpbspl's B-spline values, and their previous round
        hh = np.empty(k + 1)
        for p in range(flat.shape[0]):
            v = flat[p]
            if v < low or v > high:  # outside the knots: splev's ext modes
                if ext == ZEROS:
                    out[p] = 0.0
                    continue
                if ext == RAISE:
                    raise ValueError("SplineWrapper: a value lies outside the spline's knots (ext='raise')")
                if ext == CONST:
                    v = low if v < low else high
            # the knot interval t[m] <= v < t[m + 1], k <= m <= n - k - 2 (the end intervals extend outwards)
            m = k  # FITPACK's l
            while m < n - k - 2 and not v < t[m + 1]:
                m += 1
            # fpbspl: the k + 1 B-splines that are nonzero at v
            h[0] = 1.0
            for j in range(1, k + 1):
                for i in range(j):
                    hh[i] = h[i]
                h[0] = 0.0
                for i in range(1, j + 1):
                    li, lj = m + i, m + i - j
                    if t[li] != t[lj]:
                        f = hh[i - 1] / (t[li] - t[lj])
                        h[i - 1] += f * (t[li] - v)
                        h[i] = f * (v - t[lj])
                    else:
                        h[i] = 0.0
            s = 0.0
            for j in range(k + 1):
                s += c[m - k + j] * h[j]
            out[p] = s
        return out.reshape(x.shape)

    key = sha256(repr(("batchfit.numba_ops.splines.SplineWrapper", SPLINE_CACHE_VERSION, k, ext, out_dtype.str,
                       sha256(t.tobytes()).hexdigest(), sha256(c.tobytes()).hexdigest())).encode()).hexdigest()
    return spline, key
