"""PyMC's ``SplineWrapper`` (``pm.Interpolated``) under mode="NUMBA": nopython, cacheable, and
scipy's values (``batchfit.numba_ops.splines``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pymc.distributions.dist_math import SplineWrapper
from scipy.interpolate import CubicSpline, InterpolatedUnivariateSpline, UnivariateSpline

from batchfit import numba_ops
from batchfit.numba_ops.nopython import fallbacks_in_function

numba_ops.register()

RNG = np.random.default_rng(7)
KNOTS = np.linspace(0.0, 1.0, 7)
# inside and outside the knots, on them and on both ends
POINTS = np.concatenate([RNG.uniform(-1.5, 2.5, 200), KNOTS, [-1e9, 1e9, np.nextafter(1.0, 2.0)]])


def spline(k: int, ext: int, smooth: bool = False) -> UnivariateSpline:
    values = np.random.default_rng([k, ext, smooth]).uniform(0.1, 2.0, KNOTS.size)  # the same in any test order
    if smooth:  # fewer knots than points: coefficients padded past the used ones
        return UnivariateSpline(KNOTS, values, k=k, s=0.5, ext=ext)
    return InterpolatedUnivariateSpline(KNOTS, values, k=k, ext=ext)


def numba_and_python(op: SplineWrapper, x: pt.TensorVariable) -> tuple[pytensor.compile.Function, ...]:
    outputs = [op(x), pytensor.grad(op(x).sum(), x)]
    return pytensor.function([x], outputs, mode="NUMBA"), pytensor.function([x], outputs, mode="FAST_COMPILE")


@pytest.mark.filterwarnings("ignore:SplineWrapper should implement:FutureWarning")
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("ext", [0, 1, 3])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_values_and_gradient_are_scipys(k, ext, smooth):
    """scipy evaluates the spline (``spline(x)``, its derivative's for the gradient), as PyMC's op does."""
    sp = spline(k, ext, smooth)
    compiled, _ = numba_and_python(SplineWrapper(sp), pt.dvector("x"))
    value, gradient = compiled(POINTS)
    np.testing.assert_allclose(value, sp(POINTS), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gradient, sp.derivative()(POINTS), rtol=1e-12, atol=1e-12)
    assert fallbacks_in_function(compiled) == []  # nopython, with a cache key


@pytest.mark.filterwarnings("ignore:SplineWrapper should implement:FutureWarning")
@pytest.mark.parametrize("shape", [(), (3, 4)])
def test_any_shape_and_float32_like_pymcs_op(shape):
    sp = spline(3, 0)
    for dtype in ("float64", "float32"):
        x = pt.tensor("x", dtype=dtype, shape=(None,) * len(shape))
        compiled, python = numba_and_python(SplineWrapper(sp), x)
        points = RNG.uniform(-0.2, 1.2, shape).astype(dtype)
        for got, expected in zip(compiled(points), python(points), strict=True):
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=1e-6 if dtype == "float32" else 1e-12)


def test_outside_the_knots_raises_as_scipy_does_with_ext_raise():
    sp = spline(1, 2)
    with pytest.raises(ValueError):
        sp(2.0)
    compiled = pytensor.function([x := pt.dvector("x")], SplineWrapper(sp)(x), mode="NUMBA")
    np.testing.assert_allclose(compiled(np.array([0.0, 1.0])), sp([0.0, 1.0]), rtol=1e-12)
    with pytest.raises(ValueError, match="outside the spline's knots"):
        compiled(np.array([0.5, 2.0]))


@pytest.mark.filterwarnings("ignore:SplineWrapper should implement:FutureWarning")
@pytest.mark.filterwarnings("ignore:Numba will use object mode:UserWarning")
def test_another_callable_in_the_op_stays_in_object_mode_as_pytensor_leaves_it():
    """The op calls whatever it holds; only scipy's fitted splines have knots to compile."""
    cubic = CubicSpline(KNOTS, np.sin(KNOTS))
    compiled, _ = numba_and_python(SplineWrapper(cubic), pt.dvector("x"))
    value, gradient = compiled(POINTS[:50])
    np.testing.assert_allclose(value, cubic(POINTS[:50]), rtol=1e-12)
    np.testing.assert_allclose(gradient, cubic.derivative()(POINTS[:50]), rtol=1e-12)
    assert {f.reason for f in fallbacks_in_function(compiled)} == {"object_mode"}


def test_splines_of_other_points_compile_to_their_own_cached_function(tmp_path):
    """In fresh processes on one PyTensor cache: the second spline is its own function, not the
    first one's from the cache, and the first spline's function comes back from it."""
    script = textwrap.dedent("""
        import sys, numpy as np, pytensor, pytensor.tensor as pt
        from pymc.distributions.dist_math import SplineWrapper
        from scipy.interpolate import InterpolatedUnivariateSpline
        from batchfit import numba_ops; numba_ops.register()
        sp = InterpolatedUnivariateSpline(np.linspace(0.0, 1.0, 5), np.array(sys.argv[1:], float), k=1)
        f = pytensor.function([x := pt.dvector("x")], SplineWrapper(sp)(x), mode="NUMBA")
        print(float(f(np.array([0.3]))[0]), float(sp(0.3)))
    """)

    def run(*values: str) -> list[float]:
        env = {"PYTENSOR_FLAGS": f"base_compiledir={tmp_path}", "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([sys.executable, "-c", script, *values], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [float(v) for v in proc.stdout.split()]

    def cached() -> set[str]:
        return {p.name for p in tmp_path.rglob("*.nbc")}

    written = []
    for values in (("0", "1", "2", "1", "0"), ("5", "4", "3", "2", "1"), ("0", "1", "2", "1", "0")):
        before = cached()
        got, expected = run(*values)
        assert got == pytest.approx(expected, rel=1e-12)
        written.append(cached() - before)
    assert written[0] and written[1] and not written[2], written
