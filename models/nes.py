"""posteriordb's `nes` model (Gelman & Hill, ch. 4): party identification on ideology and demographics.

Flat priors on ``beta[1..9]`` and ``sigma > 0``, as in posteriordb, so posterior means can be
compared with its reference posterior. Coefficients are labelled 1..9 to match Stan's names.
"""

import numpy as np
import pymc as pm


def build_model(data):
    """partyid7 ~ Normal(X @ beta, sigma) with X built from the survey columns."""
    with pm.Model(coords={"coef": np.arange(1, 10)}) as model:
        real_ideo = pm.Data("real_ideo", data["real_ideo"])
        race_adj = pm.Data("race_adj", data["race_adj"])
        age = pm.Data("age_discrete", data["age_discrete"])
        educ1 = pm.Data("educ1", data["educ1"])
        gender = pm.Data("gender", data["gender"])
        income = pm.Data("income", data["income"])
        partyid7 = pm.Data("partyid7", data["partyid7"])
        beta = pm.Flat("beta", dims="coef")
        sigma = pm.HalfFlat("sigma")
        mu = (beta[0] + beta[1] * real_ideo + beta[2] * race_adj
              + beta[3] * pm.math.eq(age, 2) + beta[4] * pm.math.eq(age, 3) + beta[5] * pm.math.eq(age, 4)
              + beta[6] * educ1 + beta[7] * gender + beta[8] * income)
        pm.Normal("partyid7_obs", mu, sigma, observed=partyid7, shape=partyid7.shape)
    return model
