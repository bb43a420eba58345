"""The text loader of one rank: packed batches from worker processes, with an exact resume state.

Each rank builds ``build_text_loader(cfg, cache, rank, world_size)``. Worker ``w`` of rank ``r``
is consumer ``r * W + w`` of ``C = world_size * W`` (see :mod:`loaders.order.sample_order`); it reads its
documents, packs them (:mod:`loaders.pack.object_packer`) and sends compact batches
(:class:`loaders.pack.packed.PackedBatch`) that this process expands into :class:`TokenBatch` es.
Workers (:mod:`loaders.worker.pool`) deliver in round-robin order, so the stream is a deterministic
function of (seed, epoch, world size, workers, resume state). The main process records each
batch's ``consumed`` list on delivery (:mod:`loaders.order.progress`), so the resume state is exact
even though workers read ahead.

Ranks would deliver different numbers of batches (documents differ in length); ``data.step_policy``
(:mod:`loaders.rank.steps`) makes every rank take the same number of steps (pad or drop, reported in
``metrics()``) with one all-reduce per step when ``torch.distributed`` is initialised.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from hashlib import sha256
from typing import Callable, Iterator

import numpy as np
import torch

from shards import Manifest

from loaders.rank.batch import TokenBatch
from loaders.config import DataConfig
from loaders.order.sample_order import plan_split
from loaders.order.progress import Progress, deal_fits, merge_states
from loaders.read.shard_reader import LocalShards
from loaders.rank.steps import StepCounts, StepSync, equal_steps, padding_batch, torch_step_sync
from loaders.worker.stream import TextStream
from loaders.worker.pool import WorkerPool

log = logging.getLogger(__name__)

RECORD_EVERY = 64  # delivered batches whose consumed records are applied to the resume state at once


def dataset_fingerprint(manifest: Manifest) -> str:
    """sha256 over the shards' names, sample counts and digests (a state loads only into the same data)."""
    h = sha256()
    for s in manifest.shards:
        h.update(f"{s.name}\0{s.samples}\0{s.sha256}\n".encode())
    return h.hexdigest()[:16]


class TextLoader:
    """Resumable loader of one rank: iterate it for one epoch of :class:`TokenBatch` es.

    Attributes:
        data_wait_seconds: seconds the last ``next()`` waited for its batch (trainer step metric).
        progress: the resume state (see :mod:`loaders.order.progress`).
    """

    def __init__(self, cfg: DataConfig, manifest: Manifest, manifest_url: str, cache, rank: int = 0,
                 world_size: int = 1, in_process: bool = False, step_sync: StepSync | None = None):
        cfg.validate()
        self.step_sync = step_sync  # None: torch.distributed all-reduce when initialised
        self.steps = StepCounts()
        self.step_sync_used = "none"
        self.in_process = in_process  # worker streams interleaved in this process (same order, no processes)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.dataset = TextStream(cfg, manifest, manifest_url, cache, rank, world_size)
        self.cache = cache
        self.order_key = {"seed": cfg.seed, "shuffle": cfg.shuffle, "shuffle_block": cfg.shuffle_block,
                          "seq_len": cfg.seq_len, "dataset": dataset_fingerprint(manifest)}
        batch_tokens = cfg.seq_len * cfg.micro_batch_size
        if rank == 0 and cfg.batching == "packed" and 1 < cfg.pack_window < batch_tokens:
            log.warning("data.pack_window=%d tokens is less than one batch (seq_len x micro_batch_size = %d): most "
                        "rows will be padding; use at least %d (32 batches)", cfg.pack_window, batch_tokens,
                        32 * batch_tokens)
        self._unrecorded: list[np.ndarray] = []  # consumed records of delivered batches, not yet applied
        self.progress = self._epoch_progress(0)
        self.data_wait_seconds = 0.0
        self.last_split = None  # loaders.order.sample_order.Split of the current epoch (drop/pad counts)
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
            self._progress.record_many(np.concatenate(records))

    @property
    def epoch(self) -> int:
        """The epoch the loader is in (0-based)."""
        return self.progress.epoch

    @property
    def consumed(self) -> int:
        """Documents of the current epoch delivered so far (all ranks' after a resume)."""
        return self.progress.consumed

    def source_counts(self) -> dict | None:
        """``None``: one dataset has no sources to count (a mixture's loader counts them)."""
        return None

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning, unless the state already points into it."""
        if epoch != self.progress.epoch:
            self.progress = self._epoch_progress(epoch)

    def _epoch_progress(self, epoch: int) -> Progress:
        """A fresh :class:`Progress` of ``epoch``, nothing consumed (seam: a mixture's epochs differ in length)."""
        return Progress(epoch, self.order_key, self.dataset.manifest.total_documents, self.world_size)

    def state_dict(self) -> dict:
        """This rank's state (JSON-able). With several ranks, merge all ranks' states
        (:func:`loaders.order.progress.merge_states` or :meth:`global_state_dict`) before saving."""
        return self.progress.state_dict()

    def global_state_dict(self) -> dict:
        """All ranks' states merged (a collective: every rank must call it when
        ``torch.distributed`` is initialised; otherwise this rank's state)."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.state_dict()
        states: list = [None] * dist.get_world_size()
        dist.all_gather_object(states, self.state_dict())
        return self._merge(states)

    @staticmethod
    def _merge(states: list[dict]) -> dict:
        """All ranks' states as one (seam: a mixture merges its per-source states)."""
        return merge_states(states)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from a (merged) state, or a list of all ranks' states; any world size and workers.

        Raises:
            ValueError: the state comes from another dataset, seed, shuffle or ``seq_len``, or is
                malformed (:meth:`Progress.from_state`).
        """
        if isinstance(state, list):
            state = merge_states(state)
        p = Progress.from_state(state)
        if p.order_key != self.order_key:
            raise ValueError(f"loader state was written for {p.order_key}, this loader has {self.order_key};"
                             " resume with the same data and data.seed/shuffle/shuffle_block/seq_len")
        if p.num_samples != self.dataset.manifest.total_documents:
            raise ValueError(f"loader state counts {p.num_samples} documents in an epoch, the data has "
                             f"{self.dataset.manifest.total_documents}; resume from the checkpoint as saved")
        over = len(p.complete_ranks) >= int(state["world_size"]) or self._nothing_left(p)
        p.world_size = self.world_size
        self.progress = self._epoch_progress(p.epoch + 1) if over else p
        self.progress.complete_ranks = set()

    def _nothing_left(self, p: Progress) -> bool:
        """Whether epoch ``p`` has been read and nothing is left to hand out: a state saved right after
        the last batch, before any rank's iterator ended, has every document consumed but no rank
        marked complete (it must go on with the next epoch, not re-enter a finished one)."""
        workers = max(self.cfg.num_workers, 1)
        return p.consumed > 0 and plan_split(p.num_samples - p.consumed, self.world_size * workers,
                                             self.cfg.remainder).assigned == 0

    def split(self):
        """How the rest of the epoch is shared (:class:`loaders.order.sample_order.Split`) — drop/pad are reported here."""
        workers = max(self.cfg.num_workers, 1)
        remaining = self.progress.num_samples - self.progress.consumed
        return plan_split(remaining, self.world_size * workers, self.cfg.remainder)

    def metrics(self) -> dict:
        """Counters: batches, doc_tokens, slots (B x T), padding_efficiency, data_wait_seconds (s),
        consumed/bad/empty samples, dropped/padded samples of this epoch's split (this rank's
        view of the whole split), the step policy's padded/dropped batches and dropped
        samples/tokens of this rank (cumulative; see :mod:`loaders.rank.steps`), plus the cache's
        metrics when it has any, and ``workers_peak_rss_mb`` (the largest worker's peak resident
        memory this epoch, MiB)."""
        m = dict(self.totals)
        m["padding_efficiency"] = m["doc_tokens"] / m["slots"] if m["slots"] else 0.0
        m.update(epoch=self.epoch, consumed=self.progress.consumed, bad=self.progress.bad, empty=self.progress.empty,
                 dropped=self.last_split.dropped if self.last_split else 0,
                 padded=self.last_split.padded if self.last_split else 0)
        m.update(step_policy=self.cfg.step_policy, step_sync=self.step_sync_used,
                 padded_batches=self.steps.padded_batches, dropped_batches=self.steps.dropped_batches,
                 dropped_samples=self.steps.dropped_samples, dropped_tokens=self.steps.dropped_tokens)
        m["workers_peak_rss_mb"] = self.pool.peak_rss_mb if self.pool is not None else 0.0
        if hasattr(self.cache, "metrics"):
            m["cache"] = self.cache.metrics()
        return m

    # -- iteration --------------------------------------------------------------------
    def _batches(self) -> Iterator[TokenBatch]:
        cfg = self.cfg
        pin = cfg.pin_memory and torch.cuda.is_available()
        first = self.progress.next_worker.get(self.rank, 0)  # the workers' round-robin goes on there
        if self.in_process:
            return _expand(self.dataset.rank_batches(cfg.num_workers, first))
        if cfg.num_workers > 0:
            self.pool = WorkerPool(self.dataset, cfg.num_workers, cfg.worker_start)
            runs = self.pool.runs(first)
        else:
            runs = self.dataset.consumer_runs(0, 1)
        return _thread_prefetch(runs, cfg.prefetch_batches * max(cfg.num_workers, 1), pin, self._queue_depth)

    def _queue_depth(self, ready: int) -> None:
        """Count the batches ready in the prefetch queue when the trainer asks for one (metric)."""
        self.totals["queue_depth_sum"] += ready
        self.totals["queue_samples"] += 1

    def __iter__(self) -> Iterator[TokenBatch]:
        if self.rank in self.progress.complete_ranks or self._nothing_left(self.progress):
            self.progress = self._epoch_progress(self.epoch + 1)  # this epoch is over: go on with the next
        split = self.last_split = self.split()
        if split.dropped or split.padded:
            log.info("epoch %d: %d samples dropped, %d repeated (data.remainder=%s)",
                         self.epoch, split.dropped, split.padded, self.cfg.remainder)
        p, workers = self.progress, max(self.cfg.num_workers, 1)
        if not deal_fits(p.deal, self.world_size, workers):
            p.deal = {"world_size": self.world_size, "workers": workers, "prefix": p.prefix,
                      "done": p.done.encode(p.prefix)}
            p.next_worker = {}
        self.dataset.start(p)
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
        """Note a delivered batch's ``consumed`` entries in the resume state (seam: a mixture also
        counts tokens per source)."""
        self._unrecorded.append(batch.consumed)
        if len(self._unrecorded) >= RECORD_EVERY:
            self._apply_records()

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
        cfg = self.cfg
        rows = cfg.micro_batch_size if cfg.batching == "packed" else max(1, cfg.max_tokens // cfg.seq_len)
        return padding_batch(rows, cfg.seq_len)


def _expand(packed: Iterator) -> Iterator[TokenBatch]:
    """Packed batches as :class:`TokenBatch` es; closing it closes ``packed``."""
    try:
        for p in packed:
            yield TokenBatch.from_packed(p)
    finally:
        if hasattr(packed, "close"):
            packed.close()


def _thread_prefetch(runs: Iterator[list], depth: int, pin: bool,
                     on_get: Callable[[int], None] | None = None) -> Iterator[TokenBatch]:
    """Expand runs of packed batches into :class:`TokenBatch` es in a background thread, about
    ``depth`` batches ahead (a run crosses the thread in one hand-over); stops when the consumer
    stops, and closes ``runs`` (stopping worker processes still reading ahead). ``on_get(n)`` is
    told the number of batches ready each time the consumer asks for one."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    end = object()

    def run():
        try:
            for packed in runs:
                batch = [TokenBatch.from_packed(p) for p in packed]
                item = [b.pin_memory() for b in batch] if pin else batch
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(end)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer thread
            q.put(e)
        finally:
            if hasattr(runs, "close"):
                runs.close()

    thread = threading.Thread(target=run, name="colaflow-batch-prefetch", daemon=True)
    thread.start()
    ready: list = []
    try:
        while True:
            if on_get is not None:
                with q.mutex:  # the producer appends under this lock
                    queued = sum(len(r) for r in q.queue if isinstance(r, list))
                on_get(len(ready) + queued)
            if not ready:
                if (item := q.get()) is end:
                    break
                if isinstance(item, BaseException):
                    raise item
                ready = item[::-1]
            yield ready.pop()
    finally:
        stop.set()
        thread.join(timeout=5)


def build_text_loader(cfg: DataConfig, cache=None, rank: int = 0, world_size: int = 1,
                      in_process: bool = False, step_sync: StepSync | None = None) -> TextLoader:
    """The resumable text loader of ``rank`` of ``world_size``.

    Args:
        cfg: ``data:`` settings (``cfg.manifest``: path, folder or URL of ``manifest.json``;
            ``cfg.mixture`` is handled by :func:`loaders.rank.build.build_text_loader`).
        cache: ``cache.ShardCache`` for remote shards; ``None`` reads local shards in place.
        in_process: run the worker streams in this process (same batches, no worker processes).
        step_sync: step agreement across ranks (default: ``torch.distributed`` all-reduce when
            initialised; see :mod:`loaders.rank.steps`).
    Raises:
        FileNotFoundError / ValueError: no manifest, or an invalid config (message names the field).
    """
    manifest = Manifest.load(cfg.manifest)
    return TextLoader(cfg, manifest, cfg.manifest, cache if cache is not None else LocalShards(), rank,
                      world_size, in_process, step_sync)
