"""scipy's fitted splines: the B-spline representation scipy keeps private.

``UnivariateSpline`` (and ``InterpolatedUnivariateSpline``, which ``pm.Interpolated`` builds) holds
its knots, coefficients and degree in ``_eval_args``, the ``tck`` its ``__call__`` hands to
``scipy.interpolate.splev``; no public attribute gives the degree. Written against scipy 1.18
(``scipy/interpolate/_fitpack2.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def spline_tck(spline: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Knots, coefficients and degree of a fitted ``scipy.interpolate.UnivariateSpline``: what
    ``scipy.interpolate.splev(x, tck, ext=spline.ext)`` evaluates as ``spline(x)``."""
    t, c, k = spline._eval_args
    return np.ascontiguousarray(t, dtype=np.float64), np.ascontiguousarray(c, dtype=np.float64), int(k)
