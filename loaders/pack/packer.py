"""The one packer: chunk arrays in, compact batches out, in any batching mode (:mod:`loaders.pack.batching`).

A chunk is a row of parallel ``int64`` arrays: ``pos`` (its document's global position), ``idx``
(chunk index), ``n`` (chunks of its document), ``length``, ``group`` (the :meth:`ArrayPacker.add`
call it came in), ``key`` (its document's index in that call's keys), ``src`` (the token array
holding it) and ``off`` (its first token there). Token arrays are the shards' own (memory-mapped
raw blocks, decompressed zstd blocks, decoded members): a token is copied once, into its batch.
Chunks are buffered until they hold ``window`` tokens (checked after each whole document); the
mode then picks the batches to emit and the rest stays buffered for the next packing. Splitting
documents, gathering tokens and building the batches are numpy operations over whole groups.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import numpy.ma  # noqa: F401 - np.unique imports it on its first call: 10 ms inside the first batch otherwise
from numpy.lib.stride_tricks import sliding_window_view

from loaders.pack.batching import Batching, BestFit, RowPlan, best_fit_bins, packing_order
from loaders.pack.packed import (BatchKeys, KeyList, PackedBatch, PackingKeys, compact_ids, consumed_array,
                                 distinct_ints, records_only)

FIELDS = ("pos", "idx", "n", "length", "group", "key", "src", "off")
GATHER_TOKENS = 65_536  # tokens gathered per np.take: 512 KiB of int64 indices, within a core's L2 cache


def split_documents(pos: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, seq_len: int,
                    delivered: dict[int, set[int]] | None = None) -> dict[str, np.ndarray]:
    """Chunks of documents as arrays: document ``d`` (``lengths[d] > 0`` tokens from ``offsets[d]``)
    is cut into ``ceil(lengths[d] / seq_len)`` chunks, each treated as a document of its own
    (positions restart, no label crosses a cut); chunk indices in ``delivered[pos]`` (delivered
    before a resume) are left out. Returns ``int64`` arrays ``pos, idx, n, length, off, doc``."""
    n_ch = -(-lengths // seq_len)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), n_ch)
    idx = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(n_ch) - n_ch, n_ch)
    out = {"pos": pos[doc], "idx": idx, "n": n_ch[doc], "length": np.minimum(seq_len, lengths[doc] - idx * seq_len),
           "off": offsets[doc] + idx * seq_len, "doc": doc}
    if delivered:
        keep = np.array([c not in delivered.get(p, ()) for p, c in zip(out["pos"].tolist(), idx.tolist())], bool)
        out = {k: v[keep] for k, v in out.items()}
    return out


def _check_bounds(pool: np.ndarray, off: np.ndarray, lens: np.ndarray) -> None:
    """Raise ``IndexError`` unless every chunk (``int64`` first token ``off`` and ``lens`` tokens, > 0)
    lies inside the token array ``pool``: the gathers after it do not check each index."""
    if len(off) and (int(off.min()) < 0 or int((off + lens).max()) > len(pool)):
        bad = int(np.flatnonzero((off < 0) | (off + lens > len(pool)))[0])
        raise IndexError(f"chunk of {int(lens[bad])} tokens at {int(off[bad])} is outside its token array "
                         f"of {len(pool)} tokens")


def _fields(table: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of a chunk table (``int64 [len(FIELDS), chunks]``) by field name (views, no copy)."""
    return dict(zip(FIELDS, table))


class ArrayPacker:
    """Chunk arrays in, :class:`loaders.pack.packed.PackedBatch` es out (see the module docstring).

    Args:
        mode: the batching mode (:func:`loaders.pack.batching.batching` of the ``data:`` config).
        window: tokens buffered before a packing (>= 1; checked after each whole document).
        pad_id: the token id of padding cells (the manifest's
            :attr:`shards.format.manifest.TokenizerIdentity.padding_id`; masked and never a label).
    """

    def __init__(self, mode: Batching, window: int, pad_id: int = 0):
        self.mode, self.window, self.pad_id = mode, max(window, 1), pad_id
        # the buffer: one row per field, one column per chunk, in the first `_size` columns of `_table`. New
        # chunks go into its spare columns, a packing moves the chunks it leaves into `_spare` (then the two
        # swap) and reads the chunks it packs into `_picked`: on short documents the buffer is ~16,000 chunks
        # (1 MB), which a fresh table per append and per packing copied whole every time
        self._table = self._spare = self._picked = np.zeros((len(FIELDS), 0), np.int64)
        self._size = 0
        self.buf = _fields(self._table)  # the buffer's rows by field name (views)
        self.buffered = 0  # tokens in the buffer
        self.ready: list[PackedBatch] = []  # packed, waiting to be emitted
        self.pools: dict[int, np.ndarray] = {}  # token arrays by src number
        self.keys: dict[int, object] = {}  # sample keys by group (add call)
        self.pending: list[tuple[int, int, int]] = []  # empty/bad documents, reported with the next batch
        self._next_group = self._next_src = 0
        self._src_of: dict[int, int] = {}  # id() of a live token array -> its src number
        self._current: set[int] = set()  # src numbers of the current add call
        self._work = [np.empty(0, np.int64), np.empty(0, np.int64)]  # see _scratch
        self._iota = np.zeros(0, np.int64)  # 0, 1, 2, ... (see _runs)

    def add(self, pools, keys, chunks: dict[str, np.ndarray]) -> Iterator[PackedBatch]:
        """Add chunks in order and yield every batch that becomes ready: the batches adding their documents
        one by one would give (empty/bad documents put in :attr:`pending` before the call ride with
        its first batch).

        Args:
            pools: token arrays (or one array) the chunks are read from.
            keys: sample keys by document: a :class:`loaders.pack.packed.KeyTable` or a list (read only
                when a batch's keys are).
            chunks: ``int64`` arrays ``pos, idx, n, length, off`` (:func:`split_documents`), ``doc``
                (index into ``keys``) and ``pool`` (index into ``pools``; all 0 when absent).
        """
        pools = [pools] if isinstance(pools, np.ndarray) else list(pools)
        g = self._next_group
        self._next_group += 1
        self.keys[g] = KeyList(keys) if isinstance(keys, list) else keys
        src = np.empty(len(pools), np.int64)
        for i, p in enumerate(pools):  # an array seen before (a shard's memory map) keeps its number
            src[i] = self._src_of.get(id(p), self._next_src)
            if src[i] == self._next_src:
                self._src_of[id(p)] = self._next_src
                self.pools[self._next_src] = p
                self._next_src += 1
        self._current = set(src.tolist())
        pool = chunks.get("pool")
        n = len(chunks["pos"])
        # one table, so that moving chunks into and out of the buffer is one numpy call, not one per field
        new = np.stack([chunks["pos"], chunks["idx"], chunks["n"], chunks["length"], np.full(n, g, np.int64),
                        chunks["doc"], src[pool] if pool is not None else np.full(n, src[0] if len(src) else 0),
                        chunks["off"]]).astype(np.int64, copy=False)
        # the stream adds a whole document's chunks, then packs once the window is reached
        doc = chunks["doc"]
        tokens = np.cumsum(chunks["length"])  # tokens of the new chunks up to each
        at = 0
        while at < n:
            base = int(tokens[at - 1]) if at else 0
            reach = int(np.searchsorted(tokens, base + self.window - self.buffered))  # chunk that fills the window
            end = int(np.searchsorted(doc, doc[min(reach, n - 1)], side="right"))  # its document's end
            self._append(new[:, at:end])
            self.buffered += int(tokens[end - 1]) - base
            at = end
            while self.ready or self.buffered >= self.window:
                yield self.pop()

    def _pack(self, final: bool) -> list[PackedBatch]:
        """One packing: the batches the mode picks from the buffer (every chunk when ``final``), built
        in one pass per shape; their chunks leave the buffer."""
        b = self.buf
        plans, taken = self.mode.select(b["length"], b["pos"], b["idx"], self.window, final)
        batches = [batch for plan in plans if len(plan.counts) for batch in self._build(plan)]
        rest = np.flatnonzero(~taken)  # in buffer order: the next packing's sort stays a radix sort
        if self._spare.shape != self._table.shape:
            self._spare = np.empty_like(self._table)
        self._table, self._spare = self._take(rest, self._spare), self._table
        self._resize(len(rest))
        self.buffered = int(self.buf["length"].sum())
        self._drop_pools()
        return batches

    def _append(self, columns: np.ndarray) -> None:
        """Put chunk columns (``int64 [len(FIELDS), k]``) after the buffered ones: in the table's spare
        columns, the table doubled first when they are too few."""
        size = self._size + columns.shape[1]
        if size > self._table.shape[1]:
            table = np.empty((len(FIELDS), max(size, 2 * self._table.shape[1])), np.int64)
            table[:, :self._size] = self._table[:, :self._size]
            self._table = table
        self._table[:, self._size:size] = columns
        self._resize(size)

    def _resize(self, size: int) -> None:
        """The buffer is now the table's first ``size`` columns."""
        self._size = size
        self.buf = _fields(self._table[:, :size])

    def _take(self, columns: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Buffered chunks ``columns`` (``int64`` indices below the buffer's size) into the first columns
        of ``out`` (``int64 [len(FIELDS), >= len(columns)]``); returns ``out``.

        One contiguous row at a time: ``np.take(..., axis=1)`` copies a table with spare columns whole
        first. The indices are in range by construction, so ``mode="wrap"`` only skips ``raise``'s
        buffered copy of the output."""
        k = len(columns)
        for f in range(len(FIELDS)):
            np.take(self._table[f, :self._size], columns, out=out[f, :k], mode="wrap")
        return out

    def pop(self) -> PackedBatch:
        """Next batch; packs the buffer first when no packed batch is waiting."""
        if not self.ready:
            self.ready = self._pack(final=False)
        return self._with_pending(self.ready.pop(0))

    def flush(self) -> Iterator[PackedBatch]:
        """Everything left: waiting batches, then the whole buffer packed (a last batch padded with empty
        rows), then the empty/bad documents noted after it (a :func:`loaders.pack.packed.records_only` batch)."""
        while self.ready:
            yield self._with_pending(self.ready.pop(0))
        self.ready = self._pack(final=True)
        while self.ready:
            yield self._with_pending(self.ready.pop(0))
        if self.pending:  # empty/bad documents after the last batch
            yield records_only(self.pending, self.mode.records_width)
            self.pending = []

    def _with_pending(self, batch: PackedBatch) -> PackedBatch:
        """``batch`` with the empty/bad documents noted since the last batch added to its ``consumed``."""
        if self.pending:
            batch.consumed = np.concatenate([consumed_array(self.pending), batch.consumed])
            self.pending = []
        return batch

    def _drop_pools(self) -> None:
        """Forget the token arrays and key lists no buffered chunk reads any more (the newest stay)."""
        live = set(distinct_ints(self.buf["src"])) | self._current  # and the current add call's arrays
        for g in [g for g in self.pools if g not in live]:
            del self._src_of[id(self.pools.pop(g))]
        live = set(distinct_ints(self.buf["group"])) | {self._next_group - 1}
        for g in [g for g in self.keys if g not in live]:
            del self.keys[g]

    def _scratch(self, n: int, slot: int) -> np.ndarray:
        """A reused ``int64`` work array of ``n`` elements (``slot`` 0 or 1): a fresh multi-MB array per
        packing costs a page fault per 4 KiB, which the allocator hands back to the OS between packings."""
        if len(self._work[slot]) < n:
            self._work[slot] = np.empty(max(n, 2 * len(self._work[slot])), np.int64)
        return self._work[slot][:n]

    def _runs(self, start: np.ndarray, lens: np.ndarray, gaps: np.ndarray | None, slot: int) -> np.ndarray:
        """Chunk ``k``'s ``lens[k]`` consecutive values from ``start[k]``, all chunks one after another
        (in work array ``slot``); ``gaps[k]`` more cells after chunk ``k`` go on counting (row padding).

        Each chunk's start less its first cell, repeated, plus 0, 1, 2, ...: 1.3x faster than a
        cumulative sum of steps (numpy's cumsum is a serial loop)."""
        width = lens if gaps is None else lens + gaps
        ends = np.cumsum(width)
        n = int(ends[-1]) if len(ends) else 0
        if len(self._iota) < n:
            self._iota = np.arange(max(n, 2 * len(self._iota)), dtype=np.int64)
        return np.add(np.repeat(start - (ends - width), width), self._iota[:n], out=self._scratch(n, slot))

    def _build(self, plan: RowPlan) -> list[PackedBatch]:
        """The batches of ``plan`` (rows of ``plan.width`` tokens, ``plan.rows`` per batch), gathered in one pass."""
        if self._picked.shape[1] < len(plan.chunks):
            self._picked = np.empty((len(FIELDS), max(len(plan.chunks), self._table.shape[1])), np.int64)
        c = _fields(self._take(plan.chunks, self._picked)[:, :len(plan.chunks)])  # reused: copy what batches keep
        counts, T, B = plan.counts, plan.width, plan.rows
        R = len(counts)
        n_rows = R - int(np.argmax(counts[::-1] > 0)) if counts.any() else 0  # rows holding chunks
        lens = c["length"]
        chunk_end = np.cumsum(counts)
        done = np.concatenate([[0], np.cumsum(lens)])
        before = done[chunk_end - counts]  # tokens before each row
        fill = done[chunk_end] - before  # tokens per row
        pad = np.flatnonzero(fill < T).tolist()  # rows ending in padding (few: packed bins are full)
        srcs = c["src"]
        used = [int(srcs[0])] if len(srcs) and srcs.min() == srcs.max() else np.unique(srcs).tolist()
        pools = [self.pools[g] for g in used]
        if len(used) == 1:
            pool, off, real = pools[0], c["off"], n_rows  # real: rows with chunks (the rest: the last batch's empty rows)
            _check_bounds(pool, off, lens)
            ids = np.empty((R, T), pool.dtype)
            short = np.flatnonzero(fill[:real] < T)
            gaps = np.zeros(len(lens), np.int64)  # a padded row's cells follow its last chunk
            gaps[chunk_end[short] - 1] = T - fill[short]
            whole = (counts[:real] == 1) & (fill[:real] == T)  # rows that are one chunk of T tokens
            cuts = (np.flatnonzero(whole[1:] != whole[:-1]) + 1).tolist()
            step = max(1, GATHER_TOKENS // T)
            for a0, b0 in zip([0, *cuts], [*cuts, real]):  # runs of rows all whole or all not (a few per packing)
                if whole[a0]:
                    # each row a window of the token array, copied row by row: ~10x faster per token than the
                    # gather by index (most rows of long documents)
                    ids[a0:b0] = sliding_window_view(pool, T)[off[chunk_end[a0:b0] - 1]]
                    continue
                # each cell's token by index (padding cells read on past the row's last chunk, wrapped into the
                # token array by mode="wrap", and are set to pad_id after);
                # np.take with intp indices: about twice as fast as fancy indexing here. The indices are
                # made and used GATHER_TOKENS at a time, so they stay in the CPU cache (1.5x faster).
                # mode="wrap": the chunks are in bounds (checked above; only padding cells wrap), and "raise"
                # gathers into a buffer first, then copies it out (1.2-1.5x the time)
                for r0 in range(a0, b0, step):
                    r1 = min(b0, r0 + step)
                    a, b = int(chunk_end[r0] - counts[r0]), int(chunk_end[r1 - 1])
                    np.take(pool, self._runs(off[a:b], lens[a:b], gaps[a:b], 0), out=ids[r0:r1].reshape(-1),
                            mode="wrap")
            ids[real:] = self.pad_id
            for r in pad:
                ids[r, fill[r]:] = self.pad_id
        else:  # chunks grouped by token array (shards, zstd blocks): one gather and one scatter per array
            slot = np.searchsorted(used, srcs)  # each chunk's array, numbered 0.. in `used`
            by = np.argsort(slot.astype(np.uint16 if len(used) < 1 << 16 else np.int64), kind="stable")  # radix sort
            row_of = np.repeat(np.arange(R, dtype=np.int64), counts)
            cell = row_of * T + (done[:-1] - before[row_of])  # each chunk's first cell
            off, cell, lens_by = c["off"][by], cell[by], lens[by]
            tok = np.concatenate([[0], np.cumsum(lens_by)])
            per_pool = np.searchsorted(slot[by], np.arange(len(used) + 1)).tolist()  # each array's chunks
            ids = np.full(R * T, self.pad_id, np.result_type(*pools))
            for pool, a0, b0 in zip(pools, per_pool[:-1], per_pool[1:]):
                cuts = np.searchsorted(tok, np.arange(tok[a0] + GATHER_TOKENS, tok[b0], GATHER_TOKENS)).tolist()
                for a, b in zip([a0, *cuts], [*cuts, b0]):  # GATHER_TOKENS at a time, as above
                    if a < b:
                        ids[self._runs(cell[a:b], lens_by[a:b], None, 1)] = \
                            np.take(pool, self._runs(off[a:b], lens_by[a:b], None, 0))
            ids = ids.reshape(R, T)
        ids = ids if ids.dtype in (np.uint16, np.int32) else compact_ids(ids)
        consumed = np.stack([c["pos"], c["idx"], c["n"]], 1)
        lens32, counts32 = lens.astype(np.int32), counts.astype(np.int32)
        group = c["group"].copy()
        bounds = np.concatenate([[0], chunk_end[B - 1::B]]).tolist()
        keys = PackingKeys(dict(self.keys), group, c["key"].copy(), bounds)  # the live groups' keys (a few)
        # what a TokenBatch asks of each batch, for all of them at once (~10 us of numpy calls per batch otherwise):
        # document tokens, and whether each row is empty or one chunk filling it
        doc_tokens = np.diff(done[bounds]).tolist()
        one_doc = ((counts == 0) | ((counts == 1) & (fill == T))).reshape(-1, B).all(1).tolist()
        return [PackedBatch(ids[i * B:(i + 1) * B], lens32[a:b], counts32[i * B:(i + 1) * B], BatchKeys(keys, i),
                            consumed[a:b], doc_tokens=doc_tokens[i], one_document=one_doc[i])
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


def pack_documents(keys: list[str], documents: list[np.ndarray], seq_len: int, min_rows: int,
                   pad_id: int = 0) -> PackedBatch:
    """Documents packed into one batch as the loader packs them (``packed`` mode: chunks of ``seq_len``,
    best-fit-decreasing), with at least ``min_rows`` rows (``[max(bins, min_rows), seq_len]``).

    Args:
        keys: the documents' sample keys; ``documents``: their 1-D integer token arrays.
        pad_id: the id of padding cells (see :class:`ArrayPacker`).
    Raises:
        ValueError: an empty document list.
    """
    if not documents:
        raise ValueError("pack_documents: no documents")
    lengths = np.array([len(d) for d in documents], np.int64)
    chunks = split_documents(np.arange(len(documents), dtype=np.int64), lengths, np.cumsum(lengths) - lengths, seq_len)
    chunks["doc"] = np.arange(len(documents), dtype=np.int64)[chunks["doc"]]
    order = packing_order(chunks["length"], chunks["pos"], chunks["idx"], seq_len)
    bins = len(best_fit_bins(chunks["length"][order], seq_len)[1])
    packer = ArrayPacker(BestFit(seq_len, max(bins, min_rows), 0), int(lengths.sum()) + 1, pad_id)  # one packing: flush
    batches = list(packer.add(np.concatenate(documents), list(keys), chunks)) + list(packer.flush())
    return batches[0]
