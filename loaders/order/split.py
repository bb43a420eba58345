"""Who reads what: an epoch's remaining positions dealt to nodes, then to the consumers of each node.

A *consumer* is one rank's loader worker: consumer ``rank * W + worker`` of ``C = world_size * W``.
A *node* is the ranks that share one cache folder (``data.ranks_per_node``, torchrun's
``LOCAL_WORLD_SIZE``): ranks are numbered node by node, so node ``n`` of ``N`` holds consumers
``[n * C/N, (n + 1) * C/N)``. The global order (:mod:`loaders.order.sample_order`) does not
depend on any of this; the deal does.

The deal, computed the same way by every consumer from the order and the positions already
consumed (the resume point), with ``k`` shards needed this epoch (:meth:`loaders.protocols.Order.shards_from`
from position 0, in that order) and ``m = k // N``:

1. **Owners.** Shard ``i < N * m`` belongs to node ``i mod N``: consecutive shards of the order go
   to different nodes, so the nodes move through the order side by side, and each node downloads
   the ``m`` shards it owns, about ``1/N`` of the dataset, instead of all of it. The last
   ``k mod N`` shards belong to no node: they are the *pool*, shared out below.
2. **Quotas.** Each consumer is owed what :func:`plan_split` gives it (``R // C`` or one more of the
   ``R`` remaining positions), a node the sum over its consumers. With ``uneven`` the extra ones
   go to the nodes whose own shards hold more, so that equal shards need no exchange at all.
3. **Surplus.** The pool's positions and, for a node owning more than its quota, the last of its
   own (those of its last shards, the last in global order within a shard) are the *surplus*,
   numbered ``u = 0, 1, ...`` shard by shard in the order above, then in global order. Nodes short
   of their quota take consecutive runs of ``u`` in node order, so each reads usually one or two
   shards it does not own (more when several nodes own more than their quota and give up a little
   each: shards of very unequal document counts). A node short of more than the surplus holds
   gets the remainder policy's repeats (``pad``); surplus nobody is owed is not read (``drop``).
4. **Consumers.** A node's positions (kept and received, in global order, then its repeats) are
   numbered ``j = 0, 1, ...`` and ``j`` goes to the node's consumer ``j mod (C/N)``.

With one node this is the plain deal: remaining position ``j`` goes to consumer ``j mod C``. Each
position is dealt to exactly one consumer whatever ``N``, and consumers differ by at most one
position, as in the plain deal. With shards of about equal document counts (preprocessing rolls
them by bytes) a node downloads its ``m`` shards and one or two more: within 1.15 x its share plus
one shard once it owns 7 or more (``tests/unit/loaders/test_nodes.py``, BENCHMARKS.md). What ``N > 1`` changes is *when* a document is read: a node
reads its own shards' documents in global order, so a document is read about ``N`` shards away from
its place in the order at most (one shuffle block with one node; the pool's at the end of the
epoch), and a rank's batch draws from its node's shards of the current block, about ``1/N`` of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from loaders.protocols import Order


@dataclass(frozen=True)
class Split:
    """How the remaining positions of an epoch are shared by ``num_consumers`` consumers.

    Attributes:
        remaining: positions still to be read (the epoch minus the consumed ones).
        assigned: positions handed out (``remaining`` minus dropped, plus padded).
        dropped: positions no consumer reads this epoch (``remainder="drop"``).
        padded: repeated positions (``remainder="pad"``).
    """

    remaining: int
    assigned: int
    dropped: int
    padded: int


def plan_split(remaining: int, num_consumers: int, remainder: str) -> Split:
    """Apply the remainder policy (``uneven``, ``drop``, ``pad``) to ``remaining`` positions."""
    if num_consumers < 1:
        raise ValueError(f"num_consumers={num_consumers}: must be >= 1")
    extra = remaining % num_consumers
    if remainder == "drop":
        return Split(remaining, remaining - extra, extra, 0)
    if remainder == "pad" and extra and remaining:
        pad = num_consumers - extra
        return Split(remaining, remaining + pad, 0, pad)
    if remainder not in ("uneven", "drop", "pad"):
        raise ValueError(f"remainder={remainder!r}: use uneven, drop or pad")
    return Split(remaining, remaining, 0, 0)


def remaining_blocks(order: Order, start: int, skip: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield ``(positions, shards, locals)`` per block, positions < ``start`` or in ``skip`` removed."""
    for b in range(start // order.block, order.num_blocks):
        pos, shard, local = order.block_items(b)
        keep = pos >= start
        if len(skip):
            keep &= ~np.isin(pos, skip, assume_unique=True)
        yield pos[keep], shard[keep], local[keep]


def shard_owners(order: Order, num_nodes: int) -> np.ndarray:
    """Node of every shard (``int64``, indexed by the order's shard index): ``0 .. N-1``, or ``N`` for the
    pool (step 1 of the module docstring; shards the epoch never needs count as the pool's)."""
    needed = np.asarray(order.shards_from(0), np.int64)
    owner = np.full(int(needed.max()) + 1 if len(needed) else 0, num_nodes, np.int64)
    owned = len(needed) - len(needed) % num_nodes
    owner[needed[:owned]] = np.arange(owned) % num_nodes
    return owner


def _group_ranks(groups: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Rank of each item among the items of its group so far: ``seen[g]`` items of group ``g`` came
    before this array (updated in place), then the array's own in order. ``int64``, ``groups``' length."""
    counts = np.bincount(groups, minlength=len(seen))
    by_group = np.argsort(groups, kind="stable")
    first = np.cumsum(counts) - counts
    ranks = np.empty(len(groups), np.int64)
    ranks[by_group] = np.arange(len(groups)) - first[groups[by_group]] + seen[groups[by_group]]
    seen += counts[:len(seen)]
    return ranks


@dataclass(frozen=True)
class NodePlan:
    """The node-level deal of one epoch's remaining positions (steps 1-3 of the module docstring).

    Attributes:
        num_nodes: N.
        owner: node of every shard (:func:`shard_owners`; empty with one node).
        quota: ``int64 [N]``: positions each node is owed.
        take: ``int64 [N + 1]``: node ``m`` receives surplus numbers ``[take[m], take[m + 1])``
            (numbers from ``surplus`` on are repeats, ``pad``).
        surplus: how many positions are surplus in all.
        remaining: positions left in the epoch.
        keep, surplus_base: ``int64`` per shard (empty with one node): its first ``keep`` remaining
            positions (global order) stay with its owner, the others are surplus numbers
            ``surplus_base, surplus_base + 1, ...``.
        left: ``int64`` per shard: its remaining positions (empty with one node).
    """

    num_nodes: int
    owner: np.ndarray
    quota: np.ndarray
    take: np.ndarray
    surplus: int
    remaining: int
    keep: np.ndarray
    surplus_base: np.ndarray
    left: np.ndarray

    def shards(self, order: Order, node: int, position: int = 0) -> list[int]:
        """The shards node ``node`` reads, in the order they are first needed from ``position`` on
        (what its cache prefetches): those it owns and keeps positions of, and those it receives from."""
        shards = order.shards_from(position)
        if self.num_nodes == 1:
            return shards
        lo, hi = self.take[node], self.take[node + 1]
        given = self.left - self.keep
        receives = (given > 0) & (self.surplus_base < hi) & (self.surplus_base + given > lo) & (hi > lo)
        keeps = (self.owner == node) & (self.keep > 0)
        return [s for s in shards if keeps[s] or receives[s]]


def _quotas(assigned: int, num_consumers: int, num_nodes: int, owned: np.ndarray, uneven: bool) -> np.ndarray:
    """Positions each node is owed (``int64 [N]``): ``assigned // C`` per consumer, and the
    ``assigned % C`` extra ones one per consumer, to the nodes that own more first (``uneven``) or to
    the first consumers (``drop``/``pad``, where every consumer gets the same)."""
    per_node = num_consumers // num_nodes
    base, extra = divmod(assigned, num_consumers)
    if not uneven:
        return per_node * base + np.clip(extra - np.arange(num_nodes) * per_node, 0, per_node)
    want = np.clip(owned - per_node * base, 0, per_node)  # extra ones a node's own shards could fill
    give = np.zeros(num_nodes, np.int64)
    for n in np.argsort(-want, kind="stable"):  # the nodes that own more first, ties in node order
        give[n] = min(want[n], extra)
        extra -= give[n]
    for n in range(num_nodes):  # the rest (the pool's share) in node order
        more = min(per_node - give[n], extra)
        give[n] += more
        extra -= more
    return per_node * base + give


def plan_nodes(order: Order, num_nodes: int, num_consumers: int, start: int = 0, skip: np.ndarray | None = None,
               remainder: str = "uneven") -> NodePlan:
    """The :class:`NodePlan` of ``num_consumers`` consumers on ``num_nodes`` nodes: one pass over the
    remaining positions when ``num_nodes > 1``, none with one node. Arguments as :func:`consumer_arrays`."""
    skip = np.asarray(skip if skip is not None else [], dtype=np.int64)
    remaining = order.num_samples - start - int(np.count_nonzero(skip >= start))
    assigned = plan_split(remaining, num_consumers, remainder).assigned
    none = np.zeros(0, np.int64)
    if num_nodes == 1:
        take = np.array([0, max(assigned - remaining, 0)], np.int64)
        return NodePlan(1, none, np.array([assigned], np.int64), take, max(remaining - assigned, 0), remaining,
                        none, none, none)
    owner = shard_owners(order, num_nodes)
    left = np.zeros(len(owner), np.int64)
    for _, shard, _ in remaining_blocks(order, start, skip):
        left += np.bincount(shard, minlength=len(owner))
    owned = np.bincount(owner, weights=left, minlength=num_nodes + 1)[:num_nodes].astype(np.int64)
    quota = _quotas(assigned, num_consumers, num_nodes, owned, remainder == "uneven")
    needed = np.asarray(order.shards_from(0), np.int64)
    keep = np.where(owner < num_nodes, left, 0)
    for n in np.flatnonzero(owned > quota):  # give up the last of its own shards, the last first
        over = int(owned[n] - quota[n])
        for sh in needed[::-1][owner[needed[::-1]] == n]:
            cut = min(over, int(keep[sh]))
            keep[sh] -= cut
            over -= cut
            if not over:
                break
    given = left - keep
    base = np.zeros(len(owner), np.int64)
    base[needed] = np.cumsum(given[needed]) - given[needed]
    take = np.concatenate([[0], np.cumsum(np.maximum(quota - owned, 0))]).astype(np.int64)
    return NodePlan(num_nodes, owner, quota, take, int(given.sum()), remaining, keep, base, left)


def _node_items(order: Order, plan: NodePlan, node: int, start: int, skip: np.ndarray
                ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Node ``node``'s kept and received positions per block, in global order (step 3)."""
    seen = np.zeros(len(plan.owner), np.int64)  # remaining positions met per shard
    lo, hi = int(plan.take[node]), int(plan.take[node + 1])
    for pos, shard, local in remaining_blocks(order, start, skip):
        rank = _group_ranks(shard, seen) - plan.keep[shard]  # >= 0: surplus number within the shard
        give = rank >= 0
        u = plan.surplus_base[shard] + rank
        mine = np.where(give, (u >= lo) & (u < hi), plan.owner[shard] == node)
        if mine.any():
            yield pos[mine], shard[mine], local[mine]


def _plain_items(order: Order, plan: NodePlan, consumer: int, num_consumers: int, start: int, skip: np.ndarray
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One consumer's positions per block with one node (the plain deal: the ``j``-th remaining position
    goes to consumer ``j mod C``, but those dropped), chosen from the positions alone: only its share
    is located in the shards (:meth:`loaders.protocols.Order.block_items` of those offsets)."""
    j = 0  # remaining positions before this block
    for b in range(start // order.block, order.num_blocks):
        pos = np.arange(b * order.block, min((b + 1) * order.block, order.num_samples), dtype=np.int64)
        keep = pos >= start
        if len(skip):
            keep &= ~np.isin(pos, skip, assume_unique=True)
        at = np.flatnonzero(keep)
        first = (consumer - j) % num_consumers  # the first of this block's remaining positions that is ours
        mine = at[first:max(0, int(plan.quota[0]) - j):num_consumers]
        j += len(at)
        if len(mine):
            yield order.block_items(b, mine)


def _repeats(order: Order, plan: NodePlan, node: int, start: int, skip: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Node ``node``'s repeated positions (``pad``): the surplus numbers it is owed past the surplus,
    ``e = 0, 1, ...``, each the ``e``-th remaining position (wrapping around)."""
    lo, hi = max(int(plan.take[node]), plan.surplus), int(plan.take[node + 1])
    if hi <= lo or not plan.remaining:
        return None
    wanted = (np.arange(lo, hi) - plan.surplus) % plan.remaining
    out = np.empty((3, len(wanted)), np.int64)
    j = 0
    for items in remaining_blocks(order, start, skip):
        at = (wanted >= j) & (wanted < j + len(items[0]))
        for k in range(3):
            out[k, at] = items[k][wanted[at] - j]
        j += len(items[0])
        if j > wanted.max():
            break
    return out[0], out[1], out[2]


def consumer_arrays(order: Order, consumer: int, num_consumers: int, start: int = 0,
                    skip: np.ndarray | None = None, remainder: str = "uneven", num_nodes: int = 1,
                    plan: NodePlan | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield one consumer's ``(positions, shards, locals)`` as ``int64`` arrays, one group per shuffle
    block in global-position order (then one group of repeated items, if any).

    Args:
        order: the epoch's order.
        consumer: index in ``[0, num_consumers)`` (``rank * workers + worker``).
        start: positions below it are consumed (the checkpoint's prefix).
        skip: sorted unique positions >= ``start`` already consumed.
        remainder: policy of :func:`plan_split`; repeated items are the first remaining positions.
        num_nodes: nodes the consumers are on (node-major numbering; see the module docstring).
        plan: :func:`plan_nodes` of these arguments, when the caller has it already.
    Raises:
        ValueError: ``consumer`` out of range, or ``num_nodes`` does not divide ``num_consumers``.
    """
    if not 0 <= consumer < num_consumers:
        raise ValueError(f"consumer {consumer} out of range for {num_consumers} consumers")
    if num_nodes < 1 or num_consumers % num_nodes:
        raise ValueError(f"{num_nodes} nodes do not divide {num_consumers} consumers evenly: every node must run "
                         "the same number of ranks (data.ranks_per_node)")
    skip = np.asarray(skip if skip is not None else [], dtype=np.int64)
    per_node = num_consumers // num_nodes
    node, mine = divmod(consumer, per_node)
    plan = plan or plan_nodes(order, num_nodes, num_consumers, start, skip, remainder)
    if num_nodes == 1:
        yield from _plain_items(order, plan, consumer, num_consumers, start, skip)
        j = min(plan.remaining, int(plan.quota[0]))  # the node's positions: the repeats are numbered after them
    else:
        j = 0
        for pos, shard, local in _node_items(order, plan, node, start, skip):
            sel = (j + np.arange(len(pos))) % per_node == mine
            j += len(pos)
            if sel.any():
                yield pos[sel], shard[sel], local[sel]
    repeats = _repeats(order, plan, node, start, skip)
    if repeats is not None:
        sel = (j + np.arange(len(repeats[0]))) % per_node == mine
        if sel.any():
            yield tuple(a[sel] for a in repeats)


def consumer_items(order: Order, consumer: int, num_consumers: int, start: int = 0,
                   skip: np.ndarray | None = None, remainder: str = "uneven", num_nodes: int = 1,
                   plan: NodePlan | None = None) -> Iterator[tuple[int, int, int]]:
    """Yield ``(position, shard, local)`` for one consumer, in global-position order (then repeated items).

    Arguments and errors as :func:`consumer_arrays`.
    """
    for pos, shard, local in consumer_arrays(order, consumer, num_consumers, start, skip, remainder, num_nodes, plan):
        yield from zip(pos.tolist(), shard.tolist(), local.tolist())
