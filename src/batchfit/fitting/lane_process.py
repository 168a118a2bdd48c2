"""A helper lane: ``python -m batchfit.fitting.lane_process SPEC``, started by `batchfit.fitting.lane_pool`.

It fits the datasets of its job's batch that it claims, reporting each claim, outcome and log
record as a JSON line on stdout; it exits when its stdin closes (its job ended or died).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pickle
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from batchfit.common.quick_exit import quick_exit
from batchfit.fitting.batch import fit_datasets
from batchfit.fitting.fitter import Fitter, prepare
from batchfit.fitting.lane_pool import Claims

log = logging.getLogger("batchfit")


class _ReportHandler(logging.Handler):
    """A helper's log records as report lines on stdout, for the job's log."""

    def __init__(self, out: IO[str], lock: threading.Lock):
        super().__init__(logging.INFO)
        self.out, self.out_lock = out, lock  # not `self.lock`: that is the Handler's own, held around `emit`

    def emit(self, record: logging.LogRecord) -> None:
        _report(self.out, self.out_lock, {"log": record.levelno, "logger": record.name, "message": record.getMessage()})


def _report(out: IO[str], lock: threading.Lock, report: dict[str, Any]) -> None:
    with lock:
        out.write(json.dumps(report) + "\n")
        out.flush()


def _exit_when_orphaned() -> None:
    """Exit once stdin closes: the job ended (its lanes are done) or died (then no orphan fits on).

    Reads the file descriptor, not ``sys.stdin``: a daemon thread blocked inside the buffered
    reader holds its lock, and the interpreter's shutdown, closing stdin, would wait for it.
    """
    while os.read(0, 4096):
        pass
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """A helper lane: fit the batch's datasets this process claims, reporting each on stdout."""
    parser = argparse.ArgumentParser(prog="python -m batchfit.fitting.lane_process")
    parser.add_argument("spec", help="the lane.pickle its job wrote, in a temporary directory of its own")
    spec = pickle.loads(Path(parser.parse_args(argv).spec).read_bytes())
    threading.Thread(target=_exit_when_orphaned, daemon=True, name="batchfit-orphan-watch").start()
    # Reports go to the real stdout only; anything else printed (a model file's print) goes there
    # as a plain line, which the job logs as text.
    out, lock = sys.stdout, threading.Lock()
    logging.getLogger().addHandler(_ReportHandler(out, lock))
    logging.getLogger("batchfit").setLevel(logging.INFO)
    logging.captureWarnings(True)

    # numba's CPU target comes with the job's environment (`batchfit.numba_ops.cputarget`), inherited:
    # this process loads the entries the job loads.
    config = spec["config"]

    cache, _, ref = prepare(config, spec["inputs"], wanted=spec["ids"])
    fitter = Fitter(config, ref, cache, compile_workers=spec["threads"])
    claims = Claims(spec["ids"], Path(spec["counter"]))

    def claimed() -> Iterator[tuple[int, str]]:
        for index, dataset_id in claims:
            _report(out, lock, {"claimed": index})
            yield index, dataset_id

    for index, outcome in fit_datasets(fitter, claimed(), threads=spec["threads"]):
        _report(out, lock, {"index": index, "outcome": dataclasses.asdict(outcome)})
    return 0


if __name__ == "__main__":
    quick_exit(main())  # the work is done, its files closed: no interpreter teardown
