"""WebDataset shard format: tar shards with per-member zstd, a manifest, keys and samples.

See ``docs/shard-format.md`` for the specification.
"""
from .keys import escape_key, unescape_key
from .manifest import Manifest, ShardInfo, shard_url
from .reader import ShardError, iter_raw, iter_samples
from .sample import encode_text_sample
from .writer import ShardSequenceWriter, TarShardWriter, shard_name

__all__ = [
    "Manifest", "ShardInfo", "ShardError", "ShardSequenceWriter", "TarShardWriter",
    "encode_text_sample", "escape_key", "unescape_key", "iter_raw", "iter_samples",
    "shard_name", "shard_url",
]
