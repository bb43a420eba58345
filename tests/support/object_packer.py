"""The object packer: the loader's packing, one chunk object at a time — the oracle the array packer
(:mod:`loaders.pack.packer`) is tested against, batch for batch.

A document of ``n`` tokens is cut into ``ceil(n / seq_len)`` chunks of at most ``seq_len``
tokens; **each chunk is treated as its own document** (positions restart at 0, no label
crosses into the next chunk, so one next-token target is lost per cut).

``packed`` mode (:class:`BestFitPacker`): chunks are buffered until they hold ``window`` tokens
and packed into rows of ``seq_len`` by best-fit-decreasing (Johnson, "Near-optimal bin packing
algorithms", MIT 1973; used for LM data by Ding et al., "Fewer Truncations Improve Language
Modeling", ICML 2024). A packing emits its full bins (at most ``slack`` tokens of room), fullest
first, in whole batches (:func:`bins_to_take`); the chunks of the other bins go back to the buffer
and are packed again with new chunks, so only the end of the stream pays for badly filled rows.

``token_budget`` mode (:class:`TokenBudgetBatcher`): one chunk per row, chunks sorted by length
in the window (``window`` tokens), rows padded to the longest chunk of the batch,
``rows x padded_len <= max_tokens`` (dynamic batching as in fairseq's ``max_tokens``).
"""
from __future__ import annotations

import bisect
from operator import attrgetter

import numpy as np

from loaders.pack.batching import bins_to_take
from loaders.pack.packed import PackedBatch, compact_ids, records_only


class Chunk:
    """Chunk ``index`` of ``n_chunks`` of the document at global ``position`` (``tokens`` 1-D).

    A slotted class, not a dataclass: one is made per chunk.
    """

    __slots__ = ("position", "key", "index", "n_chunks", "tokens", "length", "sort_key")

    def __init__(self, position: int, key: str, index: int, n_chunks: int, tokens: np.ndarray):
        self.position, self.key, self.index, self.n_chunks, self.tokens = position, key, index, n_chunks, tokens
        self.length = len(tokens)
        self.sort_key = (-self.length, position, index)  # longest first, ties by place


def split_document(position: int, key: str, tokens: np.ndarray, seq_len: int,
                   skip: set[int] | frozenset = frozenset()) -> list[Chunk]:
    """Chunks of one document, leaving out the chunk indices in ``skip`` (delivered before a resume)."""
    if len(tokens) <= seq_len and not skip:  # most documents: one chunk
        return [Chunk(position, key, 0, 1, tokens)]
    n_chunks = -(-len(tokens) // seq_len)
    return [Chunk(position, key, i, n_chunks, tokens[i * seq_len:(i + 1) * seq_len])
            for i in range(n_chunks) if i not in skip]


def pack_rows(rows: list[list[Chunk]], row_len: int, n_rows: int | None = None,
              extra_consumed: list[tuple[int, int, int]] | None = None) -> PackedBatch:
    """A :class:`loaders.pack.packed.PackedBatch` ``[n_rows, row_len]`` from rows of chunks (missing rows: padding).

    Token ids are ``uint16`` when they fit, else ``int32``; the full arrays (labels, positions,
    document ids) are derived by :func:`loaders.rank.batch.expand`.
    """
    n_rows = len(rows) if n_rows is None else n_rows
    rows = rows[:n_rows]
    chunks = [ch for row in rows for ch in row]
    ids = np.zeros((n_rows, row_len), np.int64)
    if chunks:
        lens = np.fromiter((ch.length for ch in chunks), np.int64, len(chunks))
        counts = np.zeros(n_rows, np.int64)
        counts[:len(rows)] = [len(r) for r in rows]
        row_of = np.repeat(np.arange(n_rows), counts)
        ends = np.cumsum(lens)
        row_first = np.concatenate([[0], np.cumsum(counts)])[:-1]
        col = (ends - lens) - np.concatenate([[0], ends])[row_first][row_of]
        flat_chunk = np.repeat(np.arange(len(chunks)), lens)
        at = (row_of * row_len + col)[flat_chunk] + np.arange(int(ends[-1])) - (ends - lens)[flat_chunk]
        ids.reshape(-1)[at] = np.concatenate([ch.tokens for ch in chunks])
    else:
        lens, counts = np.zeros(0, np.int64), np.zeros(n_rows, np.int64)
    keys: list[str] = []
    consumed = list(extra_consumed or [])
    for ch in chunks:
        consumed.append((ch.position, ch.index, ch.n_chunks))
        if not keys or keys[-1] != ch.key:
            keys.append(ch.key)
    return PackedBatch(compact_ids(ids), lens.astype(np.int32), counts.astype(np.int32), keys, consumed)


def make_batch(rows: list[list[Chunk]], row_len: int, n_rows: int | None = None,
               extra_consumed: list[tuple[int, int, int]] | None = None):
    """:func:`pack_rows` expanded into a :class:`loaders.rank.batch.TokenBatch` (int64 ``[n_rows, row_len]`` tensors)."""
    from loaders.rank.batch import TokenBatch  # torch stays out of worker processes, which only pack

    return TokenBatch.from_packed(pack_rows(rows, row_len, n_rows, extra_consumed))


def best_fit_decreasing(chunks: list[Chunk], capacity: int) -> list[list[Chunk]]:
    """Pack chunks (each ``<= capacity`` tokens) into bins by best-fit-decreasing.

    Returns bins in creation order; deterministic (ties broken by position, chunk index).
    """
    bins: list[list[Chunk]] = []
    free: list[tuple[int, int]] = []  # sorted (free tokens, bin index)
    for ch in sorted(chunks, key=attrgetter("sort_key")):
        n = ch.length
        i = bisect.bisect_left(free, (n, -1))
        if i < len(free):
            room, b = free.pop(i)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(ch)
        if room - n > 0:
            bisect.insort(free, (room - n, b))
    return bins


class BestFitPacker:
    """Buffer chunks and emit batches of ``rows`` packed rows of ``seq_len`` tokens.

    Args:
        seq_len: row length in tokens (T).
        rows: rows per batch (B).
        window: tokens buffered before a batch is packed (>= 1; checked after each whole document).
        slack: the room (tokens) a full bin may have (:func:`bins_to_take`).
    """

    def __init__(self, seq_len: int, rows: int, window: int, slack: int):
        self.seq_len, self.rows, self.window, self.slack = seq_len, rows, max(window, 1), slack
        self.buffer: list[Chunk] = []
        self.buffered = 0  # tokens in the buffer
        self.ready_rows: list[list[list[Chunk]]] = []  # packed batches waiting to be emitted
        self.pending: list[tuple[int, int, int]] = []  # empty/bad documents, reported with the next batch

    def add(self, chunk: Chunk) -> None:
        """Buffer one chunk."""
        self.buffer.append(chunk)
        self.buffered += chunk.length

    def ready(self) -> bool:
        """Whether a batch can be popped (one is packed, or the buffer holds ``window`` tokens)."""
        return bool(self.ready_rows) or self.buffered >= self.window

    def pop(self) -> PackedBatch:
        """Next batch. When none is packed: pack the buffer and emit the fullest bins
        (:func:`bins_to_take`); the other bins' chunks stay buffered."""
        if not self.ready_rows:
            bins = best_fit_decreasing(self.buffer, self.seq_len)
            fill = [sum(c.length for c in b) for b in bins]
            order = sorted(range(len(bins)), key=lambda b: (-fill[b], b))
            take = order[:bins_to_take(np.array([fill[b] for b in order], np.int64), self.seq_len, self.rows,
                                       self.window, self.slack)]
            taken = set(take)
            self.buffer = [c for b in range(len(bins)) if b not in taken for c in bins[b]]
            self.buffered = sum(c.length for c in self.buffer)
            self.ready_rows = [[bins[b] for b in sorted(take[i:i + self.rows])] for i in range(0, len(take), self.rows)]
        return self._emit(self.ready_rows.pop(0))

    def flush(self) -> list[PackedBatch]:
        """Emit everything left (the last batch padded with empty rows; empty/bad documents noted
        after it in a :func:`loaders.pack.packed.records_only` batch)."""
        out = [self._emit(rows) for rows in self.ready_rows]
        bins = best_fit_decreasing(self.buffer, self.seq_len)
        self.buffer, self.ready_rows, self.buffered = [], [], 0
        out += [self._emit(bins[i:i + self.rows]) for i in range(0, len(bins), self.rows)]
        if self.pending:
            out.append(records_only(self.pending, self.seq_len))
            self.pending = []
        return out

    def _emit(self, rows: list[list[Chunk]]) -> PackedBatch:
        batch = pack_rows(rows, self.seq_len, self.rows, self.pending)
        self.pending = []
        return batch


class TokenBudgetBatcher:
    """Buffer chunks and emit batches of one chunk per row with ``rows x padded_len <= max_tokens``.

    Args:
        max_tokens: token budget per batch, counting padding (>= the longest chunk).
        window: tokens buffered before a batch is formed.
    """

    def __init__(self, max_tokens: int, window: int):
        self.max_tokens, self.window = max_tokens, max(window, 1)
        self.buffer: list[Chunk] = []
        self.buffered = 0  # tokens in the buffer
        self.ready_groups: list[list[Chunk]] = []  # formed, waiting to be emitted
        self.pending: list[tuple[int, int, int]] = []

    def add(self, chunk: Chunk) -> None:
        """Buffer one chunk."""
        self.buffer.append(chunk)
        self.buffered += chunk.length

    def ready(self) -> bool:
        """Whether a batch can be popped (one is formed, or the buffer holds ``window`` tokens)."""
        return bool(self.ready_groups) or self.buffered >= self.window

    def _groups(self) -> list[list[Chunk]]:
        groups: list[list[Chunk]] = []
        for ch in sorted(self.buffer, key=attrgetter("sort_key")):
            if groups and (len(groups[-1]) + 1) * groups[-1][0].length <= self.max_tokens:
                groups[-1].append(ch)
            else:
                groups.append([ch])
        return groups

    def pop(self) -> PackedBatch:
        """Next batch. When none is formed: group the buffer once (one sort) and take groups, the one
        holding the oldest buffered chunk first (so no chunk waits for ever), until at most half the
        window stays buffered."""
        if not self.ready_groups:
            arrival = {id(c): i for i, c in enumerate(self.buffer)}
            groups = sorted(self._groups(), key=lambda g: min(arrival[id(c)] for c in g))
            left = self.buffered
            for g in groups:
                self.ready_groups.append(g)
                left -= sum(c.length for c in g)
                if left <= self.window // 2:
                    break
            taken = {id(c) for g in self.ready_groups for c in g}
            self.buffer = [c for c in self.buffer if id(c) not in taken]
            self.buffered = left
        return self._emit(self.ready_groups.pop(0))

    def flush(self) -> list[PackedBatch]:
        """Emit every buffered chunk as batches (end of the stream; empty/bad documents noted after
        the last one in a :func:`loaders.pack.packed.records_only` batch)."""
        groups = self.ready_groups + self._groups()
        self.buffer, self.buffered, self.ready_groups = [], 0, []
        out = [self._emit(g) for g in groups]
        if self.pending:
            out.append(records_only(self.pending, 1))
            self.pending = []
        return out

    def _emit(self, group: list[Chunk]) -> PackedBatch:
        batch = pack_rows([[c] for c in group], max(c.length for c in group), extra_consumed=self.pending)
        self.pending = []
        return batch
