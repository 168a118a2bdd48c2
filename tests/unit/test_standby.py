"""Processes started before their work (`batchfit.common.standby`), with a standard-library module that reads
its work on stdin (``python -m json.tool``) in place of batchfit's workers."""

from __future__ import annotations

import json

import pytest

from batchfit.common.standby import standing_by


def test_take_gives_the_waiting_processes_first_then_new_ones_up_to_the_limit() -> None:
    def works(proc, n: int) -> bool:
        out, _ = proc.communicate(json.dumps({"work": n}).encode())
        return json.loads(out) == {"work": n} and proc.returncode == 0

    with standing_by("json.tool", limit=3, start=2) as standby:
        waiting = list(standby._idle)
        [first] = standby.take(1)
        assert first is waiting[0] and standby.waiting == 1
        assert works(first, 0)
        taken = standby.take(5)  # at most three at once: the one still waiting, then two new
        assert taken[0] is waiting[1] and len(taken) == 3 and standby.waiting == 0
        assert len({proc.pid for proc in [first, *taken]}) == 4
        assert all(works(proc, n) for n, proc in enumerate(taken, start=1))


def test_an_announced_line_reaches_every_process_before_its_work() -> None:
    # json.tool reads all of stdin as one document: the line and the work make one, in that order
    with standing_by("json.tool", limit=2, start=1) as standby:
        standby.announce('["told first",')
        standby.announce('["told first",')  # the same again: nothing more is written
        [waiting, later] = standby.take(2)  # one started before the line, one after
        for proc in (waiting, later):
            out, _ = proc.communicate(b'"then its work"]')
            assert json.loads(out) == ["told first", "then its work"]
        with pytest.raises(ValueError, match="already told"):
            standby.announce('["something else",')


def test_processes_not_taken_are_killed_and_reaped() -> None:
    with standing_by("json.tool", limit=2, start=2) as standby:
        [used] = standby.take(1)
        waiting = list(standby._idle)
        standby.dismiss()
        assert standby.waiting == 0
        assert json.loads(used.communicate(b"[1, 2]")[0]) == [1, 2]  # the one taken still works
    assert len(waiting) == 1
    assert waiting[0].returncode is not None and waiting[0].returncode < 0  # killed, not left to finish


def test_a_block_that_raises_still_kills_its_processes() -> None:
    procs = []
    try:
        with standing_by("json.tool", limit=2, start=2) as standby:
            procs = list(standby._idle)
            raise RuntimeError("the caller failed")
    except RuntimeError:
        pass
    assert len(procs) == 2 and all(proc.returncode is not None for proc in procs)


def test_finish_returns_the_output_and_logs_each_line_of_stderr(caplog) -> None:
    from batchfit.common.standby import finish

    with standing_by("json.tool", limit=2, start=2) as standby:
        good, bad = standby.take(2)
        with caplog.at_level("INFO", logger="batchfit"):
            assert json.loads(finish(good, b'{"a": 1}', "tool").stdout) == {"a": 1}
            failed = finish(bad, b"{not json", "tool")
    assert failed.returncode != 0 and failed.stderr.strip()
    assert [r.getMessage() for r in caplog.records] == [f"tool: {line}" for line in failed.stderr.splitlines()
                                                      if line.strip()]
