"""One rank's stream of packed batches (numpy only: loader worker processes import this, not torch).

Worker ``w`` of rank ``r`` is consumer ``r * W + w`` of ``C = world_size * W`` (see
:mod:`loaders.order.sample_order`); it reads its documents, packs them (:mod:`loaders.pack.object_packer`) and yields
:class:`loaders.pack.packed.PackedBatch` es. :meth:`TextStream.rank_batches` interleaves the workers
round-robin (an exhausted worker is skipped), the order :mod:`loaders.worker.pool` delivers in.
"""
from __future__ import annotations

import logging
from typing import Iterator

import numpy as np

from shards import Manifest, ShardError

from loaders.config import DataConfig
from loaders.pack.packer import ArrayPacker, split_documents
from shards.access.token_blocks import GroupKeys
from loaders.order.sample_order import SampleOrder, consumer_arrays
from loaders.pack.packed import PackedBatch
from loaders.pack.object_packer import BestFitPacker, TokenBudgetBatcher, split_document
from loaders.order.positions import decode_positions
from loaders.order.progress import BAD, EMPTY, Progress, deal_fits
from loaders.read.shard_reader import ShardReader

log = logging.getLogger(__name__)


class _CacheSpec:
    """A cache to re-open in a worker process: its class and config."""

    def __init__(self, cls, config):
        self.cls, self.config = cls, config


def _worker_cache(cache):
    """A cache object safe to use in this process: a ``ShardCache`` (threads, locks) travels to a
    worker process as its class and config (:class:`_CacheSpec`) and is re-opened there."""
    if not isinstance(cache, _CacheSpec):
        return cache, False
    try:
        return cache.cls(cache.config, resolve=False), True
    except TypeError:
        return cache.cls(cache.config), True


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

    Args:
        cfg: loader settings.
        manifest, manifest_url: the dataset and where it lives.
        cache: shard source (``cache.ShardCache``, :class:`loaders.read.shard_reader.LocalShards`, or any
            object with ``pinned(url, sha256, size)``).
        rank, world_size: this process's place in the job.
    Raises:
        ValueError: ``rank`` out of range.
    """

    def __init__(self, cfg: DataConfig, manifest: Manifest, manifest_url: str, cache, rank: int, world_size: int):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        self.cfg, self.manifest, self.manifest_url, self.cache = cfg, manifest, manifest_url, cache
        self.rank, self.world_size = rank, world_size
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

    def _dealt(self, worker: int, num_workers: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """One consumer's ``(positions, shards, locals)`` groups (:func:`loaders.order.sample_order.consumer_arrays`):
        dealt from :attr:`deal` when it was made for this world size and worker count (consumed
        positions then skipped, so the consumer keeps the documents it had, in order), else from
        the resume point."""
        order, c, n = self.order(), self.rank * num_workers + worker, self.world_size * num_workers
        deal = self.deal
        if not deal_fits(deal, self.world_size, num_workers):
            yield from consumer_arrays(order, c, n, self.prefix, self.skip, self.cfg.remainder)
            return
        dealt = decode_positions(deal["done"])
        for pos, shard, local in consumer_arrays(order, c, n, deal["prefix"], dealt[dealt >= deal["prefix"]],
                                                 self.cfg.remainder):
            keep = (pos >= self.prefix) & ~np.isin(pos, self.skip)
            if keep.any():
                yield pos[keep], shard[keep], local[keep]

    def order(self) -> SampleOrder:
        """The epoch's document order (documents per shard from the manifest)."""
        return SampleOrder(self.manifest.document_counts(), self.cfg.seed, self.epoch,
                           self.cfg.shuffle, self.cfg.shuffle_block)

    def consumer_positions(self, worker: int, num_workers: int) -> Iterator[tuple[int, int, int]]:
        """``(position, shard, local index)`` read by worker ``worker`` of ``num_workers`` on this rank."""
        for pos, shard, local in self._dealt(worker, num_workers):
            yield from zip(pos.tolist(), shard.tolist(), local.tolist())

    def open_reader(self, cache, order: SampleOrder) -> ShardReader:
        """The shard reader of one consumer, indexed like ``order``'s shards (seam: a mixture returns
        its router over the sources' readers, :class:`loaders.mixture.sources.MixtureReader`)."""
        return ShardReader(self.manifest, self.manifest_url, cache, self.cfg.index_dir or None)

    def _packer(self):
        if self.cfg.batching == "token_budget":
            return TokenBudgetBatcher(self.cfg.max_tokens, self.cfg.pack_window)
        return BestFitPacker(self.cfg.seq_len, self.cfg.micro_batch_size, self.cfg.pack_window)

    def consumer_batches(self, worker: int, num_workers: int) -> Iterator[PackedBatch]:
        """Packed batches of one consumer (what loader worker ``worker`` of ``num_workers`` yields)."""
        return (b for run in self.consumer_runs(worker, num_workers) for b in run)

    def consumer_runs(self, worker: int, num_workers: int) -> Iterator[list[PackedBatch]]:
        """:meth:`consumer_batches` in runs: the batches one packing makes come as one list, so they
        cross a thread or a pipe in one hand-over instead of one each."""
        if self.manifest.layout == "token_blocks" and self.cfg.batching == "packed":
            runs = _trailing_records(self._block_batches(worker, num_workers))
        else:
            runs = _trailing_records([b] for b in self._document_batches(worker, num_workers))
        return (_from_worker(run, worker) for run in runs)

    def _block_batches(self, worker: int, num_workers: int) -> Iterator[list[PackedBatch]]:
        """Token-block shards, one shuffle block of this consumer's documents at a time: located,
        split into chunks and packed with numpy (:mod:`loaders.pack.packer`); same batches as
        :meth:`_document_batches` would pack, in runs (see :meth:`consumer_runs`)."""
        order = self.order()
        cache, owned = _worker_cache(self.cache)
        reader = self.open_reader(cache, order)
        packer = ArrayPacker(self.cfg.seq_len, self.cfg.micro_batch_size, self.cfg.pack_window)
        try:
            reader.prefetch(order.shards_from(self.prefix))
            for pos, shard, local in self._dealt(worker, num_workers):
                reader.retain(set(shard.tolist()))
                yield from _runs(packer, self._pack_group(reader, packer, pos, shard, local))
            yield from _runs(packer, packer.flush())
        finally:
            reader.close()
            if owned and hasattr(cache, "close"):
                cache.close()

    def _pack_group(self, reader: ShardReader, packer: ArrayPacker, pos, shard, local) -> Iterator[PackedBatch]:
        """Locate one group's documents shard by shard (no copy), then feed their chunks in position order."""
        pools, tables, pool_of, lengths, offsets, where = [], [], [], [], [], []
        for s in dict.fromkeys(shard.tolist()):
            m = np.flatnonzero(shard == s)
            try:
                handle = reader.block_shard(s)
                arrays, pool, off, n, ok = handle.locate(local[m])
            except ShardError as e:
                if not reader.failed(s):
                    log.warning("shard %s: %d documents skipped (counted as bad): %s", self.manifest.shards[s].name,
                                len(m), e)
                arrays, handle = [], None
                pool, off, n, ok = (np.zeros(len(m), np.int64),) * 3 + (np.zeros(len(m), bool),)
            for err in handle.errors if handle is not None else ():
                log.warning("%s; its documents are skipped (counted as bad)", err)
            if handle is not None:
                handle.errors.clear()
            pool_of.append(pool + len(pools))
            pools += arrays
            tables.append(handle.docs if handle is not None else None)
            lengths.append(np.where(ok, n, -1))
            offsets.append(off)
            where.append(m)
        at = np.empty(len(pos), np.int64)
        at[np.concatenate(where)] = np.arange(len(pos))  # position order -> row in the located arrays
        lengths, offsets, pool_of = np.concatenate(lengths)[at], np.concatenate(offsets)[at], np.concatenate(pool_of)[at]
        which = np.repeat(np.arange(len(tables)), [len(w) for w in where])[at]
        keys = GroupKeys(tables, which, local[np.concatenate(where)][at])
        for p, n in zip(pos[lengths <= 0].tolist(), lengths[lengths <= 0].tolist()):
            packer.pending.append((p, BAD if n < 0 else EMPTY, 0))
        real = lengths > 0
        chunks = split_documents(pos[real], lengths[real], offsets[real], self.cfg.seq_len, self.partial)
        chunks["doc"] = np.flatnonzero(real)[chunks["doc"]]
        chunks["pool"] = pool_of[chunks["doc"]]
        yield from packer.add(pools, keys, chunks)

    def _document_batches(self, worker: int, num_workers: int) -> Iterator[PackedBatch]:
        """One document at a time (one-sample-per-document shards, or ``token_budget`` batching)."""
        order = self.order()
        cache, owned = _worker_cache(self.cache)
        reader = self.open_reader(cache, order)
        packer, seq_len = self._packer(), self.cfg.seq_len
        block = -1
        try:
            reader.prefetch(order.shards_from(self.prefix))
            for pos, shard, local in self.consumer_positions(worker, num_workers):
                if pos // order.block != block:
                    block = pos // order.block
                    reader.retain(set(order.block_items(block)[1].tolist()))
                doc = self._read(reader, shard, local, pos, packer)
                if doc is None:
                    continue
                for chunk in split_document(pos, *doc, seq_len, self.partial.get(pos, frozenset())):
                    packer.add(chunk)
                while packer.ready():
                    yield packer.pop()
            yield from packer.flush()
        finally:
            reader.close()
            if owned and hasattr(cache, "close"):
                cache.close()

    def _read(self, reader: ShardReader, shard: int, local: int, pos: int, packer) -> tuple[str, np.ndarray] | None:
        """``(key, tokens)``, or ``None`` for an empty/unreadable document (recorded, logged)."""
        name = self.manifest.shards[shard].name
        try:
            key, tokens = reader.tokens(shard, local)
        except ShardError as e:
            if not reader.failed(shard):  # a whole unreadable shard was logged once by the reader
                log.warning("sample %d of shard %s skipped (counted as bad): %s", local, name, e)
            packer.pending.append((pos, BAD, 0))
            return None
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            log.warning("sample %s of shard %s has no 1-D integer 'tokens' member; skipped (counted as bad)",
                        key, name)
            packer.pending.append((pos, BAD, 0))
            return None
        if len(tokens) == 0:
            packer.pending.append((pos, EMPTY, 0))
            return None
        return key, tokens

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

    def __getstate__(self):
        state = dict(self.__dict__)
        if getattr(self.cache, "config", None) is not None:  # threads and locks do not pickle
            state["cache"] = _CacheSpec(type(self.cache), self.cache.config)
        return state
