"""WebDataset shard format: tar shards with per-member zstd, a manifest, keys and samples.

See ``docs/shard-format.md`` for the specification.
"""
from .blocks import BlockMeta, decode_meta, encode_block, is_block, iter_documents
from .index import SampleEntry, ShardIndex, build_shard_index, read_sample
from .keys import escape_key, unescape_key
from .manifest import Manifest, ShardInfo, shard_url
from .reader import ReadStats, ShardError, iter_raw, iter_samples
from .sample import encode_image_sample, encode_text_sample
from .validate import VerifyConfig, verify_shard
from .writer import ShardSequenceWriter, TarShardWriter, TokenBlockWriter, shard_name

__all__ = [
    "BlockMeta", "TokenBlockWriter", "decode_meta", "encode_block", "is_block", "iter_documents", "Manifest", "ReadStats", "SampleEntry", "ShardIndex", "ShardInfo", "ShardError", "ShardSequenceWriter",
    "TarShardWriter", "VerifyConfig", "build_shard_index", "encode_image_sample", "encode_text_sample",
    "escape_key", "iter_raw", "iter_samples", "read_sample", "shard_name", "shard_url", "unescape_key",
    "verify_shard",
]
