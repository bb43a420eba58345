"""Best-fit-decreasing packing over chunk arrays (the token-block loader's hot path).

Same algorithm and the same batches as :class:`loaders.packing.BestFitPacker` (Johnson 1973;
Ding et al., ICML 2024): chunks are buffered until ``window`` of them wait, packed into rows
of ``seq_len`` by best-fit-decreasing, the ``rows`` fullest bins (plus further batches made only
of full bins) are emitted and the other bins' chunks go back to the buffer. Only the bin search
runs in Python, one step per run of equal-length chunks and bin (ints, no objects); splitting
documents into chunks, gathering tokens and building the batch (one gather per batch) are
numpy operations over whole groups of documents.

A chunk is a row of parallel arrays: ``pos`` (global position), ``idx`` (chunk index), ``n``
(chunks of its document), ``length``, ``group`` (which token pool holds it), ``off`` (its first
token in that pool) and ``key`` (index into the pool's key list).
"""
from __future__ import annotations

import heapq
from typing import Iterator

import numpy as np

from .packed import PackedBatch, compact_ids

FIELDS = ("pos", "idx", "n", "length", "group", "off", "key")


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


class ArrayPacker:
    """Chunk arrays in, :class:`loaders.packed.PackedBatch` es out (see the module docstring).

    Args:
        seq_len: row length in tokens (T).
        rows: rows per batch (B).
        window: chunks buffered before a batch is packed (>= 1).
    """

    def __init__(self, seq_len: int, rows: int, window: int):
        self.seq_len, self.rows, self.window = seq_len, rows, max(window, 1)
        self.buf = {f: np.zeros(0, np.int64) for f in FIELDS}
        self.ready: list[tuple[dict[str, np.ndarray], np.ndarray]] = []  # (chunks in row order, chunks per row)
        self.pools: dict[int, tuple[np.ndarray, list[str]]] = {}
        self.pending: list[tuple[int, int, int]] = []  # empty/bad documents, reported with the next batch
        self._next_group = 0

    def add(self, tokens: np.ndarray, keys: list[str], chunks: dict[str, np.ndarray]) -> Iterator[PackedBatch]:
        """Add chunks (``pos, idx, n, length, off`` into ``tokens``; ``doc`` indexes ``keys``) in order;
        yields every batch that becomes ready, exactly as adding them one by one to a
        :class:`loaders.packing.BestFitPacker` would (empty/bad documents put in :attr:`pending`
        before a group ride with its first batch instead of a later one)."""
        g = self._next_group
        self._next_group += 1
        self.pools[g] = (tokens, keys)
        new = {"pos": chunks["pos"], "idx": chunks["idx"], "n": chunks["n"], "length": chunks["length"],
               "group": np.full(len(chunks["pos"]), g, np.int64), "off": chunks["off"], "key": chunks["doc"]}
        # the stream adds a whole document's chunks, then packs once the window is reached
        doc_end = np.searchsorted(chunks["doc"], chunks["doc"], side="right")
        at = 0
        while at < len(new["pos"]):
            end = int(doc_end[min(len(new["pos"]), at + max(1, self.window - len(self.buf["pos"]))) - 1])
            self.buf = {f: np.concatenate([self.buf[f], new[f][at:end]]) for f in FIELDS}
            at = end
            while self.ready or len(self.buf["pos"]) >= self.window:
                yield self.pop()

    def _bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best-fit-decreasing over the buffer: ``(order, bin_of, fill)``, ``int64`` arrays: buffer rows in
        packing order, the bin each of them went to (bins numbered in creation order) and each bin's
        fill in tokens. A bin's chunks are the rows with its number, in packing order.

        Best fit = the bin with the least room that still fits, ties to the oldest bin: free bins are
        kept per room (a heap of bin numbers each) with a bitmask of the non-empty rooms, so the search
        is one shift and one lowest-set-bit per chunk instead of a search over all open bins."""
        b = self.buf
        order = np.lexsort((b["idx"], b["pos"], -b["length"]))
        lengths = b["length"][order]
        T = self.seq_len
        full = int(np.searchsorted(-lengths, -T, side="right"))  # chunks of seq_len come first, one bin each
        # chunks over half a row come next: each opens a bin (every open bin holds a longer one)
        big = int(np.searchsorted(-lengths, -(T // 2), side="left"))
        heaps: list[list[int]] = [[] for _ in range(T + 1)]  # room -> heap of bin numbers with that room
        for k, room in zip(range(full, big), (T - lengths[full:big]).tolist()):
            heaps[room].append(k)  # bin numbers ascend: each list is already a heap
        rooms = sum(1 << r for r in set((T - lengths[full:big]).tolist()))  # bit r: an open bin has r free tokens
        fill = [T] * full + lengths[full:big].tolist()
        bin_of = list(range(big))
        rest = lengths[big:]
        starts = np.flatnonzero(np.concatenate([[True], rest[1:] != rest[:-1]])) if len(rest) else rest
        counts = np.diff(np.append(starts, len(rest)))
        # equal chunks in a row go to one bin while they fit: after one lands in the best-fit bin,
        # that bin's smaller room is still the unique best fit for the next (older bins had more room)
        for n, left in zip(rest[starts].tolist(), counts.tolist()):
            while left:
                fits = rooms >> n
                if fits:
                    room = n + (fits & -fits).bit_length() - 1  # least room >= n
                    heap = heaps[room]
                    k = heapq.heappop(heap)
                    if not heap:
                        rooms ^= 1 << room
                else:
                    room, k = T, len(fill)
                    fill.append(0)
                q = min(left, room // n)
                bin_of += [k] * q
                fill[k] += q * n
                left -= q
                room -= q * n
                if room:
                    heap = heaps[room]
                    if not heap:
                        rooms |= 1 << room
                    heapq.heappush(heap, k)
        return order, np.array(bin_of, np.int64), np.array(fill, np.int64)

    def _take(self, order: np.ndarray, bin_of: np.ndarray, bins: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The chunks of ``bins`` (bin numbers, in row order) as a batch: chunk fields in row order, chunks per row."""
        rank = np.full(int(bin_of.max()) + 1 if len(bin_of) else 0, -1, np.int64)
        rank[bins] = np.arange(len(bins))
        row = rank[bin_of]
        sel = np.flatnonzero(row >= 0)
        rows = order[sel[np.argsort(row[sel], kind="stable")]]
        return {f: self.buf[f][rows] for f in FIELDS}, np.bincount(row[sel], minlength=len(bins)).astype(np.int64)

    def pop(self) -> PackedBatch:
        """Next batch; packs the buffer first when no packed batch is waiting."""
        if not self.ready:
            order, bin_of, fill = self._bins()
            by_fill = np.argsort(-fill, kind="stable")  # fullest first, ties by bin
            n_full = int(np.count_nonzero(fill == self.seq_len))
            take = by_fill[:max(1, n_full // self.rows) * self.rows]
            self.ready = [self._take(order, bin_of, np.sort(take[i:i + self.rows]))
                          for i in range(0, len(take), self.rows)]
            taken = np.zeros(len(fill), bool)
            taken[take] = True
            keep = np.flatnonzero(~taken[bin_of])
            rest = order[keep[np.argsort(bin_of[keep], kind="stable")]]
            self.buf = {f: self.buf[f][rest] for f in FIELDS}
            self._drop_pools()
        return self._emit(*self.ready.pop(0))

    def flush(self) -> Iterator[PackedBatch]:
        """Everything left: waiting batches, then the buffer packed (the last batch padded with empty rows)."""
        while self.ready:
            yield self._emit(*self.ready.pop(0))
        order, bin_of, fill = self._bins()
        self.ready = [self._take(order, bin_of, np.arange(i, min(i + self.rows, len(fill))))
                      for i in range(0, len(fill), self.rows)]
        self.buf = {f: self.buf[f][:0] for f in FIELDS}
        self._drop_pools()
        while self.ready:
            yield self._emit(*self.ready.pop(0))

    def _drop_pools(self) -> None:
        """Forget the token pools no buffered or waiting chunk reads any more (the newest group stays)."""
        live = set(np.unique(self.buf["group"]).tolist())
        for chunks, _ in self.ready:
            live.update(np.unique(chunks["group"]).tolist())
        for g in [g for g in self.pools if g not in live and g != self._next_group - 1]:
            del self.pools[g]

    def _emit(self, c: dict[str, np.ndarray], counts: np.ndarray) -> PackedBatch:
        T, B = self.seq_len, self.rows
        counts = np.concatenate([counts, np.zeros(B - len(counts), np.int64)])
        lens = c["length"]
        ends = np.cumsum(lens)
        row_of = np.repeat(np.arange(B, dtype=np.int64), counts)
        row_first = np.concatenate([[0], np.cumsum(counts)])[:-1]
        starts = ends - lens  # each chunk's first token in the batch's concatenated tokens
        col = starts - np.concatenate([[0], ends])[row_first][row_of]
        step = np.arange(int(ends[-1]) if len(ends) else 0)
        src = np.repeat(c["off"] - starts, lens) + step  # token positions in each chunk's pool
        dst = np.repeat(row_of * T + col - starts, lens) + step  # and in the flat [B * T] batch
        group = c["group"]
        groups = np.unique(group).tolist()
        pools = [self.pools[g][0] for g in groups]
        # uint16 pools fill a uint16 batch directly (what compact_ids would return); others go via int64
        ids = np.zeros(B * T, np.uint16 if all(p.dtype == np.uint16 for p in pools) else np.int64)
        if len(groups) == 1:
            ids[dst] = pools[0][src]
        else:
            tok_group = np.repeat(group, lens)
            for g, pool in zip(groups, pools):
                m = tok_group == g
                ids[dst[m]] = pool[src[m]]
        k = c["key"]
        first = np.flatnonzero(np.concatenate([[True], (group[1:] != group[:-1]) | (k[1:] != k[:-1])])) \
            if len(group) else group
        keys: list[str] = []
        for key in [self.pools[gi][1][ki] for gi, ki in zip(group[first].tolist(), k[first].tolist())]:
            if not keys or keys[-1] != key:  # one key per run of the same document
                keys.append(key)
        consumed = self.pending + list(zip(c["pos"].tolist(), c["idx"].tolist(), c["n"].tolist()))
        self.pending = []
        ids = ids.reshape(B, T) if ids.dtype == np.uint16 else compact_ids(ids.reshape(B, T))
        return PackedBatch(ids, lens.astype(np.int32), counts.astype(np.int32), keys, consumed)
