"""The tokenizer's training sample: the hash-ordered prefix of the corpus's texts within a byte
budget (:class:`SmallestHashSample`), taken in two steps so that no combine over the whole
corpus holds texts.

1. :class:`SampleCutoff` combines one compact row per document (hash, text digest, size: 33
   bytes) into a :class:`SampleLimit`, which admits every text of the sample and the other
   texts of the hash where the sample stops.
2. :class:`SmallestHashSample` combines only the admitted texts, which gives the sample of all
   texts (the admitted set holds the sample's prefix and the text that ended it).

(A one-step sample held up to the budget of text in every partial accumulator, one per bundle.)
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import NamedTuple

import apache_beam as beam
import numpy as np

from pipelines.stages.clean import hash_fraction


class SmallestHashSample(beam.CombineFn):
    """Combine ``(hash, text)`` pairs into the hash-ordered prefix of at most ``max_bytes`` UTF-8 bytes
    of the texts whose hash lies under ``fraction`` of the hash space, or, when there is none, of
    all texts.

    Items are ordered by ``(over the fraction, hash, text)``, so texts under the fraction come
    first and the others only fill a budget those left unused (and are dropped at the end when
    any text under the fraction exists). The prefix stops at the first text that does not fit
    (the cutoff); the first text is taken whatever its size (else a corpus whose first text is
    larger than the budget had no sample). A partial accumulator's cutoff (never its first text)
    also lies outside the global prefix (its partial running total already exceeds the budget,
    and it sorts after the global first text), so every partial trim keeps the global prefix and
    records the smallest cutoff seen: the result is the same whatever the partitioning. Output:
    list of distinct texts in hash order.
    """

    def __init__(self, max_bytes: int, fraction: float = 1.0):
        self.max_bytes, self.fraction = max_bytes, fraction

    def create_accumulator(self):
        """An empty sample: ``[bytes held, items, cutoff]``."""
        return [0, [], None]  # [bytes held, [(over, hash, text, bytes), ...], cutoff (over, hash, text) or None]

    def _trim(self, items, cutoff):
        out, total = [], 0
        for item in sorted(items):
            if cutoff is not None and item[:3] >= cutoff:
                break
            if out and item == out[-1]:  # the same text twice counts once
                continue
            if out and total + item[3] > self.max_bytes:  # the first text is taken whatever its size
                cutoff = item[:3]
                break
            out.append(item)
            total += item[3]
        return [total, out, cutoff]

    def add_input(self, acc, element):
        """Add one ``(content hash hex, text)``; trims once the items pass twice the byte budget."""
        h, text = element
        key = (hash_fraction(h) >= self.fraction, h, text)
        if acc[2] is not None and key >= acc[2]:
            return acc
        size = len(text.encode("utf-8"))
        acc[1].append((*key, size))
        acc[0] += size
        # trimming only past twice the budget keeps adds amortised O(log n)
        return self._trim(acc[1], acc[2]) if acc[0] > 2 * self.max_bytes else acc

    def merge_accumulators(self, accumulators):
        """Merge partial samples, keeping the smallest cutoff (partition-independent result)."""
        cutoffs = [a[2] for a in accumulators if a[2] is not None]
        return self._trim([x for a in accumulators for x in a[1]], min(cutoffs) if cutoffs else None)

    def extract_output(self, acc):
        """The sampled texts (list of str) in hash order, under the fraction when any text is."""
        items = self._trim(acc[1], acc[2])[1]
        under = [item for item in items if not item[0]]
        return [item[2] for item in (under or items)]


@dataclasses.dataclass(frozen=True)
class SampleLimit:
    """Which documents can be in the tokenizer sample, from hashes and sizes alone
    (:class:`SampleCutoff`): those with ``(over the fraction, hash) <= last`` (``None``: no
    limit), and only those under the fraction when ``under_only``. Every text of the sample is
    admitted, and every text that sorts before one admitted, so :class:`SmallestHashSample`
    over the admitted texts gives the sample of all texts."""

    under_only: bool
    last: tuple | None  # (over: bool, content hash hex) of the last admitted hash, inclusive

    def admits(self, h: str, fraction: float) -> bool:
        """Whether a text with content hash ``h`` (hex) may be in the sample at ``fraction``."""
        key = (hash_fraction(h) >= fraction, h)
        return not (self.under_only and key[0]) and (self.last is None or key <= self.last)


# One document in SampleCutoff: over the fraction (0/1), content hash as two big-endian halves,
# a digest of the text, UTF-8 size. Rows sort by these fields in order, like the sample's items.
CUTOFF_ROW = np.dtype([("over", "u1"), ("h1", "u8"), ("h2", "u8"), ("digest", "u8"), ("size", "u8")])
_KEY = ("over", "h1", "h2", "digest")
_PENDING_ROWS = 8192  # rows added as tuples before they are folded into the array


class SampleCutoff(beam.CombineFn):
    """Combine the :class:`SampleSize` of every document (:func:`sample_key`) into
    the :class:`SampleLimit` of :class:`SmallestHashSample` over the same documents: the first
    step of the two-step sample.

    The same prefix algorithm as :class:`SmallestHashSample` on rows ``(over, hash, digest, size)``
    (:data:`CUTOFF_ROW`, 33 bytes per document in a numpy array): the digest stands for the
    text, so the prefix counts the same distinct texts as the sample's and stops in the same
    hash (any order of the texts within one hash does; a digest collision counts two texts once,
    and the limit then admits more, never less). ``compact`` trims a partial to the budget
    before it is sent, so a partial holds at most the rows of ``max_bytes`` of documents.
    Accumulator: ``[pending row tuples, rows array, cutoff key tuple or None]``.
    """

    def __init__(self, max_bytes: int, fraction: float = 1.0):
        self.max_bytes, self.fraction = max_bytes, fraction

    def create_accumulator(self):
        """No rows yet: ``[[], empty array, None]``."""
        return [[], np.empty(0, CUTOFF_ROW), None]

    def _trim(self, rows: np.ndarray, cutoff):
        rows = np.unique(rows)  # sorted by the fields in order; the same text twice counts once
        if cutoff is not None:
            before, equal = np.zeros(len(rows), bool), np.ones(len(rows), bool)
            for name, value in zip(_KEY, cutoff):
                before |= equal & (rows[name] < value)
                equal &= rows[name] == value
            rows = rows[before]
        stop = max(1, int(np.searchsorted(np.cumsum(rows["size"]), self.max_bytes, side="right")))
        if stop < len(rows):  # the first row that does not fit
            cutoff = tuple(int(rows[name][stop]) for name in _KEY)
            rows = rows[:stop]
        return [[], rows, cutoff]

    def _fold(self, acc):
        if not acc[0]:
            return acc
        return self._trim(np.concatenate([acc[1], np.array(acc[0], CUTOFF_ROW)]), acc[2])

    def add_input(self, acc, element: "SampleSize"):
        """Add one document's :class:`SampleSize`."""
        h = element.hash
        row = (hash_fraction(h) >= self.fraction, int(h[:16], 16), int(h[16:], 16), element.digest)
        if acc[2] is not None and row >= acc[2]:
            return acc
        acc[0].append((*row, element.size))
        return self._fold(acc) if len(acc[0]) >= _PENDING_ROWS else acc

    def compact(self, acc):
        """The accumulator trimmed to the budget (Beam calls it before a partial is sent)."""
        return self._fold(acc)

    def merge_accumulators(self, accumulators):
        """Merge partial prefixes, keeping the smallest cutoff (partition-independent result)."""
        accumulators = [self._fold(a) for a in accumulators]
        cutoffs = [a[2] for a in accumulators if a[2] is not None]
        return self._trim(np.concatenate([a[1] for a in accumulators]), min(cutoffs) if cutoffs else None)

    def extract_output(self, acc) -> SampleLimit:
        """The :class:`SampleLimit`: up to the cutoff's hash, and only under the fraction when the
        prefix holds a hash under it (:class:`SmallestHashSample` then drops the others)."""
        acc = self._fold(acc)
        _, rows, cutoff = self._trim(acc[1], acc[2])
        last = None if cutoff is None else (bool(cutoff[0]), f"{cutoff[1]:016x}{cutoff[2]:016x}")
        return SampleLimit(under_only=len(rows) > 0 and rows["over"][0] == 0, last=last)


class SampleSize(NamedTuple):
    """What :class:`SampleCutoff` combines of one document.

    Attributes:
        hash: the content hash (32 hex digits).
        digest: a 64-bit BLAKE2b digest of the text as an int (tells different texts with one
            content hash apart).
        size: the text's UTF-8 size in bytes.
    """

    hash: str
    digest: int
    size: int


def sample_key(pair) -> SampleSize:
    """``(content hash, Doc)`` → its :class:`SampleSize`."""
    h, doc = pair
    data = doc.text.encode("utf-8")
    return SampleSize(h, int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big"), len(data))


def sample_text(pair, limit: SampleLimit, fraction: float):
    """``(content hash, Doc)`` → ``(hash, text)`` when ``limit`` admits the hash, else nothing."""
    h, doc = pair
    if limit.admits(h, fraction):
        yield h, doc.text
