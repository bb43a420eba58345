"""Say so while a Dask job waits on a scheduler that has no worker.

When the last ``dask worker`` dies, dask keeps the job's tasks on the scheduler until a worker
connects again (by design: workers may come back). Without a word, the job then looks hung;
:func:`wait_watching_workers` waits as dask does but prints one line when no worker has been
connected for a while, and again only rarely after that.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

NO_WORKER_WARN_S = 30.0  # seconds without a worker before the warning
NO_WORKER_REPEAT_S = 600.0  # seconds between repeats of the warning while still no worker is connected
POLL_S = 5.0  # seconds between looks at the scheduler's workers while the job runs


def wait_watching_workers(client, futures, out: TextIO | None = None, poll_s: float | None = None,
                          warn_after_s: float | None = None, repeat_s: float | None = None) -> None:
    """Block until every future in ``futures`` is done (finished, failed or cancelled), as
    ``distributed.wait`` does; meanwhile, each ``poll_s`` seconds, ask the scheduler for its
    workers (``client.nthreads()``). After ``warn_after_s`` seconds with none, write one line to
    ``out`` (default stderr) naming the scheduler's address and the ``dask worker`` command to
    start, then again every ``repeat_s`` seconds while there is still none; keep waiting either way.

    Defaults (seconds): :data:`POLL_S`, :data:`NO_WORKER_WARN_S`, :data:`NO_WORKER_REPEAT_S`,
    read at call time. Raises nothing of its own; task errors are left for the caller to gather.
    """
    from distributed import wait

    poll_s = POLL_S if poll_s is None else poll_s
    warn_after_s = NO_WORKER_WARN_S if warn_after_s is None else warn_after_s
    repeat_s = NO_WORKER_REPEAT_S if repeat_s is None else repeat_s
    address = client.scheduler.address
    none_since = next_warning = None
    while True:
        try:
            wait(futures, timeout=poll_s)
            return
        except TimeoutError:
            pass
        try:
            workers = client.nthreads()
        except OSError:  # the scheduler went away: dask cancels the futures, and the next wait returns
            continue
        now = time.monotonic()
        if workers:
            none_since = next_warning = None
            continue
        if none_since is None:
            none_since, next_warning = now, now + warn_after_s
        if now >= next_warning:
            print(f"warning: no Dask worker has been connected to the scheduler at {address} for "
                  f"{now - none_since:.0f} s; the job waits for one: start `dask worker {address}` "
                  "(docs/cluster.md)", file=out or sys.stderr, flush=True)
            next_warning = now + repeat_s
