"""A tiny regression for the scale benchmarks (benchmarks/tables.py): y ~ Normal(a + b x, sigma)."""

import pymc as pm


def build_model(data):
    with pm.Model() as model:
        x = pm.Data("x", data["x"])
        y = pm.Data("y", data["y"])
        a = pm.Normal("a", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y_obs", a + b * x, sigma, observed=y, shape=x.shape)
    return model
