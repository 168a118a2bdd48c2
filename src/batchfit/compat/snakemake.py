"""Snakemake: the scheduler's last rate-limit timer, which holds a finished run's exit, and a finished
run's last lines and exit status from its ``onsuccess`` and ``onerror`` handlers."""

from __future__ import annotations


def end_snakemake_rate_timers() -> int:
    """Cancel the timers Snakemake's job scheduler leaves behind when a run ends; return how many.

    After each pass the scheduler (snakemake 9.27, ``JobScheduler._schedule_reevalutation`` in
    ``snakemake/scheduling/job_scheduler.py``) starts a ``threading.Timer`` of the
    ``--max-jobs-per-timespan`` timespan (1 s by default) to look again once its rate limit
    allows. The timer is not a daemon thread, so the interpreter waits for the last one before it
    exits: every run ended a timespan after its last job, a noticeable part of a short sweep.
    Called from the workflow's ``onsuccess``/``onerror``, when the
    scheduler has returned and no job is left; the timer only wakes the scheduler, so cancelling
    it loses nothing.
    The timespan cannot be set shorter instead: Snakemake's parser reads ``100/100ms`` as 100 minutes.
    """
    import threading

    timers = [thread for thread in threading.enumerate() if isinstance(thread, threading.Timer)
              and getattr(thread.function, "__module__", None) == "snakemake.scheduling.job_scheduler"]
    for timer in timers:
        timer.cancel()
    return len(timers)


def exit_run(code: int, text: str) -> None:
    """End a finished Snakemake run from its ``onsuccess`` or ``onerror`` handler with ``text`` as its last
    lines and exit status ``code``.

    Snakemake (9.27, ``Workflow.execute`` in ``snakemake/workflow.py``) calls the handlers inside its
    directory lock's context manager, and its command line (``snakemake.cli.main``) catches
    ``Exception`` only: a ``SystemExit`` from a handler releases the lock and ends the process with
    its code, after the handler's output and without a traceback, and skips the lines Snakemake
    would print after the handler (the log's path, the run time; after ``onerror`` its
    ``WorkflowError``). A run whose every job succeeded has no other way to exit non-zero, nor a
    run any way to end with the handler's lines. ``tests/unit/test_compat.py`` checks this.
    """
    import sys

    print(text, file=sys.stderr, flush=True)
    raise SystemExit(code)
