"""Sets of sample positions: a packed bitmap in memory (1 bit per position) and a compressed
bitmap in saved state.

Why not a Python set: with world size W a rank consumes every W-th position of the epoch, so its
consumed positions never form a prefix it could summarise; a set of them costs about 60 bytes per
position (1 GB per rank at 100M documents on 8 ranks), and a list of them in the saved state is as
large. The bitmap costs ``num_samples / 8`` bytes whatever the layout, and zlib (RFC 1950)
compresses a rank's strided pattern to a few bytes per thousand positions.
"""
from __future__ import annotations

import base64
import zlib

import numpy as np

_SEARCH_FIRST = 64  # bytes scanned first by first_missing; doubles while every bit is set


class PositionSet:
    """Positions in ``[0, size)`` as a packed bitmap (``uint8``, little bit order: position ``p`` is
    bit ``p % 8`` of byte ``p // 8``).

    Args:
        size: positions the set can hold (``num_samples``); memory is ``ceil(size / 8)`` bytes.
    Raises:
        ValueError: a negative size.
    """

    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"PositionSet size {size} is negative")
        self.size = int(size)
        self.bits = np.zeros(-(-self.size // 8), np.uint8)
        self._count: int | None = 0  # None: to be counted again (adds only set bits, counted when asked)

    @property
    def count(self) -> int:
        """Positions in the set (a popcount of the bitmap, redone only after a change)."""
        if self._count is None:
            self._count = int(np.bitwise_count(self.bits).sum())
        return self._count

    def __len__(self) -> int:
        return self.count

    def __contains__(self, pos: int) -> bool:
        return 0 <= pos < self.size and bool(self.bits[pos >> 3] >> (pos & 7) & 1)

    def contains(self, positions) -> np.ndarray:
        """``bool`` array: whether each of ``positions`` (ints in ``[0, size)``) is in the set."""
        pos = np.asarray(positions, np.int64)
        return ((self.bits[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1).astype(bool)

    def add(self, positions) -> None:
        """Add ``positions`` (any ints, in any order, repeats allowed).

        Raises:
            ValueError: a position outside ``[0, size)``.
        """
        pos = np.asarray(positions, np.int64).ravel()
        if not len(pos):
            return
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= self.size:
            raise ValueError(f"positions {lo}..{hi} out of range [0, {self.size})")
        first, span = lo >> 3, (hi >> 3) - (lo >> 3) + 1  # bytes touched
        if span <= 2 * len(pos) + 512:  # dense (a consumer's recent positions): scatter, pack, OR in
            scratch = np.zeros(8 * span, bool)
            scratch[pos - 8 * first] = True
            self.bits[first:first + span] |= np.packbits(scratch, bitorder="little")
        else:  # sparse: ufunc.at, as several positions may share a byte (about 10x slower per position)
            np.bitwise_or.at(self.bits, pos >> 3, np.left_shift(1, pos & 7).astype(np.uint8))
        self._count = None

    def add_range(self, lo: int, hi: int) -> None:
        """Add every position in ``[lo, hi)`` (clipped to ``[0, size)``)."""
        lo, hi = max(0, lo), min(self.size, hi)
        if lo >= hi:
            return
        first, last = lo >> 3, (hi - 1) >> 3
        head = np.uint8((0xFF << (lo & 7)) & 0xFF)
        tail = np.uint8(0xFF >> (7 - ((hi - 1) & 7)))
        if first == last:
            self.bits[first] |= head & tail
        else:
            self.bits[first] |= head
            self.bits[first + 1:last] = 0xFF
            self.bits[last] |= tail
        self._count = None

    def update(self, other: "PositionSet") -> None:
        """Add every position of ``other`` (a set of the same size). Raises ``ValueError`` otherwise."""
        if other.size != self.size:
            raise ValueError(f"PositionSet sizes differ: {other.size} vs {self.size}")
        self.bits |= other.bits
        self._count = None

    def positions(self, lo: int = 0) -> np.ndarray:
        """The positions ``>= lo`` in the set, sorted (``int64``)."""
        start = max(0, lo) >> 3
        at = np.flatnonzero(np.unpackbits(self.bits[start:], bitorder="little")) + 8 * start
        return at[at >= lo].astype(np.int64)

    def mask(self) -> np.ndarray:
        """``bool [size]``: whether each position is in the set."""
        return np.unpackbits(self.bits, count=self.size, bitorder="little").astype(bool)

    def first_missing(self, lo: int = 0) -> int:
        """The smallest position ``>= lo`` not in the set (``size`` when there is none). Scans only
        as far as the first missing position (chunks doubling from 64 bytes)."""
        pos = max(0, lo)
        while pos < self.size and pos & 7:  # up to a byte boundary
            if pos not in self:
                return pos
            pos += 1
        if pos >= self.size:
            return self.size
        byte, chunk = pos >> 3, _SEARCH_FIRST
        while byte < len(self.bits):
            part = self.bits[byte:byte + chunk]
            open_ = np.flatnonzero(part != 0xFF)
            if len(open_):
                b = byte + int(open_[0])
                value = int(self.bits[b])
                return min(self.size, 8 * b + ((~value) & (value + 1)).bit_length() - 1)
            byte, chunk = byte + len(part), chunk * 2
        return self.size

    def encode(self, lo: int = 0) -> dict:
        """The positions ``>= lo`` as JSON-able ``{"from": int, "bitmap": str}``: base64 of the zlib-
        compressed bitmap from position ``from`` (``lo`` rounded down to a multiple of 8, so a few
        positions below ``lo`` may come along; callers pass ``lo`` below which all are set)."""
        start = max(0, lo) >> 3
        raw = self.bits[start:]
        used = np.flatnonzero(raw)
        raw = raw[:int(used[-1]) + 1] if len(used) else raw[:0]
        return {"from": 8 * start, "bitmap": base64.b64encode(zlib.compress(raw.tobytes(), 6)).decode("ascii")}


def decode_positions(saved) -> np.ndarray:
    """Positions saved by :meth:`PositionSet.encode`, or a plain list or array of them (older
    states), as a sorted unique ``int64`` array.

    Raises:
        ValueError: neither a list nor an encoded bitmap.
    """
    if isinstance(saved, (list, tuple, np.ndarray)):
        return np.unique(np.asarray(saved, np.int64))
    try:
        start, raw = int(saved["from"]), zlib.decompress(base64.b64decode(saved["bitmap"]))
    except (KeyError, TypeError, ValueError, zlib.error) as e:
        raise ValueError(f"saved positions are neither a list nor an encoded bitmap: {e}") from e
    return np.flatnonzero(np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")).astype(np.int64) + start


def encode_positions(positions, lo: int = 0) -> dict:
    """:meth:`PositionSet.encode` of sorted non-negative ``positions`` (``int64``) from ``lo`` on,
    for values without a known bound (a mixture source's items)."""
    pos = np.asarray(positions, np.int64)
    at = PositionSet(int(pos[-1]) + 1 if len(pos) else 0)
    at.add(pos)
    return at.encode(lo)
