"""Bundled Blockwise example: a multivariate normal per group, each with its own covariance.

Each dataset is a table with a text column ``group`` and ``D`` outcome columns
``y_0 .. y_{D-1}`` (D = 3 in the simulated data). batchfit turns ``group`` into integer codes
and puts the sorted labels in ``data.coords["group"]``, used as the model dimension ``groups``
(a dimension cannot share a pm.Data container's name).

Every group ``g`` has its own mean vector and covariance ``diag(sd_g) C diag(sd_g)``: per-group
scales ``sd_g`` and a correlation matrix ``C`` with an LKJ prior shared by the groups. (PyMC 6.4
cannot give each group its own LKJ prior here: a batched ``LKJCholeskyCov`` has no logp, and
a batched ``LKJCorr`` cannot take its batch size from a coordinate whose length varies between
datasets.) The per-group Cholesky factors ``diag(sd_g) chol(C)`` form a batch, and the
likelihood is one batched ``pm.MvNormal`` whose Cholesky factor is indexed by group, so the
compiled log density and its gradient are batched linear algebra (``Blockwise`` triangular
solves and the diagonal/solve graphs of their gradients), all compiled by numba in nopython
mode (``batchfit.nopython.model_fallbacks(build_model(data)) == []`` with
``batchfit.linalg`` imported).

Datasets differ in their number of groups and rows, yet share one compiled model.
"""

import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt

N_DIMS = 3  # outcome columns in simulated datasets


def _outcome_columns(data) -> list[str]:
    columns = sorted(
        (name for name in data.keys() if name.startswith("y_") and name[2:].isdigit()),
        key=lambda name: int(name[2:]),
    )
    if len(columns) < 2:
        raise ValueError(f"expected outcome columns y_0, y_1, ...; found {columns}")
    return columns


def build_model(data):
    """Per-group means and covariances (per-group scales x LKJ correlation); batched MvNormal."""
    columns = _outcome_columns(data)
    n_dims = len(columns)
    coords = {"groups": data.coords["group"], "outcome": columns}
    with pm.Model(coords=coords) as model:
        group = pm.Data("group", data["group"])
        ys = [pm.Data(name, data[name]) for name in columns]
        y = pt.stack(ys, axis=-1)

        mu = pm.Normal("mu", 0.0, 5.0, dims=("groups", "outcome"))
        sd = pm.HalfNormal("sd", 2.5, dims=("groups", "outcome"))
        corr = pm.LKJCorr("corr", n=n_dims, eta=2.0)
        # chol(diag(sd_g) C diag(sd_g)) = diag(sd_g) chol(C): one Cholesky factor per group.
        chol = sd[:, :, None] * pt.linalg.cholesky(corr)[None, :, :]
        pm.MvNormal("y_obs", mu=mu[group], chol=chol[group], observed=y, shape=y.shape)
    return model


def simulate(rng: np.random.Generator, index: int) -> pd.DataFrame:
    """A synthetic dataset: 3 to 6 groups of 20 to 60 rows each, D = 3 outcomes."""
    n_groups = 3 + index % 4
    labels = [f"g{k:02d}" for k in range(n_groups)]
    frames = []
    for label in labels:
        n_rows = int(rng.integers(20, 61))
        mean = rng.normal(0.0, 2.0, size=N_DIMS)
        scale = np.exp(rng.normal(0.0, 0.3, size=N_DIMS))
        # A random correlation matrix: normalised Gram matrix of a well-conditioned factor.
        factor = rng.normal(size=(N_DIMS, N_DIMS)) + 2.0 * np.eye(N_DIMS)
        gram = factor @ factor.T
        corr = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
        cov = corr * np.outer(scale, scale)
        draws = rng.multivariate_normal(mean, cov, size=n_rows)
        frame = pd.DataFrame({f"y_{d}": draws[:, d].round(4) for d in range(N_DIMS)})
        frame.insert(0, "group", label)
        frames.append(frame)
    data = pd.concat(frames, ignore_index=True)
    # Shuffle the rows so groups are interleaved, as in real data.
    return data.iloc[rng.permutation(len(data))].reset_index(drop=True)
