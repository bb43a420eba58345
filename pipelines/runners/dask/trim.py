"""Give a Dask worker's freed heap back to the operating system after every task it runs.

A Beam stage's task decodes a partition into many small Python objects, works on them and
frees them. Freed memory stays in the worker's heap (CPython's arenas or glibc's free lists)
wherever a longer-lived object sits on the same page, so a worker's resident memory grows with
the number of tasks it has run, not with what it holds. Measured at 16× the demo corpus on 2
workers (``BENCHMARKS.md``, "Preprocessing at scale"): the worker's memory between tasks rose
from about 160 MB to 300 MB while dask held under 50 MB of results.

Two parts close it, and need each other:

- ``PYTHONMALLOC=malloc`` in the worker's environment (part of the memory-bounded worker
  settings, :func:`tests.support.local_engines.dask_spill_env`, ``docs/cluster.md``): Python
  objects come from glibc's allocator instead of CPython's 1 MiB arenas, which go back to the
  OS only once every object in them is gone.
- :class:`TrimMemory`, a worker plugin :class:`pipelines.runners.dask.runner.ColaflowDaskRunner`
  registers on every worker of the cluster it runs on: after each task it calls glibc's
  ``malloc_trim(0)`` (``man 3 malloc_trim``), which returns every free page of the heap, not
  only its top, as dask's documentation suggests doing by hand ("Memory not released back to
  the OS").

Measured with both, 1× → 16× the demo corpus (``BENCHMARKS.md``): peak RSS per worker
1.10–1.30×, median 1.17× over eight runs (1.23× and 1.31× in two runs without), for about a
fifth more CPU (glibc's allocator is slower for small objects than CPython's). So the plugin
trims only on workers started with ``PYTHONMALLOC=malloc`` (trimming CPython's arenas frees
nothing measurable) and costs nothing elsewhere; on a system without glibc (macOS, musl) it
does nothing.
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
