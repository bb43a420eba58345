"""What the global stages see of a kept document: a :class:`DocKey` (its hashes, id, size and where its
text lies), never the text. The text stays in its split's record in ``OUT/.work/``
(:mod:`pipelines.io.resume`), which the tokenizer sample and the final pass
(:class:`pipelines.stages.payload.PayloadFn`) read back one split at a time, so what a grouping or a
side input holds grows with the documents' count by the bytes of their keys, not with their text.
"""
from __future__ import annotations

from typing import NamedTuple

from pipelines.config import DedupConfig
from pipelines.io import frames
from pipelines.records import Doc
from pipelines.stages.clean import content_hash
from pipelines.stages.near_dedup import minhash_batch
from pipelines.stages.tokenizer_sample import sample_key

KEYS = "keys"  # tag of a split record's keys, after its documents
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
