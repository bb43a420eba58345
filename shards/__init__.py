"""WebDataset shard format: plain tar shards of token blocks or one document per sample, and a manifest.

See ``docs/shard-format.md`` for the specification.
"""
from shards.format.blocks import BlockMeta, decode_meta, encode_block, is_block, iter_documents
from shards.format.keys import escape_key, unescape_key
from shards.format.manifest import Manifest, ShardInfo, shard_url
from shards.format.sample import encode_image_sample, encode_text_sample
from shards.io.index import SampleEntry, ShardIndex, build_shard_index, read_sample
from shards.io.reader import ReadStats, ShardError, iter_raw, iter_samples
from shards.io.writer import ShardSequenceWriter, TarShardWriter, TokenBlockWriter, shard_name
from shards.tools.validate import VerifyConfig, verify_shard

__all__ = [
    "BlockMeta", "TokenBlockWriter", "decode_meta", "encode_block", "is_block", "iter_documents", "Manifest", "ReadStats", "SampleEntry", "ShardIndex", "ShardInfo", "ShardError", "ShardSequenceWriter",
    "TarShardWriter", "VerifyConfig", "build_shard_index", "encode_image_sample", "encode_text_sample",
    "escape_key", "iter_raw", "iter_samples", "read_sample", "shard_name", "shard_url", "unescape_key",
    "verify_shard",
]
