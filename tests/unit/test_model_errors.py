"""The model author's loop (issue #45): a model that fails to build shows the model's own line on every
surface (`batchfit check`, the notebook functions, `batchfit debug`), once per distinct problem, trimmed
of batchfit's and PyMC's internals; `batchfit debug` runs one dataset as a fit job does.

What the user would see calling their own ``build_model`` is the reference: the line and source of the
model file's frame in the traceback of their own exception.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from testkit import HIERARCHICAL, REPO, output_of, sweep_settings, write_config

import batchfit
from batchfit import cli
from batchfit.errors import ModelCodeError

# PyMC cannot take a shape from a pm.Data for pm.AR (the model): building raises in PyTensor,
# deep under PyMC, with no word of the model file.
AR_MODEL = '''import pymc as pm


def build_model(data):
    with pm.Model() as model:
        fert = pm.Data("fert", data["fert"])
        rho = pm.Normal("rho", 0.0, 1.0)
        pm.AR("ar", rho=[rho], sigma=1.0, observed=fert, shape=fert.shape)
    return model
'''
COUNTRIES = ["ABW", "AFG", "AGO", "ALB", "AND"]


@pytest.fixture
def ar_project(tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project of the issue's kind: five country series, a model that fails for every one of them."""
    (tmp_path / "data").mkdir()
    for i, country in enumerate(COUNTRIES):
        pd.DataFrame({"fert": np.random.default_rng(i).normal(3.0, 0.5, size=12)}).to_csv(
            tmp_path / "data" / f"{country}.csv", index=False)
    (tmp_path / "model.py").write_text(AR_MODEL)
    write_config(tmp_path / "config.yaml", sweep_settings(session_cache, model="model.py"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def users_own_error(project: Path, dataset_id: str) -> tuple[BaseException, traceback.FrameSummary]:
    """The error the user's own build_model raises for a dataset (read as batchfit reads it), and the
    model file's frame in its traceback: what the user would find by calling it themselves."""
    spec = importlib.util.spec_from_file_location("users_model_45", project / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.build_model(batchfit.load_dataset(project / "config.yaml", dataset_id))
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises
        [frame] = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == project / "model.py"]
        return exc, frame
    raise AssertionError("the model built")


def test_notebook_load_dataset_builds_no_model_and_build_model_names_the_models_line(ar_project: Path) -> None:
    data = batchfit.load_dataset("config.yaml", "AFG")  # no model built: no error
    np.testing.assert_allclose(data["fert"], pd.read_csv(ar_project / "data" / "AFG.csv")["fert"])
    own, frame = users_own_error(ar_project, "AFG")

    with pytest.raises(ModelCodeError) as info:
        batchfit.build_model("config.yaml", "AFG")
    error = info.value
    assert str(error).endswith(f"{type(own).__name__}: {own} at model.py:{frame.lineno}")
    assert "dataset 'AFG'" in str(error) and "data/AFG.csv" in str(error)
    cause = error.__cause__
    assert type(cause) is type(own) and str(cause) == str(own)
    frames = traceback.extract_tb(cause.__traceback__)  # what a notebook prints as the cause
    assert (frames[0].filename, frames[0].lineno, frames[0].line) == (frame.filename, frame.lineno, frame.line)
    assert all("/batchfit/" not in f.filename for f in frames)
    assert len(frames) == 2 and "/pymc/" in frames[1].filename  # and the last PyMC frame only
    printed = "".join(traceback.format_exception(error))
    assert f'File "{frame.filename}", line {frame.lineno}' in printed and frame.line in printed
    assert f'File "{frame.filename}", line {frame.lineno}' in error.user_traceback
    assert frame.line in error.user_traceback


def test_check_reports_one_problem_for_every_dataset_failing_alike_with_the_models_line(
        ar_project: Path, capsys: pytest.CaptureFixture) -> None:
    own, frame = users_own_error(ar_project, "ABW")
    assert cli.main(["check", "--config", "config.yaml"]) == 1
    out = capsys.readouterr().out
    expected = f"5 datasets (ABW, AFG, AGO, … 2 more): {type(own).__name__}: {own} at model.py:{frame.lineno}"
    assert [line.strip() for line in out.splitlines() if str(own) in line and "Error" in line] == [
        expected, f"{type(own).__name__}: {own}"], out  # the problem once, and its traceback's last line
    assert f'File "{frame.filename}", line {frame.lineno}, in build_model' in out and frame.line in out
    assert "batchfit/" not in out.replace(str(ar_project), ""), out  # no frame of batchfit's
    assert "check: 5 dataset(s) with 1 distinct problem(s)" in out


def test_debug_without_pdb_prints_the_models_traceback(ar_project: Path, capsys: pytest.CaptureFixture) -> None:
    own, frame = users_own_error(ar_project, "AGO")
    assert cli.main(["debug", "--config", "config.yaml", "AGO", "--no-pdb"]) == 1
    err = capsys.readouterr().err
    assert f"build_model failed for dataset 'AGO' (data/AGO.csv): {type(own).__name__}: {own} at model.py:" in err
    assert f'File "{frame.filename}", line {frame.lineno}, in build_model\n    {frame.line}' in err
    assert "batchfit/" not in err.replace(str(ar_project), ""), err


def test_debug_opens_pdb_at_the_models_frame(ar_project: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    import pdb

    _, frame = users_own_error(ar_project, "ALB")
    seen = []
    monkeypatch.setattr(pdb, "post_mortem", lambda tb: seen.append(tb))
    assert cli.main(["debug", "--config", "config.yaml", "ALB"]) == 1
    [tb] = seen
    while tb.tb_next is not None:  # post_mortem stops at the innermost frame it is given
        tb = tb.tb_next
    assert (tb.tb_frame.f_code.co_filename, tb.tb_lineno) == (frame.filename, frame.lineno)
    assert tb.tb_frame.f_locals["fert"] is not None  # the user's variables, to inspect
    assert "opening pdb" in capsys.readouterr().err


def test_debug_in_pdb_reads_commands_from_stdin(ar_project: Path) -> None:
    """The real pdb, fed commands on stdin: it stops in build_model, at the model's line."""
    _, frame = users_own_error(ar_project, "AND")
    run = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "debug", "--config", "config.yaml", "AND"],
                         input="p [fert.name, rho.name]\nq\n", capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, output_of(run)
    assert f"{frame.filename}({frame.lineno})build_model()" in run.stdout, output_of(run)
    assert "['fert', 'rho']" in run.stdout, output_of(run)  # the model's own variables, in its frame


@pytest.mark.slow
def test_debug_runs_one_dataset_as_a_fit_job_and_samples_a_short_chain(
        tmp_path: Path, hierarchical_entry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfit.compile.fingerprint import structure_of
    from batchfit.model.simulate import simulate_datasets

    simulate_datasets(HIERARCHICAL, tmp_path / "data", 3, seed=4, prefix="s")
    config = write_config(tmp_path / "config.yaml", sweep_settings(hierarchical_entry))
    run = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "debug", "--config", str(config), "s_001",
                          "--draws", "50", "--tune", "50"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    out = run.stdout
    assert run.returncode == 0, output_of(run)
    monkeypatch.chdir(tmp_path)
    model = batchfit.build_model("config.yaml", "s_001")  # the user's model, as the sweep builds it
    rows = len(pd.read_csv("data/s_001.csv"))
    shapes = model.eval_rv_shapes()
    assert f"dataset s_001 (data/s_001.csv): {rows} rows" in out
    for rv in model.free_RVs:
        assert f"{rv.name} {tuple(int(n) for n in shapes[rv.name])}" in out, out
    assert f"structure key {structure_of(model)[:12]}" in out
    assert "cache key " in out and "batchfit's cached callbacks" in out and "(none" not in out, out
    assert "sampled 1 chain of 50 draws after 50 tuning steps" in out and "debug: ok" in out
    assert "mu_a: mean" in out and not (tmp_path / "results").exists()



SIMULATE_MODEL = '''import numpy as np
import pandas as pd


def simulate(rng, index):
    sizes = [5, 4, 3]
    return pd.DataFrame({"y": rng.normal(size=sizes[index])})


def build_model(data):
    raise NotImplementedError
'''


def test_simulate_that_raises_shows_the_models_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`batchfit simulate`'s third call raises in the model's simulate: the message names its line, and the
    command prints the model's own frame, as the user's own call of simulate shows it."""
    (tmp_path / "model.py").write_text(SIMULATE_MODEL)
    spec = importlib.util.spec_from_file_location("simulate_model_45", tmp_path / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(IndexError) as own:
        module.simulate(np.random.default_rng(0), 3)
    [frame] = [f for f in traceback.extract_tb(own.value.__traceback__) if f.filename == str(tmp_path / "model.py")]

    out = tmp_path / "out"
    assert cli.main(["simulate", "--model", str(tmp_path / "model.py"), "--n", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"simulate(rng, 3) of model file {tmp_path / 'model.py'} failed: IndexError: {own.value} at model.py:" \
           f"{frame.lineno}" in err, err
    assert f'File "{frame.filename}", line {frame.lineno}, in simulate\n    {frame.line}' in err, err
    assert "batchfit/" not in err.replace(str(tmp_path), ""), err
    assert sorted(p.name for p in out.iterdir()) == ["dataset_000.csv", "dataset_001.csv", "dataset_002.csv"]


def readme_block(after: str, index: int = 0) -> list[str]:
    """The lines of the ``index``-th fenced block after the README heading ``after``."""
    text = (REPO / "README.md").read_text().split(after, 1)[1]
    return text.split("```")[2 * index + 1].strip("\n").splitlines()


def test_the_readmes_debug_loop_is_what_check_and_debug_print(ar_project: Path, capsys: pytest.CaptureFixture) -> None:
    """README's "When the model fails" shows `batchfit check`'s report and the pdb prompt of `batchfit debug`
    for a model whose pm.AR line is the one the README quotes: both as batchfit prints them today."""
    import pymc

    [line] = [li.strip() for li in readme_block("### When the model fails") if li.strip().startswith("pm.AR(")]
    model = AR_MODEL.replace('        pm.AR("ar", rho=[rho], sigma=1.0, observed=fert, shape=fert.shape)\n',
                             '        sigma = pm.HalfNormal("sigma", 1.0)\n        ' + line + "\n")
    assert line in model
    (ar_project / "model.py").write_text(model)
    assert cli.main(["check", "--config", "config.yaml"]) == 1
    printed = capsys.readouterr().out.splitlines()
    shown = [li.replace("/home/me/my-project", str(ar_project)).replace(".../pymc", str(Path(pymc.__file__).parent))
             for li in readme_block("### When the model fails")]
    # PyMC's own line number moves with PyMC's patch releases; the frame's file and function must not.
    printed, shown = ([re.sub(r'(pymc/.*", line )\d+', r"\1N", li) for li in lines] for lines in (printed, shown))
    start = printed.index(shown[0])
    assert printed[start:start + len(shown)] == shown, "\n".join(printed)

    prompt = [li.replace("/home/me/my-project", str(ar_project)) for li in readme_block("### When the model fails", 1)]
    command = prompt[2].removeprefix("(Pdb) ")
    run = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "debug", "--config", "config.yaml", "AFG"],
                         input=f"{command}\nq\n", capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, output_of(run)
    assert "\n".join([*prompt[:2], f"(Pdb) {prompt[3]}"]) in run.stdout, output_of(run)
