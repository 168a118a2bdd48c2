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
    from batchfit.cache import open_cache
    from batchfit.compile import compile_model

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        # finite everywhere below 2 (0 at mu = 0, where its gradient is 0 / 0), -inf above
        pm.Potential("edge", pt.switch(mu > 2.0, -np.inf, pt.sqrt(pt.abs(mu))))
    return model, compile_model(model, open_cache(session_cache))


def call_logp(compiled_model, model, mu: float) -> tuple[int, float, np.ndarray]:
    record = compiled_model.sampler_for(model).user_data
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
