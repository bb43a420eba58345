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


def write_dataset_with_val_split(root: str, vocab: int, tokenizer: bool = False) -> str:
    """Counting-task shards (60 documents) with a ``val`` split (10) listed in the manifest, as
    preprocessing writes it; returns ``root``. With ``tokenizer`` the folder also carries what
    preprocessing writes for ``transformers``: a word-level ``tokenizer.json`` (``t0`` ... and
    ``<s>``, ``</s>`` as the last two ids) and ``tokenizer_config.json``, and the manifest's
    ``tokenizer_identity`` names those bos/eos ids."""
    import json
    import os

    from shards.format.manifest import TokenizerIdentity
    from trainer.export.provenance import file_sha256
    write_counting_shards(root, 60, max_samples=30, vocab=vocab, max_len=40, seed=0)
    write_counting_shards(os.path.join(root, "val"), 10, max_samples=10, vocab=vocab, max_len=40, seed=1)
    top, val = Manifest.load(root), Manifest.load(os.path.join(root, "val"))
    top.splits = {"val": {"manifest": "val/manifest.json", "shards": len(val.shards), "samples": val.total_samples,
                          "tokens": val.total_tokens, "sha256": file_sha256(os.path.join(root, "val", "manifest.json"))}}
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers
        words = {f"t{i}": i for i in range(vocab - 2)} | {"<s>": vocab - 2, "</s>": vocab - 1}
        tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(os.path.join(root, "tokenizer.json"))
        with open(os.path.join(root, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}, f)
        top.tokenizer_identity = TokenizerIdentity(kind="hf", bos_id=vocab - 2, eos_id=vocab - 1)
    top.save(root)
    return root
