"""The registry of batching modes (``data.batching``): which buffered chunks form which rows of which batch.

* ``packed`` (:class:`BestFit`): rows of ``seq_len`` tokens filled by best-fit-decreasing (Johnson,
  "Near-optimal bin packing algorithms", MIT 1973; for LM data Ding et al., "Fewer Truncations
  Improve Language Modeling", ICML 2024), ``micro_batch_size`` rows per batch; a packing emits its
  full bins (at most ``data.pack_slack`` of a row left empty) and then the fullest others, in whole
  batches (:func:`bins_to_take`), and keeps the other bins' chunks for the next.
* ``token_budget`` (:class:`TokenBudget`): one chunk per row, chunks sorted longest first and grouped
  while ``rows x longest <= max_tokens`` (dynamic batching as fairseq's ``max_tokens``); a packing
  emits groups, the one holding the oldest buffered chunk first, until at most half the window is left.

A mode sees the buffer as parallel ``int64`` arrays (``length``, ``pos``, ``idx``: the chunk's
length, its document's global position and its index in the document) and returns
:class:`RowPlan` s; :class:`loaders.pack.packer.ArrayPacker` gathers the tokens.
"""
from __future__ import annotations

import heapq
from typing import NamedTuple, Protocol

import numpy as np


class RowPlan(NamedTuple):
    """Batches of one shape: ``chunks`` (``int64`` buffer rows, in row order), ``counts`` (``int64``
    chunks per row, row order; a multiple of ``rows`` long, trailing rows empty), ``width`` (T,
    tokens per row) and ``rows`` (B, rows per batch)."""

    chunks: np.ndarray
    counts: np.ndarray
    width: int
    rows: int


class Batching(Protocol):
    """One batching mode (see the module docstring)."""

    name: str
    records_width: int  # row length of a batch that only carries resume records
    micro_batch_rows: int  # rows of a full micro-batch (the shape of a step policy's padding batch)
    micro_batch_tokens: int  # token slots (padding included) of a full micro-batch

    def select(self, length: np.ndarray, pos: np.ndarray, idx: np.ndarray, window: int,
               final: bool) -> tuple[list[RowPlan], np.ndarray]:
        """The batches to emit from a buffer of chunks: ``(plans, taken)``, ``taken`` a ``bool`` mask of the
        buffer rows they use. ``final``: the stream has ended, emit every chunk."""


def packing_order(length: np.ndarray, pos: np.ndarray, idx: np.ndarray, seq_len: int) -> np.ndarray:
    """Chunks sorted longest first, ties by position then chunk index (``int64`` buffer rows).

    The buffer is normally in (position, chunk) order already (a consumer reads its positions in
    ascending order and leftovers keep buffer order), and then a stable radix sort of the 16-bit
    room ``seq_len - length`` is the whole sort (about 10x faster than sorting int64 keys); otherwise
    one sort of a combined ``int64`` key (30x faster than ``np.lexsort`` on three keys) when it cannot
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


def bins_to_take(fill: np.ndarray, seq_len: int, rows: int, window: int, slack: int) -> int:
    """How many bins a packing emits, fullest first.

    Every full bin, in whole batches of ``rows``; then more whole batches while the bins kept back
    would hold more than ``window // 2`` tokens, so bins that cannot fill (the tails of documents
    just over a row long, say) are emitted instead of being packed again with every new document.
    At least one batch (all bins when fewer than ``rows``).

    A bin is full when at most ``slack`` tokens of it are left: best-fit-decreasing puts the shortest
    chunks last, into bins of their own, and ``seq_len // n`` chunks of ``n`` tokens leave a room that
    only a shorter chunk fills. Kept back, such bins were packed again at every packing (demo corpus:
    73 chunks of 7 tokens and 1 token of room a bin, 18,000 of 21,000 buffered chunks, for 17 batches).

    Args:
        fill: tokens per bin, sorted descending (``int64``).
        seq_len, rows: tokens per bin and bins per batch.
        window: the packer's window (tokens).
        slack: the room (tokens) a full bin may have.
    Returns:
        the number of bins to emit, the first of ``fill``.
    """
    n, n_full = len(fill), int(np.count_nonzero(fill >= seq_len - slack))
    over = int(fill.sum()) - window // 2  # tokens to emit so that at most window // 2 stay
    k = int(np.searchsorted(np.cumsum(fill), over)) + 1 if over > 0 else 0
    k = min(-(-k // rows) * rows, n // rows * rows)
    return min(max(n_full // rows, 1) * rows, n) if k <= n_full // rows * rows else k


def best_fit_bins(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit-decreasing of chunks already in packing order (``lengths``, ``int64``, each ``<= seq_len``):
    ``(bin_of, fill)``, the bin of each chunk (``int64``, bins numbered in creation order) and each bin's
    fill in tokens (``int64``).

    Best fit = the bin with the least room that still fits, ties to the oldest bin. Free bins are
    kept per room (a heap of bin numbers each) with a bitmask of the non-empty rooms, so the search
    is one shift and one lowest-set-bit per run of equal chunks instead of a search over all open
    bins; only this search runs in Python (ints, no objects), once per distinct length and bin
    filled, never per chunk."""
    T = seq_len
    per = np.bincount(lengths, minlength=T + 1)  # chunks of each length: the runs of the sorted lengths
    full = int(per[T])  # chunks of seq_len come first, one bin each
    # chunks over half a row come next: each opens a bin (every open bin holds a longer one); a run of
    # equal ones opens consecutive bins with one room, so each room's list is already a heap
    big_lens = np.flatnonzero(per[T // 2 + 1:T])[::-1] + T // 2 + 1
    # room -> heap of bin numbers (None: no open bin has that room); a list indexed by room, not a
    # dict: the loop below looks a room up a few times per bin filled (15% of its time with a defaultdict)
    heaps: list[list[int] | None] = [None] * T
    rooms = 0  # bit r: an open bin has r free tokens
    bins = full
    for n, c in zip(big_lens.tolist(), per[big_lens].tolist()):
        heaps[T - n] = list(range(bins, bins + c))
        rooms |= 1 << (T - n)
        bins += c
    big = bins  # bins opened so far: one per chunk so far
    run_bin, run_len = [], []  # the bin of each later chunk in packing order, run-length coded
    add_bin, add_len = run_bin.append, run_len.append
    small = np.flatnonzero(per[:T // 2 + 1])[::-1]
    pop, push = heapq.heappop, heapq.heappush
    # equal chunks in a row go to one bin while they fit: after one lands in the best-fit bin,
    # that bin's smaller room is still the unique best fit for the next (older bins had more room);
    # fills are summed afterwards, so the loop only tracks rooms
    for n, left in zip(small.tolist(), per[small].tolist()):
        while left:
            fits = rooms >> n
            if not fits:  # no open bin fits: the rest open new bins of T // n chunks each
                q = T // n
                whole, part = divmod(left, q)
                run_bin.extend(range(bins, bins + whole))
                run_len.extend([q] * whole)
                room = T - q * n
                if whole and room:  # their rooms are below n and new bins have the highest numbers
                    heap = heaps[room]
                    if heap:
                        heap.extend(range(bins, bins + whole))  # still a heap
                    else:
                        heaps[room] = list(range(bins, bins + whole))
                        rooms |= 1 << room
                bins += whole
                if part:
                    add_bin(bins)
                    add_len(part)
                    room = T - part * n
                    heap = heaps[room]
                    if heap:
                        heap.append(bins)
                    else:
                        heaps[room] = [bins]
                        rooms |= 1 << room
                    bins += 1
                break
            room = n + (fits & -fits).bit_length() - 1  # least room >= n
            heap = heaps[room]
            k = pop(heap)
            if not heap:
                rooms ^= 1 << room
            q = room // n
            if q > left:
                q = left
            add_bin(k)
            add_len(q)
            left -= q
            room -= q * n
            if room:
                heap = heaps[room]
                if heap:
                    push(heap, k)
                else:
                    heaps[room] = [k]
                    rooms |= 1 << room
    run_bin, run_len = np.array(run_bin, np.int64), np.array(run_len, np.int64)
    bin_of = np.concatenate([np.arange(big, dtype=np.int64), np.repeat(run_bin, run_len)])
    # a run's chunks share one length: its tokens are len x that length, summed per bin over runs, not chunks
    run_tokens = run_len * lengths[big + np.cumsum(run_len) - run_len]
    fill = np.zeros(bins, np.int64)
    fill[:big] = lengths[:big]
    fill += np.bincount(run_bin, run_tokens, bins).astype(np.int64)
    return bin_of, fill


def _small_ints(a: np.ndarray, bound: int) -> np.ndarray:
    """``a`` as ``uint16`` when its values are below ``bound`` < 2**16: a stable sort of it is a radix sort (10x faster)."""
    return a.astype(np.uint16) if bound < 1 << 16 else a


class BestFit:
    """``packed``: ``rows`` rows of ``seq_len`` tokens per batch, by best-fit-decreasing; a row with at
    most ``slack`` tokens of room is full (:func:`bins_to_take`)."""

    name = "packed"

    def __init__(self, seq_len: int, rows: int, slack: int):
        self.seq_len, self.rows, self.slack = seq_len, rows, slack
        self.records_width = seq_len
        self.micro_batch_rows, self.micro_batch_tokens = rows, rows * seq_len

    @classmethod
    def from_config(cls, cfg) -> "BestFit":
        """The mode of a ``data:`` config: ``data.seq_len``, ``data.micro_batch_size``, ``data.pack_slack``
        (a fraction of ``seq_len``, rounded down to tokens)."""
        return cls(cfg.seq_len, cfg.micro_batch_size, int(cfg.pack_slack * cfg.seq_len))

    @staticmethod
    def check(cfg) -> None:
        """Nothing beyond ``DataConfig.validate``'s own checks."""

    def select(self, length, pos, idx, window, final):
        """Every bin when ``final`` (creation order), else the fullest (:func:`bins_to_take`), rows of a batch in bin order."""
        order = packing_order(length, pos, idx, self.seq_len)
        bin_of, fill = best_fit_bins(length[order], self.seq_len)
        if final:
            take = np.arange(len(fill))
        else:
            by_fill = np.argsort(-fill, kind="stable")  # fullest first, ties by bin
            take = by_fill[:bins_to_take(fill[by_fill], self.seq_len, self.rows, window, self.slack)]
            take = np.sort(take.reshape(-1, self.rows) if len(take) % self.rows == 0 else take[None], axis=1).reshape(-1)
        rank = np.full(len(fill), -1, np.int64)
        rank[take] = np.arange(len(take))
        row = rank[bin_of]
        sel = np.flatnonzero(row >= 0)
        chunks = order[sel[np.argsort(_small_ints(row[sel], len(take)), kind="stable")]]
        counts = np.bincount(row[sel], minlength=len(take)).astype(np.int64)
        counts = np.concatenate([counts, np.zeros(-len(counts) % self.rows, np.int64)])
        taken = np.zeros(len(length), bool)
        taken[order[sel]] = True
        return [RowPlan(chunks, counts, self.seq_len, self.rows)], taken


class TokenBudget:
    """``token_budget``: one chunk per row, at most ``max_tokens`` token slots (padding included) per batch."""

    name = "token_budget"
    records_width = 1

    def __init__(self, max_tokens: int, seq_len: int):
        self.max_tokens, self.seq_len = max_tokens, seq_len
        self.micro_batch_rows, self.micro_batch_tokens = max(1, max_tokens // seq_len), max_tokens

    @classmethod
    def from_config(cls, cfg) -> "TokenBudget":
        """The mode of a ``data:`` config: ``data.max_tokens``, ``data.seq_len``."""
        return cls(cfg.max_tokens, cfg.seq_len)

    @staticmethod
    def check(cfg) -> None:
        """Raise ``ValueError`` when ``data.max_tokens`` cannot hold a chunk of ``data.seq_len`` tokens."""
        if cfg.max_tokens < cfg.seq_len:
            raise ValueError(f"data.max_tokens={cfg.max_tokens} is below data.seq_len={cfg.seq_len}:"
                             " a chunk of seq_len tokens would not fit in a batch")

    def select(self, length, pos, idx, window, final):
        """Groups of the sorted buffer; all of them when ``final`` (sorted order), else by oldest chunk
        until at most ``window // 2`` tokens are left."""
        order = packing_order(length, pos, idx, self.seq_len)
        starts, at = [], 0
        sorted_len = length[order].tolist()
        while at < len(order):  # a group holds max_tokens // its longest (first) chunk
            starts.append(at)
            at += self.max_tokens // sorted_len[at]
        bounds = starts + [len(order)]
        groups = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        if not final:
            groups.sort(key=lambda g: int(g.min()))  # the group of the oldest buffered chunk first
            left, kept = int(length.sum()), []
            for g in groups:
                kept.append(g)
                left -= int(length[g].sum())
                if left <= window // 2:
                    break
            groups = kept
        taken = np.zeros(len(length), bool)
        plans = []
        for g in groups:
            taken[g] = True
            plans.append(RowPlan(g, np.ones(len(g), np.int64), int(length[g[0]]), len(g)))
        return plans, taken


BATCHING: dict[str, type] = {mode.name: mode for mode in (BestFit, TokenBudget)}


def batching(cfg) -> Batching:
    """The batching mode of a ``data:`` config (``cfg.batching``, one of :data:`BATCHING`; ``DataConfig.validate`` checks it)."""
    return BATCHING[cfg.batching].from_config(cfg)
