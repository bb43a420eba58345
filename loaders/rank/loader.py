"""The text loader of one rank: packed batches from worker processes, with an exact resume state."""
from __future__ import annotations

import collections
import logging
import threading
import time
from hashlib import sha256
from typing import Callable, Generator, Iterator

import numpy as np
import torch

from loaders.config import DataConfig
from loaders.order.progress import Progress, deal_fits
from loaders.order.split import plan_split
from loaders.pack.batching import BestFit, batching
from loaders.protocols import ShardSource, Sources
from loaders.rank.batch import TokenBatch
from loaders.rank.steps import StepCounts, StepSync, equal_steps, padding_batch, torch_step_sync
from loaders.rank.world import resolve_ranks_per_node, resolve_world
from loaders.sources import build_sources, require_shard_source
from loaders.worker.pool import WorkerPool
from loaders.worker.stream import TextStream
from shards import Manifest

log = logging.getLogger(__name__)

# delivered batches whose consumed records are applied to the resume state at once: its sorts cost about
# half as much per batch at 256 as at 64 (long documents: 5 against 10 us a batch); the records held
# meanwhile are ~1 MB on short documents
RECORD_EVERY = 256


def dataset_fingerprint(manifest: Manifest) -> str:
    """sha256 over the shards' names, sample counts and digests (a state loads only into the same data)."""
    h = sha256()
    for s in manifest.shards:
        h.update(f"{s.name}\0{s.samples}\0{s.sha256}\n".encode())
    return h.hexdigest()[:16]


def chunk_tokens(batch: TokenBatch) -> np.ndarray:
    """Tokens of each chunk entry (``n_chunks > 0``) of ``batch.consumed``, in that order (``int64``).

    Chunk entries are listed row by row, in row order (empty/bad documents, ``n_chunks == 0``,
    before them), and a chunk's tokens are the row's tokens with its ``document_ids`` value.

    Raises:
        RuntimeError: the batch's rows and its ``consumed`` list disagree.
    """
    if batch.packed is not None:  # chunk lengths in row order: no need to expand the batch
        return batch.packed.lens.astype(np.int64)
    docs = batch.document_ids.cpu().numpy()
    lengths = [np.bincount(row[row >= 0]) for row in docs]
    out = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
    expected = int(np.count_nonzero(batch.consumed[:, 2] > 0))
    if len(out) != expected:
        raise RuntimeError(f"batch lists {expected} chunks but its rows hold {len(out)}: cannot count tokens per source")
    return out.astype(np.int64)


class TextLoader:
    """Resumable loader of one rank over its :class:`loaders.protocols.Sources` (one dataset or a
    mixture): iterate it for one epoch of :class:`TokenBatch` es. A :class:`loaders.protocols.RankLoader`.

    Args:
        cfg: ``data:`` settings.
        sources: what is read (:func:`loaders.sources.build_sources`).
        cache: where local shard files come from (``cache.ShardCache``, or
            :class:`loaders.read.shard_reader.LocalShards`).
        rank, world_size: this process's place in the job.
        in_process: run the worker streams in this process (same batches, no worker processes).
        step_sync: step agreement across ranks (default: ``torch.distributed`` all-reduce when
            initialised; see :mod:`loaders.rank.steps`).
        ranks_per_node: ranks sharing one node's cache (``None``: ``data.ranks_per_node``, else torchrun's
            ``LOCAL_WORLD_SIZE``, else one node; :func:`loaders.rank.world.resolve_ranks_per_node`).

    Attributes:
        data_wait_seconds: seconds the last ``next()`` waited for its batch (trainer step metric).
        progress: the resume state (see :mod:`loaders.order.progress`).
        stream: the rank's :class:`loaders.worker.stream.TextStream` (what worker processes run).
    Raises:
        ValueError: an invalid config (the message names the field), ``rank`` out of range, or ranks
            per node that do not divide the world size.
    """

    def __init__(self, cfg: DataConfig, sources: Sources, cache: ShardSource, rank: int = 0, world_size: int = 1,
                 in_process: bool = False, step_sync: StepSync | None = None, ranks_per_node: int | None = None):
        cfg.validate()
        self.step_sync = step_sync  # None: torch.distributed all-reduce when initialised
        self.steps = StepCounts()
        self.step_sync_used = "none"
        self.in_process = in_process  # worker streams interleaved in this process (same order, no processes)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.sources, self.cache = sources, cache
        ranks_per_node = ranks_per_node or resolve_ranks_per_node(cfg.ranks_per_node, rank, world_size)
        self.stream = TextStream(cfg, sources, cache, rank, world_size, ranks_per_node)
        self.mode = batching(cfg)
        self.order_key = {"seed": cfg.seed, "shuffle": cfg.shuffle, "shuffle_block": cfg.shuffle_block,
                          "seq_len": cfg.seq_len, "dataset": dataset_fingerprint(sources.manifest)}
        if cfg.shard_lanes > 1:  # one lane is the order states saved before lanes were written in
            self.order_key["shard_lanes"] = cfg.shard_lanes
        batch_tokens = self.mode.micro_batch_tokens
        if rank == 0 and isinstance(self.mode, BestFit) and 1 < cfg.pack_window < batch_tokens:
            log.warning("data.pack_window=%d tokens is less than one batch (seq_len x micro_batch_size = %d): most "
                        "rows will be padding; use at least %d (32 batches)", cfg.pack_window, batch_tokens,
                        32 * batch_tokens)
        self._unrecorded: list[np.ndarray] = []  # consumed records of delivered batches, not yet applied
        self._progress = sources.new_progress(0, self.order_key, world_size)
        self.data_wait_seconds = 0.0
        self.last_split = None  # loaders.order.split.Split of the current epoch (drop/pad counts)
        # queue_depth_sum / queue_samples: mean ready batches in the prefetch thread's queue
        self.totals = {"batches": 0, "doc_tokens": 0, "slots": 0, "data_wait_seconds": 0.0, "queue_depth_sum": 0,
                       "queue_samples": 0}
        self.pool: WorkerPool | None = None  # this epoch's worker processes

    # -- epochs and state -------------------------------------------------------------
    @property
    def progress(self) -> Progress:
        """The current epoch's resume state, every delivered batch recorded (applied in bulk: a
        batch's records wait until the state is read, or ``RECORD_EVERY`` batches have come)."""
        self._apply_records()
        return self._progress

    @progress.setter
    def progress(self, p: Progress) -> None:
        """Replace the resume state (records not yet applied go to the state being replaced)."""
        self._apply_records()
        self._progress = p

    def _apply_records(self) -> None:
        if self._unrecorded:
            records, self._unrecorded = self._unrecorded, []
            p = self._progress
            bad, empty = p.bad, p.empty
            p.record_many(np.concatenate(records))
            self.sources.counted(p.bad - bad, p.empty - empty)

    @property
    def epoch(self) -> int:
        """The epoch the loader is in (0-based)."""
        return self.progress.epoch

    @property
    def consumed(self) -> int:
        """Documents of the current epoch delivered so far (all ranks' after a resume)."""
        return self.progress.consumed

    def source_counts(self) -> dict | None:
        """Tokens per mixture source (:meth:`loaders.protocols.Sources.counts`), ``None`` for one dataset."""
        return self.sources.counts()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning, unless the state already points into it."""
        if epoch != self.progress.epoch:
            self.progress = self.sources.new_progress(epoch, self.order_key, self.world_size)

    def state_dict(self) -> dict:
        """This rank's state (JSON-able). With several ranks, merge all ranks' states
        (:meth:`global_state_dict`) before saving."""
        return self.sources.state_dict(self.progress)

    def global_state_dict(self) -> dict:
        """All ranks' states merged (a collective: every rank must call it when
        ``torch.distributed`` is initialised; otherwise this rank's state)."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.state_dict()
        states: list = [None] * dist.get_world_size()
        dist.all_gather_object(states, self.state_dict())
        return self.sources.merge(states)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from a (merged) state, or a list of all ranks' states; any world size and workers.

        Raises:
            ValueError: the state comes from other data or order settings, or is malformed
                (:meth:`loaders.protocols.Sources.restore`).
        """
        if isinstance(state, list):
            state = self.sources.merge(state)
        self.progress = self.sources.restore(state, self.order_key, self.world_size, self._nothing_left)
        self.progress.complete_ranks = set()

    def _nothing_left(self, p: Progress) -> bool:
        """Whether epoch ``p`` has been read and nothing is left to hand out: a state saved right after
        the last batch, before any rank's iterator ended, has every document consumed but no rank
        marked complete (it must go on with the next epoch, not re-enter a finished one)."""
        workers = max(self.cfg.num_workers, 1)
        return p.consumed > 0 and plan_split(p.num_samples - p.consumed, self.world_size * workers,
                                             self.cfg.remainder).assigned == 0

    def split(self):
        """How the rest of the epoch is shared (:class:`loaders.order.split.Split`) — drop/pad are reported here."""
        workers = max(self.cfg.num_workers, 1)
        remaining = self.progress.num_samples - self.progress.consumed
        return plan_split(remaining, self.world_size * workers, self.cfg.remainder)

    def metrics(self) -> dict:
        """Counters: batches, doc_tokens, slots (B x T), padding_efficiency, data_wait_seconds (s),
        consumed/bad/empty samples, dropped/padded samples of this epoch's split (this rank's
        view of the whole split), the step policy's padded/dropped batches and dropped
        samples/tokens of this rank (cumulative; see :mod:`loaders.rank.steps`), the shard source's
        counters (``cache``, when it keeps any), ``workers_peak_rss_mb`` (the largest worker's peak
        resident memory this epoch, MiB), and a mixture's per-source counters (``sources``)."""
        progress = self.progress
        m = dict(self.totals)
        m["padding_efficiency"] = m["doc_tokens"] / m["slots"] if m["slots"] else 0.0
        m.update(epoch=progress.epoch, consumed=progress.consumed, bad=progress.bad, empty=progress.empty,
                 dropped=self.last_split.dropped if self.last_split else 0,
                 padded=self.last_split.padded if self.last_split else 0)
        m.update(step_policy=self.cfg.step_policy, step_sync=self.step_sync_used,
                 padded_batches=self.steps.padded_batches, dropped_batches=self.steps.dropped_batches,
                 dropped_samples=self.steps.dropped_samples, dropped_tokens=self.steps.dropped_tokens)
        m["workers_peak_rss_mb"] = self.pool.peak_rss_mb if self.pool is not None else 0.0
        if cache := self.cache.metrics():
            m["cache"] = cache
        return self.sources.metrics(m)

    # -- iteration --------------------------------------------------------------------
    def _batches(self) -> Iterator[TokenBatch]:
        cfg = self.cfg
        pin = cfg.pin_memory and torch.cuda.is_available()
        first = self.progress.next_worker.get(self.rank, 0)  # the workers' round-robin goes on there
        if self.in_process:
            return _expand(self.stream.rank_batches(cfg.num_workers, first))
        if cfg.num_workers > 0:
            self.pool = WorkerPool(self.stream, cfg.num_workers, cfg.worker_start)
            runs = self.pool.runs(first)
        else:
            runs = self.stream.consumer_runs(0, 1)
        return _thread_prefetch(runs, cfg.prefetch_batches * max(cfg.num_workers, 1), pin, self._queue_depth)

    def _queue_depth(self, ready: int) -> None:
        """Count the batches ready in the prefetch queue when the trainer asks for one (metric)."""
        self.totals["queue_depth_sum"] += ready
        self.totals["queue_samples"] += 1

    def __iter__(self) -> Iterator[TokenBatch]:
        if self.rank in self.progress.complete_ranks or self._nothing_left(self.progress):
            # this epoch is over: go on with the next
            self.progress = self.sources.new_progress(self.epoch + 1, self.order_key, self.world_size)
        split = self.last_split = self.split()
        if split.dropped or split.padded:
            log.info("epoch %d: %d samples dropped, %d repeated (data.remainder=%s)",
                         self.epoch, split.dropped, split.padded, self.cfg.remainder)
        p, workers = self.progress, max(self.cfg.num_workers, 1)
        nodes = self.stream.num_nodes
        if not deal_fits(p.deal, self.world_size, workers, nodes):
            p.deal = {"world_size": self.world_size, "workers": workers, "nodes": nodes, "prefix": p.prefix,
                      "done": p.done.encode(p.prefix)}
            p.next_worker = {}
        self.stream.start(p)
        t0 = time.perf_counter()
        for batch in equal_steps(self._deliverable(self._batches()), self.cfg.step_policy, self._sync(),
                                 self.world_size, self._padding_batch, self.steps):
            self.data_wait_seconds = time.perf_counter() - t0
            self._record(batch)
            self.totals["batches"] += 1
            self.totals["doc_tokens"] += batch.num_doc_tokens
            self.totals["slots"] += batch.num_slots
            self.totals["data_wait_seconds"] += self.data_wait_seconds
            yield batch
            t0 = time.perf_counter()
        self.progress.complete_ranks.add(self.rank)

    def _deliverable(self, batches: Iterator[TokenBatch]) -> Iterator[TokenBatch]:
        """``batches`` without the records-only ones (no rows: empty/bad documents after a consumer's
        last batch, :func:`loaders.pack.packed.records_only`), whose records are noted here."""
        workers = max(self.cfg.num_workers, 1)
        for batch in batches:
            if batch.shape[0]:
                self._progress.next_worker[self.rank] = (batch.worker + 1) % workers
                yield batch
            else:
                self._record(batch)

    def _record(self, batch: TokenBatch) -> None:
        """Note a delivered batch's ``consumed`` entries in the resume state, and tell the sources (a
        mixture counts tokens per source)."""
        self._unrecorded.append(batch.consumed)
        if len(self._unrecorded) >= RECORD_EVERY:
            self._apply_records()
        if len(batch.consumed):  # the epoch without reading the state (that would apply every record now)
            self.sources.delivered(self._progress.epoch, batch.consumed, chunk_tokens(batch))

    def _sync(self) -> StepSync | None:
        """The step agreement of this epoch (``None``: none needed or none possible, warned)."""
        if self.world_size == 1 or self.cfg.step_policy == "uneven":
            self.step_sync_used = "none"
            return None
        sync = self.step_sync or torch_step_sync(self.world_size)
        self.step_sync_used = "custom" if self.step_sync else "all_reduce" if sync else "none"
        if sync is None:
            log.warning("data.step_policy=%s needs torch.distributed initialised with world size %d; ranks may "
                        "end the epoch after different step counts (init the process group before iterating)",
                        self.cfg.step_policy, self.world_size)
        return sync

    def _padding_batch(self) -> TokenBatch:
        return padding_batch(self.mode.micro_batch_rows, self.cfg.seq_len)


def _expand(packed: Generator) -> Iterator[TokenBatch]:
    """Packed batches as :class:`TokenBatch` es; closing it closes ``packed``."""
    try:
        for p in packed:
            yield TokenBatch.from_packed(p)
    finally:
        packed.close()


def _thread_prefetch(runs: Generator, depth: int, pin: bool,
                     on_get: Callable[[int], None] | None = None) -> Iterator[TokenBatch]:
    """Expand runs of packed batches into :class:`TokenBatch` es in a background thread, at most
    ``depth`` batches ahead of the consumer (``data.prefetch_batches`` per worker; a run, the batches
    one packing made, is handed over as room comes); stops when the consumer stops, and closes
    ``runs`` (stopping worker processes still reading ahead). ``on_get(n)`` is told the number of
    batches ready each time the consumer asks for one."""
    depth = max(1, depth)
    ready: collections.deque = collections.deque()  # expanded batches (then the end or an error), oldest first
    cond = threading.Condition()
    stop = threading.Event()
    end = object()

    def hand_over(items: list) -> bool:
        """Move ``items`` to ``ready`` as room comes, as many at once as fit: once ``ready`` is full, when
        it is down to half (a wake-up of this thread per ``depth // 2`` batches taken, not per batch)."""
        while items:
            with cond:
                if len(ready) >= depth:
                    while len(ready) > depth // 2 and not stop.is_set():
                        cond.wait(0.1)
                if stop.is_set():
                    return False
                take = depth - len(ready)
                ready.extend(items[:take])
                del items[:take]
                cond.notify_all()
        return True

    def run():
        try:
            for packed in runs:
                batches = [TokenBatch.from_packed(p) for p in packed]
                if not hand_over([b.pin_memory() for b in batches] if pin else batches):
                    return
            with cond:
                ready.append(end)
                cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer thread
            with cond:
                ready.append(e)
                cond.notify_all()
        finally:
            runs.close()

    thread = threading.Thread(target=run, name="colaflow-batch-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            with cond:
                if on_get is not None:
                    on_get(len(ready) - (not isinstance(ready[-1], TokenBatch) if ready else 0))
                while not ready:
                    cond.wait()
                if len(ready) == depth // 2 + 1:  # down to half once this one is taken: the thread may wait for that
                    cond.notify_all()
                item = ready.popleft()
            if item is end:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        with cond:
            cond.notify_all()
        thread.join(timeout=5)


def build_text_loader(cfg: DataConfig, cache: ShardSource | None = None, rank: int | None = None,
                      world_size: int | None = None, in_process: bool = False,
                      step_sync: StepSync | None = None) -> TextLoader:
    """The resumable text loader of ``rank`` of ``world_size`` over ``data.manifest`` or ``data.mixture``.

    Args:
        cfg: ``data:`` settings.
        cache: ``cache.ShardCache`` for remote shards; ``None`` reads local shards in place.
        rank, world_size: this process's place in the job; ``None`` (both): ``torch.distributed``'s when
            it is initialised, else rank 0 of 1 (:func:`loaders.rank.world.resolve_world`).
        in_process, step_sync: as :class:`TextLoader`.
    Raises:
        FileNotFoundError / ValueError: no manifest, an invalid config (the message names the field or
            source), remote data without a cache, or ``WORLD_SIZE`` > 1 with no process group and no rank;
            ``colaflow.config.ConfigError`` for a bad ``data.mixture`` entry.
    """
    cfg.validate()
    rank, world_size = resolve_world(rank, world_size)
    source = require_shard_source(cfg, cache)
    return TextLoader(cfg, build_sources(cfg), source, rank, world_size, in_process, step_sync)
