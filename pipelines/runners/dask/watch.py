"""Waiting on a Dask job: :class:`JobResult` (what ``ColaflowDaskRunner.run_pipeline`` returns)
releases each finished sink partition at once, and says so while the job waits on a scheduler
that has no worker.

When the last ``dask worker`` dies, dask keeps the job's tasks on the scheduler until a worker
connects again (by design: workers may come back). Without a word, the job then looks hung;
:func:`completed_watching_workers` waits as dask does but prints one line when no worker has been
connected for a while, and again only rarely after that.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from apache_beam.runners.dask.dask_runner import DaskRunnerResult
from apache_beam.runners.runner import PipelineState

NO_WORKER_WARN_S = 30.0  # seconds without a worker before the warning
NO_WORKER_REPEAT_S = 600.0  # seconds between repeats of the warning while still no worker is connected
POLL_S = 5.0  # seconds between looks at the scheduler's workers while the job runs


def completed_watching_workers(client, futures: set, out: TextIO | None = None, timeout_s: float | None = None):
    """Yield each future of ``futures`` as it is done (finished, failed or cancelled), removing it
    from the set first, so the caller holds no finished future it does not keep (dask then
    releases its result on the cluster). Meanwhile, each :data:`POLL_S` seconds without one done,
    ask the scheduler for its workers (``client.nthreads()``): after :data:`NO_WORKER_WARN_S`
    seconds with none, write one line to ``out`` (default stderr) naming the scheduler's address
    and the ``dask worker`` command to start, then again every :data:`NO_WORKER_REPEAT_S` seconds
    while there is still none; keep waiting either way (workers may come back).

    The constants are read at call time. Raises ``TimeoutError`` once ``timeout_s`` seconds have
    passed with futures left (``None``: no limit); task errors are left for the caller
    (``future.result()``).
    """
    from distributed import wait

    start = time.monotonic()
    address = client.scheduler.address
    none_since = next_warning = None
    while futures:
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{len(futures)} Dask task(s) of the job still running after {timeout_s:g} s")
        try:
            done = set(wait(futures, timeout=POLL_S, return_when="FIRST_COMPLETED").done)
        except TimeoutError:
            done = set()
        if done:
            while done:
                yield _take(done, futures)  # no local name keeps it while this generator waits
            continue
        try:
            workers = client.nthreads()
        except OSError:  # the scheduler went away: dask cancels the futures, and the next wait returns
            continue
        now = time.monotonic()
        if workers:
            none_since = next_warning = None
            continue
        if none_since is None:
            none_since, next_warning = now, now + NO_WORKER_WARN_S
        if now >= next_warning:
            print(f"warning: no Dask worker has been connected to the scheduler at {address} for "
                  f"{now - none_since:.0f} s; the job waits for one: start `dask worker {address}` "
                  "(docs/cluster.md)", file=out or sys.stderr, flush=True)
            next_warning = now + NO_WORKER_REPEAT_S


def _take(done: set, futures: set):
    """One future out of ``done``, removed from ``futures`` too."""
    future = done.pop()
    futures.discard(future)
    return future


class JobResult(DaskRunnerResult):
    """The running job: one future per sink partition, each released as soon as it completes
    (a result held to the end of the job would keep, on its worker, the state of every task
    upstream of it: a worker forgets a finished task only once no task it still knows depends on
    it, about 5.5 KB each, thousands per worker at 16× the demo corpus). While it waits it says
    when no worker is connected (:func:`completed_watching_workers`); closes
    the client once the job has ended."""

    def wait_until_finish(self, duration=None):
        """Wait for every sink partition (``duration`` in milliseconds, ``None``: no limit) and
        return ``PipelineState.DONE``; raises the first task error, or ``TimeoutError``."""
        self.futures = set(self.futures)  # emptied as they complete; cancel() cancels what is left
        try:
            for future in completed_watching_workers(
                    self.client, self.futures, timeout_s=None if duration is None else duration / 1000):
                future.result()  # raises the task's error here, on the client
            self._state = PipelineState.DONE
        except BaseException:
            self._state = PipelineState.FAILED
            raise
        finally:
            self.client.close()
        return self._state
