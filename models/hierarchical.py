"""Bundled example: a hierarchical (varying-intercept) linear regression.

Each dataset is a table with a numeric covariate ``x``, an outcome ``y`` and a text column
``group``; batchfit turns ``group`` into integer codes and puts the sorted labels in
``data.coords["group"]``, used as the model dimension ``groups`` (a dimension cannot share
a pm.Data container's name). Datasets differ in their number of rows and of groups, yet share one
compiled model.
"""

import numpy as np
import pandas as pd
import pymc as pm


def build_model(data, noise="normal"):
    """One intercept per group, partially pooled; a common slope and noise scale.

    ``noise``: "normal", or "student" for Student-t noise with 4 degrees of freedom, robust to
    outliers (config `params`; config/variants.yaml fits both and compares them, docs/variants.md).
    """
    if noise not in ("normal", "student"):
        raise ValueError(f"noise must be 'normal' or 'student', got {noise!r}")
    with pm.Model(coords={"groups": data.coords["group"]}) as model:
        x = pm.Data("x", data["x"])
        group = pm.Data("group", data["group"])
        y = pm.Data("y", data["y"])
        mu_a = pm.Normal("mu_a", 0.0, 5.0)
        sigma_a = pm.HalfNormal("sigma_a", 2.0)
        a = pm.Normal("a", mu_a, sigma_a, dims="groups")
        b = pm.Normal("b", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        if noise == "student":
            pm.StudentT("y_obs", nu=4.0, mu=a[group] + b * x, sigma=sigma, observed=y, shape=x.shape)
        else:
            pm.Normal("y_obs", a[group] + b * x, sigma, observed=y, shape=x.shape)
    return model


def simulate(rng: np.random.Generator, index: int) -> pd.DataFrame:
    """A synthetic dataset: 3 to 8 groups and 40 to 200 rows, sizes varying with ``index``."""
    n_groups = 3 + index % 6
    n_rows = 40 + (index * 37) % 161
    labels = [f"g{k:02d}" for k in range(n_groups)]
    idx = np.arange(n_rows) % n_groups
    intercepts = rng.normal(1.0, 0.8, size=n_groups)
    x = rng.normal(size=n_rows)
    y = intercepts[idx] + 0.7 * x + rng.normal(0.0, 0.5, size=n_rows)
    return pd.DataFrame({"group": np.array(labels)[idx], "x": x.round(4), "y": y.round(4)})
