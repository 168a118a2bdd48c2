"""Bundled example: a one-compartment pharmacokinetic model with first-order oral absorption.

Each dataset is one subject's observations from a NONMEM-style table (``ID, TIME, DV, AMT, EVID,
MDV, WT``; config/pk.yaml splits it by ``ID`` and keeps the observation rows, ``EVID == 0``). The
dose and the body weight are one number per subject: ``data.scalar`` returns each as a 0-d array,
entered as ``pm.Data``, so every subject shares one compiled model (a Python ``float`` would be a
constant of the graph: a compile per dose). The dose comes from the side table of dosing records
(config key ``values``), the weight from the subject's rows.
"""

import numpy as np
import pandas as pd
import pymc as pm


def build_model(data):
    """Concentration after a single oral dose: C(t) = dose ka / (V (ka - ke)) (exp(-ke t) - exp(-ka t)),
    ke = CL / V, with CL scaled allometrically by weight; log-normal residual error."""
    with pm.Model() as model:
        time = pm.Data("TIME", data["TIME"])
        conc = pm.Data("DV", data["DV"])
        dose = pm.Data("dose", data.scalar("dose"))
        weight = pm.Data("WT", data.scalar("WT"))
        log_cl = pm.Normal("log_CL", np.log(3.0), 0.5)  # L/h for 70 kg
        log_v = pm.Normal("log_V", np.log(35.0), 0.5)  # L
        log_ka = pm.Normal("log_ka", np.log(1.5), 0.5)  # 1/h
        sigma = pm.HalfNormal("sigma", 0.5)
        cl = pm.Deterministic("CL", pm.math.exp(log_cl) * (weight / 70.0) ** 0.75)
        v = pm.math.exp(log_v)
        ka = pm.math.exp(log_ka)
        ke = cl / v
        pm.Deterministic("t_half", np.log(2.0) / ke)
        mean = dose * ka / (v * (ka - ke)) * (pm.math.exp(-ke * time) - pm.math.exp(-ka * time))
        pm.LogNormal("DV_obs", pm.math.log(mean), sigma, observed=conc, shape=time.shape)
    return model


def simulate(rng: np.random.Generator, n_subjects: int) -> pd.DataFrame:
    """A NONMEM-style table of ``n_subjects`` subjects: a dosing record (``EVID == 1``, ``AMT`` the dose, ``DV``
    empty) then 10 to 12 observations each."""
    rows = []
    times = np.array([0.25, 0.5, 1.0, 2.0, 3.5, 5.0, 7.0, 9.0, 12.0, 24.0, 36.0, 48.0])
    for subject in range(1, n_subjects + 1):
        weight = round(float(rng.uniform(50.0, 95.0)), 1)
        dose = round(float(rng.choice([250.0, 320.0, 400.0])), 1)
        cl = 3.0 * np.exp(rng.normal(0.0, 0.3)) * (weight / 70.0) ** 0.75
        v = 35.0 * np.exp(rng.normal(0.0, 0.2))
        ka = 1.5 * np.exp(rng.normal(0.0, 0.3))
        ke = cl / v
        n_obs = 10 + subject % 3
        observed = np.sort(times[:n_obs] * np.exp(rng.normal(0.0, 0.05, n_obs))).round(2)
        mean = dose * ka / (v * (ka - ke)) * (np.exp(-ke * observed) - np.exp(-ka * observed))
        conc = (mean * np.exp(rng.normal(0.0, 0.15, n_obs))).round(3)
        rows.append({"ID": subject, "TIME": 0.0, "DV": np.nan, "AMT": dose, "EVID": 1, "MDV": 1, "WT": weight})
        rows += [{"ID": subject, "TIME": t, "DV": c, "AMT": 0.0, "EVID": 0, "MDV": 0, "WT": weight}
                 for t, c in zip(observed, conc, strict=True)]
    return pd.DataFrame(rows)
