"""The global sample order of an epoch.

Order: a function of ``(seed, epoch)`` and the manifest only, never of the world size or
the worker count.

1. The shards are permuted; their samples are concatenated in that order
   (concatenated index ``q`` in ``[0, S)``, S = samples in the manifest). With ``lanes = K > 1``
   (``data.shard_lanes``) the shards holding samples are first dealt to ``K`` lanes once for all
   epochs (by a seeded permutation), each lane's shards are permuted per epoch, and the epoch takes
   one shard of each lane in turn: the ``i``-th shard of every epoch is in lane ``i mod K``. The deal
   over ``N`` nodes gives shard ``i`` to node ``i mod N`` (:mod:`loaders.order.split`), so with ``N``
   dividing ``K`` a node reads the same shards every epoch and its cache can serve them again.
2. The concatenation is cut into blocks of ``shuffle_block`` samples and each block is
   permuted on its own (a block shuffle: a sample moves at most one block away, so at any
   time a reader touches only the few shards overlapping the current block).
3. Global position ``i`` (0 .. S-1) is the ``i``-th sample of that sequence.

Permutations are argsorts of SplitMix64 hashes (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014), so they are fixed by the seed and do not
depend on numpy's generator streams, which may change between versions.

Which consumer (rank x worker) reads which position is :mod:`loaders.order.split`'s business.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_TAG_SHARDS, _TAG_BLOCK, _TAG_LANES = 1, 2, 3
_MASK = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser over a ``uint64`` array (wrapping arithmetic); returns ``uint64``."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        return z ^ (z >> np.uint64(31))


def _mix64(x: int) -> int:
    """:func:`splitmix64` of one value, in Python ints (a numpy call per value costs ~10 us)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _stream_seed(*parts: int) -> np.uint64:
    """The stream seed of ``parts`` (ints): :func:`splitmix64` chained over them, as ``uint64``."""
    h = 0
    for p in parts:
        h = _mix64(h ^ (p & _MASK))
    return np.uint64(h)


def permutation(n: int, *seed_parts: int) -> np.ndarray:
    """A permutation of ``range(n)`` (``int64``) fixed by the integer ``seed_parts``."""
    with np.errstate(over="ignore"):
        keys = splitmix64(np.arange(n, dtype=np.uint64) * _GOLDEN + _stream_seed(*seed_parts))
    # the keys are distinct (x * odd + c and SplitMix64's finaliser are bijections of 64-bit ints), so
    # every sort gives this one permutation
    return argsort_distinct(keys)


def argsort_distinct(keys: np.ndarray) -> np.ndarray:
    """``np.argsort`` of distinct ``uint64`` ``keys`` (``int64``): each key's high bits with its index in
    the low ones, sorted plainly (twice as fast as an argsort), is the keys' order wherever no two keys
    share their high bits (checked; otherwise numpy's default argsort, half the time of its stable one)."""
    n = len(keys)
    bits = np.uint64(max(n - 1, 1).bit_length())
    if bits <= 32:
        tagged = np.sort((keys >> bits) << bits | np.arange(n, dtype=np.uint64))
        high = tagged >> bits
        if (high[1:] != high[:-1]).all():
            return (tagged & ((np.uint64(1) << bits) - np.uint64(1))).astype(np.int64)
    return np.argsort(keys).astype(np.int64)


def laned_permutation(counts: np.ndarray, seed: int, epoch: int, lanes: int) -> np.ndarray:
    """Shard order of an epoch over ``lanes`` lanes (``int64``; module docstring, step 1): the shards
    holding samples, one lane after the other in turn, then the empty ones."""
    full = np.flatnonzero(counts > 0)
    fixed = full[permutation(len(full), seed, _TAG_LANES)]  # lane of fixed[i]: i mod lanes, every epoch
    keys = np.empty(len(full), np.int64)
    for lane in range(min(lanes, len(full))):
        members = np.arange(lane, len(full), lanes)
        keys[members[permutation(len(members), seed, epoch, _TAG_SHARDS, lane)]] = members
    return np.concatenate([fixed[np.argsort(keys, kind="stable")], np.flatnonzero(counts == 0)]).astype(np.int64)


class SampleOrder:
    """Global sample order of one epoch.

    Args:
        shard_samples: samples per shard, in manifest order.
        seed, epoch: the order is a function of these (and ``shard_samples``) only.
        shuffle: ``False`` keeps manifest order (position = concatenated index).
        block: samples per shuffle block.
        lanes: shard lanes (see the module docstring; 1: one permutation of all shards per epoch).
    """

    def __init__(self, shard_samples: list[int], seed: int, epoch: int, shuffle: bool = True, block: int = 4096,
                 lanes: int = 1):
        counts = np.asarray(shard_samples, dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("negative sample count in the manifest")
        self.seed, self.epoch, self.shuffle, self.block = seed, epoch, shuffle, max(1, int(block))
        if not shuffle:
            self.shard_order = np.arange(len(counts))
        elif lanes > 1:
            self.shard_order = laned_permutation(counts, seed, epoch, lanes)
        else:
            self.shard_order = permutation(len(counts), seed, epoch, _TAG_SHARDS)
        self.cum = np.concatenate([[0], np.cumsum(counts[self.shard_order])]).astype(np.int64)
        self.num_samples = int(self.cum[-1])
        self.num_blocks = -(-self.num_samples // self.block)

    def block_items(self, b: int, index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions, shard indices (manifest order) and in-shard sample indices of block ``b``, or only
        of its items at offsets ``index`` (``int64``; a consumer locates its share, not the block).

        Returns three ``int64`` arrays of the block's length (``shuffle_block``, the last shorter) or ``index``'s.
        """
        lo = b * self.block
        hi = min(lo + self.block, self.num_samples)
        inner = permutation(hi - lo, self.seed, self.epoch, _TAG_BLOCK, b) if self.shuffle else np.arange(hi - lo)
        at = np.arange(hi - lo, dtype=np.int64) if index is None else index
        q = lo + inner[at]
        k = np.searchsorted(self.cum, q, side="right") - 1
        return lo + at, self.shard_order[k], q - self.cum[k]

    def shards_from(self, position: int) -> list[int]:
        """Shard indices (manifest order) in the order they are first needed from ``position`` on."""
        lo = (position // self.block) * self.block
        first = int(np.searchsorted(self.cum, lo, side="right") - 1)
        return [int(s) for s, n in zip(self.shard_order[first:], np.diff(self.cum)[first:]) if n > 0]
