"""Resharding: the same samples, in the same order, rolled into shards of a new size."""
from __future__ import annotations

import os

from tqdm import tqdm

from shards.format.blocks import block_counts, is_block
from shards.format.manifest import Manifest
from shards.format.sample import count_tokens, field_name
from shards.io.reader import ShardError, iter_raw
from shards.io.writer import ShardSequenceWriter
from shards.tools.validate import resolve


def sample_tokens(fields: dict[str, bytes]) -> int:
    """Tokens in a raw sample's ``tokens.npy[.zst]`` member (0 when it has none)."""
    return sum(count_tokens(s, d) for s, d in fields.items() if field_name(s) == "tokens" and ".npy" in s)


def reshard(paths: list[str], out_dir: str, max_samples: int | None = None, max_bytes: int | None = None,
            prefix: str = "shard", progress: bool = True) -> Manifest:
    """Copy every sample of ``paths`` (folders, manifests or ``.tar`` files) into new shards.

    Member bytes are copied unchanged (a token block stays one block; ``max_samples`` counts
    blocks then); the new ``manifest.json`` in ``out_dir`` keeps the source manifest's layout,
    tokenizer (path rewritten relative to ``out_dir``), vocab size and dtype.

    Raises:
        ShardError: a source shard is malformed, or a sample cannot be written in our format
            (e.g. a member name over 100 bytes); the message names shard and member.
        ValueError: neither ``max_samples`` nor ``max_bytes`` given.
    """
    items = resolve(paths)
    src = next((m for _, _, m in items if m is not None), None)
    src_dir = next((os.path.dirname(p) for p, _, m in items if m is not None), None)
    writer = ShardSequenceWriter(out_dir, prefix, max_samples=max_samples, max_bytes=max_bytes)
    bar = tqdm(desc="reshard", unit="sample", disable=not progress)
    try:
        for path, _, _ in items:
            for key, fields in iter_raw(path):
                try:
                    docs = block_counts(fields, f"{path}: sample {key!r}")[0] if is_block(fields) else 1
                    writer.write(key, fields, sample_tokens(fields), docs)
                except ValueError as e:
                    raise ShardError(f"{path}: sample {key!r}: {e}", "corrupt") from e
                bar.update()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    manifest = Manifest(shards=writer.close())
    if src is not None:
        manifest.vocab_size, manifest.token_dtype, manifest.layout = src.vocab_size, src.token_dtype, src.layout
        if src.tokenizer:
            manifest.tokenizer = os.path.relpath(os.path.join(src_dir, src.tokenizer), out_dir)
    manifest.save(out_dir)
    return manifest
