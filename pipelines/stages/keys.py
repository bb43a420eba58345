"""What the global stages see of a kept document: a :class:`DocKey` (its hashes, id, size and where its
text lies), never the text. The text stays in its split's record in ``OUT/.work/``
(:mod:`pipelines.io.resume`), which the tokenizer sample and the final pass
(:class:`pipelines.stages.payload.PayloadFn`) read back one split at a time.

What crosses the global steps for every document is one row of :data:`KEY_ROW` per document, in one
array per split (:func:`key_rows`): :class:`KeyStats` combines them into the content hashes held by
more than one document and the ids shared by two texts (:class:`RepeatStats`). Only the documents of
a repeated hash go on as :class:`DocKey` s, to exact dedup (:class:`pipelines.stages.payload.Candidates`);
the others are kept by the final pass on its own.
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from pipelines.config import DedupConfig
from pipelines.io import frames
from pipelines.records import Doc
from pipelines.stages.clean import content_hash
from pipelines.stages.near_dedup import minhash_batch
from pipelines.stages.sorted_runs import BUCKET_BITS, SortedRun, SpilledRuns, distinct, read_range
from pipelines.stages.tokenizer_sample import SampleSize, sample_key

KEYS = "keys"  # tag of a split record's keys, in frames of their own before its documents
KEY_BATCH = 512  # documents whose MinHash signatures are computed in one call


class DocKey(NamedTuple):
    """One kept document as the global stages (dedup, the tokenizer's cutoff) see it.

    Attributes:
        hash: :func:`pipelines.stages.clean.content_hash` of its text (32 hex digits).
        id: its id as read (:func:`pipelines.stages.payload.unique_keys` makes an id two texts share unique).
        source: the corpus it came from.
        split: :func:`pipelines.io.resume.split_id` of the input split whose record holds its text.
        index: its position among the kept documents of that record.
        digest: 64-bit BLAKE2b digest of its text (:func:`pipelines.stages.tokenizer_sample.sample_key`).
        size: its text's UTF-8 size in bytes.
    """

    hash: str
    id: str
    source: str
    split: str
    index: int
    digest: int
    size: int


def doc_keys(docs: list[Doc], split: str, first: int, dedup: DedupConfig) -> list[tuple[DocKey, bytes | None]]:
    """The :class:`DocKey` of each of ``docs``, the kept documents ``first, first + 1, ...`` of ``split``,
    with its MinHash signature.

    Args:
        docs: consecutive kept documents of one split.
        split: the split's id.
        first: the index of ``docs[0]`` among the split's kept documents.
        dedup: with ``near``, the signatures are computed (uint32 bytes; else ``None``). They stay
            in the split's record, out of the keys: only near dedup reads them
            (:class:`pipelines.stages.payload.Candidates` for the band rows, :class:`~pipelines.stages.payload.NearDocs`
            for the candidates), so no other global step holds them.
    Returns:
        ``(key, signature)`` per document, in order.
    """
    sigs = minhash_batch([d.text for d in docs], dedup) if dedup.near else [None] * len(docs)
    out = []
    for i, (doc, sig) in enumerate(zip(docs, sigs)):
        h = content_hash(doc.text)
        size = sample_key((h, doc))
        out.append((DocKey(h, doc.id, doc.source, split, first + i, size.digest, size.size),
                    None if sig is None else sig.tobytes()))
    return out


# One document of a split: its content hash and id hash (128 bits each, as two big-endian halves),
# its text's digest and UTF-8 size (DocKey.digest, DocKey.size). 48 bytes, not a Python object each.
KEY_ROW = np.dtype([("h1", "u8"), ("h2", "u8"), ("i1", "u8"), ("i2", "u8"), ("digest", "u8"), ("size", "u8")])
HASH = np.dtype([("h1", "u8"), ("h2", "u8")])  # a 128-bit hash as two big-endian halves, sorted as the hex


def id_hash(doc_id: str) -> tuple[int, int]:
    """128-bit BLAKE2b of ``doc_id`` (UTF-8) as two big-endian 64-bit halves (ints): the id in
    :data:`KEY_ROW`, as :func:`pipelines.stages.clean.content_hash` stands for a text."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


def key_rows(keys: list[DocKey]) -> np.ndarray:
    """The :data:`KEY_ROW` array of ``keys`` (one split's documents), in order.

    Args:
        keys: the documents' :class:`DocKey` s.
    Returns:
        a :data:`KEY_ROW` array, one row per key.
    """
    return np.array([(int(k.hash[:16], 16), int(k.hash[16:], 16), *id_hash(k.id), k.digest, k.size) for k in keys],
                    KEY_ROW)


def sample_sizes(rows: np.ndarray):
    """The :class:`~pipelines.stages.tokenizer_sample.SampleSize` of each :data:`KEY_ROW` of ``rows``
    (the tokenizer sample's cutoff reads hashes and sizes alone), one at a time (a generator)."""
    for h1, h2, _, _, digest, size in rows.tolist():
        yield SampleSize(f"{h1:016x}{h2:016x}", digest, size)


def hashes_of(keys: list[DocKey]) -> np.ndarray:
    """The content hashes of ``keys`` as a :data:`HASH` array (for ``np.isin`` against :class:`RepeatStats`)."""
    return np.array([(int(k.hash[:16], 16), int(k.hash[16:], 16)) for k in keys], HASH)


def ids_of(keys: list[DocKey]) -> np.ndarray:
    """The :func:`id_hash` es of ``keys``' ids as a :data:`HASH` array."""
    return np.array([id_hash(k.id) for k in keys], HASH)


class RepeatStats(NamedTuple):
    """What :class:`KeyStats` finds in all documents' :data:`KEY_ROW` s; each a sorted :data:`HASH` array.

    Attributes:
        hashes: content hashes held by two documents or more (exact dedup decides among them).
        shared_ids: id hashes under which two different texts lie (those ids are made unique with
            :func:`pipelines.records.disambiguate_id`).
    """

    hashes: np.ndarray
    shared_ids: np.ndarray


# A document's (id hash, content hash), sorted by id first: a KeyStats run's second section
_BY_ID = np.dtype([("i1", "u8"), ("i2", "u8"), ("h1", "u8"), ("h2", "u8")])


def _repeated_adjacent(values: np.ndarray) -> np.ndarray:
    """The values of sorted :data:`HASH` array ``values`` that occur more than once, once each, sorted."""
    return np.unique(values[1:][values[1:] == values[:-1]])


class KeyStats(SpilledRuns):
    """Combine :data:`KEY_ROW` arrays (one per split) into :class:`RepeatStats`, on disk
    (:class:`~pipelines.stages.sorted_runs.SpilledRuns`): a run holds its documents' content hashes
    (:data:`HASH`, sorted) and then their distinct (id hash, content hash) pairs (sorted by id), and
    the output is found one range of the hash at a time over all runs, so it holds ``RUN_ROWS``
    documents and about 1/2**BUCKET_BITS of the runs' rows, not 32 bytes for every document (which
    held 35 MB, 70 MB while compacting, at 16x the demo corpus).

    Args:
        folder: the spill folder (fsspec URL; ``OUT/.work/spill``), which every worker can reach.
    """

    def sections(self, rows: np.ndarray) -> list[np.ndarray]:
        """A run of :data:`KEY_ROW` s ``rows``: their content hashes, sorted; their distinct (id, text) pairs, sorted."""
        texts = rows[["h1", "h2"]].astype(HASH)
        texts.sort()
        pairs = np.empty(len(rows), _BY_ID)
        for name in _BY_ID.names:
            pairs[name] = rows[name]
        pairs.sort()
        return [texts, distinct(pairs)]

    def found(self, runs: list[SortedRun]) -> RepeatStats:
        """The :class:`RepeatStats`, a range of the hash at a time: a content hash is repeated when two
        documents hold it; an id is shared when two distinct (id, text) pairs hold it."""
        texts, ids = [np.empty(0, HASH)], [np.empty(0, HASH)]
        for b in range(1 << BUCKET_BITS):
            texts.append(_repeated_adjacent(read_range(runs, 0, HASH, b)))
            pairs = distinct(read_range(runs, 1, _BY_ID, b))  # the same pair in two runs counts once
            ids.append(_repeated_adjacent(pairs[["i1", "i2"]].astype(HASH)))
        return RepeatStats(np.concatenate(texts), np.concatenate(ids))


def record_keys(stream) -> list[tuple[DocKey, bytes | None]]:
    """A split record's ``(key, signature)`` pairs, in order, read from ``stream`` (the record's file,
    binary) a frame at a time up to its first frame of documents: the passes that need keys alone
    neither read nor decode the split's documents (:mod:`pipelines.io.resume` writes the keys first)."""
    pairs = []
    for chunk in frames.chunks_stream(stream):
        if chunk[0][0] != KEYS:
            break
        pairs += [value for _, value in chunk]
    return pairs


def record_docs(data: bytes) -> tuple[list[Doc], list[tuple[DocKey, bytes | None]]]:
    """A split record's kept documents (in order) and their ``(key, signature)`` pairs
    (:mod:`pipelines.io.resume`)."""
    docs, keys = [], []
    for tag, value in frames.decode(data):
        if tag is None:
            docs.append(value)
        elif tag == KEYS:
            keys.append(value)
    return docs, keys
