"""Faults injected into the preprocessing job's per-split work (:mod:`pipelines.io.resume`): every
split read from the input is logged, and the process SIGKILLs itself once it recorded a given
number of finished splits.

Installed in the process that runs the splits: the DirectRunner's, by running this module as the
job's command line (``python -m tests.support.split_faults --input ... --output ...``, the options of
``beam_runner.py``), or a Dask worker's, by ``dask worker --preload tests.support.split_faults``.
Set by environment variables:

* ``COLAFLOW_TEST_READS``: a file that gets one line per split read, its :func:`~pipelines.io.resume.split_id`.
* ``COLAFLOW_TEST_KILL_AFTER``: SIGKILL the process right after it recorded this many splits (unset or 0: never).
"""
from __future__ import annotations

import os
import signal
import sys

READS = "COLAFLOW_TEST_READS"
KILL_AFTER = "COLAFLOW_TEST_KILL_AFTER"


def install() -> None:
    """Wrap :mod:`pipelines.io.resume`'s ``read_split`` (log each split read to ``$COLAFLOW_TEST_READS``)
    and :meth:`~pipelines.io.resume.WorkFolder.save` (SIGKILL after ``$COLAFLOW_TEST_KILL_AFTER`` records)."""
    import pipelines.io.resume as resume

    reads, kill_after = os.environ.get(READS), int(os.environ.get(KILL_AFTER) or 0)
    read_split, save = resume.read_split, resume.WorkFolder.save
    saved = [0]

    def logged_read(split, *args):
        if reads:
            with open(reads, "a", encoding="utf-8") as f:  # one short append per line: whole lines across processes
                f.write(f"{resume.split_id(split)}\n")
        return read_split(split, *args)

    def save_then_kill(self, split, data):
        save(self, split, data)
        saved[0] += 1
        if kill_after and saved[0] >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    resume.read_split, resume.WorkFolder.save = logged_read, save_then_kill


def dask_setup(worker) -> None:
    """``dask worker --preload`` entry point: :func:`install` in the worker process."""
    install()


if __name__ == "__main__":
    install()
    import beam_runner

    sys.exit(beam_runner.main(sys.argv[1:]))
