"""Batched linear algebra under mode="NUMBA": fully compiled, cacheable, and correct.

Matrix of cases: PyTensor batched linear-algebra ops (batch 3, matrices 3x3) with their
gradients, and PyMC models carrying batched covariances (logp and its gradient w.r.t. the
value variables). Each case must (a) have no object-mode or uncacheable op in the compiled
numba graph and (b) match NumPy/SciPy references (values) and PyTensor's Python backend
(values and gradients) to tight tolerance.

Every linear-algebra case also runs with the numba core-shape rewrite disabled, so every
``Blockwise`` reaches numba without a known core output shape: the path that fell back to
object mode before ``batchfit.numba_ops.linalg`` (seen as ``Blockwise{AllocDiag}`` in gradients of
batched Cholesky solves, depending on rewrite order).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zlib
from collections.abc import Callable

import numpy as np
import pandas as pd
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytensor.tensor.linalg as la
import pytest
import scipy.linalg
import scipy.stats
from pytensor.compile.mode import Mode, get_mode
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor.blockwise import Blockwise
from testkit import REPO

import batchfit.numba_ops.linalg  # noqa: F401  (registers the numba implementations)
from batchfit.numba_ops.nopython import (
    fallbacks_in_function,
    model_fallbacks,
    model_graphs,
    model_variable_names,
)

BATCH, N, K = 3, 3, 2
RTOL, ATOL = 1e-9, 1e-11

NUMBA = get_mode("NUMBA")
#: Every Blockwise reaches numba without a precomputed core shape.
NUMBA_NO_CORE_SHAPE = get_mode("NUMBA").excluding("introduce_explicit_core_shape_blockwise")
#: Reference: PyTensor's Python implementations (``perform``), no C compilation.
PYTHON = Mode(linker="py", optimizer="fast_compile")


# --------------------------------------------------------------------------------------------
# Linear-algebra ops and their gradients
# --------------------------------------------------------------------------------------------


def _spd(x):
    return x @ x.mT + N * pt.eye(N)


def _np_spd(x):
    return x @ np.swapaxes(x, -1, -2) + N * np.eye(N)


def _well_conditioned(x):
    return x + 2 * N * pt.eye(N)


def _np_well_conditioned(x):
    return x + 2 * N * np.eye(N)


def _batched(f, *arrays):
    return np.stack([f(*(a[i] for a in arrays)) for i in range(BATCH)])


# name -> (graph builder f(X, B, b), NumPy/SciPy reference f(X, B, b))
LINALG_CASES: dict[str, tuple[Callable, Callable]] = {
    "cholesky": (
        lambda X, B, b: la.cholesky(_spd(X)),
        lambda X, B, b: np.linalg.cholesky(_np_spd(X)),
    ),
    "solve": (
        lambda X, B, b: la.solve(_well_conditioned(X), B),
        lambda X, B, b: np.linalg.solve(_np_well_conditioned(X), B),
    ),
    "solve_vector": (
        lambda X, B, b: la.solve(_well_conditioned(X), b, b_ndim=1),
        lambda X, B, b: np.linalg.solve(_np_well_conditioned(X), b[..., None])[..., 0],
    ),
    "solve_pos": (
        lambda X, B, b: la.solve(_spd(X), B, assume_a="pos"),
        lambda X, B, b: np.linalg.solve(_np_spd(X), B),
    ),
    "cho_solve": (
        lambda X, B, b: la.cho_solve((la.cholesky(_spd(X)), True), B),
        lambda X, B, b: _batched(
            lambda s, bb: scipy.linalg.cho_solve((np.linalg.cholesky(s), True), bb), _np_spd(X), B
        ),
    ),
    "solve_triangular_lower": (
        lambda X, B, b: la.solve_triangular(la.cholesky(_spd(X)), B, lower=True),
        lambda X, B, b: _batched(
            lambda s, bb: scipy.linalg.solve_triangular(np.linalg.cholesky(s), bb, lower=True),
            _np_spd(X),
            B,
        ),
    ),
    "solve_triangular_upper": (
        lambda X, B, b: la.solve_triangular(la.cholesky(_spd(X)).mT, b, lower=False, b_ndim=1),
        lambda X, B, b: _batched(
            lambda s, bb: scipy.linalg.solve_triangular(np.linalg.cholesky(s).T, bb, lower=False),
            _np_spd(X),
            b,
        ),
    ),
    "det": (
        lambda X, B, b: la.det(_well_conditioned(X)),
        lambda X, B, b: np.linalg.det(_np_well_conditioned(X)),
    ),
    "slogdet": (
        lambda X, B, b: pt.stack(la.slogdet(X - N * pt.eye(N)), axis=-1),
        lambda X, B, b: np.stack(np.linalg.slogdet(X - N * np.eye(N)), axis=-1),
    ),
    "inv": (
        lambda X, B, b: la.inv(_well_conditioned(X)),
        lambda X, B, b: np.linalg.inv(_np_well_conditioned(X)),
    ),
    "eigh_values": (
        lambda X, B, b: la.eigh(_spd(X))[0],
        lambda X, B, b: np.linalg.eigh(_np_spd(X))[0],
    ),
    # Eigenvectors are defined up to sign: compare (and differentiate) their squares.
    "eigh_vectors": (
        lambda X, B, b: la.eigh(_spd(X))[1] ** 2,
        lambda X, B, b: np.linalg.eigh(_np_spd(X))[1] ** 2,
    ),
}


@pytest.fixture(scope="module")
def linalg_inputs():
    rng = np.random.default_rng(20260)
    return (
        rng.normal(size=(BATCH, N, N)),
        rng.normal(size=(BATCH, N, K)),
        rng.normal(size=(BATCH, N)),
    )


def _assert_close(actual, expected, what):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("mode", [NUMBA, NUMBA_NO_CORE_SHAPE], ids=["numba", "numba-no-core-shape"])
def test_batched_linalg_ops_and_gradients(mode, linalg_inputs):
    """Every case's value and the gradient of a weighted sum of it, all in one compiled function
    per mode (one numba compile instead of one per case: the cases share most of their kernels)."""
    X, B, b = pt.tensor3("X"), pt.tensor3("B"), pt.matrix("b")
    expected = {case: reference(*linalg_inputs) for case, (_, reference) in LINALG_CASES.items()}
    outputs, where = [], {}
    for case, (build, _) in LINALG_CASES.items():
        out = build(X, B, b)
        weights = np.random.default_rng(7).normal(size=expected[case].shape)
        cost = (pt.as_tensor(weights) * out).sum()
        used = [v for v in (X, B, b) if v in pytensor.graph.traversal.graph_inputs([out])]
        where[case] = slice(len(outputs), len(outputs) + 2 + len(used))
        outputs += [out, cost, *pytensor.grad(cost, used)]

    fn = pytensor.function([X, B, b], outputs, mode=mode, on_unused_input="ignore")
    assert fallbacks_in_function(fn) == []
    got = fn(*linalg_inputs)
    expected_python = pytensor.function([X, B, b], outputs, mode=PYTHON, on_unused_input="ignore")(*linalg_inputs)
    for case in LINALG_CASES:
        _assert_close(got[where[case]][0], expected[case], f"{case}: value vs numpy/scipy")
        for i, (g, e) in enumerate(zip(got[where[case]], expected_python[where[case]], strict=True)):
            _assert_close(g, e, f"{case}: output {i} vs python backend")


def test_gradient_of_batched_cholesky_matches_finite_differences(linalg_inputs):
    X = pt.tensor3("X")
    cost = (la.cholesky(_spd(X)) ** 2).sum() + la.cho_solve((la.cholesky(_spd(X)), True), pt.ones((BATCH, N, 1))).sum()
    fn = pytensor.function([X], [cost, pytensor.grad(cost, X)], mode=NUMBA)
    assert fallbacks_in_function(fn) == []
    x0 = linalg_inputs[0]
    _, grad = fn(x0)
    eps = 1e-6
    direction = np.random.default_rng(3).normal(size=x0.shape)
    numeric = (fn(x0 + eps * direction)[0] - fn(x0 - eps * direction)[0]) / (2 * eps)
    np.testing.assert_allclose((grad * direction).sum(), numeric, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# The Blockwise implementation for unknown core shapes, on its own
# --------------------------------------------------------------------------------------------


def test_blockwise_without_core_shape_broadcasts_static_batch_dims():
    A = pt.tensor("A", shape=(1, None, N, N))
    B = pt.tensor("B", shape=(None, 2, N, K))
    out = la.solve(_well_conditioned(A), B)
    cost = out.sum()
    grads = pytensor.grad(cost, [A, B])
    fn = pytensor.function([A, B], [out, *grads], mode=NUMBA_NO_CORE_SHAPE)
    assert any(isinstance(n.op, Blockwise) for n in fn.maker.fgraph.apply_nodes)
    assert fallbacks_in_function(fn) == []
    rng = np.random.default_rng(5)
    a, bb = rng.normal(size=(1, 2, N, N)), rng.normal(size=(4, 2, N, K))
    ref = pytensor.function([A, B], [out, *grads], mode=PYTHON)(a, bb)
    for g, e in zip(fn(a, bb), ref, strict=True):
        _assert_close(g, e, "broadcast solve")


def test_blockwise_without_core_shape_scalar_core_output_and_empty_batch():
    X = pt.tensor3("X")
    x = pt.matrix("x")
    per_matrix = pt.sum(x**2) + pt.max(x)  # (m,n)->(): a core op whose output is 0-d
    out = vectorize_graph(per_matrix, {x: X})
    # A Blockwise of an OpFromGraph, as produced by pt.vectorize of a composite function
    ofg = pytensor.compile.builders.OpFromGraph([x], [per_matrix])
    bw = Blockwise(ofg, signature="(m,n)->()")(X)
    fn = pytensor.function([X], [out, bw], mode=NUMBA_NO_CORE_SHAPE)
    assert fallbacks_in_function(fn) == []
    data = np.random.default_rng(2).normal(size=(4, 2, 3))
    expected = (data**2).sum(axis=(1, 2)) + data.max(axis=(1, 2))
    got_vec, got_bw = fn(data)
    _assert_close(got_vec, expected, "vectorized")
    _assert_close(got_bw, expected, "blockwise ofg")
    empty = fn(np.zeros((0, 2, 3)))
    assert empty[1].shape == (0,)


def test_blockwise_without_core_shape_rejects_runtime_broadcasting():
    A, B = pt.tensor3("A"), pt.tensor3("B")
    fn = pytensor.function([A, B], la.solve(A, B), mode=NUMBA_NO_CORE_SHAPE)
    eye = np.broadcast_to(np.eye(N), (3, N, N)).copy()
    with pytest.raises(ValueError):
        fn(eye, np.ones((1, N, K)))


#: Run in a fresh interpreter: a batched solve whose Blockwise reaches numba without a core shape,
#: compiled before and after importing batchfit.numba_ops.linalg (and after registering twice more).
REGISTRATION_SCRIPT = """
import json, warnings
import numpy as np
import pytensor, pytensor.tensor as pt, pytensor.tensor.linalg as la
from pytensor.compile.mode import get_mode
from pytensor.link.numba.dispatch.basic import numba_funcify_and_cache_key
from pytensor.tensor.blockwise import Blockwise

mode = get_mode("NUMBA").excluding("introduce_explicit_core_shape_blockwise")
A, B = pt.tensor3("A"), pt.tensor3("B")
rng = np.random.default_rng(0)
a, b = rng.normal(size=(4, 3, 3)) + 6 * np.eye(3), rng.normal(size=(4, 3, 2))

def compile_and_run():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pytensor.function([A, B], la.solve(A, B), mode=mode)(a, b)
    return {"object_mode": [str(w.message) for w in caught if "object mode" in str(w.message)],
            "error": float(np.max(np.abs(out - np.linalg.solve(a, b))))}

result = {"before": compile_and_run()}
import batchfit.numba_ops.linalg
result["after"] = compile_and_run()
batchfit.numba_ops.linalg.register()
batchfit.numba_ops.linalg.register()
result["dispatch_kept"] = (numba_funcify_and_cache_key.dispatch(Blockwise)
                           is batchfit.numba_ops.linalg.numba_funcify_Blockwise_dynamic_core_shape)
result["again"] = compile_and_run()
print(json.dumps(result))
"""


def test_importing_batchfit_linalg_moves_blockwise_from_object_mode_to_nopython():
    """Checked in a fresh process, since this module imported batchfit.numba_ops.linalg already."""
    proc = subprocess.run([sys.executable, "-c", REGISTRATION_SCRIPT], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # without batchfit.numba_ops.linalg PyTensor runs the Blockwise's perform in object mode ...
    assert any("Blockwise{Solve" in m for m in result["before"]["object_mode"]), result["before"]
    # ... with it the same graph compiles in nopython mode, to the same values
    assert result["after"]["object_mode"] == [], result["after"]
    # registering again keeps batchfit's implementation
    assert result["dispatch_kept"]
    assert result["again"]["object_mode"] == []
    for stage in ("before", "after", "again"):
        assert result[stage]["error"] < 1e-12, result


# --------------------------------------------------------------------------------------------
# PyMC models with batched covariances
# --------------------------------------------------------------------------------------------

G, D = 3, 3


def _observed(rng, *shape):
    return rng.normal(size=shape)


def _batched_corr_and_sd():
    corr = pm.LKJCorr("corr", n=D, eta=2.0, shape=(G, D, D))
    sd = pm.HalfNormal("sd", 1.5, shape=(G, D))
    return corr, sd


def model_mvnormal_cov(rng):
    with pm.Model() as model:
        corr, sd = _batched_corr_and_sd()
        cov = sd[:, :, None] * corr * sd[:, None, :]
        mu = pm.Normal("mu", 0.0, 2.0, shape=(G, D))
        pm.MvNormal("y", mu=mu, cov=cov, observed=_observed(rng, 4, G, D))
    return model


def model_mvnormal_chol(rng):
    with pm.Model() as model:
        corr, sd = _batched_corr_and_sd()
        chol = sd[:, :, None] * la.cholesky(corr)
        mu = pm.Normal("mu", 0.0, 2.0, shape=(G, D))
        pm.MvNormal("y", mu=mu, chol=chol, observed=_observed(rng, 4, G, D))
    return model


def model_mvstudentt_cov(rng):
    with pm.Model() as model:
        corr, sd = _batched_corr_and_sd()
        cov = sd[:, :, None] * corr * sd[:, None, :]
        nu = pm.Gamma("nu", 4.0, 0.5)
        pm.MvStudentT("y", nu=nu, mu=np.zeros(D), scale=cov, observed=_observed(rng, 4, G, D))
    return model


def model_mvstudentt_chol(rng):
    with pm.Model() as model:
        corr, sd = _batched_corr_and_sd()
        chol = sd[:, :, None] * la.cholesky(corr)
        pm.MvStudentT("y", nu=5.0, mu=np.zeros(D), chol=chol, observed=_observed(rng, 4, G, D))
    return model


def model_lkj_cholesky_cov_per_group(rng):
    # PyMC 6.4 has no logp for a batched LKJCholeskyCov (it raises "only implemented for
    # vector values"), so each group gets its own and the factors are stacked into a batch.
    with pm.Model() as model:
        chols = [
            pm.LKJCholeskyCov(f"chol_{g}", n=D, eta=2.0, sd_dist=pm.Exponential.dist(1.0, size=D))[0] for g in range(G)
        ]
        mu = pm.Normal("mu", 0.0, 2.0, shape=(G, D))
        pm.MvNormal("y", mu=mu, chol=pt.stack(chols), observed=_observed(rng, 4, G, D))
    return model


def model_gp_marginal(rng):
    x = np.linspace(0.0, 1.0, 4)[:, None]
    with pm.Model() as model:
        ls = pm.Gamma("ls", 2.0, 4.0)
        eta = pm.HalfNormal("eta", 1.0)
        sigma = pm.HalfNormal("sigma", 0.5)
        gp = pm.gp.Marginal(cov_func=eta**2 * pm.gp.cov.ExpQuad(1, ls=ls))
        gp.marginal_likelihood("y", X=x, y=rng.normal(size=4), sigma=sigma)
    return model


def model_gp_batched_kernel(rng):
    x = np.linspace(0.0, 1.0, 4)
    with pm.Model() as model:
        ls = pm.Gamma("ls", 2.0, 4.0, shape=G)
        eta = pm.HalfNormal("eta", 1.0, shape=G)
        sqdist = (x[:, None] - x[None, :]) ** 2
        kernel = eta[:, None, None] ** 2 * pt.exp(-0.5 * sqdist / ls[:, None, None] ** 2)
        kernel = kernel + 0.05 * pt.eye(4)
        pm.MvNormal("y", mu=0.0, cov=kernel, observed=_observed(rng, G, 4))
    return model


MODEL_CASES = {
    "mvnormal_cov": model_mvnormal_cov,
    "mvnormal_chol": model_mvnormal_chol,
    "mvstudentt_cov": model_mvstudentt_cov,
    "mvstudentt_chol": model_mvstudentt_chol,
    "lkj_cholesky_cov_per_group": model_lkj_cholesky_cov_per_group,
    "gp_marginal": model_gp_marginal,
    "gp_batched_kernel": model_gp_batched_kernel,
}


def _random_point(model, rng):
    return {k: v + rng.normal(scale=0.3, size=np.shape(v)) for k, v in model.initial_point().items()}


def _at_point(model, var, point, mode=PYTHON):
    """Evaluate ``var`` (random variables replaced by their values) at a point of value variables."""
    [expr] = model.replace_rvs_by_values([var])
    fn = model.compile_fn(expr, inputs=model.value_vars, mode=mode, on_unused_input="ignore")
    return fn(point)


def _check_models(models, rngs):
    """The log densities and gradients of ``models`` (name -> model), all in one function compiled
    under numba: no fallback, and equal to PyTensor's Python backend at two random points per model
    (drawn with ``rngs[name]``). One function: one numba compile instead of one per model."""
    inputs, outputs, where, names = [], [], {}, {}
    for case, model in models.items():
        outs, ins = model_graphs(model)
        where[case] = (slice(len(inputs), len(inputs) + len(ins)), slice(len(outputs), len(outputs) + len(outs)))
        inputs += ins
        outputs += outs
        names.update(model_variable_names(model))
    fn = pytensor.function(inputs, outputs, mode=NUMBA)
    assert fallbacks_in_function(fn, variable_names=names) == []
    ref = pytensor.function(inputs, outputs, mode=PYTHON)
    for _ in range(2):
        args = []
        for case, model in models.items():
            point = _random_point(model, rngs[case])
            args += [point[v.name] for v in inputs[where[case][0]]]
        got, expected = fn(*args), ref(*args)
        for case, (_, outs) in where.items():
            for i, (g, e) in enumerate(zip(got[outs], expected[outs], strict=True)):
                _assert_close(g, e, f"{case}: logp/gradient output {i}")


def test_batched_models_logp_and_gradient():
    rngs = {case: np.random.default_rng(zlib.crc32(case.encode())) for case in MODEL_CASES}
    _check_models({case: build(rngs[case]) for case, build in MODEL_CASES.items()}, rngs)


def test_batched_mvnormal_likelihood_matches_scipy():
    rng = np.random.default_rng(11)
    model = model_mvnormal_chol(rng)
    point = _random_point(model, rng)
    y_rv = model["y"]
    corr = _at_point(model, model["corr"], point)
    sd = _at_point(model, model["sd"], point)
    mu = point["mu"]
    obs = model.rvs_to_values[y_rv].data
    expected = np.stack(
        [
            scipy.stats.multivariate_normal(mu[g], sd[g][:, None] * corr[g] * sd[g][None, :]).logpdf(obs[:, g])
            for g in range(G)
        ],
        axis=-1,
    )
    _assert_close(
        _at_point(model, model.logp(vars=[y_rv], sum=False)[0], point, NUMBA), expected, "MvNormal logp vs scipy"
    )


def test_gp_marginal_likelihood_matches_scipy():
    rng = np.random.default_rng(13)
    model = model_gp_marginal(rng)
    point = _random_point(model, rng)
    ls, eta, sigma = (np.exp(point[f"{n}_log__"]) for n in ("ls", "eta", "sigma"))
    x = np.linspace(0.0, 1.0, 4)
    jitter = 1e-6  # pm.gp.Marginal stabilises the covariance diagonal
    cov = eta**2 * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2) + (sigma**2 + jitter) * np.eye(4)
    y_rv = model["y"]
    got = _at_point(model, model.logp(vars=[y_rv]), point, NUMBA)
    expected = scipy.stats.multivariate_normal(np.zeros(4), cov).logpdf(model.rvs_to_values[y_rv].data)
    np.testing.assert_allclose(got, expected, rtol=1e-7)


# --------------------------------------------------------------------------------------------
# The bundled example model
# --------------------------------------------------------------------------------------------


class TableData(dict):
    """Minimal stand-in for batchfit's dataset object: column arrays plus ``.coords``."""

    def __init__(self, frame: pd.DataFrame):
        super().__init__()
        self.coords: dict[str, list[str]] = {}
        for column in frame.columns:
            if pd.api.types.is_numeric_dtype(frame[column]):
                self[column] = frame[column].to_numpy()
            else:
                labels = sorted(frame[column].unique())
                self.coords[column] = labels
                self[column] = np.searchsorted(np.array(labels), frame[column].to_numpy()).astype("int64")


@pytest.fixture(scope="module")
def grouped_mvnormal():
    spec = importlib.util.spec_from_file_location("grouped_mvnormal", REPO / "models" / "grouped_mvnormal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grouped_mvnormal_simulate_shapes(grouped_mvnormal):
    sizes = set()
    for index in range(8):
        frame = grouped_mvnormal.simulate(np.random.default_rng(index), index)
        assert list(frame.columns) == ["group", "y_0", "y_1", "y_2"]
        counts = frame["group"].value_counts()
        assert 3 <= len(counts) <= 6
        assert counts.between(20, 60).all()
        assert np.isfinite(frame[["y_0", "y_1", "y_2"]].to_numpy()).all()
        sizes.add((len(counts), len(frame)))
    assert len(sizes) > 1  # datasets vary in size


def test_grouped_mvnormal_model_is_fully_compiled_and_correct(grouped_mvnormal):
    frame = grouped_mvnormal.simulate(np.random.default_rng(1), 1)
    data = TableData(frame)
    model = grouped_mvnormal.build_model(data)
    # Contract: every per-dataset array enters as pm.Data named after its column.
    for column in frame.columns:
        assert column in model.named_vars
        np.testing.assert_array_equal(model[column].get_value(), data[column])
    assert list(model.coords["groups"]) == data.coords["group"]
    assert model_fallbacks(model) == []
    _check_models({"grouped_mvnormal": model}, {"grouped_mvnormal": np.random.default_rng(4)})


def test_grouped_mvnormal_logp_matches_scipy(grouped_mvnormal):
    frame = grouped_mvnormal.simulate(np.random.default_rng(2), 2)
    data = TableData(frame)
    model = grouped_mvnormal.build_model(data)
    point = _random_point(model, np.random.default_rng(5))
    y_rv = model["y_obs"]
    got = _at_point(model, model.logp(vars=[y_rv]), point, NUMBA)
    mu = point["mu"]
    sd = np.exp(point["sd_log__"])
    corr = _at_point(model, model["corr"], point)
    y = frame[["y_0", "y_1", "y_2"]].to_numpy()
    g = data["group"]
    expected = sum(
        scipy.stats.multivariate_normal(mu[k], sd[k][:, None] * corr * sd[k][None, :]).logpdf(y[g == k]).sum()
        for k in range(len(data.coords["group"]))
    )
    np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_grouped_mvnormal_one_structure_for_different_sizes(grouped_mvnormal):
    """Datasets of different sizes reuse one compiled function by swapping pm.Data values."""
    small = TableData(grouped_mvnormal.simulate(np.random.default_rng(0), 0))
    large = TableData(grouped_mvnormal.simulate(np.random.default_rng(3), 3))
    assert len(small.coords["group"]) != len(large.coords["group"])
    model = grouped_mvnormal.build_model(small)
    outputs, inputs = model_graphs(model)
    fn = pytensor.function(inputs, outputs[0], mode=NUMBA)
    n_groups = len(large.coords["group"])
    model.set_data("group", large["group"], coords={"groups": large.coords["group"]})
    for name in ("y_0", "y_1", "y_2"):
        model.set_data(name, large[name])
    point = {
        "mu": np.zeros((n_groups, 3)),
        "sd_log__": np.zeros((n_groups, 3)),
        "corr_cholesky_corr__": np.zeros(3),
    }
    reference = grouped_mvnormal.build_model(large)
    expected = reference.compile_logp(mode=PYTHON)(point)
    np.testing.assert_allclose(fn(*[point[v.name] for v in inputs]), expected, rtol=1e-10)
