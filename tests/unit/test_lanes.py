"""A fit job with more threads than chains: helper processes fit datasets of its batch (`batchfit.fitting.lane_pool`).

The model file here is the bundled hierarchical model (the same graph, so the session's cache
entry serves it) with a gate: the job's own process does not build a dataset until a helper has
built one, so the helper surely takes part, however slowly it starts on a loaded machine.
"""

from __future__ import annotations

import json
import logging
import os
import signal

import numpy as np
import pytest
from testkit import HIERARCHICAL
from testkit.fits import SAMPLER, assert_groups_equal, make_config, read_tree, write_datasets

from batchfit.fitting.batch import fit_batch

GATED_MODEL = f'''
import os, pathlib, signal, time

_source = pathlib.Path({str(HIERARCHICAL)!r}).read_text()
exec(compile(_source, {str(HIERARCHICAL)!r}, "exec"))
_hierarchical = build_model
_builds = 0


def build_model(data):
    """The hierarchical model; builds after a process's first (the reference) are logged and gated."""
    global _builds
    _builds += 1
    marker = pathlib.Path(os.environ["LANES_MARKER"])
    if _builds > 1:
        with open(os.environ["LANES_BUILDS"], "a") as log:
            log.write(f"{{os.getpid()}} {{data.id}}\\n")
        if os.getpid() == int(os.environ["LANES_JOB_PID"]):
            deadline = time.monotonic() + 600
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        elif not marker.exists():
            marker.write_text(str(os.getpid()))
            if os.environ.get("LANES_DIE"):
                os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
    return _hierarchical(data)
'''


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lanes-data")
    write_datasets(root, range(10))
    return root


@pytest.fixture
def gated(tmp_path, monkeypatch):
    model = tmp_path / "gated.py"
    model.write_text(GATED_MODEL)
    monkeypatch.setenv("LANES_MARKER", str(tmp_path / "marker"))
    monkeypatch.setenv("LANES_BUILDS", str(tmp_path / "builds.txt"))
    monkeypatch.setenv("LANES_JOB_PID", str(os.getpid()))
    return model


def builds(tmp_path) -> list[tuple[int, str]]:
    lines = (tmp_path / "builds.txt").read_text().split("\n")
    return [(int(pid), dataset) for pid, dataset in (line.split() for line in lines if line)]


def test_two_lanes_share_the_batch_and_draw_what_one_lane_draws(data_dir, tmp_path, gated, hierarchical_entry,
                                                                 caplog):
    """``chains: 1`` on 2 threads: a helper process fits part of the batch; every dataset is fitted
    once, and every group equals a one-thread fit's, in the batch's order."""
    ids = ["d2", "d5", "d7", "d9", "d4"]
    data = [str(data_dir / "*.csv")]
    sequential = make_config(tmp_path / "one", hierarchical_entry, data, extras=True, sampler={**SAMPLER, "chains": 1})
    fit_batch(sequential, ids, batch_id="b", threads=1)
    config = make_config(tmp_path / "two", hierarchical_entry, data, model=gated, extras=True,
                         columns={"group": {"scope": "dataset"}}, sampler={**SAMPLER, "chains": 1})
    with caplog.at_level(logging.INFO, logger="batchfit"):
        report = fit_batch(config, ids, batch_id="b", threads=2)
    assert [(o.dataset, o.status) for o in report.outcomes] == [(d, "ok") for d in ids], report.outcomes

    built = builds(tmp_path)
    assert sorted(d for _, d in built) == sorted(ids), f"each dataset built once, by one lane: {built}"
    helpers = {pid for pid, _ in built} - {os.getpid()}
    assert len(helpers) == 1, built
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("lane 1: structure ") and "cache hit" in m for m in messages), \
        "the helper's own log lines reach the job's log"
    progress = [m for m in messages if m.startswith("progress: ")]
    assert progress and progress[-1].startswith(f"progress: {len(ids)}/{len(ids)} datasets, "), progress
    manifest = json.loads(config.layout.batch_manifest("b").read_text())
    assert list(manifest["datasets"]) == ids

    for d in ids:
        one, two = read_tree(sequential.layout.fit(d)), read_tree(config.layout.fit(d))
        assert_groups_equal(one, two, groups=("posterior", "posterior_predictive", "observed_data", "constant_data"))
        # The pointwise log-likelihood of a process that compiled its function and of one that
        # loaded it from numba's cache differ in the last bits (3.6e-15 measured, 2026-12-03),
        # with or without lanes; the draws above are bit-identical.
        np.testing.assert_allclose(one["log_likelihood"]["y_obs"], two["log_likelihood"]["y_obs"], rtol=1e-13, atol=0)
    assert not np.array_equal(read_tree(config.layout.fit("d2"))["posterior"]["mu_a"],
                              read_tree(config.layout.fit("d5"))["posterior"]["mu_a"])


def test_a_helper_that_dies_costs_only_the_dataset_it_was_fitting(data_dir, tmp_path, gated, hierarchical_entry,
                                                                  monkeypatch, caplog):
    """The helper is killed (SIGKILL) while building its first dataset: that dataset is recorded as
    failed with the lane's exit, the job's own lane fits the others, and the job ends normally."""
    monkeypatch.setenv("LANES_DIE", "1")
    ids = ["d3", "d6", "d8"]
    config = make_config(tmp_path / "res", hierarchical_entry, [str(data_dir / "*.csv")], model=gated,
                         columns={"group": {"scope": "dataset"}}, sampler={**SAMPLER, "chains": 1})
    with caplog.at_level(logging.INFO, logger="batchfit"):
        report = fit_batch(config, ids, batch_id="b", threads=2)

    [(helper, doomed)] = [(pid, d) for pid, d in builds(tmp_path) if pid != os.getpid()]
    outcomes = {o.dataset: o for o in report.outcomes}
    assert [o.dataset for o in report.outcomes] == ids
    assert outcomes[doomed].status == "failed" and outcomes[doomed].stage == "lane", outcomes[doomed]
    assert f"exit code {-signal.SIGKILL}" in outcomes[doomed].message and doomed in outcomes[doomed].message
    assert all(outcomes[d].status == "ok" and config.layout.fit(d).exists() for d in ids if d != doomed), outcomes
    failure = json.loads(config.layout.failure(doomed).read_text())
    assert failure["stage"] == "lane" and failure["error_type"] == "LaneDied", failure
    assert any(r.levelno == logging.WARNING and f"process {helper}) ended with exit code {-signal.SIGKILL}"
               in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
