"""Loader worker processes that start in milliseconds (fork) or a fraction of a second (spawn),
handing batches over through shared memory.

``data.worker_start`` picks how a worker starts:

* ``fork`` (default on Linux, as torch's ``DataLoader``): the worker is ``os.fork()`` ed from the
  trainer, so it starts with every module already loaded. Its job runs numpy and zstandard code
  only — never torch, CUDA or the trainer's threads — it re-opens the node cache from its config
  (nothing pooled is shared), resets Ctrl-C to the default and leaves with ``os._exit``.
* ``spawn``: a fresh interpreter (``python -m loaders.worker.pool RING_FD``) that imports only numpy,
  zstandard and the shard readers (about 0.2 s), inheriting nothing of the trainer but its ring.

Protocol. Each worker has a ring (:class:`BatchRing`): an anonymous shared file (Linux
``memfd_create``, elsewhere a temporary file unlinked at once; never named in ``/dev/shm``, so
nothing outlives the two processes, however they end) mapped by the parent and the worker. The worker gets ``(stream, worker, num_workers)`` pickled
(:class:`loaders.worker.stream.TextStream`, whose cache pickles as its config: the worker opens its own).
It writes the arrays (token ids, chunk lengths, row counts, resume records, keys as shard and document
numbers, looked up in the parent only if read: :class:`loaders.pack.packed.RefKeys`) of
each run of batches one packing made (:meth:`loaders.worker.stream.TextStream.consumer_runs`) into
the ring as one record (more where the ids' dtype changes or half the ring is full), each field's
arrays of all its batches one after another, and sends only small pickled headers over its pipe:
``("batches", end, [spec, ...])`` per run, ``end`` being the ring position after its records, then
``("end", peak RSS in MiB)``, or ``("error", message)``. The parent copies each record out of the
ring (one ``memcpy``; a batch outlives its ring space), its batches' arrays being views of that copy, and
returns the space by writing ``end`` (8 bytes) to the worker's credit pipe: a worker is at most a
ring ahead, and waits for credit when the ring is full. The parent takes batches round-robin over
the workers, skipping finished ones — the order of :meth:`loaders.worker.stream.TextStream.rank_batches`
— so the batches do not depend on timing.
"""
from __future__ import annotations

import collections
import gc
import math
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import traceback
from typing import BinaryIO, Iterator

import numpy as np

from loaders.pack.packed import KeyLookup, PackedBatch, RefKeys, key_refs

RING_MIN_BYTES = 8 << 20  # a worker's ring: at least this, and 16 full batches of int32 ids (see ring_bytes)
_ALIGN = 64  # records start on cache lines; arrays inside a record on 8 bytes
_CREDIT = struct.Struct("<q")


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


def ring_bytes(micro_batch_tokens: int) -> int:
    """The ring size (bytes) of a worker whose full batches hold ``micro_batch_tokens`` token slots: room
    for 16 such batches of ``int32`` ids, whole pages, and at least :data:`RING_MIN_BYTES`."""
    return max(RING_MIN_BYTES, -(-16 * 4 * micro_batch_tokens // mmap.PAGESIZE) * mmap.PAGESIZE)


def _anonymous_file() -> int:
    """A descriptor of a new file that has no name: a ``memfd`` on Linux, elsewhere a temporary file
    unlinked at once (macOS has no ``memfd_create``); either is freed when its last holder closes it."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("colaflow-batches", os.MFD_CLOEXEC)
    fd, name = tempfile.mkstemp(prefix="colaflow-batches-")  # not inherited: spawn passes it explicitly
    os.unlink(name)
    return fd


class BatchRing:
    """One worker's shared memory: an anonymous file of ``size`` bytes mapped here (see the module docstring).

    Attributes:
        fd: the file's descriptor, until :meth:`release_fd` (once the worker has it).
        view: ``uint8 [size]`` over the mapping.
    """

    def __init__(self, size: int):
        self.fd: int | None = _anonymous_file()
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size)
        self.view = np.frombuffer(self._map, np.uint8)

    def release_fd(self) -> None:
        """Close the descriptor (the mapping stays): the worker holds its own."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Unmap (no batch holds a view: records are copied out) and close the descriptor."""
        self.release_fd()
        self.view = None
        self._map.close()


_FIXED = (np.dtype(np.int32), np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.int64), np.dtype(np.int64))


def _layout(spec: tuple) -> tuple[list[tuple[np.dtype, int, int]], int]:
    """The arrays of a record (one or more batches, each field's arrays one after another) as
    ``(dtype, elements, byte offset)`` in the record, and its size in bytes.

    ``spec`` is a header's ``(offset, ids dtype, ids shapes [(B, T), ...], then per batch: chunks, rows,
    records, keys, worker, document tokens, one document per row)``: ids, ``int32`` lengths, ``int32``
    row counts, ``int64`` resume records (3 each), and the keys as ``int64`` shard numbers and ``int64``
    document indices in their shards (:func:`loaders.pack.packed.key_refs`), each field on 8 bytes."""
    counts = (sum(b * t for b, t in spec[2]), sum(spec[3]), sum(spec[4]), 3 * sum(spec[5]), sum(spec[6]),
              sum(spec[6]))
    out, at = [], 0
    for dt, n in zip((np.dtype(spec[1]), *_FIXED), counts):
        out.append((dt, n, at))
        at += -(-dt.itemsize * n // 8) * 8
    return out, at


def _record_spec(batches: list[PackedBatch], refs: list[tuple[np.ndarray, np.ndarray]]) -> list:
    """The header of a record holding ``batches`` (their keys as ``refs``), its offset still 0 (see :func:`_layout`)."""
    return [0, batches[0].ids.dtype.str, [b.ids.shape for b in batches], [len(b.lens) for b in batches],
            [len(b.row_chunks) for b in batches], [len(b.consumed) for b in batches], [len(s) for s, _ in refs],
            [b.worker for b in batches], [b.doc_tokens for b in batches], [b.one_document for b in batches]]


class _RingWriter:
    """Worker side of a ring: writes the batches of a run as few records, waits for credit from the
    parent when the ring is full.

    Args:
        view: ``uint8`` over the ring; ``credits``: the read end of the credit pipe; ``out``: the header pipe.
    """

    def __init__(self, view: np.ndarray, credits: int, out: BinaryIO):
        self.view, self.size, self.credits, self.out = view, len(view), credits, out
        os.set_blocking(credits, False)
        self.head = 0  # bytes written since the start (ring position: head % size)
        self.freed = 0  # bytes the parent has copied out since the start
        self.pending: list[list] = []  # headers of records written, not yet sent

    def _take_credit(self, wait: bool) -> None:
        """Read the parent's credits (cumulative: the latest counts); ``wait`` for one when none is there.

        Raises:
            BrokenPipeError: the parent has gone.
        """
        if wait:
            select.select([self.credits], [], [])
        try:
            got = os.read(self.credits, 1 << 12)
        except BlockingIOError:
            return
        if not got:
            raise BrokenPipeError("the loader's parent closed the credit pipe")
        self.freed = max(self.freed, _CREDIT.unpack_from(got, len(got) - _CREDIT.size)[0])

    def write_run(self, run: list[PackedBatch]) -> None:
        """Copy the batches of ``run`` into the ring: one record per stretch of batches with one ids dtype
        that fits in half the ring (a record per batch cost ~25 us of numpy calls per batch here, and
        as much again in the parent); their headers go out with the run (:meth:`send`).

        Raises:
            ValueError: a batch's record is larger than the ring.
        """
        batches, keys, size = [], [], 0
        for batch in run:
            k = key_refs(batch.keys)  # references: the parent looks keys up only if it reads them
            # its bytes in a record (see _layout), and up to 8 more per field for alignment
            one = (batch.ids.nbytes + 4 * (len(batch.lens) + len(batch.row_chunks)) + 24 * len(batch.consumed)
                   + 16 * len(k[0]) + 48)
            if batches and (batch.ids.dtype != batches[0].ids.dtype or size + one > self.size // 2):
                self._write(batches, keys)
                batches, keys, size = [], [], 0
            batches.append(batch)
            keys.append(k)
            size += one
        if batches:
            self._write(batches, keys)

    def _write(self, batches: list[PackedBatch], keys: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Copy ``batches`` into the ring as one record, each field's arrays concatenated in place."""
        spec = _record_spec(batches, keys)
        fields, size = _layout(tuple(spec))
        size = -(-size // _ALIGN) * _ALIGN
        if size > self.size:
            raise ValueError(f"a batch record of {size} bytes is larger than the worker's ring ({self.size} bytes)")
        skip = self.size - self.head % self.size if self.head % self.size + size > self.size else 0
        # wait while the ring space the record needs still holds records the parent has not copied out
        # (it needs their headers to do so)
        while self.freed < self.head and self.head + skip + size - self.freed > self.size:
            if self.pending:
                self.send()  # takes the credit already there, which may be enough
            else:
                self._take_credit(wait=True)
        self.head += skip
        at = spec[0] = self.head % self.size
        parts = ([b.ids.reshape(-1) for b in batches], [b.lens for b in batches], [b.row_chunks for b in batches],
                 [b.consumed.reshape(-1) for b in batches], [s for s, _ in keys], [d for _, d in keys])
        for arrays, (dt, n, off) in zip(parts, fields):
            np.concatenate(arrays, out=self.view[at + off:at + off + dt.itemsize * n].view(dt))
        self.head += size
        self.pending.append(spec)

    def send(self) -> None:
        """Send the headers of the records written so far, the ring position after them, and take any credit."""
        if self.pending:
            pickle.dump(("batches", self.head, self.pending), self.out, protocol=pickle.HIGHEST_PROTOCOL)
            self.out.flush()
            self.pending = []
        self._take_credit(wait=False)


def _read_record(view: np.ndarray, spec: tuple, lookup: KeyLookup) -> list[PackedBatch]:
    """Copy the record ``spec`` out of the ring ``view`` (one ``memcpy``: a batch outlives its ring space)
    into new batches, whose arrays are writable views of that copy; their keys are looked up through
    ``lookup`` when read."""
    fields, size = _layout(spec)
    record = view[spec[0]:spec[0] + size].copy()
    ids, lens, rows, consumed, key_shard, key_local = (record[off:off + dt.itemsize * n].view(dt)
                                                       for dt, n, off in fields)
    out = []
    i = c = r = k = e = 0
    for (b, t), nc, nr, nk, ne, worker, doc_tokens, one_doc in zip(*spec[2:]):
        out.append(PackedBatch(ids[i:i + b * t].reshape(b, t), lens[c:c + nc], rows[r:r + nr],
                               RefKeys(key_shard[e:e + ne], key_local[e:e + ne], lookup),
                               consumed[3 * k:3 * (k + nk)].reshape(nk, 3), worker, doc_tokens, one_doc))
        i, c, r, k, e = i + b * t, c + nc, r + nr, k + nk, e + ne
    return out


class _Forked:
    """A worker forked from this process: its pid, its header pipe's read end and its credit pipe's write end."""

    def __init__(self, job: bytes, ring: BatchRing):
        read, write = os.pipe()
        credit_read, credit_write = os.pipe()
        for f in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice by the child
            f.flush()
        self.pid = os.fork()
        if self.pid == 0:
            gc.freeze()  # the trainer's objects are never collected here: no pause, no copy-on-write of their pages
            os.close(read)
            os.close(credit_write)
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the process group; the trainer reports it
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                with os.fdopen(write, "wb") as out:
                    code = _work(job, out, ring.view, credit_read)
            finally:
                os._exit(code)  # never return into the trainer's code, run its atexit hooks or flush its buffers
        os.close(write)
        os.close(credit_read)
        self.stdout: BinaryIO = os.fdopen(read, "rb")
        self.credits: BinaryIO = os.fdopen(credit_write, "wb", buffering=0)  # 8-byte writes, whole
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


class _Spawned(subprocess.Popen):
    """A worker in a fresh interpreter given its ring's descriptor; its job, then its credits, come on stdin."""

    def __init__(self, job: bytes, ring: BatchRing):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_path(), env.get("PYTHONPATH", "")) if p)
        super().__init__([sys.executable, "-m", "loaders.worker.pool", str(ring.fd)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env, pass_fds=(ring.fd,))
        self.stdin.write(_CREDIT.pack(len(job)) + job)
        self.stdin.flush()
        self.credits: BinaryIO = os.fdopen(os.dup(self.stdin.fileno()), "wb", buffering=0)  # 8-byte writes, whole
        self.stdin.close()


class WorkerPool:
    """Run ``num_workers`` consumers of one rank in worker processes; iterate for their batches.

    Args:
        stream: the rank's :class:`loaders.worker.stream.TextStream` (already :meth:`~TextStream.start` ed).
        num_workers: worker processes (>= 1).
        start: ``fork`` or ``spawn`` (see the module docstring).
        ring_size: bytes of each worker's ring (default: :func:`ring_bytes` of the stream's batching mode).
    Raises:
        WorkerError (while iterating): a worker raised (its traceback is in the message) or died.
    """

    def __init__(self, stream, num_workers: int, start: str = "fork", ring_size: int | None = None):
        from loaders.pack.batching import batching

        self.peak_rss_mb = 0.0  # the largest finished worker's peak resident memory, MiB
        self.key_lookup = KeyLookup(stream.open_reader)  # keys of its batches, when read, through a reader of ours
        size = ring_size or ring_bytes(batching(stream.cfg).micro_batch_tokens)
        jobs = [pickle.dumps((stream, w, num_workers), protocol=pickle.HIGHEST_PROTOCOL) for w in range(num_workers)]
        self.rings: list[BatchRing] = []
        self.procs: list = []
        try:
            for job in jobs:
                self.rings.append(BatchRing(size))
                self.procs.append(_Forked(job, self.rings[-1]) if start == "fork" else _Spawned(job, self.rings[-1]))
                self.rings[-1].release_fd()  # the worker has it: the memory goes when both let go
        except BaseException:
            self.close()
            raise

    def _next(self, w: int):
        proc = self.procs[w]
        try:
            msg = pickle.load(proc.stdout)
        except (EOFError, pickle.UnpicklingError, OSError) as e:
            code = proc.wait()
            raise WorkerError(f"loader worker {w} (pid {proc.pid}) exited with status {code} without finishing "
                              f"({type(e).__name__}); its log is above, on stderr") from e
        if msg[0] == "error":
            raise WorkerError(f"loader worker {w} failed: {msg[1]}")
        return msg

    def _fill(self, w: int, into: collections.deque) -> bool:
        """Read worker ``w``'s next run into ``into`` (copied out of its ring, whose space goes back to
        the worker); ``False`` when the worker has finished."""
        while not into:
            msg = self._next(w)
            if msg[0] == "end":
                self.peak_rss_mb = max(self.peak_rss_mb, float(msg[1] or 0.0))
                return False
            _, end, specs = msg
            for spec in specs:
                into.extend(_read_record(self.rings[w].view, spec, self.key_lookup))
            try:
                self.procs[w].credits.write(_CREDIT.pack(end))
            except BrokenPipeError:  # the worker has gone: its next header read says how
                pass
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
        """Stop every worker (also ones that are still reading ahead), reap them and unmap their rings."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            proc.credits.close()
            proc.wait()
        self.procs = []
        for ring in self.rings:
            ring.close()
        self.rings = []


def _work(job: bytes, out: BinaryIO, ring: np.ndarray, credits: int) -> int:
    """Worker side: run the job, write its batches into ``ring`` and their headers to ``out`` (credit
    comes on ``credits``); the exit status (130: Ctrl-C)."""
    try:
        stream, worker, num_workers = pickle.loads(job)  # the stream's shard source is this worker's own copy
        writer = _RingWriter(ring, credits, out)
        try:
            for run in stream.consumer_runs(worker, num_workers):
                writer.write_run(run)
                writer.send()
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
    """``python -m loaders.worker.pool RING_FD`` (spawn): the job then credits from stdin, batch
    headers to stdout (stderr stays the log)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the header stream
    job = _read_exact(0, _CREDIT.unpack(_read_exact(0, _CREDIT.size))[0])
    fd = int(sys.argv[1])
    ring = mmap.mmap(fd, 0)
    os.close(fd)  # the mapping keeps the memory
    return _work(job, out, np.frombuffer(ring, np.uint8), 0)


def _read_exact(fd: int, n: int) -> bytes:
    """``n`` bytes from ``fd`` (unbuffered: the credits that follow the job must stay in the pipe).

    Raises:
        EOFError: the pipe ended first.
    """
    parts = []
    while n:
        got = os.read(fd, n)
        if not got:
            raise EOFError("the loader's parent closed the pipe before the whole job came")
        parts.append(got)
        n -= len(got)
    return b"".join(parts)


if __name__ == "__main__":
    sys.exit(_serve())
