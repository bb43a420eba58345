"""Cache configuration (the ``cache:`` section of a YAML config)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CacheConfig:
    """Per-node shard cache settings.

    Attributes:
        dir: local cache directory (NVMe on a cluster node).
        max_bytes: byte limit for cached shards; int or a human size such as ``"200GiB"``.
        prefetch_shards: downloads kept in flight ahead of the reader.
        verify: sha256 policy for cached files: ``always``, ``first`` or ``never``.
    """

    dir: str = "~/.cache/colaflow/shards"
    max_bytes: int | str = "10GiB"
    prefetch_shards: int = 2
    verify: str = "first"
