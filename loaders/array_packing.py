"""Best-fit-decreasing packing over chunk arrays (the token-block loader's hot path).

Same algorithm and the same batches as :class:`loaders.packing.BestFitPacker` (Johnson 1973;
Ding et al., ICML 2024): chunks are buffered until ``window`` of them wait, packed into rows
of ``seq_len`` by best-fit-decreasing, the ``rows`` fullest bins (plus further batches made only
of full bins) are emitted and the other bins' chunks go back to the buffer. Only the bin search
walks chunks in Python (ints, no objects); splitting documents into chunks, gathering tokens
and building the batch are numpy operations over whole groups of documents.

A chunk is a row of parallel arrays: ``pos`` (global position), ``idx`` (chunk index), ``n``
(chunks of its document), ``length``, ``group`` (which token pool holds it), ``off`` (its first
token in that pool) and ``key`` (index into the pool's key list).
"""
from __future__ import annotations

import bisect
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

    def _bins(self) -> tuple[list[list[int]], list[int]]:
        """Best-fit-decreasing bins (lists of buffer rows) in creation order, and each bin's fill in tokens."""
        b = self.buf
        order = np.lexsort((b["idx"], b["pos"], -b["length"]))
        lengths = b["length"][order]
        full = int(np.searchsorted(-lengths, -self.seq_len, side="right"))  # chunks of seq_len come first
        bins: list[list[int]] = [[r] for r in order[:full].tolist()]  # each fills a bin alone: no search
        fill: list[int] = [self.seq_len] * full
        free: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
        for row, n in zip(order[full:].tolist(), lengths[full:].tolist()):
            i = bisect.bisect_left(free, (n, -1))
            if i < len(free):
                room, k = free.pop(i)
            else:
                room, k = self.seq_len, len(bins)
                bins.append([])
                fill.append(0)
            bins[k].append(row)
            fill[k] += n
            if room - n > 0:
                bisect.insort(free, (room - n, k))
        return bins, fill

    def _batch(self, bins: list[list[int]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        rows = np.array([r for bn in bins for r in bn], np.int64)
        return {f: self.buf[f][rows] for f in FIELDS}, np.array([len(bn) for bn in bins], np.int64)

    def pop(self) -> PackedBatch:
        """Next batch; packs the buffer first when no packed batch is waiting."""
        if not self.ready:
            bins, fill = self._bins()
            order = np.argsort(-np.asarray(fill, np.int64), kind="stable").tolist()  # fullest first, ties by bin
            n_full = fill.count(self.seq_len)
            take = order[:max(1, n_full // self.rows) * self.rows]
            taken = set(take)
            self.ready = [self._batch([bins[k] for k in sorted(take[i:i + self.rows])])
                          for i in range(0, len(take), self.rows)]
            rest = np.array([r for k in range(len(bins)) if k not in taken for r in bins[k]], np.int64)
            self.buf = {f: self.buf[f][rest] for f in FIELDS}
        return self._emit(*self.ready.pop(0))

    def flush(self) -> Iterator[PackedBatch]:
        """Everything left: waiting batches, then the buffer packed (the last batch padded with empty rows)."""
        while self.ready:
            yield self._emit(*self.ready.pop(0))
        bins, _ = self._bins()
        self.ready = [self._batch(bins[i:i + self.rows]) for i in range(0, len(bins), self.rows)]
        self.buf = {f: self.buf[f][:0] for f in FIELDS}
        while self.ready:
            yield self._emit(*self.ready.pop(0))

    def _emit(self, c: dict[str, np.ndarray], counts: np.ndarray) -> PackedBatch:
        T, B = self.seq_len, self.rows
        counts = np.concatenate([counts, np.zeros(B - len(counts), np.int64)])
        lens = c["length"]
        ends = np.cumsum(lens)
        row_of = np.repeat(np.arange(B, dtype=np.int64), counts)
        row_first = np.concatenate([[0], np.cumsum(counts)])[:-1]
        col = (ends - lens) - np.concatenate([[0], ends])[row_first][row_of]
        ids = np.zeros(B * T, np.int64)
        for g in np.unique(c["group"]).tolist():
            m = np.flatnonzero(c["group"] == g)
            ln = lens[m]
            starts = np.cumsum(ln) - ln
            src = np.repeat(c["off"][m] - starts, ln) + np.arange(int(ln.sum()))
            dst = np.repeat(row_of[m] * T + col[m] - starts, ln) + np.arange(int(ln.sum()))
            ids[dst] = self.pools[g][0][src]
        keys: list[str] = []
        for g, k in zip(c["group"].tolist(), c["key"].tolist()):
            key = self.pools[g][1][k]
            if not keys or keys[-1] != key:
                keys.append(key)
        consumed = self.pending + list(zip(c["pos"].tolist(), c["idx"].tolist(), c["n"].tolist()))
        self.pending = []
        live = set(np.unique(self.buf["group"]).tolist())
        for chunks, _ in self.ready:
            live.update(np.unique(chunks["group"]).tolist())
        for g in [g for g in self.pools if g not in live and g != self._next_group - 1]:
            del self.pools[g]
        return PackedBatch(compact_ids(ids.reshape(B, T)), lens.astype(np.int32), counts.astype(np.int32), keys, consumed)
