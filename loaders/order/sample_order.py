"""The global sample order of an epoch and its split over consumers (rank x worker).

Order: a function of ``(seed, epoch)`` and the manifest only, never of the world size or
the worker count.

1. The shards are permuted; their samples are concatenated in that order
   (concatenated index ``q`` in ``[0, S)``, S = samples in the manifest).
2. The concatenation is cut into blocks of ``shuffle_block`` samples and each block is
   permuted on its own (a block shuffle: a sample moves at most one block away, so at any
   time a reader touches only the few shards overlapping the current block).
3. Global position ``i`` (0 .. S-1) is the ``i``-th sample of that sequence.

Permutations are argsorts of SplitMix64 hashes (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014), so they are fixed by the seed and do not
depend on numpy's generator streams, which may change between versions.

Split: the positions not yet consumed (all of them at the start of an epoch; after a
resume, all but the ones a checkpoint lists) are numbered ``j = 0, 1, ...`` in order, and
``j`` goes to consumer ``j mod C`` (C = ranks x workers; consumer ``rank * W + worker``).
Each consumer reads its own samples by random access into the shards (see
:mod:`loaders.read.shard_reader`): every consumer opens the shards of the current block but
reads only its members — a node downloads every shard once (through its cache), which is
the price of a sample-level order that does not depend on the world size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_TAG_SHARDS, _TAG_BLOCK = 1, 2


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser over a ``uint64`` array (wrapping arithmetic); returns ``uint64``."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        return z ^ (z >> np.uint64(31))


def _stream_seed(*parts: int) -> np.uint64:
    h = np.uint64(0)
    for p in parts:
        h = splitmix64(np.array([h ^ np.uint64(p & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))[0]
    return h


def permutation(n: int, *seed_parts: int) -> np.ndarray:
    """A permutation of ``range(n)`` (``int64``) fixed by the integer ``seed_parts``."""
    with np.errstate(over="ignore"):
        keys = splitmix64(np.arange(n, dtype=np.uint64) * _GOLDEN + _stream_seed(*seed_parts))
    return np.argsort(keys, kind="stable").astype(np.int64)


class SampleOrder:
    """Global sample order of one epoch.

    Args:
        shard_samples: samples per shard, in manifest order.
        seed, epoch: the order is a function of these (and ``shard_samples``) only.
        shuffle: ``False`` keeps manifest order (position = concatenated index).
        block: samples per shuffle block.
    """

    def __init__(self, shard_samples: list[int], seed: int, epoch: int, shuffle: bool = True, block: int = 4096):
        counts = np.asarray(shard_samples, dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("negative sample count in the manifest")
        self.seed, self.epoch, self.shuffle, self.block = seed, epoch, shuffle, max(1, int(block))
        self.shard_order = permutation(len(counts), seed, epoch, _TAG_SHARDS) if shuffle else np.arange(len(counts))
        self.cum = np.concatenate([[0], np.cumsum(counts[self.shard_order])]).astype(np.int64)
        self.num_samples = int(self.cum[-1])
        self.num_blocks = -(-self.num_samples // self.block)

    def block_items(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions, shard indices (manifest order) and in-shard sample indices of block ``b``.

        Returns three ``int64`` arrays of the block's length (``shuffle_block``, the last shorter).
        """
        lo = b * self.block
        hi = min(lo + self.block, self.num_samples)
        inner = permutation(hi - lo, self.seed, self.epoch, _TAG_BLOCK, b) if self.shuffle else np.arange(hi - lo)
        q = lo + inner
        k = np.searchsorted(self.cum, q, side="right") - 1
        return np.arange(lo, hi, dtype=np.int64), self.shard_order[k], q - self.cum[k]

    def shards_from(self, position: int) -> list[int]:
        """Shard indices (manifest order) in the order they are first needed from ``position`` on."""
        lo = (position // self.block) * self.block
        first = int(np.searchsorted(self.cum, lo, side="right") - 1)
        return [int(s) for s, n in zip(self.shard_order[first:], np.diff(self.cum)[first:]) if n > 0]


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


def _remaining_blocks(order: SampleOrder, start: int, skip: np.ndarray):
    """Yield ``(positions, shards, locals)`` per block, positions < ``start`` or in ``skip`` removed."""
    for b in range(start // order.block, order.num_blocks):
        pos, shard, local = order.block_items(b)
        keep = pos >= start
        if len(skip):
            keep &= ~np.isin(pos, skip, assume_unique=True)
        yield pos[keep], shard[keep], local[keep]


def consumer_arrays(order: SampleOrder, consumer: int, num_consumers: int, start: int = 0,
                    skip: np.ndarray | None = None, remainder: str = "uneven"
                    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield one consumer's ``(positions, shards, locals)`` as ``int64`` arrays, one group per shuffle
    block in global-position order (then one group of padded items, if any).

    Args:
        order: the epoch's order.
        consumer: index in ``[0, num_consumers)`` (``rank * workers + worker``).
        start: positions below it are consumed (the checkpoint's prefix).
        skip: sorted unique positions >= ``start`` already consumed.
        remainder: policy of :func:`plan_split`; padded items repeat the first remaining positions.
    Raises:
        ValueError: ``consumer`` out of range.
    """
    if not 0 <= consumer < num_consumers:
        raise ValueError(f"consumer {consumer} out of range for {num_consumers} consumers")
    skip = np.asarray(skip if skip is not None else [], dtype=np.int64)
    remaining = order.num_samples - start - int(np.count_nonzero(skip >= start))
    split = plan_split(remaining, num_consumers, remainder)
    limit = min(split.assigned, remaining)
    j = 0
    for pos, shard, local in _remaining_blocks(order, start, skip):
        if j >= limit:
            break
        idx = j + np.arange(len(pos))
        sel = (idx % num_consumers == consumer) & (idx < limit)
        if sel.any():
            yield pos[sel], shard[sel], local[sel]
        j += len(pos)
    wanted = [(e - remaining) % remaining for e in range(remaining, split.assigned) if e % num_consumers == consumer]
    if not wanted:
        return
    found: dict[int, tuple[int, int, int]] = {}
    j = 0
    for pos, shard, local in _remaining_blocks(order, start, skip):
        for w in wanted:
            if j <= w < j + len(pos):
                found[w] = (int(pos[w - j]), int(shard[w - j]), int(local[w - j]))
        j += len(pos)
        if len(found) == len(set(wanted)):
            break
    yield tuple(np.array([found[w][k] for w in wanted], np.int64) for k in range(3))


def consumer_items(order: SampleOrder, consumer: int, num_consumers: int, start: int = 0,
                   skip: np.ndarray | None = None, remainder: str = "uneven") -> Iterator[tuple[int, int, int]]:
    """Yield ``(position, shard, local)`` for one consumer, in global-position order (then padded items).

    Arguments and errors as :func:`consumer_arrays`.
    """
    for pos, shard, local in consumer_arrays(order, consumer, num_consumers, start, skip, remainder):
        yield from zip(pos.tolist(), shard.tolist(), local.tolist())
