"""batchfit's logp callback keeps nutpie's contract: the log density and gradient PyMC computes,
and a non-zero code when either is not finite (nutpie then rejects the point)."""

from __future__ import annotations

import ctypes

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest


@pytest.fixture(scope="module")
def compiled(session_cache):
    from batchfit.cache.store import open_cache
    from batchfit.compile.build import compile_model

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        # finite everywhere below 2 (0 at mu = 0, where its gradient is 0 / 0), -inf above
        pm.Potential("edge", pt.switch(mu > 2.0, -np.inf, pt.sqrt(pt.abs(mu))))
    return model, compile_model(model, open_cache(session_cache))


def call_logp(compiled_model, model, mu: float, record: np.ndarray | None = None) -> tuple[int, float, np.ndarray]:
    record = compiled_model.sampler_for(model).user_data if record is None else record
    x, grad, logp = np.array([mu]), np.zeros(1), np.zeros(1)
    code = compiled_model.logp.ctypes(1, *(a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (x, grad, logp)),
                                      record.ctypes.data_as(ctypes.c_void_p))
    return code, float(logp[0]), grad


def test_finite_point_gives_pymcs_log_density_and_gradient(compiled):
    model, compiled_model = compiled
    code, logp, grad = call_logp(compiled_model, model, 1.0)
    assert code == 0
    point = {"mu": np.array(1.0)}
    np.testing.assert_allclose(logp, model.compile_logp()(point), rtol=1e-12)
    np.testing.assert_allclose(grad, model.compile_dlogp()(point), rtol=1e-12)


def test_non_finite_log_density_and_gradient_are_distinct_codes(compiled):
    model, compiled_model = compiled
    assert np.isnan(model.compile_dlogp()({"mu": np.array(0.0)})).all()  # what PyMC computes there
    assert call_logp(compiled_model, model, 0.0)[0] == 3  # finite log density, NaN gradient
    assert np.isneginf(model.compile_logp()({"mu": np.array(3.0)}))
    assert call_logp(compiled_model, model, 3.0)[0] == 4  # -inf log density


def call_expand(compiled_model, mu: float, record: np.ndarray) -> int:
    x, out = np.array([mu]), np.zeros(int(record[1]))
    pointers = (a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (x, out))
    return compiled_model.expand.ctypes(1, len(out), *pointers, record.ctypes.data_as(ctypes.c_void_p))


def test_an_error_in_the_log_density_is_a_rejected_point(session_cache):
    from pytensor.raise_op import Assert

    from batchfit.cache.store import open_cache
    from batchfit.compile.build import compile_model

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Potential("checked", Assert("mu must stay below 2")(pt.constant(0.0), mu < 2.0))
    compiled_model = compile_model(model, open_cache(session_cache))
    with pytest.raises(AssertionError, match="below 2"):  # what PyMC's own function does there
        model.compile_logp()({"mu": np.array(3.0)})
    assert call_logp(compiled_model, model, 1.0)[0] == 0
    assert call_logp(compiled_model, model, 3.0)[0] == 1  # not 0: a cfunc that raises returns 0


def test_a_record_pointing_outside_the_parameters_is_refused_not_read(compiled):
    """The callbacks check the record before reading it: a numba cfunc that raises (here, the
    reshape of a too short stretch) would return 0, nutpie's code for success."""
    model, compiled_model = compiled
    record = compiled_model.sampler_for(model).user_data
    [mu] = [slot for slot in compiled_model.spec.slots if slot.kind == "param"]
    start = compiled_model.spec.offsets()[mu]  # where the record says mu starts in x
    assert call_logp(compiled_model, model, 1.0, record)[0] == 0
    assert call_expand(compiled_model, 1.0, record) == 0
    for bad in (1, -1):  # past x's one value; before it
        broken = record.copy()
        broken[start] = bad
        assert call_logp(compiled_model, model, 1.0, broken)[0] == -1, bad
        assert call_expand(compiled_model, 1.0, broken) == -1, bad
