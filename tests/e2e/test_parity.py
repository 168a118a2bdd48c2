"""Parity with ``pm.sample``: every corpus model (tests/testkit/parity_corpus.py) gives batchfit the posterior
that ``pm.sample(nuts_sampler="nutpie")`` gives on the same file.

One session fixture writes the selected models and datasets, then fits them twice: batchfit's
compile and fit stages, and ``pm.sample``, each in runner subprocesses that fit a few models one
after another, two runners at a time (the test process's PyTensor and numba state stays
untouched, and a runner pays its imports once for its models). The reference compiles through
PyTensor's JAX backend where it can, so no op implementation is shared by both sides
(parity_run.fit_reference); its runners run in .venv-reference, which has JAX at the test venv's
pymc, pytensor and nutpie (tests/testkit/venvs.py), so JAX is in no environment batchfit runs in. A
runner that dies is restarted for the models after the one it died on, which is recorded as
crashed. Each model is then one test case comparing the two posteriors (posterior_checks).

A model batchfit cannot fit is a bug to fix; only an understood upstream limitation may be
``xfail(strict=True)``, with its issue: when it starts to pass, the mark must go.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from testkit import parity_corpus, parity_run
from testkit.posterior_checks import SD_RATIO, assert_same_posterior

RUNNER = Path(parity_run.__file__)
MODEL_TIMEOUT = 600  # seconds per model a runner process is given (a few dozen on an idle core)
RUNNERS = 2  # runner processes at a time: CI's two cores (which the other xdist worker shares)
# Models per runner process, each of which pays its imports once. batchfit's side costs about four
# times the reference's (numba against JAX compiling): cut in smaller pieces, it is shared by both
# runners instead of keeping one busy long after the other is done.
MODELS_PER_RUNNER = {"batchfit": 5, "reference": 12}

# Models no batchfit path can fit although pm.sample can, each with the upstream issue that stops
# it (a model batchfit's cached path cannot take goes through nutpie's own compile instead). None now.
XFAIL: dict[str, str] = {}

CASES = parity_corpus.cases()


def _run_side(side: str, python: Path, root: Path, names: list[str], log_name: str) -> None:
    """Fit `names` with one runner process of `python`; after a crash, record it and go on with the rest."""
    log = (root / log_name).open("a")
    remaining = list(names)
    while remaining:
        proc = subprocess.run([str(python), str(RUNNER), side, str(root), *remaining], stdout=log,
                              stderr=subprocess.STDOUT, timeout=MODEL_TIMEOUT * len(remaining), env=os.environ.copy())
        done = [n for n in remaining if (root / n / f"{side}.json").exists()]
        crashed = [n for n in remaining if n not in done and (root / n / f"{side}.started").exists()]
        for name in crashed[:1]:  # the one running when the process died
            (root / name / f"{side}.json").write_text(json.dumps(
                {"status": "failed", "message": f"the process died (exit code {proc.returncode})"}))
        remaining = [n for n in remaining if not (root / n / f"{side}.json").exists()]
        if proc.returncode == 0 and remaining:
            raise RuntimeError(f"{side} runner exited without fitting {remaining}")


def _selected(session: pytest.Session) -> list[str]:
    """The corpus models whose test case this session runs (``-k`` picks a few while developing)."""
    tests = ("test_batchfit_posterior_matches_pm_sample", "test_batchfit_posterior_under_sampler_settings")
    return list(dict.fromkeys(item.callspec.params["name"] for item in session.items
                              if getattr(item, "originalname", "") in tests))


@pytest.fixture(scope="session")
def corpus(request, tmp_path_factory, session_cache, reference_python) -> Path:
    """The selected corpus models fitted by batchfit (in this venv) and by pm.sample (in .venv-reference, with
    JAX); the directory holding the results."""
    root = tmp_path_factory.mktemp("parity")
    names = _selected(request.session)
    for name in names:
        parity_corpus.write_case(CASES[name], root, session_cache)
    start = time.perf_counter()
    python = {"batchfit": Path(sys.executable), "reference": reference_python}
    jobs = []
    for side in ("batchfit", "reference"):
        n_jobs = -(-len(names) // MODELS_PER_RUNNER[side])
        # every n_jobs-th model, so each job mixes large family models with small feature ones
        jobs += [(side, python[side], root, names[j::n_jobs], f"{side}-{j}.log") for j in range(n_jobs)]
    with ThreadPoolExecutor(RUNNERS) as pool:
        for done in [pool.submit(_run_side, *job) for job in jobs]:
            done.result()
    results = {side: [json.loads((root / n / f"{side}.json").read_text()) for n in names]
               for side in ("batchfit", "reference")}
    cpu = {side: sum(r.get("cpu_seconds", 0.0) for r in rs) for side, rs in results.items()}
    numba = [n for n, r in zip(names, results["reference"], strict=True) if r.get("backend") == "numba"]
    print(f"\nparity corpus: {len(names)} models fitted by both in {time.perf_counter() - start:.0f} s "
          f"(CPU: batchfit {cpu['batchfit']:.0f} s, pm.sample {cpu['reference']:.0f} s; "
          f"pm.sample compiled with numba, not JAX: {numba or 'none'})")
    return root


def _result(root: Path, name: str, side: str) -> dict:
    path = root / name / f"{side}.json"
    assert path.exists(), f"{name}: the {side} runner left no result (see {root}/{side}-*.log)"
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL[name])) if name in XFAIL else name
    for name in CASES])
def test_batchfit_posterior_matches_pm_sample(corpus, name):
    import xarray as xr

    reference = _result(corpus, name, "reference")
    assert reference["status"] == "ok", f"{name}: pm.sample fails, so it does not belong in the corpus: " \
                                        f"{reference['message']}"
    ours = _result(corpus, name, "batchfit")
    assert ours["status"] == "ok", f"{name}: batchfit failed: {ours['message']}"
    with xr.open_datatree(corpus / name / "batchfit" / "fits" / "d.nc") as tree:
        posterior = tree["posterior"].to_dataset().load()
    with xr.open_dataset(corpus / name / "reference.nc", engine="h5netcdf") as ref:
        assert_same_posterior(posterior, ref.load(), label=name)


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize("family", parity_run.SETTING_FAMILIES)
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL[name])) if name in XFAIL else name
    for name in CASES])
def test_batchfit_posterior_under_sampler_settings(corpus, name, family):
    """Each family of sampler settings (parity_run.SETTING_FAMILIES) fits every corpus model, and the
    posterior is pm.sample's within the corpus's tolerance: nutpie's low-rank adaptation among them
    gives the posterior of the diagonal adaptation pm.sample's nutpie runs."""
    import xarray as xr

    from batchfit.fitting.sampler_settings import default_settings

    reference = _result(corpus, name, "reference")
    assert reference["status"] == "ok", f"{name}: pm.sample fails: {reference['message']}"
    ours = _result(corpus, name, f"batchfit-{family}")
    assert ours["status"] == "ok", f"{name} under {family}: batchfit failed: {ours['message']}"
    with xr.open_datatree(corpus / name / f"batchfit-{family}" / "fits" / "d.nc") as tree:
        posterior = tree["posterior"].to_dataset().load()
        recorded = json.loads(tree["sample_stats"].attrs["inference_library_settings"])  # what nutpie was given
        kept = set(tree.children)
    settings = {**default_settings(), **parity_run.SETTING_FAMILIES[family]}
    # nutpie records draw_diag as its diag adaptation without the gradient-based estimate
    adaptation = "low_rank" if settings["adaptation"] == "low_rank" else "diag"
    assert (recorded["adaptation"], recorded["settings"]["maxdepth"]) == (adaptation, settings["max_treedepth"])
    mass_matrix = recorded["settings"]["adapt_options"]["mass_matrix_options"]
    if adaptation == "diag":
        assert mass_matrix["use_grad_based_estimate"] == (settings["adaptation"] == "diag")
    assert ({"warmup_posterior", "warmup_sample_stats"} <= kept) == (not settings["discard_tuned_samples"])
    with xr.open_dataset(corpus / name / "reference.nc", engine="h5netcdf") as ref:
        assert_same_posterior(posterior, ref.load(), label=f"{name} under {family}")


def test_every_public_distribution_is_in_the_corpus_or_skipped_with_a_reason():
    import pymc.distributions as pmd

    listed = [set(parity_corpus.PRIOR), set(parity_corpus.LIKELIHOOD), set(parity_corpus.SKIPPED)]
    for name in pmd.__all__:
        assert sum(name in names for names in listed) == 1, f"pymc.distributions.{name}: put it in exactly one " \
                                                            "of PRIOR, LIKELIHOOD or SKIPPED"
    assert not set().union(*listed) - set(pmd.__all__), "the corpus lists names PyMC does not export"
    fitted = {name for families in parity_corpus.family_groups().values() for name in families}
    kinds = {name: parity_corpus.classify(name) for name in pmd.__all__}
    for name, kind in kinds.items():
        if kind in ("continuous", "discrete") and name not in parity_corpus.SKIPPED:
            assert name in fitted, f"{name} ({kind}) is in no corpus model"
        if kind == "discrete":
            assert name not in parity_corpus.PRIOR, f"{name} is discrete: NUTS cannot sample it as a free variable"


def test_comparator_passes_a_right_posterior_and_fails_a_wrong_one():
    """Two independent samples of one posterior agree, heavy-tailed ones included; a shift of 0.75 sd,
    an sd 40% too large or a stuck chain do not."""
    import xarray as xr

    rng = np.random.default_rng(7)

    def posterior(shift: float = 0.0, scale: float = 1.0) -> xr.Dataset:
        # AR(1) chains like MCMC's (autocorrelation 0.5), 2 chains x 400 draws, a scalar and a vector
        def chains(shape: tuple[int, ...]) -> np.ndarray:
            e = rng.normal(size=(2, 400, *shape))
            x = np.empty_like(e)
            x[:, 0] = e[:, 0]
            for i in range(1, 400):
                x[:, i] = 0.5 * x[:, i - 1] + np.sqrt(0.75) * e[:, i]
            return shift + scale * x
        return xr.Dataset({"a": (("chain", "draw"), chains(())),
                           "b": (("chain", "draw", "b_dim_0"), chains((3,)))})

    reference = posterior()
    assert_same_posterior(posterior(), reference, label="right")
    # A heavy tail (Student-t, 2.5 degrees of freedom): independent samples' sds often differ by more
    # than a third, but by less than their Monte Carlo error, so they must pass
    from scipy import stats

    def heavy() -> xr.Dataset:
        return xr.Dataset({"a": (("chain", "draw"), stats.t(2.5).rvs(size=(2, 400), random_state=rng))})

    pairs = [(heavy(), heavy()) for _ in range(20)]
    low, high = SD_RATIO
    assert any(not low <= float(a["a"].std() / b["a"].std()) <= high for a, b in pairs), "no pair tests the rule"
    for i, (a, b) in enumerate(pairs):
        assert_same_posterior(a, b, label=f"heavy tail {i}")
    with pytest.raises(AssertionError, match="mean"):
        assert_same_posterior(posterior(shift=0.75), reference, label="shifted")
    with pytest.raises(AssertionError, match="ratio"):
        assert_same_posterior(posterior(scale=1.4), reference, label="too wide")
    with pytest.raises(AssertionError, match="missing"):
        assert_same_posterior(posterior().drop_vars("b"), reference, label="variable lost")
    stuck = posterior()
    stuck["a"][1] = stuck["a"][1, 0]  # the second chain never moves
    with pytest.raises(AssertionError, match="ours chains did not mix on a"):
        assert_same_posterior(stuck, reference, label="stuck chain")
