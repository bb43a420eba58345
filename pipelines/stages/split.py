"""Train/validation split of the kept documents, chosen by content hash.

A document goes to the validation split when a salted hash of its content hash
(:func:`pipelines.stages.clean.content_hash`, the exact-dedup key) falls below
``split.val_fraction`` of the hash space. The choice depends on the text alone, never on ids,
arrival order, runner or worker count, so reruns and runners split identically; exact
duplicates share a hash, so a text can never sit in both splits. Validation documents become a
second shard set in ``OUT/val/``, listed in the ``splits`` section of the top-level manifest.
"""
from __future__ import annotations

import dataclasses
import hashlib

import apache_beam as beam

from pipelines.config import ShardsConfig
from pipelines.records import TokenizedDoc
from pipelines.stages.clean import content_hash, hash_fraction
from shards import Manifest

VAL = "val"  # tag of the validation output and name of its split
VAL_DIR = "val"  # folder of the validation shard set, relative to the output folder
SALT = b"colaflow-split-v1\0"  # keeps the split independent of the tokenizer's hash sample


def split_position(text: str) -> float:
    """Where a document falls in ``[0, 1)`` for the split: the first 64 bits of
    ``BLAKE2b(SALT + content_hash(text))`` as a fraction (same on every machine and run)."""
    return hash_fraction(hashlib.blake2b(SALT + content_hash(text).encode("ascii"), digest_size=16).hexdigest())


def is_validation(text: str, val_fraction: float) -> bool:
    """Whether a document of this text belongs to the validation split."""
    return split_position(text) < val_fraction


class SplitBatchFn(beam.DoFn):
    """A batch (list) of :class:`~pipelines.records.TokenizedDoc` → the training part (main output)
    and the validation part (tag ``val``); empty parts are not emitted."""

    def __init__(self, val_fraction: float):
        self.val_fraction = val_fraction

    def process(self, batch: list[TokenizedDoc]):
        """Split one batch by :func:`is_validation` of each document's text."""
        train, val = [], []
        for item in batch:
            (val if is_validation(item.doc.text, self.val_fraction) else train).append(item)
        if train:
            yield train
        if val:
            yield beam.pvalue.TaggedOutput(VAL, val)


def val_shard_config(cfg: ShardsConfig) -> ShardsConfig:
    """Shard settings of the validation set: those of training, but the shard count always derives
    from ``target_bytes`` (a ``num_shards`` chosen for the training set would split the small
    validation set into tiny shards)."""
    return dataclasses.replace(cfg, num_shards=0)


def split_entry(manifest: Manifest, manifest_path: str, manifest_bytes: bytes) -> dict:
    """The manifest's ``splits`` entry of one shard set: ``manifest`` (path relative to the
    top-level folder), ``shards``, ``samples`` (documents: a token block holds many), ``tokens`` and
    ``sha256`` (hex, of the split's ``manifest.json`` bytes)."""
    return {"manifest": manifest_path, "shards": len(manifest.shards), "samples": manifest.total_documents,
            "tokens": manifest.total_tokens, "sha256": hashlib.sha256(manifest_bytes).hexdigest()}
