"""Per-node shard cache: fetch shards through fsspec into a size-limited local directory,
verify them, evict least-recently-used entries, prefetch ahead of the reader.

Public API::

    from cache import ShardCache, CacheConfig, parse_size
    cache = ShardCache(CacheConfig(dir="/nvme/cache", max_bytes="1TiB"))
    path = cache.get(url, sha256=..., size=...)
"""
from cache.config import CacheConfig, format_size, load_cache_config, parse_size
from cache.errors import (CacheError, CacheFullError, CacheLockError, CacheReadOnlyError, ShardFetchError,
                          ShardVerifyError)
from cache.shard_cache import ShardCache

__all__ = [
    "CacheConfig", "CacheError", "CacheFullError", "CacheLockError", "CacheReadOnlyError", "ShardCache", "ShardFetchError", "ShardVerifyError",
    "format_size", "load_cache_config", "parse_size",
]
