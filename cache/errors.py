"""Errors raised by the shard cache; each message names the shard and says what to do next."""
from __future__ import annotations


class CacheError(RuntimeError):
    """Base class of shard cache errors."""


class ShardFetchError(CacheError):
    """A shard could not be downloaded after all retries (or is missing at its source).

    Attributes:
        url: the shard's source URL.
        attempts: download attempts made.
    """

    def __init__(self, message: str, url: str, attempts: int = 0):
        super().__init__(message)
        self.url, self.attempts = url, attempts


class ShardVerifyError(ShardFetchError):
    """Downloaded bytes did not match the manifest's size or sha256 (after all retries)."""


class CacheFullError(CacheError):
    """The cache cannot make room for a shard within ``max_bytes`` / ``min_free_bytes``."""


class CacheReadOnlyError(CacheError):
    """The cache folder cannot be written (read-only mount or permissions) and the request needs
    a write: a download, an eviction, or a shard that is not cached there."""


class CacheLockError(CacheError):
    """A cache lock stayed held by another process that made no progress for longer than
    ``cache.fetch_wait_s``; the message names the lock, the holder's pid and what to do.

    Attributes:
        pid: the holder's process id (``None`` when it did not record one).
    """

    def __init__(self, message: str, pid: int | None):
        super().__init__(message)
        self.pid = pid
