"""Synthetic datasets for tests: shards a small model learns in a few steps."""
from __future__ import annotations

import numpy as np

from shards import Manifest, ShardSequenceWriter, encode_text_sample


def write_counting_shards(directory: str, docs: int, max_samples: int, vocab: int, max_len: int,
                          seed: int = 0, min_len: int = 8) -> list:
    """Write ``docs`` easy-to-learn documents as shards plus ``manifest.json``; returns the shards.

    Document i counts up mod ``vocab`` from a random start, with a length drawn from
    ``[min_len, max_len)`` tokens (``uint16``), keys ``doc0000``, ``doc0001``, ...; a small model
    learns it within a few steps, so tests can assert that the loss falls.
    """
    rng = np.random.default_rng(seed)
    w = ShardSequenceWriter(directory, max_samples=max_samples)
    for i in range(docs):
        n = int(rng.integers(min_len, max_len))
        toks = ((int(rng.integers(0, vocab)) + np.arange(n)) % vocab).astype(np.uint16)
        w.write(f"doc{i:04d}", encode_text_sample(toks, {"id": i}), tokens=n)
    shards = w.close()
    Manifest(shards=shards, vocab_size=vocab).save(directory)
    return shards
