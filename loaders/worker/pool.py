"""Loader worker processes that start in milliseconds (fork) or a fraction of a second (spawn).

``data.worker_start`` picks how a worker starts:

* ``fork`` (default on Linux, as torch's ``DataLoader``): the worker is ``os.fork()`` ed from the
  trainer, so it starts with every module already loaded. Its job runs numpy and zstandard code
  only — never torch, CUDA or the trainer's threads — it re-opens the node cache from its config
  (nothing pooled is shared), resets Ctrl-C to the default and leaves with ``os._exit``.
* ``spawn``: a fresh interpreter (``python -m loaders.worker.pool``) that imports only numpy,
  zstandard and the shard readers (about 0.2 s), inheriting nothing of the trainer.

Protocol: the worker gets ``(stream, worker, num_workers)`` pickled
(:class:`loaders.worker.stream.TextStream`, whose cache pickles as its config: the worker opens its own) and writes
pickles to its pipe: ``("batches", [PackedBatch, ...])`` per run of batches one packing made
(:meth:`loaders.worker.stream.TextStream.consumer_runs`), then ``("end", peak RSS in MiB)``, or
``("error", message)``. The pipe's buffer bounds how far a worker reads ahead. The parent takes
batches round-robin over the workers, skipping finished ones — the order of
:meth:`loaders.worker.stream.TextStream.rank_batches` — so the batches do not depend on timing.
"""
from __future__ import annotations

import collections
import gc
import os
import pickle
import signal
import subprocess
import sys
import traceback
from typing import BinaryIO, Iterator

from loaders.pack.packed import PackedBatch


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


class _Forked:
    """A worker forked from this process: its pid and the read end of its pipe."""

    def __init__(self, job: bytes):
        read, write = os.pipe()
        for f in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice by the child
            f.flush()
        self.pid = os.fork()
        if self.pid == 0:
            gc.freeze()  # the trainer's objects are never collected here: no pause, no copy-on-write of their pages
            os.close(read)
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the process group; the trainer reports it
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                with os.fdopen(write, "wb") as out:
                    code = _work(job, out)
            finally:
                os._exit(code)  # never return into the trainer's code, run its atexit hooks or flush its buffers
        os.close(write)
        self.stdout: BinaryIO = os.fdopen(read, "rb")
        self.status: int | None = None

    def poll(self) -> int | None:
        """Exit status, or ``None`` while running."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def wait(self) -> int:
        """Wait for the worker; its exit status (negative: killed by that signal)."""
        if self.status is None:
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.status

    def kill(self) -> None:
        """SIGKILL the worker."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _spawned(job: bytes) -> subprocess.Popen:
    """A worker in a fresh interpreter, given its job on stdin."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_path(), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "loaders.worker.pool"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env)
    proc.stdin.write(job)
    proc.stdin.close()
    return proc


class WorkerPool:
    """Run ``num_workers`` consumers of one rank in worker processes; iterate for their batches.

    Args:
        stream: the rank's :class:`loaders.worker.stream.TextStream` (already :meth:`~TextStream.start` ed).
        num_workers: worker processes (>= 1).
        start: ``fork`` or ``spawn`` (see the module docstring).
    Raises:
        WorkerError (while iterating): a worker raised (its traceback is in the message) or died.
    """

    def __init__(self, stream, num_workers: int, start: str = "fork"):
        self.peak_rss_mb = 0.0  # the largest finished worker's peak resident memory, MiB
        jobs = [pickle.dumps((stream, w, num_workers), protocol=pickle.HIGHEST_PROTOCOL) for w in range(num_workers)]
        self.procs = [_Forked(job) if start == "fork" else _spawned(job) for job in jobs]

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

    def runs(self, first: int = 0) -> Iterator[list[PackedBatch]]:
        """The batches in round-robin order over the workers from worker ``first`` on (finished ones
        skipped), as lists: each list holds what can be handed on without waiting for a worker."""
        waiting: list[collections.deque] = [collections.deque() for _ in self.procs]
        n = len(self.procs)
        active = [w % n for w in range(first, first + n)]
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


def _work(job: bytes, out: BinaryIO) -> int:
    """Worker side: run the job, write runs of batches to ``out``; the exit status (130: Ctrl-C)."""
    try:
        stream, worker, num_workers = pickle.loads(job)  # the stream's shard source is this worker's own copy
        try:
            for run in stream.consumer_runs(worker, num_workers):
                pickle.dump(("batches", run), out, protocol=pickle.HIGHEST_PROTOCOL)
                out.flush()
        finally:
            stream.cache.close()
        pickle.dump(("end", peak_rss_mb()), out)
        out.flush()
    except BrokenPipeError:  # the parent stopped reading (end of iteration): nothing to report
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        pickle.dump(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"), out)
        out.flush()
        return 1
    return 0


def _serve() -> int:
    """``python -m loaders.worker.pool`` (spawn): the job from stdin, batches to stdout (stderr stays the log)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the batch stream
    return _work(sys.stdin.buffer.read(), out)


if __name__ == "__main__":
    sys.exit(_serve())
