"""Best-fit-decreasing packing over chunk arrays (the token-block loader's hot path).

Same algorithm and the same batches as :class:`loaders.pack.object_packer.BestFitPacker` (Johnson 1973;
Ding et al., ICML 2024): chunks are buffered until they hold ``window`` tokens, packed into rows
of ``seq_len`` by best-fit-decreasing, the fullest bins are emitted in whole batches
(:func:`loaders.pack.object_packer.bins_to_take`) and the other bins' chunks go back to the buffer. Only the bin search
runs in Python, one step per run of equal-length chunks and bin (ints, no objects); splitting
documents into chunks, gathering tokens and building the batch (one gather per batch) are
numpy operations over whole groups of documents.

A chunk is a row of parallel arrays: ``pos`` (global position), ``idx`` (chunk index), ``n``
(chunks of its document), ``length``, ``group`` (the :meth:`ArrayPacker.add` call it came in),
``key`` (its document's index in that call's keys), ``src`` (the token array holding it) and
``off`` (its first token there). Token arrays are the shards' own (memory-mapped raw blocks,
decompressed zstd blocks): a token is copied once, into its batch.
"""
from __future__ import annotations

import collections
import heapq
from typing import Iterator

import numpy as np
import numpy.ma  # noqa: F401 - np.unique imports it on its first call: 10 ms inside the first batch otherwise

from loaders.pack.packed import BatchKeys, PackedBatch, compact_ids, consumed_array, records_only
from loaders.pack.object_packer import bins_to_take

FIELDS = ("pos", "idx", "n", "length", "group", "key", "src", "off")
GATHER_TOKENS = 65_536  # tokens gathered per np.take: 512 KiB of int64 indices, within a core's L2 cache


def split_documents(pos: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, seq_len: int,
                    delivered: dict[int, set[int]] | None = None) -> dict[str, np.ndarray]:
    """Chunks of documents as arrays: document ``d`` (``lengths[d] > 0`` tokens from ``offsets[d]``)
    is cut into ``ceil(lengths[d] / seq_len)`` chunks; chunk indices in ``delivered[pos]`` (chunks
    delivered before a resume) are left out. Returns ``int64`` arrays ``pos, idx, n, length, off, doc``."""
    n_ch = -(-lengths // seq_len)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), n_ch)
    idx = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(n_ch) - n_ch, n_ch)
    out = {"pos": pos[doc], "idx": idx, "n": n_ch[doc], "length": np.minimum(seq_len, lengths[doc] - idx * seq_len),
           "off": offsets[doc] + idx * seq_len, "doc": doc}
    if delivered:
        keep = np.array([c not in delivered.get(p, ()) for p, c in zip(out["pos"].tolist(), idx.tolist())], bool)
        out = {k: v[keep] for k, v in out.items()}
    return out


def _packing_order(length: np.ndarray, pos: np.ndarray, idx: np.ndarray, seq_len: int) -> np.ndarray:
    """Chunks sorted longest first, ties by position then chunk index. The buffer is normally in
    (position, chunk) order already (a consumer reads its positions in ascending order and the
    packer keeps leftovers in buffer order), and then a stable radix sort of the 16-bit room
    ``seq_len - length`` is the whole sort (about 10x faster than sorting int64 keys); otherwise one
    sort of a combined ``int64`` key (30x faster than ``np.lexsort`` on three keys) when it cannot
    overflow."""
    if not len(length):
        return np.zeros(0, np.int64)
    n_pos, n_idx = int(pos.max()) + 1, int(idx.max()) + 1
    if (seq_len + 1) * n_pos * n_idx >= 1 << 62:
        return np.lexsort((idx, pos, -length))
    tie = pos * n_idx + idx
    if seq_len < 1 << 16 and (tie[1:] > tie[:-1]).all():
        return np.argsort((seq_len - length).astype(np.uint16), kind="stable")
    return np.argsort((seq_len - length) * (n_pos * n_idx) + tie)


class ArrayPacker:
    """Chunk arrays in, :class:`loaders.pack.packed.PackedBatch` es out (see the module docstring).

    Args:
        seq_len: row length in tokens (T).
        rows: rows per batch (B).
        window: tokens buffered before a batch is packed (>= 1; checked after each whole document).
    """

    def __init__(self, seq_len: int, rows: int, window: int):
        self.seq_len, self.rows, self.window = seq_len, rows, max(window, 1)
        self.buf = {f: np.zeros(0, np.int64) for f in FIELDS}
        self.buffered = 0  # tokens in the buffer
        self.ready: list[PackedBatch] = []  # packed, waiting to be emitted
        self.pools: dict[int, np.ndarray] = {}  # token arrays by src number
        self.keys: dict[int, object] = {}  # sample keys by group (add call)
        self.pending: list[tuple[int, int, int]] = []  # empty/bad documents, reported with the next batch
        self._next_group = self._next_src = 0
        self._src_of: dict[int, int] = {}  # id() of a live token array -> its src number
        self._current: set[int] = set()  # src numbers of the current add call
        self._work = [np.empty(0, np.int64), np.empty(0, np.int64)]  # see _scratch

    def add(self, pools, keys, chunks: dict[str, np.ndarray]) -> Iterator[PackedBatch]:
        """Add chunks in order and yield every batch that becomes ready, exactly as adding them one by
        one to a :class:`loaders.pack.object_packer.BestFitPacker` would (empty/bad documents put in
        :attr:`pending` before a group ride with its first batch instead of a later one).

        Args:
            pools: token arrays (or one array) the chunks are read from.
            keys: sample keys by document (a list, or any object indexed like one; read only when a
                batch's keys are).
            chunks: ``int64`` arrays ``pos, idx, n, length, off`` (:func:`split_documents`), ``doc``
                (index into ``keys``) and ``pool`` (index into ``pools``; all 0 when absent).
        """
        pools = [pools] if isinstance(pools, np.ndarray) else list(pools)
        g = self._next_group
        self._next_group += 1
        self.keys[g] = keys
        src = np.empty(len(pools), np.int64)
        for i, p in enumerate(pools):  # an array seen before (a shard's memory map) keeps its number
            src[i] = self._src_of.get(id(p), self._next_src)
            if src[i] == self._next_src:
                self._src_of[id(p)] = self._next_src
                self.pools[self._next_src] = p
                self._next_src += 1
        self._current = set(src.tolist())
        pool = chunks.get("pool")
        new = {"pos": chunks["pos"], "idx": chunks["idx"], "n": chunks["n"], "length": chunks["length"],
               "group": np.full(len(chunks["pos"]), g, np.int64), "key": chunks["doc"],
               "src": src[pool] if pool is not None else np.full(len(chunks["pos"]), src[0] if len(src) else 0),
               "off": chunks["off"]}
        # the stream adds a whole document's chunks, then packs once the window is reached
        n = len(new["pos"])
        doc_end = np.searchsorted(chunks["doc"], chunks["doc"], side="right")
        tokens = np.cumsum(new["length"])  # tokens of the new chunks up to each
        at = 0
        while at < n:
            base = int(tokens[at - 1]) if at else 0
            reach = int(np.searchsorted(tokens, base + self.window - self.buffered))  # chunk that fills the window
            end = int(doc_end[min(reach, n - 1)])
            self.buf = {f: np.concatenate([self.buf[f], new[f][at:end]]) for f in FIELDS}
            self.buffered += int(tokens[end - 1]) - base
            at = end
            while self.ready or self.buffered >= self.window:
                yield self.pop()

    def _bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best-fit-decreasing over the buffer: ``(order, bin_of, fill)``, ``int64`` arrays: buffer rows in
        packing order, the bin each of them went to (bins numbered in creation order) and each bin's
        fill in tokens. A bin's chunks are the rows with its number, in packing order.

        Best fit = the bin with the least room that still fits, ties to the oldest bin: free bins are
        kept per room (a heap of bin numbers each) with a bitmask of the non-empty rooms, so the search
        is one shift and one lowest-set-bit per chunk instead of a search over all open bins."""
        b = self.buf
        order = _packing_order(b["length"], b["pos"], b["idx"], self.seq_len)
        lengths = b["length"][order]
        T = self.seq_len
        full = int(np.searchsorted(-lengths, -T, side="right"))  # chunks of seq_len come first, one bin each
        # chunks over half a row come next: each opens a bin (every open bin holds a longer one)
        big = int(np.searchsorted(-lengths, -(T // 2), side="left"))
        heaps: collections.defaultdict[int, list[int]] = collections.defaultdict(list)  # room -> heap of bin numbers
        for k, room in zip(range(full, big), (T - lengths[full:big]).tolist()):
            heaps[room].append(k)  # bin numbers ascend: each list is already a heap
        rooms = sum(1 << r for r in set((T - lengths[full:big]).tolist()))  # bit r: an open bin has r free tokens
        bins = big  # bins opened so far
        run_bin, run_len = list(range(big)), [1] * big  # the bin of each chunk in packing order, run-length coded
        rest = lengths[big:]
        starts = np.flatnonzero(np.concatenate([[True], rest[1:] != rest[:-1]])) if len(rest) else rest
        counts = np.diff(np.append(starts, len(rest)))
        # equal chunks in a row go to one bin while they fit: after one lands in the best-fit bin,
        # that bin's smaller room is still the unique best fit for the next (older bins had more room);
        # fills are summed afterwards, so the loop only tracks rooms
        for n, left in zip(rest[starts].tolist(), counts.tolist()):
            while left:
                fits = rooms >> n
                if not fits:  # no open bin fits: the rest open new bins of T // n chunks each
                    q = T // n
                    whole, part = divmod(left, q)
                    run_bin.extend(range(bins, bins + whole))
                    run_len.extend([q] * whole)
                    if whole and T - q * n:  # their rooms are below n and new bins have the highest numbers
                        if not heaps[T - q * n]:
                            rooms |= 1 << (T - q * n)
                        heaps[T - q * n].extend(range(bins, bins + whole))  # still a heap
                    bins += whole
                    if part:
                        run_bin.append(bins)
                        run_len.append(part)
                        if not heaps[T - part * n]:
                            rooms |= 1 << (T - part * n)
                        heaps[T - part * n].append(bins)
                        bins += 1
                    break
                room = n + (fits & -fits).bit_length() - 1  # least room >= n
                heap = heaps[room]
                k = heapq.heappop(heap)
                if not heap:
                    rooms ^= 1 << room
                q = room // n
                if q > left:
                    q = left
                run_bin.append(k)
                run_len.append(q)
                left -= q
                room -= q * n
                if room:
                    heap = heaps[room]
                    if not heap:
                        rooms |= 1 << room
                    heapq.heappush(heap, k)
        bin_of = np.repeat(np.array(run_bin, np.int64), run_len)
        return order, bin_of, np.bincount(bin_of, lengths, bins).astype(np.int64)

    def _take(self, order: np.ndarray, bin_of: np.ndarray, bins: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The chunks of ``bins`` (bin numbers, in row order) as a batch: chunk fields in row order, chunks per row."""
        rank = np.full(int(bin_of.max()) + 1 if len(bin_of) else 0, -1, np.int64)
        rank[bins] = np.arange(len(bins))
        row = rank[bin_of]
        sel = np.flatnonzero(row >= 0)
        # a stable sort of small ints is a radix sort: 10x faster than of int64
        rows = order[sel[np.argsort(row[sel].astype(np.uint16 if len(bins) < 1 << 16 else np.int64), kind="stable")]]
        return {f: self.buf[f][rows] for f in FIELDS}, np.bincount(row[sel], minlength=len(bins)).astype(np.int64)

    def pop(self) -> PackedBatch:
        """Next batch; packs the buffer first when no packed batch is waiting (every batch of one
        packing is built in one pass)."""
        if not self.ready:
            order, bin_of, fill = self._bins()
            by_fill = np.argsort(-fill, kind="stable")  # fullest first, ties by bin
            take = by_fill[:bins_to_take(fill[by_fill], self.seq_len, self.rows, self.window)]
            rows = np.sort(take.reshape(-1, self.rows) if len(take) % self.rows == 0 else take[None], axis=1)
            self.ready = self._build(*self._take(order, bin_of, rows.reshape(-1)))
            taken = np.zeros(len(fill), bool)
            taken[take] = True
            left = np.zeros(len(order), bool)
            left[order] = ~taken[bin_of]
            rest = np.flatnonzero(left)  # in buffer order: the next packing's sort stays a radix sort
            self.buf = {f: self.buf[f][rest] for f in FIELDS}
            self.buffered = int(self.buf["length"].sum())
            self._drop_pools()
        return self._with_pending(self.ready.pop(0))

    def flush(self) -> Iterator[PackedBatch]:
        """Everything left: waiting batches, then the buffer packed (the last batch padded with empty rows),
        then the empty/bad documents noted after it (a :func:`loaders.pack.packed.records_only` batch)."""
        while self.ready:
            yield self._with_pending(self.ready.pop(0))
        order, bin_of, fill = self._bins()
        if len(fill):
            self.ready = self._build(*self._take(order, bin_of, np.arange(len(fill))))
        self.buf = {f: self.buf[f][:0] for f in FIELDS}
        self.buffered = 0
        self._drop_pools()
        while self.ready:
            yield self._with_pending(self.ready.pop(0))
        if self.pending:  # empty/bad documents after the last batch
            yield records_only(self.pending, self.seq_len)
            self.pending = []

    def _with_pending(self, batch: PackedBatch) -> PackedBatch:
        """``batch`` with the empty/bad documents noted since the last batch added to its ``consumed``."""
        if self.pending:
            batch.consumed = np.concatenate([consumed_array(self.pending), batch.consumed])
            self.pending = []
        return batch

    def _drop_pools(self) -> None:
        """Forget the token arrays and key lists no buffered chunk reads any more (the newest stay)."""
        live = set(np.unique(self.buf["src"]).tolist()) | self._current  # and the current add call's arrays
        for g in [g for g in self.pools if g not in live]:
            del self._src_of[id(self.pools.pop(g))]
        live = set(np.unique(self.buf["group"]).tolist()) | {self._next_group - 1}
        for g in [g for g in self.keys if g not in live]:
            del self.keys[g]

    def _scratch(self, n: int, slot: int) -> np.ndarray:
        """A reused ``int64`` work array of ``n`` elements (``slot`` 0 or 1): a fresh multi-MB array per
        packing costs a page fault per 4 KiB, which the allocator hands back to the OS between packings."""
        if len(self._work[slot]) < n:
            self._work[slot] = np.empty(max(n, 2 * len(self._work[slot])), np.int64)
        return self._work[slot][:n]

    def _runs(self, start: np.ndarray, lens: np.ndarray, gaps: np.ndarray | None, slot: int) -> np.ndarray:
        """Chunk ``k``'s ``lens[k]`` consecutive values from ``start[k]``, all chunks one after another,
        as one cumulative sum (in work array ``slot``); ``gaps[k]`` more cells after chunk ``k`` repeat
        its last value (row padding)."""
        width = lens if gaps is None else lens + gaps
        ends = np.cumsum(width)
        d = self._scratch(int(ends[-1]) if len(ends) else 0, slot)
        d.fill(1)
        for k in np.flatnonzero(gaps).tolist() if gaps is not None else ():
            d[ends[k] - gaps[k]:ends[k]] = 0
        last = np.concatenate([[0], start[:-1] + lens[:-1] - 1])  # the value just before each chunk
        d[ends - width] = start - last
        return np.cumsum(d, out=d)

    def _build(self, c: dict[str, np.ndarray], counts: np.ndarray) -> list[PackedBatch]:
        """Batches of ``rows`` rows from chunks in row order (``counts``: chunks per row; the last batch
        padded with empty rows), all gathered in one pass."""
        T, B = self.seq_len, self.rows
        n_batches, n_rows = -(-len(counts) // B), len(counts)
        R = n_batches * B
        counts = np.concatenate([counts, np.zeros(R - len(counts), np.int64)])
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
            # each cell's token in the one array (padding cells repeat the row's last token, zeroed after);
            # np.take with intp indices: about twice as fast as fancy indexing here. The indices are
            # made and used GATHER_TOKENS at a time, so they stay in the CPU cache (1.5x faster)
            real = n_rows  # rows with chunks (the rest: the last batch's empty rows)
            short = np.flatnonzero(fill[:real] < T)
            gaps = np.zeros(len(lens), np.int64)  # a padded row's cells follow its last chunk
            gaps[chunk_end[short] - 1] = T - fill[short]
            ids = np.empty(R * T, pools[0].dtype)
            step = max(1, GATHER_TOKENS // T)
            for r0 in range(0, real, step):
                r1 = min(real, r0 + step)
                a, b = int(chunk_end[r0] - counts[r0]), int(chunk_end[r1 - 1])
                np.take(pools[0], self._runs(c["off"][a:b], lens[a:b], gaps[a:b], 0), out=ids[r0 * T:r1 * T])
            ids[real * T:] = 0
            ids = ids.reshape(R, T)
            for r in pad:
                ids[r, fill[r]:] = 0
        else:  # chunks grouped by token array (shards, zstd blocks): one gather and one scatter per array
            slot = np.searchsorted(used, srcs)  # each chunk's array, numbered 0.. in `used`
            by = np.argsort(slot.astype(np.uint16 if len(used) < 1 << 16 else np.int64), kind="stable")  # radix sort
            row_of = np.repeat(np.arange(R, dtype=np.int64), counts)
            cell = row_of * T + (done[:-1] - before[row_of])  # each chunk's first cell
            off, cell, lens_by = c["off"][by], cell[by], lens[by]
            tok = np.concatenate([[0], np.cumsum(lens_by)])
            per_pool = np.searchsorted(slot[by], np.arange(len(used) + 1)).tolist()  # each array's chunks
            ids = np.zeros(R * T, np.result_type(*pools))
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
        group = c["group"]
        tables = dict(self.keys)  # the live groups' keys (a few): no per-chunk pass to find the used ones
        bounds = np.concatenate([[0], chunk_end[B - 1::B]]).tolist()
        return [PackedBatch(ids[i * B:(i + 1) * B], lens32[a:b], counts32[i * B:(i + 1) * B],
                            BatchKeys(tables, group[a:b], c["key"][a:b]), consumed[a:b])
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
