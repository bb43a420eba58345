"""Say so while a Dask job waits on a scheduler that has no worker.

When the last ``dask worker`` dies, dask keeps the job's tasks on the scheduler until a worker
connects again (by design: workers may come back). Without a word, the job then looks hung;
:func:`completed_watching_workers` waits as dask does but prints one line when no worker has been
connected for a while, and again only rarely after that.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

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
            done = wait(futures, timeout=POLL_S, return_when="FIRST_COMPLETED").done
        except TimeoutError:
            done = ()
        for future in done:
            futures.discard(future)
            yield future
        if done:
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
