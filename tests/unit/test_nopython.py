"""batchfit.numba_ops.nopython: finding ops that numba runs in object mode or cannot cache."""

from __future__ import annotations

import sys
import types

import numba
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.link.numba.dispatch.basic import numba_funcify
from pytensor.tensor.blockwise import Blockwise

from batchfit.numba_ops.nopython import (
    Fallback,
    fallbacks_in_function,
    find_fallbacks,
    model_fallbacks,
    model_variable_names,
    record_generic_fallbacks,
)


class PythonOnlyTwice(Op):
    """An op with only a Python ``perform``: numba must fall back to object mode."""

    __props__ = ()

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = 2 * inputs[0]

    def pullback(self, inputs, outputs, cotangents):
        return [2 * cotangents[0]]


class LegacyThrice(Op):
    """An op with a legacy ``numba_funcify`` registration: nopython, but no cache key."""

    __props__ = ()

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = 3 * inputs[0]


@numba_funcify.register(LegacyThrice)
def _funcify_legacy_thrice(op, node=None, **kwargs):
    @numba.njit
    def thrice(x):
        return 3 * x

    return thrice


def test_python_only_op_is_reported_as_object_mode_with_nearest_name():
    x = pt.vector("x")
    y = PythonOnlyTwice()(pt.exp(x))
    y.name = "twice_y"
    z = (y**2).sum()
    [fb] = find_fallbacks([z], [x])
    assert fb == Fallback("PythonOnlyTwice", "object_mode", "twice_y")
    text = str(fb)
    assert "\n" not in text
    assert "PythonOnlyTwice" in text and "object mode" in text and "twice_y" in text


def test_recording_fallbacks_triggers_no_lazy_module_attribute(monkeypatch):
    """A module-level ``__getattr__`` (pymc.plots's imports arviz_plots and matplotlib) is not called."""
    asked: list[str] = []
    lazy = types.ModuleType("batchfit_test_lazy_module")
    lazy.__getattr__ = lambda name: asked.append(name)
    monkeypatch.setitem(sys.modules, lazy.__name__, lazy)
    x = pt.vector("x")
    with record_generic_fallbacks() as calls:
        pytensor.function([x], PythonOnlyTwice()(x), mode="NUMBA")
    assert asked == []
    assert [type(op).__name__ for op, _ in calls] == ["PythonOnlyTwice"]


def test_clean_graph_has_no_fallbacks():
    x = pt.vector("x")
    # scipy.special-backed scalar ops look up a function pointer with numba.objmode once
    # per process: that must not count as object mode.
    z = pt.special.gammaln(pt.exp(x)).sum() + pt.logsumexp(x)
    assert find_fallbacks([z, pytensor.grad(z, x)], [x]) == []


def test_core_op_of_blockwise_is_reported_inside_the_blockwise():
    x = pt.matrix("x")
    y = Blockwise(PythonOnlyTwice(), signature="(n)->(n)")(x)
    [fb] = find_fallbacks([y.sum()], [x])
    assert fb.op == "PythonOnlyTwice"
    assert fb.reason == "object_mode"
    assert len(fb.inside) == 1 and "Blockwise" in fb.inside[0]
    assert "inside" in str(fb)


def test_uncacheable_op_is_reported():
    x = pt.vector("x")
    y = LegacyThrice()(x)
    y.name = "thrice"
    fbs = find_fallbacks([y.sum()], [x])
    assert fbs == [Fallback("LegacyThrice", "uncacheable", "thrice")]
    assert "cache" in str(fbs[0])


def test_uncacheable_core_op_is_found_through_the_blockwise():
    x = pt.matrix("x")
    y = Blockwise(LegacyThrice(), signature="(n)->(n)")(x)
    fbs = find_fallbacks([y.sum()], [x])
    assert [(fb.op, fb.reason) for fb in fbs] == [("LegacyThrice", "uncacheable")]
    assert "Blockwise" in fbs[0].inside[0]


def test_op_inside_an_opfromgraph_is_found():
    a = pt.vector("a")
    ofg = OpFromGraph([a], [PythonOnlyTwice()(a) + 1.0], inline=False)
    x = pt.vector("x")
    out = ofg(x)
    out.name = "ofg_out"
    fbs = find_fallbacks([out.sum()], [x])
    assert [(fb.op, fb.reason, fb.variable) for fb in fbs] == [("PythonOnlyTwice", "object_mode", "ofg_out")]
    assert fbs[0].inside  # names the OpFromGraph


def test_op_inside_a_scan_is_found():
    x = pt.vector("x")
    ys = pytensor.scan(lambda v: PythonOnlyTwice()(v), sequences=[x], return_updates=False)
    fbs = find_fallbacks([ys.sum()], [x])
    assert [(fb.op, fb.reason) for fb in fbs] == [("PythonOnlyTwice", "object_mode")]
    assert any("Scan" in s for s in fbs[0].inside)


def test_explicit_objmode_block_in_a_registered_kernel_is_reported():
    x = pt.matrix("x")
    # PyTensor's Unique with an axis runs numpy.unique inside numba.objmode.
    fbs = find_fallbacks([pt.unique(x, axis=0)], [x])
    assert len(fbs) == 1 and fbs[0].reason == "object_mode" and "Unique" in fbs[0].op


def test_fallbacks_in_function_reads_a_compiled_numba_function():
    x = pt.vector("x")
    with pytest.warns(UserWarning):  # PyTensor's own object-mode warning
        fn = pytensor.function([x], PythonOnlyTwice()(x), mode="NUMBA")
    [fb] = fallbacks_in_function(fn)
    assert fb.reason == "object_mode"
    np.testing.assert_allclose(fn(np.arange(3.0)), [0.0, 2.0, 4.0])


def test_fallbacks_in_function_rejects_other_backends():
    x = pt.vector("x")
    fn = pytensor.function([x], x * 2, mode="FAST_COMPILE")
    with pytest.raises(TypeError, match="NUMBA"):
        fallbacks_in_function(fn)


def test_variable_names_restrict_and_rename():
    x = pt.vector("x")
    y = PythonOnlyTwice()(x)
    y.name = "internal"
    z = y.sum()
    z.name = "total"
    [fb] = find_fallbacks([z], [x], variable_names={"total"})
    assert fb.variable == "total"
    [fb] = find_fallbacks([z], [x], variable_names={"x": "the_input"})
    assert fb.variable == "the_input"
    [fb] = find_fallbacks([z], [x], variable_names=set())
    assert fb.variable is None


def test_model_fallbacks_names_model_variables():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0, shape=3)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", mu, sigma, observed=np.zeros(3))
    assert model_fallbacks(model) == []
    names = model_variable_names(model)
    assert names["sigma_log__"] == "sigma"
    assert names["mu"] == "mu"

    with pm.Model() as bad:
        mu = pm.Normal("mu", 0.0, 1.0, shape=3)
        pm.Potential("pot", -(PythonOnlyTwice()(mu) ** 2).sum())
    fbs = model_fallbacks(bad)
    assert fbs and all(fb.reason == "object_mode" for fb in fbs)
    assert {fb.variable for fb in fbs} <= {"mu", "pot"}
