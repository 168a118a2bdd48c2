"""Real data: posteriordb's NES survey years, checked against posteriordb's reference posteriors."""

from __future__ import annotations

import pandas as pd
import pytest
from testkit import REPO

from batchfit.config import config_from_dict
from batchfit.sweep.collect_job import run_collect
from batchfit.sweep.stages import run_compile, run_fit

REPO_MODEL = "models/nes.py"


@pytest.mark.slow
def test_every_posterior_mean_matches_the_reference(nes_dir, session_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = config_from_dict({
        "model": REPO_MODEL,
        "datasets": [str(nes_dir / "nes*.csv")],
        "sampler": {"draws": 1000, "tune": 1000, "chains": 4, "seed": 2026},
        "batch_size": 8,
        "cache_dir": str(session_cache),
        "results_dir": str(tmp_path / "results"),
    })
    run_compile(config)
    assert run_fit(config, threads=2) == 0
    report = run_collect(config)
    assert report.n_failed == 0

    reference = pd.read_csv(nes_dir / "reference_posterior_summary.csv")
    summary = pd.read_csv(config.layout.summary)
    merged = reference.merge(summary, on=["dataset", "parameter"], suffixes=("_ref", ""))
    assert len(merged) == len(reference) == 80  # 8 years x (9 coefficients + sigma)
    z = (merged["mean"] - merged["mean_ref"]).abs() / merged["sd_ref"]
    worst = merged.loc[z.idxmax()]
    assert z.max() < 0.15, f"{worst.dataset} {worst.parameter}: {worst['mean']} vs {worst.mean_ref}"
    # The posterior sd is right too (a sampler stuck in a mode could match means by luck).
    ratio = merged["sd"] / merged["sd_ref"]
    assert ratio.between(0.85, 1.15).all()
