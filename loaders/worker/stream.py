"""One rank's stream of packed batches: the one read loop of a consumer (numpy only, never torch).
"""
from __future__ import annotations

import logging
from typing import Iterator

import numpy as np

from loaders.config import DataConfig
from loaders.order.positions import decode_positions
from loaders.order.progress import BAD, EMPTY, Progress, deal_fits
from loaders.order.split import NodePlan, consumer_arrays, plan_nodes
from loaders.pack.batching import batching
from loaders.pack.packed import GroupKeys, PackedBatch, distinct_ints
from loaders.pack.packer import ArrayPacker, split_documents
from loaders.protocols import Order, Reader, ShardSource, Sources
from shards import ShardError

log = logging.getLogger(__name__)


def _first_seen(values: np.ndarray) -> list[int]:
    """The distinct values of an ``int64`` array in the order they first appear (``dict.fromkeys`` of a
    block's 4096 shard numbers costs ~0.15 ms; most blocks read one shard)."""
    if not len(values) or values.min() == values.max():
        return values[:1].tolist()
    distinct, first = np.unique(values, return_index=True)
    return distinct[np.argsort(first)].tolist()


def _runs(packer: ArrayPacker, batches: Iterator[PackedBatch]) -> Iterator[list[PackedBatch]]:
    """``batches`` grouped into the runs the packer makes at once (a run ends where the next batch
    needs more input or another packing)."""
    run: list[PackedBatch] = []
    for b in batches:
        run.append(b)
        if not packer.ready:
            yield run
            run = []
    if run:
        yield run


def _trailing_records(runs: Iterator[list[PackedBatch]]) -> Iterator[list[PackedBatch]]:
    """``runs`` with the latest batch held back until the next one (or the end), so the records of
    empty/bad documents met after the consumer's last batch (the records-only batch a packer's
    ``flush`` ends with) ride with that batch: a state saved right after it accounts for every
    document. A consumer with no batch at all passes its records-only batch on."""
    held: PackedBatch | None = None
    extra: list[PackedBatch] = []
    for run in runs:
        real = [b for b in run if b.num_slots]
        if real:
            out = ([held] if held is not None else []) + real[:-1]
            if out:
                yield out
            held = real[-1]
        extra += [b for b in run if not b.num_slots]
    if held is not None:
        for b in extra:
            held.consumed = np.concatenate([held.consumed, b.consumed])
        yield [held]
    elif extra:
        yield extra


def _from_worker(run: list[PackedBatch], worker: int) -> list[PackedBatch]:
    """``run`` with each batch marked as packed by ``worker``."""
    for b in run:
        b.worker = worker
    return run


class TextStream:
    """Packed batches of one rank for the epoch and resume point set by :meth:`start`.

    Pickles (to a loader worker process) with its sources and its shard source (a cache pickles as
    its config: the worker opens its own).

    Args:
        cfg: loader settings.
        sources: what is read (one dataset or a mixture, :class:`loaders.protocols.Sources`).
        cache: where local shard files come from (:class:`loaders.protocols.ShardSource`).
        rank, world_size: this process's place in the job.
        ranks_per_node: ranks sharing this node's cache (numbered node by node; ``None``: all of them,
            one node). Each node reads only its own shards (:mod:`loaders.order.split`).
    Raises:
        ValueError: ``rank`` out of range, or ``ranks_per_node`` does not divide ``world_size``.
    """

    def __init__(self, cfg: DataConfig, sources: Sources, cache: ShardSource, rank: int, world_size: int,
                 ranks_per_node: int | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        ranks_per_node = ranks_per_node or world_size
        if ranks_per_node < 1 or world_size % ranks_per_node:
            raise ValueError(f"{ranks_per_node} ranks per node do not divide world size {world_size}: every node must "
                             "run the same number of ranks (data.ranks_per_node)")
        self.cfg, self.sources, self.cache = cfg, sources, cache
        self.rank, self.world_size = rank, world_size
        self.num_nodes, self.node = world_size // ranks_per_node, rank // ranks_per_node
        self.epoch, self.prefix = 0, 0
        self.skip = np.empty(0, np.int64)
        self.partial: dict[int, set[int]] = {}
        self.deal: dict | None = None

    def start(self, progress: Progress) -> None:
        """Read epoch ``progress.epoch`` from its resume point on (positions already consumed skipped),
        dealt as ``progress.deal`` says when it was made for this layout."""
        self.epoch, self.prefix = progress.epoch, progress.prefix
        self.skip = progress.done.positions(self.prefix)
        self.partial = {p: set(c) for p, (_, c) in progress.partial.items()}
        self.deal = progress.deal

    def order(self) -> Order:
        """The current epoch's document order."""
        cfg = self.cfg
        return self.sources.order(self.epoch, cfg.seed, cfg.shuffle, cfg.shuffle_block, cfg.shard_lanes)

    def open_reader(self) -> Reader:
        """A reader of the sources' shards, indexed like :meth:`order`'s, through :attr:`cache`."""
        return self.sources.reader(self.cache, self.cfg.index_dir or None)

    def _deal_point(self, num_workers: int) -> tuple[int, np.ndarray, bool]:
        """``(start, skip, refilter)`` the deal starts from: :attr:`deal`'s when it was made for this
        world size, node count and worker count (``refilter``: positions consumed since are skipped
        after the deal, so each consumer keeps the documents it had, in order; none were when the
        resume point is the deal's), else the resume point."""
        deal = self.deal
        if not deal_fits(deal, self.world_size, num_workers, self.num_nodes):
            return self.prefix, self.skip, False
        dealt = decode_positions(deal["done"])
        start, skip = int(deal["prefix"]), dealt[dealt >= deal["prefix"]]
        return start, skip, self.prefix != start or not np.array_equal(self.skip, skip)

    def plan(self, order: Order, num_workers: int) -> NodePlan:
        """The node-level deal of the epoch for ``num_workers`` workers per rank (:func:`loaders.order.split.plan_nodes`)."""
        start, skip, _ = self._deal_point(num_workers)
        return plan_nodes(order, self.num_nodes, self.world_size * num_workers, start, skip, self.cfg.remainder)

    def _dealt(self, order: Order, worker: int, num_workers: int, plan: NodePlan | None = None
               ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """One consumer's ``(positions, shards, locals)`` groups (:func:`loaders.order.split.consumer_arrays`),
        dealt from :meth:`_deal_point`; ``plan``: :meth:`plan`, when the caller has it."""
        c, n = self.rank * num_workers + worker, self.world_size * num_workers
        start, skip, refilter = self._deal_point(num_workers)
        plan = plan or self.plan(order, num_workers)
        for pos, shard, local in consumer_arrays(order, c, n, start, skip, self.cfg.remainder, self.num_nodes, plan):
            if refilter:
                keep = (pos >= self.prefix) & ~np.isin(pos, self.skip)
                pos, shard, local = pos[keep], shard[keep], local[keep]
            if len(pos):
                yield pos, shard, local

    def consumer_positions(self, worker: int, num_workers: int) -> Iterator[tuple[int, int, int]]:
        """``(position, shard, local index)`` read by worker ``worker`` of ``num_workers`` on this rank."""
        for pos, shard, local in self._dealt(self.order(), worker, num_workers):
            yield from zip(pos.tolist(), shard.tolist(), local.tolist())

    def consumer_batches(self, worker: int, num_workers: int) -> Iterator[PackedBatch]:
        """Packed batches of one consumer (what loader worker ``worker`` of ``num_workers`` yields)."""
        return (b for run in self.consumer_runs(worker, num_workers) for b in run)

    def consumer_runs(self, worker: int, num_workers: int) -> Iterator[list[PackedBatch]]:
        """:meth:`consumer_batches` in runs: the batches one packing makes come as one list, so they
        cross a thread or a pipe in one hand-over instead of one each."""
        return (_from_worker(run, worker) for run in _trailing_records(self._runs(worker, num_workers)))

    def _runs(self, worker: int, num_workers: int) -> Iterator[list[PackedBatch]]:
        """The read loop: one shuffle block of this consumer's documents at a time, located in their
        shards (no copy), split into chunks and packed (:class:`loaders.pack.packer.ArrayPacker`)."""
        order = self.order()
        reader = self.open_reader()
        packer = ArrayPacker(batching(self.cfg), self.cfg.pack_window, self.sources.manifest.padding_id)
        try:
            plan = self.plan(order, num_workers)
            reader.prefetch(plan.shards(order, self.node, self.prefix))  # this node's shards only
            for pos, shard, local in self._dealt(order, worker, num_workers, plan):
                reader.retain(set(distinct_ints(shard)))
                yield from _runs(packer, self._pack_group(reader, packer, pos, shard, local))
            yield from _runs(packer, packer.flush())
        finally:
            reader.close()

    def _pack_group(self, reader: Reader, packer: ArrayPacker, pos, shard, local) -> Iterator[PackedBatch]:
        """Locate one group's documents shard by shard (no copy), then feed their chunks in position order."""
        pools, handles, pool_of, lengths, offsets, where = [], [], [], [], [], []
        shards = _first_seen(shard)
        for s in shards:
            m = np.flatnonzero(shard == s)
            try:
                handle = reader.handle(s)
                arrays, pool, off, n, ok = handle.locate(local[m])
            except ShardError as e:
                if not reader.failed(s):
                    log.warning("shard %s: %d documents skipped (counted as bad): %s", reader.shard_name(s), len(m), e)
                arrays, handle = [], None
                pool, off, n, ok = (np.zeros(len(m), np.int64),) * 3 + (np.zeros(len(m), bool),)
            for err in handle.errors if handle is not None else ():
                log.warning("%s; skipped (counted as bad)", err)
            if handle is not None:
                handle.errors.clear()
            pool_of.append(pool + len(pools))
            pools += arrays
            handles.append(handle)
            lengths.append(np.where(ok, n, -1))
            offsets.append(off)
            where.append(m)
        lengths, offsets, pool_of = np.concatenate(lengths), np.concatenate(offsets), np.concatenate(pool_of)
        which = np.repeat(np.arange(len(handles)), [len(w) for w in where])
        if len(shards) > 1:  # back to position order (one shard's rows are in it already: most groups)
            at = np.empty(len(pos), np.int64)
            at[np.concatenate(where)] = np.arange(len(pos))  # position order -> row in the located arrays
            lengths, offsets, pool_of, which = lengths[at], offsets[at], pool_of[at], which[at]
        keys = GroupKeys(handles, np.asarray(shards, np.int64), which, local)
        for p, n in zip(pos[lengths <= 0].tolist(), lengths[lengths <= 0].tolist()):
            packer.pending.append((p, BAD if n < 0 else EMPTY, 0))
        real = lengths > 0
        chunks = split_documents(pos[real], lengths[real], offsets[real], self.cfg.seq_len, self.partial)
        chunks["doc"] = np.flatnonzero(real)[chunks["doc"]]
        chunks["pool"] = pool_of[chunks["doc"]]
        yield from packer.add(pools, keys, chunks)

    def rank_batches(self, num_workers: int, first: int = 0) -> Iterator[PackedBatch]:
        """This rank's batches in the workers' delivery order, without processes: worker round-robin
        from worker ``first`` on, exhausted workers skipped (``num_workers`` 0 means 1)."""
        num_workers = max(num_workers, 1)
        streams = [self.consumer_batches(w % num_workers, num_workers) for w in range(first, first + num_workers)]
        while streams:
            for it in list(streams):
                try:
                    yield next(it)
                except StopIteration:
                    streams.remove(it)
