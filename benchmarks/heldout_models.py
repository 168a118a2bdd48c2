"""Held-out models for benchmarks/compile.py: models of kinds the parity corpus lacks or writes differently.

Written for the compile benchmark as a new user would write them, before anyone looked at how
they compile, and not changed since to suit batchfit: a figure over them says how batchfit's cold
compile does on models nobody tuned it for (the parity corpus's figures say how it does on the
corpus, which the compile was tuned on). Do not edit a model to make it compile faster; add a new
one instead (and say so in benchmarks/README.md).

Each is a `parity_corpus.Case` (a model file's text and a writer of its one dataset), written
with `parity_corpus.write_case` like the corpus's. Data are simulated from a fixed seed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
from testkit.parity_corpus import Case, _csv, _netcdf

HEADER = "import numpy as np\nimport pymc as pm\nimport pytensor.tensor as pt\n\n\n"


def _source(body: str) -> str:
    return HEADER + textwrap.dedent(body).strip() + "\n"


def _groups(rng: np.random.Generator, n: int, k: int, prefix: str = "g") -> tuple[np.ndarray, np.ndarray]:
    """Row codes (every group present) and their text labels."""
    codes = np.concatenate([np.arange(k), rng.integers(0, k, n - k)])
    return codes, np.array([f"{prefix}{c:02d}" for c in codes])


def lkj_corr_intercepts_slopes() -> Case:
    """Varying intercepts and two slopes, correlated through an LKJ prior (compute_corr=True), non-centred
    as ``z @ chol.T``, the correlation matrix kept as a Deterministic."""
    rng = np.random.default_rng(101)
    n, k = 160, 8
    codes, labels = _groups(rng, n, k)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    effects = rng.multivariate_normal([1.0, 0.5, -0.3], np.diag([0.8, 0.4, 0.3]) ** 2, k)
    y = effects[codes, 0] + effects[codes, 1] * x1 + effects[codes, 2] * x2 + rng.normal(0, 0.5, n)
    source = _source('''
        def build_model(data):
            coords = {"groups": data.coords["group"], "coef": ["intercept", "x1", "x2"],
                      "coef_": ["intercept", "x1", "x2"]}
            with pm.Model(coords=coords) as model:
                group = pm.Data("group", data["group"])
                x1 = pm.Data("x1", data["x1"])
                x2 = pm.Data("x2", data["x2"])
                y = pm.Data("y", data["y"])
                chol, corr, stds = pm.LKJCholeskyCov(
                    "chol_cov", n=3, eta=2.0, sd_dist=pm.HalfNormal.dist(1.0, shape=3), compute_corr=True
                )
                pm.Deterministic("corr", corr, dims=("coef", "coef_"))
                pm.Deterministic("stds", stds, dims="coef")
                mu_beta = pm.Normal("mu_beta", 0.0, 2.0, dims="coef")
                z = pm.Normal("z", 0.0, 1.0, dims=("groups", "coef"))
                beta = pm.Deterministic("beta", mu_beta + z @ chol.T, dims=("groups", "coef"))
                b = beta[group]
                mu = b[:, 0] + b[:, 1] * x1 + b[:, 2] * x2
                sigma = pm.HalfNormal("sigma", 1.0)
                pm.Normal("y_obs", mu, sigma, observed=y, shape=y.shape)
            return model
    ''')
    return Case("heldout-lkj-corr-intercepts-slopes", source,
                _csv({"group": labels, "x1": x1.round(4), "x2": x2.round(4), "y": y.round(4)}))


def crossed_effects_design_matrices() -> Case:
    """Crossed random effects of site and year entering through one-hot design matrices (``Z @ u``),
    fixed effects through ``X @ beta``, a Student-t likelihood."""
    rng = np.random.default_rng(102)
    n, n_site, n_year, p = 150, 6, 5, 3
    site, year = rng.integers(0, n_site, n), rng.integers(0, n_year, n)
    site[:n_site], year[:n_year] = np.arange(n_site), np.arange(n_year)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, p - 1))])
    Z_site, Z_year = np.eye(n_site)[site], np.eye(n_year)[year]
    y = X @ [2.0, 0.7, -0.4] + Z_site @ rng.normal(0, 0.6, n_site) + Z_year @ rng.normal(0, 0.3, n_year)
    y = y + 0.5 * rng.standard_t(5, n)
    source = _source('''
        def build_model(data):
            coords = {"predictor": data.coords["predictor"], "site": data.coords["site"],
                      "year": data.coords["year"]}
            with pm.Model(coords=coords) as model:
                X = pm.Data("X", data["X"])
                Z_site = pm.Data("Z_site", data["Z_site"])
                Z_year = pm.Data("Z_year", data["Z_year"])
                y = pm.Data("y", data["y"])
                beta = pm.Normal("beta", 0.0, 3.0, dims="predictor")
                sd_site = pm.HalfNormal("sd_site", 1.0)
                sd_year = pm.HalfNormal("sd_year", 1.0)
                u_site = pm.Deterministic("u_site", sd_site * pm.Normal("u_site_z", 0.0, 1.0, dims="site"),
                                          dims="site")
                u_year = pm.Deterministic("u_year", sd_year * pm.Normal("u_year_z", 0.0, 1.0, dims="year"),
                                          dims="year")
                mu = X @ beta + Z_site @ u_site + Z_year @ u_year
                nu = pm.Gamma("nu", 2.0, 0.1)
                sigma = pm.HalfNormal("sigma", 1.0)
                pm.StudentT("y_obs", nu=nu, mu=mu, sigma=sigma, observed=y, shape=y.shape)
            return model
    ''')
    return Case("heldout-crossed-effects-design-matrices", source, _netcdf(
        {"X": (("row", "predictor"), X.round(4)), "Z_site": (("row", "site"), Z_site),
         "Z_year": (("row", "year"), Z_year), "y": (("row",), y.round(4))},
        coords={"predictor": ["intercept", "x1", "x2"], "site": [f"s{i}" for i in range(n_site)],
                "year": [f"y{2015 + i}" for i in range(n_year)]}))


def latent_factor_model() -> Case:
    """A two-factor model of four measurements per subject: the subjects' factor scores times the loadings
    (``F @ L.T``), lower-triangular loadings with a positive diagonal, a noise scale per measurement."""
    rng = np.random.default_rng(103)
    n, m, k = 60, 4, 2
    L = np.array([[1.0, 0.0], [0.7, 0.5], [0.4, 0.9], [-0.5, 0.6]])
    Y = rng.normal(size=(n, k)) @ L.T + rng.normal(0, 0.4, (n, m))
    source = _source('''
        def build_model(data):
            coords = {"measure": data.coords["measure"], "factor": ["f1", "f2"]}
            with pm.Model(coords=coords) as model:
                Y = pm.Data("Y", data["Y"])
                n = Y.shape[0]
                diag = pm.HalfNormal("diag", 1.0, dims="factor")
                below = pm.Normal("below", 0.0, 1.0, shape=5)
                L = pt.zeros((4, 2))
                L = pt.set_subtensor(L[0, 0], diag[0])
                L = pt.set_subtensor(L[1, 1], diag[1])
                L = pt.set_subtensor(L[1, 0], below[0])
                L = pt.set_subtensor(L[2:, 0], below[1:3])
                L = pt.set_subtensor(L[2:, 1], below[3:5])
                loadings = pm.Deterministic("loadings", L, dims=("measure", "factor"))
                F = pm.Normal("F", 0.0, 1.0, shape=(n, 2))
                intercept = pm.Normal("intercept", 0.0, 2.0, dims="measure")
                noise = pm.HalfNormal("noise", 1.0, dims="measure")
                pm.Normal("Y_obs", intercept + F @ loadings.T, noise, observed=Y, shape=Y.shape)
            return model
    ''')
    return Case("heldout-latent-factor-model", source,
                _netcdf({"Y": (("subject", "measure"), Y.round(4))}, coords={"measure": ["m1", "m2", "m3", "m4"]}))


def zinb_noncentred_groups() -> Case:
    """Zero-inflated negative binomial counts: a log-linear mean with a non-centred group effect, the
    zero-inflation probability a logistic function of a covariate."""
    rng = np.random.default_rng(104)
    n, k = 200, 10
    codes, labels = _groups(rng, n, k, "plot")
    x, w = rng.normal(size=n), rng.normal(size=n)
    mu = np.exp(1.0 + 0.5 * x + rng.normal(0, 0.5, k)[codes])
    counts = rng.negative_binomial(3.0, 3.0 / (3.0 + mu))
    counts = np.where(rng.random(n) < 1 / (1 + np.exp(-(-0.5 + 0.8 * w))), 0, counts)
    source = _source('''
        def build_model(data):
            with pm.Model(coords={"plots": data.coords["plot"]}) as model:
                plot = pm.Data("plot", data["plot"])
                x = pm.Data("x", data["x"])
                w = pm.Data("w", data["w"])
                count = pm.Data("count", data["count"])
                a = pm.Normal("a", 0.0, 2.0)
                b = pm.Normal("b", 0.0, 1.0)
                sigma_plot = pm.HalfNormal("sigma_plot", 1.0)
                plot_z = pm.Normal("plot_z", 0.0, 1.0, dims="plots")
                plot_effect = pm.Deterministic("plot_effect", sigma_plot * plot_z, dims="plots")
                c0 = pm.Normal("c0", 0.0, 1.5)
                c1 = pm.Normal("c1", 0.0, 1.0)
                zero_prob = pm.math.invlogit(c0 + c1 * w)
                alpha = pm.Gamma("alpha", 2.0, 0.5)
                mu = pm.math.exp(a + b * x + plot_effect[plot])
                pm.ZeroInflatedNegativeBinomial("count_obs", psi=1.0 - zero_prob, mu=mu, alpha=alpha,
                                                observed=count, shape=count.shape)
            return model
    ''')
    return Case("heldout-zinb-noncentred-groups", source,
                _csv({"plot": labels, "x": x.round(4), "w": w.round(4), "count": counts}))


def hurdle_negative_binomial() -> Case:
    """Hurdle counts: whether any at all from a logistic regression with a site effect, how many (given
    some) from a negative binomial regression."""
    rng = np.random.default_rng(105)
    n, k = 180, 6
    codes, labels = _groups(rng, n, k, "site")
    x = rng.normal(size=n)
    some = rng.random(n) < 1 / (1 + np.exp(-(0.3 + 0.9 * x + rng.normal(0, 0.7, k)[codes])))
    counts = np.where(some, 1 + rng.negative_binomial(2.0, 2.0 / (2.0 + np.exp(1.2 + 0.4 * x))), 0)
    source = _source('''
        def build_model(data):
            with pm.Model(coords={"sites": data.coords["site"]}) as model:
                site = pm.Data("site", data["site"])
                x = pm.Data("x", data["x"])
                count = pm.Data("count", data["count"])
                h0 = pm.Normal("h0", 0.0, 1.5)
                h1 = pm.Normal("h1", 0.0, 1.0)
                sd_site = pm.HalfNormal("sd_site", 1.0)
                site_effect = pm.Normal("site_effect", 0.0, sd_site, dims="sites")
                psi = pm.math.sigmoid(h0 + h1 * x + site_effect[site])
                m0 = pm.Normal("m0", 0.0, 2.0)
                m1 = pm.Normal("m1", 0.0, 1.0)
                alpha = pm.Exponential("alpha", 0.5)
                pm.HurdleNegativeBinomial("count_obs", psi=psi, mu=pm.math.exp(m0 + m1 * x), alpha=alpha,
                                          observed=count, shape=count.shape)
            return model
    ''')
    return Case("heldout-hurdle-negative-binomial", source,
                _csv({"site": labels, "x": x.round(4), "count": counts}))


def mixture_of_regressions() -> Case:
    """Two regressions mixed: a Normal one and a heavy-tailed Student-t one with its own line, ordered
    intercepts against label switching."""
    rng = np.random.default_rng(106)
    n = 150
    x = rng.uniform(-2, 2, n)
    first = rng.random(n) < 0.6
    y = np.where(first, -1.0 + 0.8 * x + rng.normal(0, 0.4, n), 2.0 - 0.5 * x + 0.6 * rng.standard_t(4, n))
    source = _source('''
        def build_model(data):
            with pm.Model() as model:
                x = pm.Data("x", data["x"])
                y = pm.Data("y", data["y"])
                w = pm.Dirichlet("w", a=np.array([2.0, 2.0]))
                intercept = pm.Normal("intercept", 0.0, 3.0, shape=2,
                                      transform=pm.distributions.transforms.ordered, initval=np.array([-1.0, 1.0]))
                slope = pm.Normal("slope", 0.0, 2.0, shape=2)
                sigma = pm.HalfNormal("sigma", 1.0, shape=2)
                nu = pm.Gamma("nu", 2.0, 0.2)
                components = [
                    pm.Normal.dist(mu=intercept[0] + slope[0] * x, sigma=sigma[0]),
                    pm.StudentT.dist(nu=nu, mu=intercept[1] + slope[1] * x, sigma=sigma[1]),
                ]
                pm.Mixture("y_obs", w=w, comp_dists=components, observed=y, shape=y.shape)
            return model
    ''')
    return Case("heldout-mixture-of-regressions", source, _csv({"x": x.round(4), "y": y.round(4)}))


def ordered_logistic_groups() -> Case:
    """A five-point rating from two predictors and a rater effect, four ordered cutpoints."""
    rng = np.random.default_rng(107)
    n, k = 200, 8
    codes, labels = _groups(rng, n, k, "rater")
    x1, x2 = rng.normal(size=n), rng.binomial(1, 0.5, n)
    latent = 0.9 * x1 - 0.6 * x2 + rng.normal(0, 0.5, k)[codes] + rng.logistic(size=n)
    rating = np.digitize(latent, [-2.0, -0.7, 0.5, 1.8])
    source = _source('''
        def build_model(data):
            with pm.Model(coords={"raters": data.coords["rater"], "cut": range(4)}) as model:
                rater = pm.Data("rater", data["rater"])
                x1 = pm.Data("x1", data["x1"])
                x2 = pm.Data("x2", data["x2"])
                rating = pm.Data("rating", data["rating"])
                b1 = pm.Normal("b1", 0.0, 1.0)
                b2 = pm.Normal("b2", 0.0, 1.0)
                sd_rater = pm.HalfNormal("sd_rater", 1.0)
                rater_effect = pm.Normal("rater_effect", 0.0, sd_rater, dims="raters")
                cutpoints = pm.Normal("cutpoints", mu=np.array([-2.0, -1.0, 1.0, 2.0]), sigma=2.0, dims="cut",
                                      transform=pm.distributions.transforms.ordered)
                eta = b1 * x1 + b2 * x2 + rater_effect[rater]
                pm.OrderedLogistic("rating_obs", eta=eta, cutpoints=cutpoints, observed=rating,
                                   shape=rating.shape)
            return model
    ''')
    return Case("heldout-ordered-logistic-groups", source,
                _csv({"rater": labels, "x1": x1.round(4), "x2": x2, "rating": rating}))


def gp_sum_of_kernels() -> Case:
    """A marginal GP of a monthly series: a long-term ExpQuad trend plus a yearly Periodic kernel damped
    by an ExpQuad, plus a Matern32 for the short-term wiggle; a linear mean."""
    rng = np.random.default_rng(108)
    t = np.arange(48, dtype=float)
    y = 0.05 * t + np.sin(2 * np.pi * t / 12) + 0.3 * np.sin(t / 3) + rng.normal(0, 0.2, t.size)
    source = _source('''
        def build_model(data):
            with pm.Model() as model:
                t = pm.Data("t", data["t"])
                y = pm.Data("y", data["y"])
                ls_trend = pm.Gamma("ls_trend", 4.0, 0.2)
                eta_trend = pm.HalfNormal("eta_trend", 1.0)
                ls_period = pm.Gamma("ls_period", 4.0, 4.0)
                ls_decay = pm.Gamma("ls_decay", 10.0, 0.2)
                eta_period = pm.HalfNormal("eta_period", 1.0)
                ls_short = pm.Gamma("ls_short", 2.0, 1.0)
                eta_short = pm.HalfNormal("eta_short", 0.5)
                cov = (eta_trend**2 * pm.gp.cov.ExpQuad(1, ls=ls_trend)
                       + eta_period**2 * pm.gp.cov.Periodic(1, period=12.0, ls=ls_period)
                       * pm.gp.cov.ExpQuad(1, ls=ls_decay)
                       + eta_short**2 * pm.gp.cov.Matern32(1, ls=ls_short))
                slope = pm.Normal("slope", 0.0, 0.1)
                intercept = pm.Normal("intercept", 0.0, 1.0)
                gp = pm.gp.Marginal(mean_func=pm.gp.mean.Linear(coeffs=slope, intercept=intercept), cov_func=cov)
                sigma = pm.HalfNormal("sigma", 0.5)
                gp.marginal_likelihood("y_obs", X=t[:, None], y=y, sigma=sigma)
            return model
    ''')
    return Case("heldout-gp-sum-of-kernels", source, _csv({"t": t, "y": y.round(4)}))


def pk_one_compartment() -> Case:
    """Concentrations after one oral dose, one-compartment model in closed form (no ODE): absorption and
    elimination rates and the volume vary by subject (log-normal, non-centred), log-normal error."""
    rng = np.random.default_rng(109)
    k = 10
    times = np.array([0.25, 0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 24.0])
    subject = np.repeat(np.arange(k), times.size)
    t = np.tile(times, k)
    dose = np.repeat(rng.choice([100.0, 200.0], k), times.size)
    ka = np.exp(np.log(1.2) + rng.normal(0, 0.3, k))[subject]
    ke = np.exp(np.log(0.15) + rng.normal(0, 0.2, k))[subject]
    v = np.exp(np.log(20.0) + rng.normal(0, 0.2, k))[subject]
    conc = dose * ka / (v * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t)) * np.exp(rng.normal(0, 0.15, t.size))
    source = _source('''
        def build_model(data):
            coords = {"subjects": data.coords["subject"], "param": ["ka", "ke", "v"]}
            with pm.Model(coords=coords) as model:
                subject = pm.Data("subject", data["subject"])
                time = pm.Data("time", data["time"])
                dose = pm.Data("dose", data["dose"])
                conc = pm.Data("conc", data["conc"])
                log_ka_pop = pm.Normal("log_ka_pop", np.log(1.0), 0.5)
                log_ke_pop = pm.Normal("log_ke_pop", np.log(0.1), 0.5)
                log_v_pop = pm.Normal("log_v_pop", np.log(20.0), 0.5)
                omega = pm.HalfNormal("omega", 0.5, dims="param")
                eta = pm.Normal("eta", 0.0, 1.0, dims=("param", "subjects"))
                ka = pm.Deterministic("ka", pt.exp(log_ka_pop + omega[0] * eta[0]), dims="subjects")
                ke = pm.Deterministic("ke", pt.exp(log_ke_pop + omega[1] * eta[1]), dims="subjects")
                v = pm.Deterministic("v", pt.exp(log_v_pop + omega[2] * eta[2]), dims="subjects")
                ka_i, ke_i, v_i = ka[subject], ke[subject], v[subject]
                pred = dose * ka_i / (v_i * (ka_i - ke_i)) * (pt.exp(-ke_i * time) - pt.exp(-ka_i * time))
                sigma = pm.HalfNormal("sigma", 0.5)
                pm.LogNormal("conc_obs", mu=pt.log(pred), sigma=sigma, observed=conc, shape=conc.shape)
            return model
    ''')
    return Case("heldout-pk-one-compartment", source,
                _csv({"subject": [f"id{s:02d}" for s in subject], "time": t, "dose": dose, "conc": conc.round(5)}))


def censored_weibull_survival() -> Case:
    """Right-censored survival times: a Weibull regression on two covariates, each row's follow-up time
    its censoring bound (``pm.Censored``)."""
    rng = np.random.default_rng(110)
    n = 200
    age, treated = rng.normal(size=n), rng.binomial(1, 0.5, n)
    scale = np.exp(2.0 - 0.3 * age + 0.5 * treated)
    event = scale * rng.weibull(1.5, n)
    follow_up = rng.uniform(3.0, 15.0, n)
    source = _source('''
        def build_model(data):
            with pm.Model() as model:
                age = pm.Data("age", data["age"])
                treated = pm.Data("treated", data["treated"])
                follow_up = pm.Data("follow_up", data["follow_up"])
                time = pm.Data("time", data["time"])
                b0 = pm.Normal("b0", 0.0, 3.0)
                b_age = pm.Normal("b_age", 0.0, 1.0)
                b_treated = pm.Normal("b_treated", 0.0, 1.0)
                shape = pm.Gamma("shape", 2.0, 1.0)
                scale = pt.exp(b0 + b_age * age + b_treated * treated)
                pm.Censored("time_obs", pm.Weibull.dist(alpha=shape, beta=scale), lower=None, upper=follow_up,
                            observed=time, shape=time.shape)
            return model
    ''')
    return Case("heldout-censored-weibull-survival", source, _csv(
        {"age": age.round(4), "treated": treated, "follow_up": follow_up.round(4),
         "time": np.minimum(event, follow_up).round(4)}))


def horseshoe_logistic() -> Case:
    """A logistic regression on twelve predictors under a regularised horseshoe prior (Piironen and
    Vehtari), non-centred."""
    rng = np.random.default_rng(111)
    n, p = 200, 12
    X = rng.normal(size=(n, p))
    beta = np.zeros(p)
    beta[:3] = [1.5, -1.0, 0.8]
    outcome = rng.binomial(1, 1 / (1 + np.exp(-(X @ beta - 0.3))))
    source = _source('''
        def build_model(data):
            with pm.Model(coords={"predictor": data.coords["predictor"]}) as model:
                X = pm.Data("X", data["X"])
                outcome = pm.Data("outcome", data["outcome"])
                n, p = X.shape[0], X.shape[1]
                p0 = 3.0
                tau0 = p0 / (12.0 - p0) / np.sqrt(200.0) * 2.0
                tau = pm.HalfStudentT("tau", nu=2.0, sigma=tau0)
                lam = pm.HalfStudentT("lam", nu=5.0, sigma=1.0, dims="predictor")
                c2 = pm.InverseGamma("c2", 2.0, 8.0)
                lam_tilde = pt.sqrt(c2 * lam**2 / (c2 + tau**2 * lam**2))
                z = pm.Normal("z", 0.0, 1.0, dims="predictor")
                beta = pm.Deterministic("beta", z * tau * lam_tilde, dims="predictor")
                intercept = pm.Normal("intercept", 0.0, 2.0)
                pm.Bernoulli("outcome_obs", logit_p=intercept + X @ beta, observed=outcome, shape=outcome.shape)
            return model
    ''')
    return Case("heldout-horseshoe-logistic", source, _netcdf(
        {"X": (("row", "predictor"), X.round(4)), "outcome": (("row",), outcome)},
        coords={"predictor": [f"x{i:02d}" for i in range(p)]}))


def cases() -> dict[str, Case]:
    """The held-out models by name."""
    found = [lkj_corr_intercepts_slopes(), crossed_effects_design_matrices(), latent_factor_model(),
             zinb_noncentred_groups(), hurdle_negative_binomial(), mixture_of_regressions(), ordered_logistic_groups(),
             gp_sum_of_kernels(), pk_one_compartment(), censored_weibull_survival(), horseshoe_logistic()]
    return {case.name: case for case in found}


def write_all(root: Path, cache_dir: Path) -> dict[str, Any]:
    """Write every held-out case (model, data, config) under ``root``; return their configs by name."""
    from testkit.parity_corpus import write_case

    return {name: write_case(case, root, cache_dir) for name, case in cases().items()}
