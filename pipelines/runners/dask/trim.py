"""Give a Dask worker's freed heap back to the operating system after every task it runs.

:class:`TrimMemory`, a worker plugin :class:`pipelines.runners.dask.runner.ColaflowDaskRunner`
registers on every worker, calls glibc's ``malloc_trim(0)`` (``man 3 malloc_trim``: returns every
free page of the heap, not only its top) after each task, on workers whose environment has
``PYTHONMALLOC=malloc`` (Python objects in glibc's heap rather than CPython's arenas, which
trimming cannot free); elsewhere, and without glibc, it does nothing. Measured effect and cost:
``BENCHMARKS.md`` ("Preprocessing at scale"); settings: ``docs/cluster.md``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

from distributed.diagnostics.plugin import WorkerPlugin

PLUGIN_NAME = "colaflow-trim-memory"  # one registration per cluster; re-registering replaces it


@functools.cache
def _libc_trim():
    """glibc's ``malloc_trim`` as a callable of one ``size_t`` (bytes to keep at the heap's top),
    or ``None`` where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the process's free heap pages to the OS now (``malloc_trim(0)``). Returns whether
    memory was released (``False`` also where glibc is absent). Its time grows with the heap's
    size (glibc walks every free chunk)."""
    trim = _libc_trim()
    return bool(trim(0)) if trim is not None else False


class TrimMemory(WorkerPlugin):
    """Dask worker plugin: on a worker whose environment has ``PYTHONMALLOC=malloc``,
    :func:`trim_heap` each time a task leaves the ``executing`` state (finished, failed or
    cancelled), so the next task starts from what the worker holds; elsewhere nothing.
    ``trims`` counts the calls made on this worker. Register with
    ``client.register_plugin(TrimMemory(), name=PLUGIN_NAME)``."""

    def setup(self, worker) -> None:
        """Decide once per worker whether it trims (``PYTHONMALLOC=malloc`` and glibc present)."""
        self._on = os.environ.get("PYTHONMALLOC") == "malloc" and _libc_trim() is not None
        self.trims = 0

    def transition(self, key, start: str, finish: str, **kwargs) -> None:
        """Trim after a task has run (``start == "executing"``); other transitions are ignored."""
        if start == "executing" and self._on:
            trim_heap()
            self.trims += 1
