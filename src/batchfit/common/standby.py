"""Python processes started before their work is known, so that their start-up overlaps the caller's.

Starting Python and importing PyMC or ArviZ keeps a core busy for a while. A caller that will
likely hand work to other processes starts them here first, goes on with its own imports and
preparation, and gives each its work on stdin once it knows it: by then they have imported
what the work needs. Each is ``python -m <module>``, whose main imports and then reads its work
from stdin, and must do nothing else before: a process not needed is killed (it has done no
work, and would only finish its imports on a core the caller may want). Something every process
needs before its work, which the caller learns early (the environment the compile workers
import PyTensor under), it tells them with `announce`: one line, which each reads first.

Plain processes rather than ``multiprocessing``: its spawn and forkserver starts run the caller's
``__main__`` file again, which under Snakemake is the rule script itself, and a fork of a process
running threads may deadlock.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("batchfit")


class Standby:
    """Processes of ``python -m <module>``, at most ``limit`` working at once: ``start`` of them start
    now, the others when `take` wants them. Use `standing_by`, whose end kills those not taken."""

    def __init__(self, module: str, limit: int, start: int = 0):
        self.module = module
        self.limit = limit
        self._announced: bytes | None = None
        self._idle = [self._started() for _ in range(min(start, limit))]
        self._dismissed: list[subprocess.Popen] = []

    def _started(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", self.module], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if self._announced is not None:
            _tell(proc, self._announced)
        return proc

    def announce(self, line: str) -> None:
        """Write ``line`` (no newline in it) to every process, waiting or started later, before its work; once.

        Announcing the same line again does nothing; a different one is a caller's error: a
        process may already have acted on the first.
        """
        data = line.encode() + b"\n"
        if self._announced is not None:
            if data != self._announced:
                raise ValueError(f"{self.module}'s processes were already told {self._announced!r}")
            return
        if b"\n" in data[:-1]:
            raise ValueError(f"an announced line must hold no newline: {line!r}")
        self._announced = data
        for proc in self._idle:
            _tell(proc, data)

    @property
    def waiting(self) -> int:
        """The processes started and not yet taken."""
        return len(self._idle)

    def take(self, n: int) -> list[subprocess.Popen]:
        """``n`` processes (at most ``limit``) for the caller to give work: those waiting first, then new ones.

        The caller owns them: it gives each its work and waits for it (`finish`).
        """
        n = min(n, self.limit)
        taken, self._idle = self._idle[:n], self._idle[n:]
        return taken + [self._started() for _ in range(n - len(taken))]

    def dismiss(self) -> None:
        """Kill the processes waiting (no work was written to them), without waiting for them to exit."""
        for proc in self._idle:
            proc.kill()
        self._dismissed += self._idle
        self._idle = []

    def close(self) -> None:
        """Dismiss the processes waiting, and reap those dismissed."""
        self.dismiss()
        for proc in self._dismissed:
            proc.communicate()  # closes our ends of its pipes


@contextmanager
def standing_by(module: str, limit: int, start: int = 0) -> Iterator[Standby]:
    """`Standby` processes of ``module``; those not taken are killed when the block ends."""
    standby = Standby(module, limit, start)
    try:
        yield standby
    finally:
        standby.close()


def _tell(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.flush()
    except BrokenPipeError:  # it died starting: `finish` reports its exit code and stderr
        pass


def finish(proc: subprocess.Popen, work: bytes, name: str) -> subprocess.CompletedProcess:
    """Give ``proc`` (taken from a `Standby`) its ``work`` and wait for it to exit.

    Its stdout is returned; each line of its stderr (warnings, log lines, a traceback) goes to
    our log, after ``name``.
    """
    out, err = proc.communicate(work)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())
    for line in done.stderr.splitlines():
        if line.strip():
            log.info("%s: %s", name, line)
    return done
