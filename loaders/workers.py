"""Loader worker processes that start in a fraction of a second.

Each worker is a fresh interpreter (``python -m loaders.workers``, started with
:mod:`subprocess`) that imports only numpy, zstandard and the shard readers — never torch and
never the trainer's main module — so it is reading within a few hundred milliseconds, where a
torch ``DataLoader`` worker first imports torch (seconds). Like ``forkserver`` it inherits no
threads, locks or pooled connections of the trainer.

Protocol: the parent writes one pickle to the worker's stdin, ``(stream, worker, num_workers)``
(:class:`loaders.stream.TextStream`, whose cache travels as its class and config); the worker
writes pickles to its stdout: ``("batches", [PackedBatch, ...])`` per run of batches one packing
made (:meth:`loaders.stream.TextStream.consumer_runs`), then ``("end", peak RSS in MiB)``, or
``("error", message)``. The pipe's buffer bounds how far a worker reads ahead. The parent takes
batches round-robin over the workers, skipping finished ones — the order of
:meth:`loaders.stream.TextStream.rank_batches` — so the batches do not depend on timing.
"""
from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys
import traceback
from typing import Iterator

from .packed import PackedBatch


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (``VmHWM`` of ``/proc/self/status``; 0 where absent).

    Unlike ``getrusage``'s ``ru_maxrss``, it does not carry over the parent's peak across ``exec``.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class WorkerError(RuntimeError):
    """A loader worker failed or died; the message holds its error or exit status."""


def _src_path() -> str:
    """The folder holding the ``loaders`` package (workers must import this very copy)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WorkerPool:
    """Run ``num_workers`` consumers of one rank in worker processes; iterate for their batches.

    Args:
        stream: the rank's :class:`loaders.stream.TextStream` (already :meth:`~TextStream.start` ed).
        num_workers: worker processes (>= 1).
    Raises:
        WorkerError (while iterating): a worker raised (its traceback is in the message) or died.
    """

    def __init__(self, stream, num_workers: int):
        self.peak_rss_mb = 0.0  # the largest finished worker's peak resident memory, MiB
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_path(), env.get("PYTHONPATH", "")) if p)
        payloads = [pickle.dumps((stream, w, num_workers), protocol=pickle.HIGHEST_PROTOCOL) for w in range(num_workers)]
        self.procs = [subprocess.Popen([sys.executable, "-m", "loaders.workers"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env) for _ in range(num_workers)]
        for proc, payload in zip(self.procs, payloads):
            proc.stdin.write(payload)
            proc.stdin.close()

    def _next(self, w: int):
        proc = self.procs[w]
        try:
            kind, item = pickle.load(proc.stdout)
        except (EOFError, pickle.UnpicklingError, OSError) as e:
            code = proc.wait()
            raise WorkerError(f"loader worker {w} (pid {proc.pid}) exited with status {code} without finishing "
                              f"({type(e).__name__}); its log is above, on stderr") from e
        if kind == "error":
            raise WorkerError(f"loader worker {w} failed: {item}")
        return kind, item

    def _fill(self, w: int, into: collections.deque) -> bool:
        """Read worker ``w``'s next run into ``into``; ``False`` when the worker has finished."""
        while not into:
            kind, item = self._next(w)
            if kind == "end":
                self.peak_rss_mb = max(self.peak_rss_mb, float(item or 0.0))
                return False
            into.extend(item)
        return True

    def __iter__(self) -> Iterator[PackedBatch]:
        return (b for run in self.runs() for b in run)

    def runs(self) -> Iterator[list[PackedBatch]]:
        """The batches in round-robin order over the workers (finished ones skipped), as lists: each
        list holds what can be handed on without waiting for a worker."""
        waiting: list[collections.deque] = [collections.deque() for _ in self.procs]
        active = list(range(len(self.procs)))
        try:
            while active:
                run = []
                for w in list(active):
                    if not waiting[w]:
                        if run:  # hand on what is ready before blocking on this worker
                            yield run
                            run = []
                        if not self._fill(w, waiting[w]):
                            active.remove(w)
                            continue
                    run.append(waiting[w].popleft())
                if run:
                    yield run
        finally:
            self.close()

    def close(self) -> None:
        """Stop every worker (also ones that are still reading ahead) and reap them."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            proc.wait()


def _serve() -> int:
    """Worker side: read the job from stdin, write batches to stdout (stderr stays the log)."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a stray print must not corrupt the batch stream
    stream, worker, num_workers = pickle.load(sys.stdin.buffer)
    try:
        for run in stream.consumer_runs(worker, num_workers):
            pickle.dump(("batches", run), out, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.dump(("end", peak_rss_mb()), out)
    except BrokenPipeError:  # the parent stopped reading (end of iteration): nothing to report
        return 0
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the trainer reports it
        return 130
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        pickle.dump(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"), out)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
