"""The parity corpus: small PyMC models that ``pm.sample(nuts_sampler="nutpie")`` fits, each with its data.

Two parts:

* **Families**, generated from ``pymc.distributions.__all__``. Every public entry is either in
  ``PRIOR`` (a continuous family, sampled as a free variable and pulled towards a data value by a
  Normal likelihood, so its logp, transform and support all matter), in ``LIKELIHOOD`` (a
  family used as the observed distribution of a continuous free parameter: every discrete
  family, point-mass mixtures, censoring) or in ``SKIPPED`` with the reason. `classify` sorts
  the entries by what an instance is (support rank, dtype, module), and families of one kind
  are fitted together, a few per model, to keep the corpus inside CI's budget.
* **Features**: hand-written models for what a user's model file may do (coords of every
  kind, data of rank 0 to 3 from CSV and NetCDF, Deterministic, Potential, CustomDist,
  Censored, Truncated, mixtures, ZeroSumNormal, LKJCholeskyCov, time series, a GP, integer
  index data, missing values).

Every model follows batchfit's contract (docs/model.md): ``build_model(data)`` with
each array entering as ``pm.Data`` named after its column. Data are fixed (seeded), small and
written by `write_case`; this module imports PyMC only inside functions that need it.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SAMPLER = {"draws": 400, "tune": 400, "chains": 2, "seed": 20261130}
# Families fitted in one model. Each model costs a fixed ~20 s of CPU beyond its families (~15 s for
# batchfit's compile worker and callbacks, ~6 s for pm.sample's compile): fewer, larger models keep the
# corpus inside CI's budget; a dozen is still a short list to bisect.
FAMILIES_PER_MODEL = 12

# Continuous families as free variables: keyword arguments, and the data value (default 1.0)
# that the Normal(x, 0.5) likelihood pulls the variable towards (inside the support).
PRIOR: dict[str, tuple[str, float]] = {
    "AsymmetricLaplace": ("kappa=1.5, mu=0.0, b=1.0", 1.0),
    "Beta": ("alpha=2.0, beta=3.0", 0.4),
    "Cauchy": ("alpha=0.0, beta=1.0", 1.0),
    "ChiSquared": ("nu=3.0", 1.0),
    "ExGaussian": ("mu=0.0, sigma=1.0, nu=1.0", 1.0),
    "Exponential": ("lam=1.0", 1.0),
    "Flat": ("", 1.0),
    "Gamma": ("alpha=2.0, beta=1.0", 1.0),
    "Gumbel": ("mu=0.0, beta=1.0", 1.0),
    "HalfCauchy": ("beta=1.0", 1.0),
    "HalfFlat": ("", 1.0),
    "HalfNormal": ("sigma=1.0", 1.0),
    "HalfStudentT": ("nu=3.0, sigma=1.0", 1.0),
    "Interpolated": ("x_points=np.linspace(0.0, 1.0, 5), pdf_points=np.array([0.5, 1.0, 1.5, 1.0, 0.5])", 0.5),
    "InverseGamma": ("alpha=3.0, beta=2.0", 1.0),
    "Kumaraswamy": ("a=2.0, b=3.0", 0.4),
    "Laplace": ("mu=0.0, b=1.0", 1.0),
    "LogNormal": ("mu=0.0, sigma=0.5", 1.0),
    "Lognormal": ("mu=0.0, sigma=0.5", 1.0),
    "Logistic": ("mu=0.0, s=1.0", 1.0),
    "LogitNormal": ("mu=0.0, sigma=1.0", 0.4),
    "Moyal": ("mu=0.0, sigma=1.0", 1.0),
    "Normal": ("mu=0.0, sigma=1.0", 1.0),
    "Pareto": ("alpha=3.0, m=1.0", 1.5),
    "Rice": ("nu=1.0, sigma=1.0", 1.0),
    "SkewNormal": ("mu=0.0, sigma=1.0, alpha=2.0", 1.0),
    "SkewStudentT": ("a=2.0, b=3.0, mu=0.0, sigma=1.0", 1.0),
    "StudentT": ("nu=4.0, mu=0.0, sigma=1.0", 1.0),
    "Triangular": ("lower=0.0, c=0.3, upper=1.0", 0.4),
    "TruncatedNormal": ("mu=0.0, sigma=1.0, lower=-1.0, upper=2.0", 0.5),
    "Uniform": ("lower=0.0, upper=2.0", 1.0),
    "VonMises": ("mu=0.0, kappa=2.0", 0.5),
    "Wald": ("mu=1.0, lam=2.0", 1.0),
    "Weibull": ("alpha=2.0, beta=1.0", 1.0),
    "NormalMixture": ("w=np.array([0.3, 0.7]), mu=np.array([-1.0, 1.0]), sigma=np.array([0.5, 0.5])", 0.5),
    "Mixture": ("w=np.array([0.3, 0.7]), comp_dists=[pm.Normal.dist(-1.0, 0.5), pm.Normal.dist(1.0, 0.5)]", 0.5),
    "Truncated": ("dist=pm.Normal.dist(0.0, 1.0), lower=-1.0, upper=2.0", 0.5),
    # multivariate
    "MvNormal": ("mu=np.zeros(3), cov=np.eye(3)", 0.5),
    "MvStudentT": ("nu=4.0, mu=np.zeros(3), scale=np.eye(3)", 0.5),
    "Dirichlet": ("a=np.full(3, 2.0)", 0.3),
    "LKJCorr": ("n=3, eta=2.0", 0.3),
    # sd_dist keeps the standard deviations off zero: with Exponential(1), batchfit's chain 1 at the corpus
    # seed went into the funnel at a Cholesky diagonal near 0 (gradient ~380) and stayed (r_hat 2.2); its logp
    # and gradient there equal PyMC's, so it is the geometry, which pm.sample's chains meet by chance too
    "LKJCholeskyCov": ("n=3, eta=2.0, sd_dist=pm.Gamma.dist(5.0, 5.0, shape=3), compute_corr=False", 0.5),
    "MatrixNormal": ("mu=np.zeros((2, 3)), rowcov=np.eye(2), colcov=np.eye(3)", 0.5),
    "KroneckerNormal": ("mu=np.zeros(6), covs=[np.eye(2), np.eye(3)]", 0.5),
    "CAR": ("mu=np.zeros(3), W=np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]]), alpha=0.5, tau=1.0", 0.5),
    # the default zero_sum_stdev=0.001 leaves a ridge NUTS crosses slowly (ESS ~20 in 800 draws, too few to
    # compare sds); a wider soft constraint keeps the family's logp and mixes
    "ICAR": ("W=np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]]), sigma=1.0, zero_sum_stdev=0.1", 0.5),
    "StickBreakingWeights": ("alpha=2.0, K=4", 0.2),
    "ZeroSumNormal": ("sigma=1.0, shape=4", 0.5),
    # time series
    # AR, GARCH11 and EulerMaruyama get `shape`, not `steps`: their length is then static
    "AR": ("rho=np.array([0.5]), sigma=1.0, init_dist=pm.Normal.dist(0.0, 1.0), shape=9", 0.5),
    "GaussianRandomWalk": ("mu=0.0, sigma=1.0, init_dist=pm.Normal.dist(0.0, 1.0), steps=8", 0.5),
    "RandomWalk": ("innovation_dist=pm.Normal.dist(0.0, 1.0), init_dist=pm.Normal.dist(0.0, 1.0), steps=8", 0.5),
    "MvGaussianRandomWalk": (
        "mu=np.zeros(2), cov=np.eye(2), init_dist=pm.MvNormal.dist(np.zeros(2), np.eye(2)), steps=4", 0.5),
    "MvStudentTRandomWalk": (
        "nu=4.0, mu=np.zeros(2), scale=np.eye(2), init_dist=pm.MvNormal.dist(np.zeros(2), np.eye(2)), steps=4",
        0.5),
    "GARCH11": ("omega=0.1, alpha_1=0.3, beta_1=0.5, initial_vol=1.0, shape=9", 0.5),
    "EulerMaruyama": (
        "dt=0.1, sde_fn=lambda x, k: (-k * x, 1.0), sde_pars=(1.0,), init_dist=pm.Normal.dist(0.0, 1.0), shape=9",
        0.5),
}


@dataclass(frozen=True)
class Likelihood:
    """A family as the observed distribution: `prior` and `kwargs` use ``{t}`` for the free parameter;
    `data` is a NumPy expression of `rng` (and `stats`) giving observations in the family's support."""

    prior: str
    kwargs: str
    data: str


_GAMMA, _BETA, _NORMAL = "pm.Gamma('{t}', 2.0, 0.5)", "pm.Beta('{t}', 1.0, 1.0)", "pm.Normal('{t}', 0.0, 1.0)"
_CUTS = "pm.Normal('{t}', np.array([-1.0, 1.0]), 2.0, transform=pm.distributions.transforms.ordered)"
_COUNTS = "rng.poisson(3.0, 30)"
LIKELIHOOD: dict[str, Likelihood] = {
    "Bernoulli": Likelihood(_BETA, "p={t}", "rng.binomial(1, 0.3, 30)"),
    "BetaBinomial": Likelihood("pm.HalfNormal('{t}', 5.0)", "alpha={t}, beta=2.0, n=10", "rng.binomial(10, 0.5, 30)"),
    "Binomial": Likelihood(_BETA, "n=10, p={t}", "rng.binomial(10, 0.3, 30)"),
    "Categorical": Likelihood("pm.Dirichlet('{t}', np.ones(3))", "p={t}", "rng.integers(0, 3, 30)"),
    # DiracDelta, DiscreteUniform and HyperGeometric have no continuous parameter: their logp is a
    # constant of the data, next to a Normal free parameter (a wrong logp is -inf or an error).
    "DiracDelta": Likelihood(_NORMAL, "c=3", "np.full(30, 3)"),
    "DiscreteUniform": Likelihood(_NORMAL, "lower=0, upper=5", "rng.integers(0, 6, 30)"),
    "HyperGeometric": Likelihood(_NORMAL, "N=20, k=8, n=6", "rng.hypergeometric(8, 12, 6, 30)"),
    "DiscreteWeibull": Likelihood("pm.Beta('{t}', 2.0, 2.0)", "q={t}, beta=1.5", "rng.poisson(1.5, 30)"),
    "Geometric": Likelihood(_BETA, "p={t}", "rng.geometric(0.3, 30)"),
    "NegativeBinomial": Likelihood(_GAMMA, "mu={t}, alpha=3.0", _COUNTS),
    "Poisson": Likelihood(_GAMMA, "mu={t}", _COUNTS),
    "OrderedLogistic": Likelihood(_CUTS, "eta=0.0, cutpoints={t}", "rng.integers(0, 3, 30)"),
    "OrderedProbit": Likelihood(_CUTS, "eta=0.0, cutpoints={t}, sigma=1.0", "rng.integers(0, 3, 30)"),
    "ZeroInflatedPoisson": Likelihood(_GAMMA, "psi=0.7, mu={t}", _COUNTS),
    "ZeroInflatedBinomial": Likelihood(_BETA, "psi=0.7, n=10, p={t}", "rng.binomial(10, 0.3, 30)"),
    "ZeroInflatedNegativeBinomial": Likelihood(_GAMMA, "psi=0.7, mu={t}, alpha=3.0", _COUNTS),
    "HurdlePoisson": Likelihood(_GAMMA, "psi=0.7, mu={t}", _COUNTS),
    "HurdleNegativeBinomial": Likelihood(_GAMMA, "psi=0.7, mu={t}, alpha=3.0", _COUNTS),
    "HurdleGamma": Likelihood("pm.Gamma('{t}', 2.0, 1.0)", "psi=0.7, alpha={t}, beta=1.0",
                              "rng.gamma(2.0, 1.0, 30) * rng.binomial(1, 0.7, 30)"),
    "HurdleLogNormal": Likelihood(_NORMAL, "psi=0.7, mu={t}, sigma=0.5",
                                  "rng.lognormal(0.0, 0.5, 30) * rng.binomial(1, 0.7, 30)"),
    # point masses at the bounds: not a free variable, an observed one
    "Censored": Likelihood("pm.Normal('{t}', 0.0, 2.0)", "dist=pm.Normal.dist({t}, 1.0), lower=-1.0, upper=1.0",
                           "np.clip(rng.normal(0.3, 1.0, 30), -1.0, 1.0)"),
    # multivariate observations (rank 2 and 3 data)
    "Multinomial": Likelihood("pm.Dirichlet('{t}', np.ones(3))", "n=10, p={t}",
                              "rng.multinomial(10, [0.2, 0.3, 0.5], 20)"),
    "DirichletMultinomial": Likelihood("pm.HalfNormal('{t}', 5.0, shape=3)", "n=10, a={t}",
                                       "rng.multinomial(10, [0.2, 0.3, 0.5], 20)"),
    "OrderedMultinomial": Likelihood(_CUTS, "eta=0.0, cutpoints={t}, n=10",
                                     "rng.multinomial(10, [0.3, 0.4, 0.3], 20)"),
    "Wishart": Likelihood("pm.HalfNormal('{t}', 2.0)", "nu=5, V={t} * np.eye(2)",
                          "stats.wishart(df=5, scale=np.eye(2)).rvs(10, random_state=rng)"),
}

# Entries of pymc.distributions.__all__ that are not a family to fit, and why.
SKIPPED: dict[str, str] = {
    "Distribution": "base class of every distribution, not a family",
    "Continuous": "base class of the continuous families",
    "Discrete": "base class of the discrete families",
    "SymbolicRandomVariable": "base class of PyMC's symbolic random variables (an Op), not a family",
    "CustomDist": "a factory for user distributions: the features 'customdist-logp' and 'customdist-dist' fit it",
    "DensityDist": "the older name of CustomDist's factory (covered with it)",
    "Simulator": "likelihood-free: it has no logp, pm.sample cannot use NUTS on it (only SMC)",
    "PolyaGamma": "its logp needs the optional polyagamma package (not a PyMC dependency) and runs in object mode",
    "WishartBartlett": "a helper function building a Wishart from Normal and ChiSquared free variables (both fitted "
                       "as families); the Wishart family itself is in LIKELIHOOD",
}

# Families fitted in a model of their own: their pm.sample reference cannot be compiled through
# JAX, which would otherwise take their group's other families' reference onto numba, the backend
# batchfit runs (posterior_checks.sample_reference).
FIT_ALONE = {
    "Interpolated",  # its logp's SplineWrapper op has no JAX conversion
}

BASES = ("Distribution", "Continuous", "Discrete", "SymbolicRandomVariable")


def classify(name: str) -> str:
    """What a public entry of ``pymc.distributions`` is: 'base', 'helper', or the kind of an instance.

    An instance's kind is read off the random variable it builds: 'timeseries' (module
    ``pymc.distributions.timeseries``), 'multivariate' (support of rank > 0) or 'continuous' /
    'discrete' by its dtype.
    """
    import pymc.distributions as pmd

    obj = getattr(pmd, name)
    if name in BASES:
        return "base"
    if not inspect.isclass(obj) or not hasattr(obj, "dist"):
        return "helper"
    if obj.__module__.endswith("timeseries"):
        return "timeseries"
    rv = instance(name)
    if rv is None:  # not built by the corpus (SKIPPED): its base class says what it is
        return next((kind.lower() for kind in ("Continuous", "Discrete") if issubclass(obj, getattr(pmd, kind))),
                    "other")
    ndim_supp = getattr(rv.owner.op, "ndim_supp", 0)
    if ndim_supp > 0:
        return "multivariate"
    return "discrete" if rv.dtype.startswith(("int", "uint", "bool")) else "continuous"


def instance(name: str) -> Any:
    """``pm.<name>.dist(...)`` with the corpus's arguments (None for entries the corpus cannot build)."""
    import pymc as pm
    from scipy import stats  # noqa: F401  (used by eval'd expressions)

    if name in PRIOR:
        kwargs = PRIOR[name][0]
    elif name in LIKELIHOOD:
        spec = LIKELIHOOD[name]
        kwargs = spec.kwargs.format(t=_true_value(spec))
    else:
        return None
    return eval(f"pm.{name}.dist({kwargs})", {"pm": pm, "np": np})


def _true_value(spec: Likelihood) -> str:
    """A value of the free parameter inside its support, to build an instance for `classify`."""
    if "Dirichlet" in spec.prior:
        return "np.full(3, 1 / 3)"
    if "ordered" in spec.prior:
        return "np.array([-1.0, 1.0])"
    if "shape=3" in spec.prior:
        return "np.ones(3)"
    return "0.5"


# --- cases: a model file and its dataset ---------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One corpus model: the model file's text and a writer of its one dataset (returns the file)."""

    name: str
    source: str
    write_data: Callable[[Path], Path]


def _csv(columns: dict[str, Any]) -> Callable[[Path], Path]:
    def write(directory: Path) -> Path:
        import pandas as pd

        path = directory / "d.csv"
        pd.DataFrame(columns).to_csv(path, index=False)
        return path
    return write


def _netcdf(variables: dict[str, tuple[tuple[str, ...], Any]], coords: dict[str, Any] | None = None
            ) -> Callable[[Path], Path]:
    def write(directory: Path) -> Path:
        import xarray as xr

        path = directory / "d.nc"
        xr.Dataset({k: (dims, np.asarray(v)) for k, (dims, v) in variables.items()},
                   coords=coords or {}).to_netcdf(path, engine="h5netcdf")
        return path
    return write


def _model(*bodies: str, coords: str = "") -> str:
    """A model file: ``build_model(data)`` running the `bodies` inside ``with pm.Model(<coords>)``."""
    body = "\n".join(textwrap.dedent(b).strip() for b in bodies)
    return ("import numpy as np\nimport pymc as pm\nimport pytensor.tensor as pt\n\n\n"
            f"def build_model(data):\n    with pm.Model({coords}) as model:\n"
            + textwrap.indent(body, " " * 8) + "\n    return model\n")


def family_groups() -> dict[str, list[str]]:
    """Families by kind, chunked into models of FAMILIES_PER_MODEL; prior and likelihood use kept apart.

    A FIT_ALONE family leaves its chunk (the others keep theirs) for a model named after it.
    """
    import pymc.distributions as pmd

    groups: dict[str, list[str]] = {}
    for name in pmd.__all__:
        kind = classify(name)
        if name in SKIPPED:
            continue
        use = "prior" if name in PRIOR else "likelihood"
        groups.setdefault(f"{use}-{kind}", []).append(name)
    chunked = {}
    for key, names in groups.items():
        n_models = -(-len(names) // FAMILIES_PER_MODEL)
        for i, chunk in enumerate(np.array_split(np.array(names), n_models), start=1):
            chunked[f"family-{key}-{i}"] = [name for name in chunk.tolist() if name not in FIT_ALONE]
        chunked.update({f"family-{key}-{name}": [name] for name in names if name in FIT_ALONE})
    return chunked


def family_case(case_name: str, families: list[str]) -> Case:
    """One model fitting several families, each with its own data column and free variable(s).

    A group is all PRIOR or all LIKELIHOOD families (`family_groups`), so its data are one kind of file.
    """
    rng = np.random.default_rng(_seed(case_name))
    lines, variables, columns = [], {}, {}
    for name in families:
        col = f"y_{name}"
        if name in PRIOR:
            kwargs, value = PRIOR[name]
            sep = ", " if kwargs else ""
            # a Potential, not an observed Normal: one data value serves every element, whatever the shape
            lines += [f'{col} = pm.Data("{col}", data["{col}"])',
                      f'x_{name} = pm.{name}("x_{name}"{sep}{kwargs})',
                      f'pm.Potential("obs_{name}", pm.logp(pm.Normal.dist({col}[0], 0.5), x_{name}).sum())']
            columns[col] = [value]
        else:
            spec = LIKELIHOOD[name]
            from scipy import stats

            values = np.asarray(eval(spec.data, {"rng": rng, "np": np, "stats": stats}))
            t = f"t_{name}"
            lines += [f'{col} = pm.Data("{col}", data["{col}"])',
                      f"{t} = {spec.prior.format(t=t)}",
                      f'pm.{name}("obs_{name}", {spec.kwargs.format(t=t)}, observed={col})']
            variables[col] = (tuple(f"{name}_{i}" for i in range(values.ndim)), values)
    # one-row tables for the prior families; NetCDF for observations of differing lengths and ranks
    return Case(case_name, _model("\n".join(lines)), _csv(columns) if columns else _netcdf(variables))


def _seed(text: str) -> int:
    """A stable seed from a name (Python's hash() is salted per process)."""
    import zlib

    return zlib.crc32(text.encode())


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(_seed(name))


def _varying_slopes(rng: np.random.Generator, n_groups: int = 6, per_group: int = 6) -> dict[str, Any]:
    """Columns x, group, y of a regression whose intercept and slope vary by group."""
    n = n_groups * per_group
    idx = np.arange(n) % n_groups
    x = np.round(rng.normal(0.0, 1.0, n), 4)
    a, b = rng.normal(0.0, 1.0, n_groups), rng.normal(0.0, 0.5, n_groups)
    y = np.round(0.5 + a[idx] + (1.0 + b[idx]) * x + rng.normal(0.0, 0.5, n), 4)
    return {"x": x, "group": np.array([f"g{k}" for k in range(n_groups)])[idx], "y": y}


def feature_cases() -> list[Case]:
    """Hand-written models for what a model file may do; each name says what it covers."""
    r = _rng("features")
    n = 24
    x = np.round(r.normal(0.0, 1.0, n), 4)
    group = np.array(["north", "south", "east"])[np.arange(n) % 3]
    code = np.arange(n) % 3
    y = np.round(0.5 + 1.5 * x + np.array([-1.0, 0.0, 1.0])[code] + r.normal(0.0, 0.5, n), 4)
    t = np.arange(n)
    trend = np.round(np.cumsum(r.normal(0.0, 0.3, n)) + r.normal(0.0, 0.2, n), 4)
    counts = r.poisson(np.exp(0.5 + 0.4 * x))
    regression = """
        x = pm.Data("x", data["x"])
        y = pm.Data("y", data["y"])
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 2.0)
    """
    cases = [
        Case("coords-text-labels", _model("""
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            mu_a = pm.Normal("mu_a", 0.0, 5.0)
            sigma_a = pm.HalfNormal("sigma_a", 2.0)
            a = pm.Normal("a", mu_a, sigma_a, dims="groups")
            b = pm.Normal("b", 0.0, 2.0)
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", a[group] + b * x, sigma, observed=y, shape=x.shape)
        """, coords='coords={"groups": data.coords["group"]}'), _csv({"x": x, "group": group, "y": y})),
        # integer codes as the coordinate values (np.unique gives an int64 array) and an int pm.Data index
        Case("coords-integer-array-int-index", _model("""
            site = pm.Data("site", data["site"])
            y = pm.Data("y", data["y"])
            a = pm.Normal("a", 0.0, 5.0, dims="sites")
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", a[site], sigma, observed=y, shape=site.shape)
        """, coords='coords={"sites": np.unique(data["site"])}'), _csv({"site": code, "y": y})),
        Case("coords-range", _model("""
            y = pm.Data("y", data["y"], dims="obs_id")
            mu = pm.Normal("mu", 0.0, 5.0)
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", mu, sigma, observed=y, dims="obs_id")
        """, coords='coords={"obs_id": range(len(data["y"]))}'), _csv({"y": y})),
        Case("coords-none-regression", _model(regression, """
            pm.Normal("y_obs", a + b * x, sigma, observed=y, shape=x.shape)
        """), _csv({"x": x, "y": y})),
        # rank 0: a NetCDF scalar sets the prior scale
        Case("rank0-netcdf-scalar", _model("""
            scale = pm.Data("scale", data["scale"])
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, scale)
            sigma = pm.HalfNormal("sigma", scale)
            pm.Normal("y_obs", mu, sigma, observed=y, shape=y.shape)
        """), _netcdf({"scale": ((), 3.0), "y": (("row",), y)})),
        Case("rank2-netcdf-design-matrix", _model("""
            X = pm.Data("X", data["X"])
            y = pm.Data("y", data["y"])
            beta = pm.Normal("beta", 0.0, 5.0, dims="predictor")
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", pt.dot(X, beta), sigma, observed=y, shape=y.shape)
        """, coords='coords={"predictor": data.coords["predictor"]}'),
             _netcdf({"X": (("row", "predictor"), np.column_stack([np.ones(n), x, x**2])), "y": (("row",), y)},
                     coords={"predictor": ["intercept", "x", "x2"]})),
        # rank 3 with text coordinate labels from the NetCDF file
        Case("rank3-netcdf-text-coords", _model("""
            y = pm.Data("y", data["y"], dims=("site", "year", "rep"))
            mu = pm.Normal("mu", 0.0, 5.0, dims=("site", "year"))
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", mu[:, :, None], sigma, observed=y, dims=("site", "year", "rep"))
        """, coords='coords={k: data.coords[k] for k in ("site", "year", "rep")}'),
             _netcdf({"y": (("site", "year", "rep"), np.round(r.normal(1.0, 1.0, (2, 3, 4)), 4))},
                     coords={"site": ["a", "b"], "year": ["y2020", "y2021", "y2022"],
                             "rep": ["r1", "r2", "r3", "r4"]})),
        Case("deterministic-and-potential", _model(regression, """
            mu = pm.Deterministic("mu", a + b * x)
            pm.Deterministic("slope_ratio", b / sigma)
            pm.Potential("soft_sum_to_one", -0.5 * ((a + b - 1.0) / 0.5) ** 2)
            pm.Normal("y_obs", mu, sigma, observed=y, shape=x.shape)
        """), _csv({"x": x, "y": y})),
        Case("customdist-logp", _model(regression, """
            def logp(value, mu, sigma):
                return pm.logp(pm.Normal.dist(mu, sigma), value)
            pm.CustomDist("y_obs", a + b * x, sigma, logp=logp, observed=y, shape=x.shape)
        """), _csv({"x": x, "y": y})),
        Case("customdist-dist", _model(regression, """
            def dist(mu, sigma, size):
                return pm.math.exp(pm.Normal.dist(mu, sigma, size=size))
            pm.CustomDist("y_obs", a + b * x, sigma, dist=dist, observed=y, shape=x.shape)
        """), _csv({"x": x, "y": np.round(np.exp(0.3 * y), 4)})),
        Case("censored-regression", _model(regression, """
            upper = pm.Data("upper", data["upper"])
            pm.Censored("y_obs", pm.Normal.dist(a + b * x, sigma), lower=None, upper=upper, observed=y,
                        shape=x.shape)
        """), _csv({"x": x, "y": np.minimum(y, 1.5), "upper": np.full(n, 1.5)})),
        Case("truncated-regression", _model(regression, """
            lower = pm.Data("lower", data["lower"])
            pm.Truncated("y_obs", pm.Normal.dist(a + b * x, sigma), lower=lower, upper=None, observed=y,
                         shape=x.shape)
        """), _csv({"x": x[y > -0.5], "y": y[y > -0.5], "lower": np.full(int((y > -0.5).sum()), -0.5)})),
        Case("mixture-of-normals", _model("""
            y = pm.Data("y", data["y"])
            w = pm.Dirichlet("w", np.ones(2))
            mu = pm.Normal("mu", np.array([-2.0, 2.0]), 1.0, transform=pm.distributions.transforms.ordered)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.Mixture("y_obs", w, [pm.Normal.dist(mu[0], sigma), pm.Normal.dist(mu[1], sigma)], observed=y,
                       shape=y.shape)
        """), _csv({"y": np.round(np.where(code == 0, -2.0, 2.0) + r.normal(0.0, 0.7, n), 4)})),
        Case("normal-mixture", _model("""
            y = pm.Data("y", data["y"])
            w = pm.Dirichlet("w", np.ones(2))
            mu = pm.Normal("mu", np.array([-2.0, 2.0]), 1.0, transform=pm.distributions.transforms.ordered)
            sigma = pm.HalfNormal("sigma", 1.0, shape=2)
            pm.NormalMixture("y_obs", w, mu, sigma=sigma, observed=y, shape=y.shape)
        """), _csv({"y": np.round(np.where(code == 0, -2.0, 2.0) + r.normal(0.0, 0.7, n), 4)})),
        Case("zerosumnormal-effects", _model("""
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 5.0)
            effect = pm.ZeroSumNormal("effect", sigma=2.0, dims="groups")
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", mu + effect[group], sigma, observed=y, shape=y.shape)
        """, coords='coords={"groups": data.coords["group"]}'), _csv({"group": group, "y": y})),
        Case("lkj-cholesky-mvnormal", _model("""
            y = pm.Data("y", data["y"])
            chol, corr, sds = pm.LKJCholeskyCov("chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3))
            mu = pm.Normal("mu", 0.0, 5.0, dims="var")
            pm.MvNormal("y_obs", mu, chol=chol, observed=y, shape=y.shape)
        """, coords='coords={"var": data.coords["var"]}'),
             _netcdf({"y": (("row", "var"), np.round(r.multivariate_normal(
                 [0.0, 1.0, -1.0], [[1.0, 0.5, 0.2], [0.5, 1.0, 0.3], [0.2, 0.3, 1.0]], 30), 4))},
                 coords={"var": ["u", "v", "w"]})),
        Case("gaussian-random-walk-trend", _model("""
            y = pm.Data("y", data["y"])
            sigma_rw = pm.HalfNormal("sigma_rw", 0.5)
            trend = pm.GaussianRandomWalk("trend", sigma=sigma_rw, init_dist=pm.Normal.dist(0.0, 1.0),
                                          shape=y.shape)
            sigma = pm.HalfNormal("sigma", 0.5)
            pm.Normal("y_obs", trend, sigma, observed=y, shape=y.shape)
        """), _csv({"y": trend})),
        Case("ar1-observed", _model("""
            y = pm.Data("y", data["y"])
            rho = pm.Uniform("rho", -1.0, 1.0, shape=1)
            sigma = pm.HalfNormal("sigma", 1.0)
            pm.AR("y_obs", rho=rho, sigma=sigma, init_dist=pm.Normal.dist(0.0, 2.0), observed=y,
                  steps=y.shape[0] - 1)
        """), _csv({"y": trend})),
        Case("gp-marginal", _model("""
            t = pm.Data("t", data["t"])
            y = pm.Data("y", data["y"])
            ell = pm.InverseGamma("ell", 5.0, 20.0)
            eta = pm.HalfNormal("eta", 1.0)
            sigma = pm.HalfNormal("sigma", 0.5)
            gp = pm.gp.Marginal(cov_func=eta**2 * pm.gp.cov.ExpQuad(1, ls=ell))
            gp.marginal_likelihood("y_obs", X=t[:, None], y=y, sigma=sigma)
        """), _csv({"t": t[:12].astype(float), "y": trend[:12]})),
        # PyMC imputes NaN in a NumPy observed array (not in a pm.Data): y_obs_unobserved is a free variable
        Case("missing-values-imputed", _model("""
            x = pm.Data("x", data["x"])
            a = pm.Normal("a", 0.0, 5.0)
            b = pm.Normal("b", 0.0, 5.0)
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", a + b * x, sigma, observed=data["y"])
        """), _csv({"x": x, "y": np.where(t % 6 == 0, np.nan, y)})),
        Case("eight-schools-halfcauchy", _model("""
            y = pm.Data("y", data["y"])
            sigma = pm.Data("sigma", data["sigma"])
            mu = pm.Normal("mu", 0.0, 5.0)
            tau = pm.HalfCauchy("tau", 5.0)
            theta_z = pm.Normal("theta_z", 0.0, 1.0, dims="school")
            theta = pm.Deterministic("theta", mu + tau * theta_z, dims="school")
            pm.Normal("y_obs", theta, sigma, observed=y, dims="school")
        """, coords='coords={"school": data.coords["name"]}'),
             _csv({"name": list("ABCDEFGH"), "y": [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0],
                   "sigma": [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]})),
        Case("poisson-regression-int-counts", _model("""
            x = pm.Data("x", data["x"])
            count = pm.Data("count", data["count"])
            a = pm.Normal("a", 0.0, 2.0)
            b = pm.Normal("b", 0.0, 2.0)
            pm.Poisson("count_obs", pm.math.exp(a + b * x), observed=count, shape=x.shape)
        """), _csv({"x": x, "count": counts})),
        Case("ordered-logistic-regression", _model("""
            x = pm.Data("x", data["x"])
            grade = pm.Data("grade", data["grade"])
            b = pm.Normal("b", 0.0, 2.0)
            cut = pm.Normal("cut", np.array([-1.0, 1.0]), 2.0, transform=pm.distributions.transforms.ordered)
            pm.OrderedLogistic("grade_obs", eta=b * x, cutpoints=cut, observed=grade, shape=x.shape)
        """), _csv({"x": x, "grade": np.digitize(x + r.logistic(0.0, 1.0, n), [-1.0, 1.0])})),
        # varying intercepts and slopes with LKJ-correlated group effects (the compile benchmark's slow
        # case): six groups of six rows and its own data, so that pm.sample's chains mix
        Case("lkj-varying-intercept-slope", _model("""
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2.0, sd_dist=pm.Exponential.dist(2.0, shape=2))
            mu = pm.Normal("mu", 0.0, 5.0, dims="coef")
            z = pm.Normal("z", 0.0, 1.0, dims=("groups", "coef"))
            effects = pm.Deterministic("effects", mu + pt.dot(z, chol.T), dims=("groups", "coef"))
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", effects[group, 0] + effects[group, 1] * x, sigma, observed=y, shape=x.shape)
        """, coords='coords={"groups": data.coords["group"], "coef": ["intercept", "slope"]}'),
             _csv(_varying_slopes(_rng("lkj-varying-intercept-slope")))),
        Case("zinb-group-regression", _model("""
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            count = pm.Data("count", data["count"])
            a = pm.Normal("a", 0.0, 2.0)
            b = pm.Normal("b", 0.0, 2.0)
            sigma_g = pm.HalfNormal("sigma_g", 1.0)
            g = pm.Normal("g", 0.0, sigma_g, dims="groups")
            psi = pm.Beta("psi", 2.0, 2.0)
            alpha = pm.Gamma("alpha", 2.0, 0.5)
            pm.ZeroInflatedNegativeBinomial("count_obs", psi=psi, mu=pm.math.exp(a + b * x + g[group]), alpha=alpha,
                                            observed=count, shape=x.shape)
        """, coords='coords={"groups": data.coords["group"]}'),
             _csv({"x": x, "group": group, "count": np.where(r.random(n) < 0.3, 0, counts)})),
        # a shape computed from the data as a Python int rather than dims=
        Case("shape-from-data-python-int", _model("""
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            k = len(data.coords["group"])
            a = pm.Normal("a", 0.0, 5.0, shape=(k,))
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y_obs", a[group], sigma, observed=y, shape=y.shape)
        """), _csv({"group": group, "y": y})),
    ]
    return cases


def cases() -> dict[str, Case]:
    """The whole corpus by name: family models first, then features."""
    found = [family_case(name, families) for name, families in family_groups().items()] + feature_cases()
    return {case.name: case for case in found}


def write_case(case: Case, root: Path, cache_dir: Path) -> Path:
    """Write the case's model file, dataset and batchfit config under ``root/<name>``; return the config."""
    import yaml

    directory = root / case.name
    (directory / "data").mkdir(parents=True, exist_ok=True)
    model = directory / "model.py"
    model.write_text(case.source)
    data = case.write_data(directory / "data")
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(model), "datasets": [str(data)], "sampler": SAMPLER, "batch_size": 1,
        "cache_dir": str(cache_dir), "results_dir": str(directory / "batchfit"),
        "health": {"max_r_hat": 1.1, "min_ess_bulk": 50, "max_divergences": 1000}}))
    return config
