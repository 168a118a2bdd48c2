"""A fit job's sampling lanes: helper processes that fit datasets of the same batch beside it.

A job with more threads than the sampler's chains fits ``threads // chains`` datasets at once.
Each lane is a process of its own: a dataset's Python work (load, build, check, turning the
trace into a DataTree, writing NetCDF) takes this kind of model longer than its sampling, so
lanes sharing one interpreter were held by its GIL and gained nothing over one lane.

The job's own process is lane 0 and starts ``lanes - 1`` helpers (``python -m batchfit.fitting.lane_process``)
first, so their imports and cache load overlap its own. Every lane claims the batch's next
dataset from a counter file under a lock only when it is ready to prepare one, so a lane that
starts late or meets slow datasets simply takes fewer. Helpers report on stdout, one JSON line
each: the datasets they claim, their outcomes and their log records, which the job's log
receives; their stderr goes to the job's log line by line. A helper that dies (killed, out of
memory, a crash in native code) costs only the dataset it was fitting: that dataset is recorded
as failed, and the other lanes fit the rest. A helper whose parent dies sees its stdin close
and exits, so no orphan keeps fitting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from filelock import FileLock

from batchfit.config import Config
from batchfit.fitting.job_inputs import SHARED, JobInputs
from batchfit.records.manifest import Outcome

log = logging.getLogger("batchfit")


LANE_MODULE = "batchfit.fitting.lane_process"  # what a helper runs: python -m LANE_MODULE SPEC
LANE_STAGE = "lane"  # the failure stage of a dataset whose helper process died while fitting it


def lane_count(threads: int, chains: int, n_datasets: int) -> int:
    """How many datasets a job fits at once: one per ``chains`` threads, no more than it has."""
    return max(1, min(threads // max(1, chains), n_datasets))


class Claims:
    """The batch's datasets, handed out one at a time to whichever lane asks first.

    With one lane an in-memory count; with several a counter file under a file lock, which every
    lane of the job (on one machine) shares.
    """

    def __init__(self, dataset_ids: Sequence[str], counter: Path | None = None):
        self.ids = tuple(dataset_ids)
        self.counter = counter
        self._next = 0
        if counter is not None and not counter.exists():
            counter.write_text("0")

    def claim(self) -> int | None:
        """The position of the next unclaimed dataset, now this lane's; None when none is left."""
        if self.counter is None:
            index, self._next = self._next, self._next + 1
        else:
            with FileLock(self.counter.with_suffix(".lock")):
                index = int(self.counter.read_text())
                self.counter.write_text(str(index + 1))
        return index if index < len(self.ids) else None

    def close(self) -> None:
        """Let no lane claim another dataset (the job stops: ``on_error: stop``, or an error)."""
        if self.counter is None:
            self._next = len(self.ids)
        else:
            with FileLock(self.counter.with_suffix(".lock")):
                self.counter.write_text(str(len(self.ids)))

    def __iter__(self) -> Iterator[tuple[int, str]]:
        while (index := self.claim()) is not None:
            yield index, self.ids[index]


@dataclass
class Helper:
    """One helper lane's process and what the job knows of it."""

    number: int
    process: subprocess.Popen
    claimed: set[int] = field(default_factory=set)  # claimed and not yet reported
    ended: bool = False


class Lanes:
    """The helper lanes of one job, and the batch's claims they share with the job's own lane."""

    def __init__(self, config: Config, dataset_ids: Sequence[str], *, threads: int, directory: Path,
                 inputs: JobInputs = SHARED):
        lanes = lane_count(threads, config.sampler.chains, len(dataset_ids))
        self.threads_each = max(1, threads // lanes)
        self.claims = Claims(dataset_ids, directory / "claims" if lanes > 1 else None)
        self.events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self.helpers: list[Helper] = []
        if lanes == 1:
            return
        # The job's Config itself (a frozen dataclass), validated once, when the job read it.
        spec = directory / "lane.pickle"
        spec.write_bytes(pickle.dumps({"config": config, "ids": list(dataset_ids), "counter": str(self.claims.counter),
                                       "threads": self.threads_each, "inputs": inputs}))
        for number in range(1, lanes):
            process = subprocess.Popen([sys.executable, "-m", LANE_MODULE, str(spec)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
            helper = Helper(number, process)
            self.helpers.append(helper)
            for stream, reader in ((process.stdout, self._read_reports), (process.stderr, self._read_stderr)):
                threading.Thread(target=reader, args=(helper, stream), daemon=True,
                                 name=f"batchfit-lane-{number}").start()
        log.info("fitting %d datasets at once: this process and %d helper process(es), %d thread(s) each",
                 lanes, len(self.helpers), self.threads_each)

    def _read_reports(self, helper: Helper, stream: IO[str]) -> None:
        """Pass a helper's report lines to the job's thread; log what is not a report (a model's print)."""
        for line in stream:
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                report = None
            if not isinstance(report, dict):
                log.info("lane %d: %s", helper.number, line.rstrip())
            elif "log" in report:
                logging.getLogger(report["logger"]).log(report["log"], "lane %d: %s", helper.number, report["message"])
            else:
                self.events.put((helper.number, report))
        self.events.put((helper.number, None))  # its stdout closed: it has ended

    @staticmethod
    def _read_stderr(helper: Helper, stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                log.info("lane %d: %s", helper.number, line.rstrip())

    def outcomes(self, own: Iterable[tuple[int, Outcome]]) -> Iterator[tuple[int, Outcome]]:
        """Every lane's (position, Outcome): this process's ``own`` and the helpers', as they come.

        Ends once every dataset of the batch has one, without waiting for a helper still starting
        (`stop` ends it). A dataset whose lane ended before reporting it (the helper was killed or
        crashed) comes as failed; the lanes left fit the rest.
        """
        seen: set[int] = set()

        def noted(items: Iterable[tuple[int, Outcome]]) -> Iterator[tuple[int, Outcome]]:
            for item in items:
                seen.add(item[0])
                yield item

        for item in own:
            yield from noted([item])
            yield from noted(self._reported(block=False))
        while len(seen) < len(self.claims.ids) and not all(h.ended for h in self.helpers):
            yield from noted(self._reported(block=True))
        lost = [i for i in range(len(self.claims.ids)) if i not in seen]  # claimed by a lane that died unreported
        yield from ((i, self._lost(i, "a helper lane")) for i in lost)

    def _reported(self, *, block: bool) -> Iterator[tuple[int, Outcome]]:
        while True:
            try:
                number, report = self.events.get(block=block, timeout=1.0 if block else None)
            except queue.Empty:
                return
            helper = self.helpers[number - 1]
            if report is None:
                yield from self._ended(helper)
            elif "claimed" in report:
                helper.claimed.add(report["claimed"])
            else:
                helper.claimed.discard(report["index"])
                yield report["index"], Outcome(**report["outcome"])
            block = False  # one wait at most: the caller looks again

    def _ended(self, helper: Helper) -> Iterator[tuple[int, Outcome]]:
        helper.ended = True
        code = helper.process.wait()
        if code != 0:
            log.warning("lane %d (process %d) ended with exit code %d%s", helper.number, helper.process.pid, code,
                        "" if helper.claimed else " holding no dataset; the other lanes fit the batch")
        lane = f"lane {helper.number}, process {helper.process.pid}, exit code {code}"
        yield from ((index, self._lost(index, lane)) for index in sorted(helper.claimed))
        helper.claimed.clear()

    def _lost(self, index: int, lane: str) -> Outcome:
        dataset_id = self.claims.ids[index]
        return Outcome(dataset_id, "failed", 0.0, LANE_STAGE, "LaneDied",
                       f"the helper process fitting dataset '{dataset_id}' ({lane}) ended before it finished; "
                       "its last lines in this log say why")

    def stop(self) -> None:
        """End the helpers: at once if the job stops early, else once they have claimed everything."""
        self.claims.close()
        for helper in self.helpers:
            with contextlib.suppress(OSError):
                helper.process.stdin.close()  # a helper exits when its stdin closes
            if helper.process.poll() is None and helper.claimed:
                helper.process.kill()  # the job is stopping with a dataset still running there
        for helper in self.helpers:
            try:
                helper.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                helper.process.kill()
                helper.process.wait()


@contextlib.contextmanager
def lanes(config: Config, dataset_ids: Sequence[str], *, threads: int,
          inputs: JobInputs = SHARED) -> Iterator[Lanes]:
    """The lanes of a fit job for ``dataset_ids``; helpers are started now and ended on leaving.

    ``inputs``: the job's own (`batchfit.fitting.job_inputs`), which a helper prepares from as the job does.
    """
    with tempfile.TemporaryDirectory(prefix="batchfit-lanes-") as directory:
        job_lanes = Lanes(config, dataset_ids, threads=threads, directory=Path(directory), inputs=inputs)
        try:
            yield job_lanes
        finally:
            job_lanes.stop()
