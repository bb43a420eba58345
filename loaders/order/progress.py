"""Resume state of an epoch, in global positions (independent of world size and workers).

Every batch carries ``consumed`` records ``(position, chunk, n_chunks)``: the document at
global ``position`` delivered chunk ``chunk`` of its ``n_chunks``. ``n_chunks == 0`` means the
document is finished without tokens (``chunk == EMPTY``: no tokens; ``chunk == BAD``: unreadable,
logged and counted). A document is consumed once all its chunks were delivered.

The state is ``epoch`` + ``prefix`` (every position below it is consumed) + ``done`` (the
consumed positions above the prefix; a bitmap of ``num_samples`` bits in memory, compressed in a
saved state, :mod:`loaders.order.positions`) + ``partial`` (documents with some chunks delivered), so
``consumed = prefix + len(done)`` is the global count of consumed samples. It is exact at chunk
level: on resume, consumed documents are skipped and partial ones deliver only their missing
chunks, whatever the new world size and worker count. Each rank tracks its own batches; merge the
ranks' states with :func:`merge_states` (or ``TextLoader.global_state_dict``) before saving.

Empty/unreadable documents are reported with the consumer's next batch; those after a consumer's
last batch ride with its last batch or, when it has none, with a batch of records only
(:func:`loaders.pack.packed.records_only`).
"""
from __future__ import annotations

import numpy as np

from loaders.order.positions import PositionSet, decode_positions
from loaders.pack.packed import consumed_array

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
        done: every consumed position (:class:`loaders.order.positions.PositionSet`, S bits).
        partial: position -> (n_chunks, delivered chunk indices) for documents in flight (read-only,
            built from the ``(position, chunk, n_chunks)`` rows kept for them).
        complete_ranks: ranks whose share of the epoch was fully delivered.
        bad, empty: unreadable / empty documents seen (counted, never silently dropped).
        deal: how the epoch's documents were dealt to consumers: ``{"world_size", "workers", "nodes",
            "prefix", "done"}``, the layout and the consumed positions the deal started from
            (``done`` as :meth:`PositionSet.encode` writes it; :func:`loaders.order.split.consumer_arrays`).
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
        self._carry = np.empty((0, 3), np.int64)  # unique rows of the documents with some chunks delivered
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

    @property
    def partial(self) -> dict[int, tuple[int, set[int]]]:
        """position -> (n_chunks, delivered chunk indices) of the documents with some chunks delivered."""
        out: dict[int, tuple[int, set[int]]] = {}
        for pos, chunk, n in self._carry.tolist():
            out.setdefault(pos, (n, set()))[1].add(chunk)
        return out

    def record(self, pos: int, chunk: int, n_chunks: int) -> None:
        """Note one delivered chunk (or an empty/bad document); repeats are ignored."""
        self.record_many(np.array([[pos, chunk, n_chunks]], np.int64))

    def record_many(self, consumed) -> None:
        """:meth:`record` for each ``(position, chunk, n_chunks)`` row of ``consumed`` (``int64 [k, 3]``
        or a list of tuples), vectorised: one-chunk documents (most of them) are consumed at once;
        an empty/bad document is counted once and consumed; the chunks of longer documents join the
        rows kept for documents in flight, and a document whose every chunk is there is consumed."""
        consumed = consumed_array(consumed)
        n = consumed[:, 2]
        finished = [consumed[n == 1, 0]]  # adding a consumed document again changes nothing
        if (n != 1).any():  # the others' repeats would count twice or wait for chunks forever: dropped
            consumed = consumed[n != 1]
            consumed = consumed[~self.done.contains(consumed[:, 0])]
            n = consumed[:, 2]
        if (n <= 0).any():
            empties = consumed[n <= 0]
            pos, first = np.unique(empties[:, 0], return_index=True)
            kind = empties[first, 1]
            self.bad += int(np.count_nonzero(kind == BAD))
            self.empty += int(np.count_nonzero(kind == EMPTY))
            finished.append(pos)
        if (n > 1).any() or len(self._carry):
            rows = np.concatenate([self._carry, consumed[n > 1]])
            base = int(rows[:, 2].max()) + 1
            _, first = np.unique(rows[:, 0] * base + rows[:, 1], return_index=True)
            rows = rows[first]  # one row per delivered (document, chunk), sorted by document
            docs, start, count = np.unique(rows[:, 0], return_index=True, return_counts=True)
            whole = count >= rows[start, 2]
            finished.append(docs[whole])
            self._carry = rows[np.repeat(~whole, count)]
        self.done.add(np.concatenate(finished))

    def state_dict(self) -> dict:
        """Plain JSON-able dict; ``done`` holds the consumed positions above ``prefix`` as a
        compressed bitmap (:meth:`loaders.order.positions.PositionSet.encode`)."""
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
            ValueError: another version, a missing or malformed field, or consumed or partial
                positions outside the epoch (a hand-edited or corrupt state).
        """
        if state.get("version") not in (1, STATE_VERSION):
            raise ValueError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        try:
            p = cls(int(state["epoch"]), dict(state["order_key"]), int(state["num_samples"]),
                    int(state["world_size"]), prefix=int(state["prefix"]),
                    bad=int(state.get("bad", 0)), empty=int(state.get("empty", 0)))
            p.complete_ranks = set(state.get("complete_ranks", []))
            p.deal = state.get("deal")
            p.next_worker = {int(r): int(w) for r, w in state.get("next_worker", {}).items()}
            if p.epoch < 0 or not 0 <= int(state["prefix"]) <= p.num_samples:
                raise ValueError(f"epoch {p.epoch} or prefix {state['prefix']} is outside epochs >= 0 and "
                                 f"positions [0, {p.num_samples}]")
            p.done.add(decode_positions(state["done"]))
            p.record_many(partial_rows(state["partial"], p.num_samples))
            if p.deal is not None:
                _check_deal(p.deal, p.num_samples)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"loader state is malformed ({type(e).__name__}: {e}); resume from the checkpoint "
                             "as saved, or from an earlier one") from e
        return p


def partial_rows(partial: list, num_samples: int | None = None) -> np.ndarray:
    """``int64 [k, 3]`` rows ``(position, chunk, n_chunks)`` of a saved state's ``partial`` list
    (``[[position, n_chunks, [chunk, ...]], ...]``; a mixture source's items have no upper bound:
    ``num_samples=None``).

    Raises:
        ValueError: a position outside ``[0, num_samples)``, fewer than 2 chunks, or a chunk index
            outside ``[0, n_chunks)`` (such a row would consume a document whose chunks were not all read).
    """
    rows = np.array([(int(pos), int(c), int(n)) for pos, n, chunks in partial for c in chunks],
                    np.int64).reshape(-1, 3)
    past = rows[:, 0] >= num_samples if num_samples is not None else False
    bad = (rows[:, 0] < 0) | past | (rows[:, 2] < 2) | (rows[:, 1] < 0) | (rows[:, 1] >= rows[:, 2])
    if bad.any():
        pos, c, n = rows[int(np.argmax(bad))].tolist()
        raise ValueError(f"partial chunk {c} of {n} at position {pos} is outside positions "
                         f"[0, {num_samples or 'any'}) or chunks [0, n_chunks >= 2)")
    return rows


def _check_deal(deal: dict, num_samples: int) -> None:
    """Raises ``ValueError`` (or ``KeyError``/``TypeError``) unless :attr:`Progress.deal` holds a layout
    of at least one rank and worker, on nodes that divide the ranks, and a prefix and dealt positions
    inside the epoch."""
    dealt = decode_positions(deal["done"])
    if int(deal["world_size"]) < 1 or int(deal["workers"]) < 1 or int(deal.get("nodes", 1)) < 1 \
            or int(deal["world_size"]) % int(deal.get("nodes", 1)) or not 0 <= int(deal["prefix"]) <= num_samples \
            or (len(dealt) and (dealt[0] < 0 or dealt[-1] >= num_samples)):
        raise ValueError(f"deal of world size {deal['world_size']} x {deal['workers']} workers on "
                         f"{deal.get('nodes', 1)} nodes from prefix {deal['prefix']} is outside positions "
                         f"[0, {num_samples}] or nodes that divide the ranks")


def deal_fits(deal: dict | None, world_size: int, workers: int, nodes: int = 1) -> bool:
    """Whether :attr:`Progress.deal` was made for ``world_size`` ranks of ``workers`` workers each on
    ``nodes`` nodes (a deal without ``nodes``, written before nodes were dealt apart, is one node's)."""
    return bool(deal) and deal["world_size"] == world_size and deal["workers"] == workers \
        and deal.get("nodes", 1) == nodes


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
        merged.record_many(p._carry)
    return merged.state_dict()
