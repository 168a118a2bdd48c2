"""Cache keys are exact: models that compile to different code never share an entry, and the
same model always finds its own, whatever the process compiled before.

The unit matrix checks keys directly; the end-to-end tests sweep each pair of models one after
the other with one cache directory and check that the second sweep compiled its own entry and
that its posterior is its own model's (the one ``pm.sample`` gives).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from testkit import write_config

BATCHFIT = Path(sys.executable).parent / "batchfit"

# One template for every variant: the observed likelihood, one extra term and the model options
# are filled in, so each pair differs in exactly one thing.
MODEL = textwrap.dedent("""\
    import numpy as np
    import pymc as pm

    def build_model(data):
        with pm.Model({model_kwargs}) as model:
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 5.0)
            sigma = pm.HalfNormal("sigma", 2.0{sigma_kwargs})
            {likelihood}
            {extra}
        return model
""")
NORMAL = 'pm.Normal("obs", mu, sigma, observed=y, shape=y.shape)'
COMMON = dict(model_kwargs="", sigma_kwargs="", likelihood=NORMAL,
              extra='pm.Potential("pen", -0.5 * mu**2); pm.Deterministic("scaled", mu * 2.0)')
CUSTOM_LOGP = ('pm.CustomDist("obs", mu, sigma, observed=y, shape=y.shape, '
               'logp=lambda v, mu, sigma: pm.logp(pm.Normal.dist(mu{shift}, sigma), v))')
# A penalty through a scipy spline of a parabola centred at 0 (or 3): PyMC's SplineWrapper op holds the
# spline, whose knots and coefficients live in private attributes; no graph input shows them.
SPLINE = ('from scipy.interpolate import InterpolatedUnivariateSpline; '
          'from pymc.distributions.dist_math import SplineWrapper; knots = np.linspace(-20.0, 20.0, 41); '
          'parabola = InterpolatedUnivariateSpline(knots, -0.5 * (knots{shift}) ** 2, k=3); '
          'pm.Potential("pen", SplineWrapper(parabola)(mu))')
CUSTOM_DIST = ('pm.CustomDist("obs", mu, sigma, observed=y, shape=y.shape, '
               'dist=lambda mu, sigma, size: pm.Normal.dist(mu{shift}, sigma, size=size))')

VARIANTS = {
    "common": COMMON,
    "potential changed": {**COMMON, "extra": 'pm.Potential("pen", -2.0 * mu**2); pm.Deterministic("scaled", mu * 2.0)'},
    "deterministic constant changed": {
        **COMMON, "extra": 'pm.Potential("pen", -0.5 * mu**2); pm.Deterministic("scaled", mu * 3.0)'},
    "no transform": {**COMMON, "sigma_kwargs": ", default_transform=None"},
    "other observed distribution": {
        **COMMON, "likelihood": 'pm.StudentT("obs", nu=3.0, mu=mu, sigma=sigma, observed=y, shape=y.shape)'},
    "check_bounds off": {**COMMON, "model_kwargs": "check_bounds=False"},
    "CustomDist logp": {**COMMON, "extra": "", "likelihood": CUSTOM_LOGP.format(shift="")},
    "CustomDist logp shifted": {**COMMON, "extra": "", "likelihood": CUSTOM_LOGP.format(shift=" + 10.0")},
    "CustomDist dist": {**COMMON, "extra": "", "likelihood": CUSTOM_DIST.format(shift="")},
    "CustomDist dist shifted": {**COMMON, "extra": "", "likelihood": CUSTOM_DIST.format(shift=" + 10.0")},
    "spline penalty": {**COMMON, "extra": SPLINE.format(shift="")},
    "spline penalty shifted": {**COMMON, "extra": SPLINE.format(shift=" - 3.0")},
}
# (first sweep, second sweep): the second must get its own key, entry and posterior.
DIFFERENT = [
    ("common", "potential changed"),
    ("common", "deterministic constant changed"),
    ("common", "no transform"),
    ("common", "other observed distribution"),
    ("common", "check_bounds off"),
    ("CustomDist logp", "CustomDist logp shifted"),
    ("CustomDist dist", "CustomDist dist shifted"),
    ("spline penalty", "spline penalty shifted"),
]

# Distributions whose PyMC graphs share interned inner-graph nodes between models: compiling
# one used to change the key of the next one built in the same process.
SHARED_INNER_GRAPHS = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"t": range(len(data["y"]))}) as model:
            y = pm.Data("y", data["y"])
            tau = pm.HalfCauchy("tau", 5.0)
            shape = pm.Weibull("shape", 1.5, 2.0)
            trend = pm.GaussianRandomWalk("trend", sigma=tau, dims="t")
            effect = pm.ZeroSumNormal("effect", sigma=shape, dims="t")
            pm.Normal("obs", trend + effect, 1.0, observed=y, dims="t")
        return model
""")


def write_model(directory: Path, name: str, source: str) -> Path:
    path = directory / f"{name.replace(' ', '_')}.py"
    path.write_text(source)
    return path


def variant_file(directory: Path, name: str) -> Path:
    return write_model(directory, name, MODEL.format(**VARIANTS[name]))


def dataset(name: str, y: np.ndarray):
    from batchfit.data.dataset import Dataset

    return Dataset(id=name, path=Path(f"{name}.csv"), arrays={"y": y}, coords={})


def key_of(model_file: Path, y: np.ndarray) -> str:
    from batchfit.compile.graphs import sampler_key
    from batchfit.model.model_file import build_model, load_model_file

    return sampler_key(build_model(load_model_file(model_file), dataset("d", y)))


Y = np.array([1.2, 0.4, 2.1, 1.7, 0.9, 1.4, 2.6, 0.8])


# --- keys -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("first", "second"), DIFFERENT)
def test_models_that_compile_differently_get_different_keys(tmp_path, first, second):
    assert key_of(variant_file(tmp_path, first), Y) != key_of(variant_file(tmp_path, second), Y)


def test_every_variant_has_its_own_key(tmp_path):
    keys = {name: key_of(variant_file(tmp_path, name), Y) for name in VARIANTS}
    assert len(set(keys.values())) == len(VARIANTS), keys


def test_same_model_same_key_whatever_the_data_lengths(tmp_path):
    model = variant_file(tmp_path, "common")
    assert key_of(model, Y) == key_of(model, np.linspace(0.0, 3.0, 40))


def test_same_key_after_a_compile_in_the_same_process(tmp_path):
    from batchfit.compile.graphs import compile_sampler_functions
    from batchfit.model.model_file import build_model, load_model_file

    model_file = write_model(tmp_path, "shared_inner", SHARED_INNER_GRAPHS)
    before = key_of(model_file, Y)
    compile_sampler_functions(build_model(load_model_file(model_file), dataset("d", Y)))
    assert key_of(model_file, Y) == before


def test_same_key_in_another_process(tmp_path):
    model_file = write_model(tmp_path, "shared_inner", SHARED_INNER_GRAPHS)
    script = textwrap.dedent(f"""
        import numpy as np, sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]  # the module, testkit
        from test_keys import key_of, Y
        from pathlib import Path
        print(key_of(Path({str(model_file)!r}), Y))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == key_of(model_file, Y)


def test_an_edited_helper_beside_the_model_changes_the_key_exactly_when_it_changes_the_graph(tmp_path):
    """The model's likelihood comes from a module beside it: the key follows the graph it builds."""
    source = MODEL.format(**{**COMMON, "likelihood": "likelihoods.observe(mu, sigma, y)"})
    model_file = write_model(tmp_path, "with_helper", "import likelihoods\n" + source)
    helper = tmp_path / "likelihoods.py"
    normal = ("import pymc as pm\n\ndef observe(mu, sigma, y):\n"
              "    return pm.Normal('obs', mu, sigma, observed=y, shape=y.shape)\n")
    helper.write_text(normal)
    first = key_of(model_file, Y)
    helper.write_text(normal + "# a comment shapes no graph\n")
    assert key_of(model_file, Y) == first
    helper.write_text(normal.replace("pm.Normal('obs', mu, sigma,", "pm.StudentT('obs', nu=4.0, mu=mu, sigma=sigma,"))
    assert key_of(model_file, Y) != first


def test_custom_dist_closure_over_data_changes_the_structure(tmp_path):
    """A logp that captures a value from the data compiles differently for each dataset."""
    from batchfit.compile.fingerprint import model_fingerprint
    from batchfit.model.model_file import build_model, load_model_file

    source = MODEL.format(**{**COMMON, "extra": "", "likelihood": (
        'shift = float(data["y"][0]); pm.CustomDist("obs", mu, sigma, observed=y, shape=y.shape, '
        'logp=lambda v, mu, sigma: pm.logp(pm.Normal.dist(mu + shift, sigma), v))')})
    module = load_model_file(write_model(tmp_path, "closure", source))
    first = model_fingerprint(build_model(module, dataset("a", Y)))
    assert model_fingerprint(build_model(module, dataset("b", Y))) == first
    assert model_fingerprint(build_model(module, dataset("c", Y + 1.0))) != first


def test_code_digest_covers_the_callback_generator(tmp_path):
    import batchfit
    from batchfit.common.hashing import package_sources, sources_digest

    def digest(package: Path) -> str:  # what compile.fingerprint.code_digest computes of a package
        return sources_digest(package_sources(package=package), root=package)

    package = Path(batchfit.__file__).parent
    copy = shutil.copytree(package, tmp_path / "batchfit", ignore=shutil.ignore_patterns("__pycache__"))
    assert digest(copy) == digest(package)  # the workflow is package data, no code
    fit_script = copy / "workflow" / "scripts" / "fit.py"
    fit_script.write_text(fit_script.read_text() + "\n# a rule script shapes no compiled code\n")
    assert digest(copy) == digest(package)
    callbacks_py = copy / "compile" / "callbacks.py"
    source = callbacks_py.read_text()
    assert '"    logp[0] = value[()]",' in source
    callbacks_py.write_text(source.replace('"    logp[0] = value[()]",', '"    logp[0] = -value[()]",'))
    assert digest(copy) != digest(package)


# --- end to end: the second sweep's posterior is its own ---------------------------------------

SAMPLER = {"draws": 400, "tune": 400, "chains": 2, "seed": 5}


def sweep(tmp_path: Path, model_file: Path, cache_dir: Path, data_dir: Path) -> dict:
    """Run ``batchfit fit`` for one model in a fresh process; return its manifest and posterior."""
    results = tmp_path / f"results-{model_file.stem}"
    config = write_config(tmp_path / f"{model_file.stem}.yaml", {
        "model": str(model_file), "datasets": [str(data_dir / "*.csv")], "sampler": SAMPLER,
        "cache_dir": str(cache_dir), "results_dir": str(results)})
    proc = subprocess.run([str(BATCHFIT), "fit", "--config", str(config)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [manifest] = [json.loads(p.read_text()) for p in (results / "batches").glob("*.json")]
    import xarray as xr

    tree = xr.open_datatree(results / "fits" / "d.nc")
    return {"compile": manifest["compile"], "posterior": tree["posterior"].to_dataset().load()}


def pm_sample_posteriors(model_files: list[Path], python: Path) -> list[object]:
    """What ``pm.sample`` with nutpie gives for each model on the same data (posterior_checks.reference_posteriors,
    in one process of the reference venv's `python`)."""
    from testkit.posterior_checks import reference_posteriors

    return reference_posteriors(python, [(model_file, dataset("d", Y)) for model_file in model_files],
                                draws=SAMPLER["draws"], tune=SAMPLER["tune"], chains=2, random_seed=11)


@pytest.mark.slow
def test_second_sweep_of_a_different_model_gets_its_own_entry_and_posterior(tmp_path, reference_python):
    from testkit.posterior_checks import assert_same_posterior

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    np.savetxt(data_dir / "d.csv", Y, header="y", comments="", fmt="%.6f")
    cache_dir = tmp_path / "cache"
    files = {name: variant_file(tmp_path, name) for name in VARIANTS}
    seconds = [second for _, second in DIFFERENT]
    references = pm_sample_posteriors([files[name] for name in seconds], reference_python)
    expected = dict(zip(seconds, references, strict=True))
    swept = {}
    for first, second in DIFFERENT:
        for name in (first, second):
            if name not in swept:
                swept[name] = sweep(tmp_path, files[name], cache_dir, data_dir)
        assert swept[second]["compile"].startswith("cache miss"), (first, second, swept[second]["compile"])
        assert_same_posterior(swept[second]["posterior"], expected[second],
                              label=f"{second} swept after {first}")
    shifted, plain = swept["CustomDist logp shifted"]["posterior"], swept["CustomDist logp"]["posterior"]
    assert float(shifted["mu"].mean()) < float(plain["mu"].mean()) - 8.0  # the -10 shift, not a shared entry
