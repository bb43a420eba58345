"""Resume state of an epoch, in global positions (independent of world size and workers).

Every batch carries ``consumed`` records ``(position, chunk, n_chunks)``: the document at
global ``position`` delivered chunk ``chunk`` of its ``n_chunks``. ``n_chunks == 0`` means the
document is finished without tokens (``chunk == EMPTY``: no tokens; ``chunk == BAD``: unreadable,
logged and counted). A document is consumed once all its chunks were delivered.

The state is ``epoch`` + ``prefix`` (every position below it is consumed) + ``done`` (the
consumed positions above the prefix; a bitmap of ``num_samples`` bits in memory, compressed in a
saved state, :mod:`loaders.positions`) + ``partial`` (documents with some chunks delivered), so
``consumed = prefix + len(done)`` is the global count of consumed samples. It is exact at chunk
level: on resume, consumed documents are skipped and partial ones deliver only their missing
chunks, whatever the new world size and worker count. Each rank tracks its own batches; merge the
ranks' states with :func:`merge_states` (or ``TextLoader.global_state_dict``) before saving.

Empty/unreadable documents are reported with the consumer's next batch; those after a consumer's
last batch ride with its last batch or, when it has none, with a batch of records only
(:func:`loaders.packed.records_only`).
"""
from __future__ import annotations

import numpy as np

from .packed import consumed_array
from .positions import PositionSet, decode_positions

STATE_VERSION = 2  # 2: consumed positions saved as a compressed bitmap (1: a list; still read)
EMPTY, BAD = -1, -2


class Progress:
    """Consumed samples of one epoch.

    Args and attributes:
        epoch: epoch number.
        order_key: what fixes the order (seed, shuffle, block, seq_len, dataset fingerprint);
            a state only loads into a loader with the same key.
        num_samples: samples in the epoch (S).
        world_size: ranks of the run that wrote the state.
        prefix: all positions ``< prefix`` are consumed (given: a starting point; read: the
            longest consumed prefix, computed when read).
        done: every consumed position (:class:`loaders.positions.PositionSet`, S bits).
        partial: position -> (n_chunks, delivered chunk indices) for documents in flight.
        complete_ranks: ranks whose share of the epoch was fully delivered.
        bad, empty: unreadable / empty documents seen (counted, never silently dropped).
        deal: how the epoch's documents were dealt to consumers: ``{"world_size", "workers",
            "prefix", "done"}``, the layout and the consumed positions the deal started from
            (``done`` as :meth:`PositionSet.encode` writes it; :func:`loaders.order.consumer_arrays`).
            A resume with the same layout deals from it again and skips what was consumed since,
            so each consumer keeps its documents, in order; another layout deals the documents left
            anew. ``None``: not dealt yet.
        next_worker: rank -> the worker whose batch that rank delivers next.
    """

    def __init__(self, epoch: int, order_key: dict, num_samples: int, world_size: int = 1, prefix: int = 0,
                 bad: int = 0, empty: int = 0):
        self.epoch, self.order_key, self.num_samples, self.world_size = epoch, order_key, num_samples, world_size
        self.done = PositionSet(num_samples)
        self.done.add_range(0, prefix)
        self._prefix = 0
        self.partial: dict[int, tuple[int, set[int]]] = {}
        self.complete_ranks: set[int] = set()
        self.bad, self.empty = bad, empty
        self.deal: dict | None = None
        self.next_worker: dict[int, int] = {}

    @property
    def prefix(self) -> int:
        """Every position below it is consumed (the first position not consumed)."""
        self._prefix = self.done.first_missing(self._prefix)
        return self._prefix

    @property
    def consumed(self) -> int:
        """Global count of consumed samples."""
        return self.done.count

    @property
    def complete(self) -> bool:
        """Every rank delivered its share (the epoch is over)."""
        return len(self.complete_ranks) >= self.world_size

    def is_consumed(self, pos: int) -> bool:
        """Whether document ``pos`` (position in the epoch's order) was fully delivered."""
        return pos in self.done

    def record(self, pos: int, chunk: int, n_chunks: int) -> None:
        """Note one delivered chunk (or an empty/bad document); repeats are ignored."""
        if pos in self.done:
            return
        if n_chunks <= 0:
            self.bad += chunk == BAD
            self.empty += chunk == EMPTY
        elif n_chunks > 1:
            n, chunks = self.partial.setdefault(pos, (n_chunks, set()))
            chunks.add(chunk)
            if len(chunks) < n:
                return
        self.partial.pop(pos, None)
        self.done.add([pos])

    def record_many(self, consumed) -> None:
        """:meth:`record` for each ``(position, chunk, n_chunks)`` row of ``consumed`` (``int64 [k, 3]``
        or a list of tuples), in bulk: one-chunk documents (most of them) and documents whose every
        chunk is among the rows are added to :attr:`done` at once; only the chunks of documents that
        straddle calls, and empty/bad documents, are noted one by one."""
        consumed = consumed_array(consumed)
        n = consumed[:, 2]
        finished = [consumed[n == 1, 0]]
        if (n > 1).any():
            multi = consumed[n > 1]
            base = int(multi[:, 2].max()) + 1
            docs, at = np.unique(multi[:, 0], return_index=True)
            per_doc = np.bincount(np.searchsorted(docs, np.unique(multi[:, 0] * base + multi[:, 1]) // base),
                                  minlength=len(docs))  # distinct chunks delivered per document
            whole = per_doc == multi[at, 2]
            finished.append(docs[whole])
            for p in set(docs[whole].tolist()) & self.partial.keys():
                del self.partial[p]
            straddle = np.isin(multi[:, 0], docs[~whole])
            if straddle.any():
                for pos, chunk, n_chunks in multi[straddle].tolist():
                    self.record(pos, chunk, n_chunks)
        if (n <= 0).any():
            for pos, chunk, n_chunks in consumed[n <= 0].tolist():
                self.record(pos, chunk, n_chunks)
        self.done.add(np.concatenate(finished))

    def state_dict(self) -> dict:
        """Plain JSON-able dict; ``done`` holds the consumed positions above ``prefix`` as a
        compressed bitmap (:meth:`loaders.positions.PositionSet.encode`)."""
        prefix = self.prefix
        return {
            "version": STATE_VERSION, "epoch": self.epoch, "order_key": dict(self.order_key),
            "num_samples": self.num_samples, "world_size": self.world_size, "consumed": self.consumed,
            "prefix": prefix, "done": self.done.encode(prefix),
            "partial": [[p, n, sorted(c)] for p, (n, c) in sorted(self.partial.items())],
            "complete_ranks": sorted(self.complete_ranks), "bad": self.bad, "empty": self.empty,
            "deal": self.deal, "next_worker": {str(r): w for r, w in sorted(self.next_worker.items())},
        }

    @classmethod
    def from_state(cls, state: dict) -> "Progress":
        """Inverse of :meth:`state_dict` (also reads version 1 states, whose ``done`` is a list).

        Raises:
            ValueError: another version, or consumed positions outside the epoch.
        """
        if state.get("version") not in (1, STATE_VERSION):
            raise ValueError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        p = cls(int(state["epoch"]), dict(state["order_key"]), int(state["num_samples"]),
                int(state["world_size"]), prefix=int(state["prefix"]),
                bad=int(state.get("bad", 0)), empty=int(state.get("empty", 0)))
        p.complete_ranks = set(state.get("complete_ranks", []))
        p.deal = state.get("deal")
        p.next_worker = {int(r): int(w) for r, w in state.get("next_worker", {}).items()}
        p.done.add(decode_positions(state["done"]))
        for pos, n, chunks in state["partial"]:
            for c in chunks:
                p.record(int(pos), int(c), int(n))
        return p


def deal_fits(deal: dict | None, world_size: int, workers: int) -> bool:
    """Whether :attr:`Progress.deal` was made for ``world_size`` ranks of ``workers`` workers each."""
    return bool(deal) and deal["world_size"] == world_size and deal["workers"] == workers


def merge_states(states: list[dict]) -> dict:
    """Union of the per-rank states of one run (all ranks, any order) into one global state.

    Raises:
        ValueError: the states come from different epochs, orders or datasets.
    """
    if not states:
        raise ValueError("merge_states: no states given")
    ps = [Progress.from_state(s) for s in states]
    first = ps[0]
    for p in ps[1:]:
        if (p.epoch, p.order_key, p.num_samples) != (first.epoch, first.order_key, first.num_samples):
            raise ValueError(f"merge_states: epoch/order differ ({p.epoch}, {p.order_key}) vs "
                             f"({first.epoch}, {first.order_key}): states come from different runs or steps")
    merged = Progress(first.epoch, first.order_key, first.num_samples, max(p.world_size for p in ps))
    merged.deal = first.deal if all(p.deal == first.deal for p in ps) else None
    merged.next_worker = {r: w for p in ps for r, w in p.next_worker.items()}
    for p in ps:
        merged.done.update(p.done)
        merged.complete_ranks |= p.complete_ranks
        merged.bad += p.bad
        merged.empty += p.empty
    for p in ps:  # after every rank's done: a document finished on one rank is not partial
        for pos, (n, chunks) in p.partial.items():
            for c in chunks:
                merged.record(pos, c, n)
    return merged.state_dict()
