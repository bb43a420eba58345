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
import uuid
from typing import NamedTuple

import apache_beam as beam
import fsspec
import numpy as np

from pipelines.config import DedupConfig
from pipelines.io import frames
from pipelines.records import Doc
from pipelines.stages.clean import content_hash
from pipelines.stages.near_dedup import minhash_batch
from pipelines.stages.tokenizer_sample import SampleSize, sample_key

KEYS = "keys"  # tag of a split record's keys, in frames of their own before its documents
KEY_BATCH = 512  # documents whose MinHash signatures are computed in one call


class DocKey(NamedTuple):
    """One kept document as the global stages (dedup, the tokenizer's cutoff) see it.

    Attributes:
        hash: :func:`pipelines.stages.clean.content_hash` of its text (32 hex digits).
        id: its id (:class:`pipelines.stages.exact_dedup.UniqueIds` may make it unique).
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
            (:class:`SplitSignatures`), so no other global step holds them.
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


# A document's (id hash, content hash), sorted by id first: a run's second section (KeyStats)
_BY_ID = np.dtype([("i1", "u8"), ("i2", "u8"), ("h1", "u8"), ("h2", "u8")])
BUCKET_BITS = 8  # KeyStats reads its runs back in 2**BUCKET_BITS ranges of the hash (the top bits of h1, i1)
RUN_ROWS = 1 << 17  # documents KeyStats holds (6 MB of KEY_ROWs) before it writes them as a run


class PairRun(NamedTuple):
    """One :class:`KeyStats` run: a file of the spill folder holding some documents' content hashes
    (:data:`HASH`, sorted) and then their distinct (id hash, content hash) pairs (``_BY_ID``, sorted).

    Attributes:
        path: the file's fsspec URL.
        by_text: int64[2**BUCKET_BITS + 1]: where each range of the content hash starts in the first
            section (in rows); the last is its row count.
        by_id: int64[2**BUCKET_BITS + 1]: the same for the id hash in the second section.
    """

    path: str
    by_text: np.ndarray
    by_id: np.ndarray


def _bucket_starts(top: np.ndarray) -> np.ndarray:
    """Where each of the 2**BUCKET_BITS ranges of sorted uint64 array ``top`` starts, and its length
    (int64[2**BUCKET_BITS + 1])."""
    bounds = np.arange(1, 1 << BUCKET_BITS, dtype=np.uint64) << np.uint64(64 - BUCKET_BITS)
    return np.concatenate([[0], np.searchsorted(top, bounds), [len(top)]]).astype(np.int64)


def _write_run(folder: str, rows: np.ndarray) -> PairRun:
    """Write :data:`KEY_ROW` array ``rows`` as a :class:`PairRun` in ``folder`` (a new file).

    Args:
        folder: the spill folder (fsspec URL).
        rows: some documents' :data:`KEY_ROW` s.
    Returns:
        the run.
    """
    texts = rows[["h1", "h2"]].astype(HASH)
    texts.sort()
    pairs = np.empty(len(rows), _BY_ID)
    for name in _BY_ID.names:
        pairs[name] = rows[name]
    pairs.sort()
    pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])] if len(pairs) else pairs
    path = f"{folder.rstrip('/')}/{uuid.uuid4().hex}.pairs"
    fs, local = fsspec.core.url_to_fs(path)
    fs.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(local, "wb") as f:
        f.write(texts.tobytes())
        f.write(pairs.tobytes())
    return PairRun(path, _bucket_starts(texts["h1"]), _bucket_starts(pairs["i1"]))


def _read_range(path: str, dtype: np.dtype, base: int, first: int, stop: int) -> np.ndarray:
    """Rows ``first`` to ``stop`` (in ``dtype`` rows) of the section of run file ``path`` that starts at
    byte ``base``."""
    if stop == first:
        return np.empty(0, dtype)
    fs, local = fsspec.core.url_to_fs(path)
    data = fs.cat_file(local, start=int(base + first * dtype.itemsize), end=int(base + stop * dtype.itemsize))
    return np.frombuffer(data, dtype)


def _repeated_adjacent(values: np.ndarray) -> np.ndarray:
    """The values of sorted :data:`HASH` array ``values`` that occur more than once, once each, sorted."""
    return np.unique(values[1:][values[1:] == values[:-1]])


class KeyStats(beam.CombineFn):
    """Combine :data:`KEY_ROW` arrays (one per split) into :class:`RepeatStats`, on disk: every
    ``RUN_ROWS`` documents are written as a :class:`PairRun` to ``folder``, and the output is found one
    range of the hash at a time over all runs, so it holds ``RUN_ROWS`` documents and about
    1/2**BUCKET_BITS of the runs' rows, not 32 bytes for every document (which held 35 MB, 70 MB while
    compacting, at 16x the demo corpus).

    Accumulator ``[pending KEY_ROW arrays, pending rows, runs]``; runs are read, never deleted here:
    they go with ``OUT/.work/`` at the end of the job.

    Args:
        folder: the spill folder (fsspec URL; ``OUT/.work/spill``), which every worker can reach.
    """

    def __init__(self, folder: str):
        self.folder = folder

    def create_accumulator(self):
        """No rows yet."""
        return [[], 0, []]

    def _flush(self, acc) -> None:
        if acc[1]:
            rows = np.concatenate(acc[0])
            acc[0], acc[1] = [], 0
            acc[2].append(_write_run(self.folder, rows))

    def add_input(self, acc, rows: np.ndarray):
        """Add one split's :data:`KEY_ROW` array."""
        acc[0].append(rows)
        acc[1] += len(rows)
        if acc[1] >= RUN_ROWS:
            self._flush(acc)
        return acc

    def compact(self, acc):
        """The accumulator with its pending rows written as a run (Beam calls it before a partial is
        sent, so a partial is a list of file names)."""
        self._flush(acc)
        return acc

    def merge_accumulators(self, accumulators):
        """All partial accumulators' pending rows and runs together."""
        merged = self.create_accumulator()
        for acc in accumulators:
            merged[0] += acc[0]
            merged[1] += acc[1]
            merged[2] += acc[2]
        return merged

    def extract_output(self, acc) -> RepeatStats:
        """The :class:`RepeatStats`, a range of the hash at a time: a content hash is repeated when two
        documents hold it; an id is shared when two distinct (id, text) pairs hold it."""
        self._flush(acc)
        runs, texts, ids = acc[2], [np.empty(0, HASH)], [np.empty(0, HASH)]
        for b in range(1 << BUCKET_BITS):
            found = np.concatenate([np.empty(0, HASH)] + [
                _read_range(r.path, HASH, 0, r.by_text[b], r.by_text[b + 1]) for r in runs])
            found.sort()
            texts.append(_repeated_adjacent(found))
            pairs = np.concatenate([np.empty(0, _BY_ID)] + [
                _read_range(r.path, _BY_ID, r.by_text[-1] * HASH.itemsize, r.by_id[b], r.by_id[b + 1]) for r in runs])
            pairs.sort()
            if len(pairs):  # the same pair in two runs counts once
                pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])]
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
