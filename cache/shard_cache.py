"""``ShardCache``: make a shard local, verified and pinned, sharing one folder per node (``cache/README.md``).
"""
from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

from cache.config import CacheConfig
from cache.errors import CacheReadOnlyError, ShardFetchError
from cache.metrics import CacheMetrics
from cache.storage.fetch import Downloader, FetchSpec, PartialChangedError, hash_file, remote_size
from cache.storage.locks import FileLock
from cache.storage.prefetch import Prefetcher
from cache.storage.store import EntryMeta, Store, entry_key
from shards.format.urls import split_query, url_name

log = logging.getLogger(__name__)


class ShardCache:
    """Per-node shard cache.

    Args:
        config: settings; node (host-name pattern) and ``COLAFLOW_CACHE_*`` environment overrides
            are applied unless ``resolve=False``. The resolved config is ``self.config``.
        resolve: apply ``config.resolved()``.

    Opening a cache creates its directory and removes stale temp files (see ``Store.cleanup``);
    an existing folder this process cannot write is opened read-only (``self.read_only``).
    All methods are thread-safe; any number of processes may share ``config.dir``.

    Raises:
        CacheReadOnlyError: the folder is missing and cannot be created.
    """

    def __init__(self, config: CacheConfig | None = None, resolve: bool = True):
        cfg = config or CacheConfig()
        self.config = cfg.resolved() if resolve else cfg
        try:
            self.store = Store(self.config.path, self.config.max_bytes_int, self.config.min_free_bytes_int,
                               wait_s=self.config.fetch_wait_s)
        except OSError as e:
            raise CacheReadOnlyError(f"cannot create the cache folder {self.config.path} ({e.strerror}); "
                                     f"set cache.dir to a writable folder") from e
        self.read_only = self.store.read_only
        if not self.read_only:
            self.store.cleanup(self.config.partial_ttl_s)
        self._metrics = CacheMetrics()
        self._pid = os.getpid()
        self._prefetcher = self._new_prefetcher()

    # -- public API ---------------------------------------------------------------------
    def get(self, url: str, sha256: str | None = None, size: int | None = None) -> str:
        """Block until the shard is local and verified; return its local path.

        Args:
            url: local path or fsspec URL (``http://``, ``s3://`` ...); ``*.tar.zst`` is stored
                decompressed when ``config.decompress``.
            sha256: hex digest of the (decompressed) file from the manifest, or ``None``.
            size: byte size of the (decompressed) file from the manifest, or ``None``.

        The entry is not pinned after return: open the path at once (an open file survives
        eviction on POSIX) or use ``pinned``.

        Raises:
            ShardFetchError: the shard is missing at its source or every download attempt failed.
            ShardVerifyError: downloads kept failing the size/sha256 check.
            CacheFullError: no room within ``max_bytes`` / ``min_free_bytes``.
        """
        with self.pinned(url, sha256, size) as path:
            return path

    @contextmanager
    def pinned(self, url: str, sha256: str | None = None, size: int | None = None) -> Iterator[str]:
        """Like ``get``, and no process on the node can evict the entry until the block exits.

        Raises (besides ``get``'s): CacheReadOnlyError: a read-only cache does not hold a valid copy.
        """
        self._after_fork()
        key = self.key(url)
        if self.read_only:
            yield self._read_only_path(key, url, sha256, size)
            return
        pin = self.store.pin_lock(key)
        pin.wait()  # an eviction's probe holds it for moments; a stuck one is named (CacheLockError)
        try:
            self._prefetcher.consumed(url)  # after our own pin: the prefetcher's hold on it can go
            t0 = time.monotonic()
            path = self._ready(key, url, sha256, size)
            if path is not None:
                self._metrics.hits.inc()
            else:
                self._metrics.misses.inc()
                path = self._materialise(key, url, sha256, size)
                self._metrics.stall_seconds.inc(time.monotonic() - t0)
            self._metrics.bytes_served.inc(os.path.getsize(path))
            yield path
        finally:
            pin.release()

    def prefetch(self, items: Iterable[tuple]) -> None:
        """Hand the future read order ``[(url, sha256, size), ...]``; keeps up to ``prefetch_shards``
        shards downloading or downloaded ahead of the last ``get`` and holds the downloaded ones
        until they are read. The depth is capped so that the shards ahead plus the one in hand fit
        in ``max_bytes`` (largest known size in ``items``). Replaces any earlier order. Prefetch
        failures are logged; the later ``get`` retries and raises."""
        self._after_fork()
        items = list(items)
        self._prefetcher.set_order(items, self.prefetch_depth(items))

    def prefetch_depth(self, items: Iterable[tuple]) -> int:
        """Prefetch depth used for ``items``: ``prefetch_shards`` capped at ``max_bytes // largest
        shard - 1`` (0 in a read-only cache). Shard sizes are bytes; unknown sizes do not cap."""
        if self.read_only:
            return 0
        largest = max((int(i[2]) for i in items if len(i) > 2 and i[2]), default=0)
        depth = self.config.prefetch_shards
        if largest:
            depth = min(depth, max(0, self.store.max_bytes // largest - 1))
        return depth

    def metrics(self) -> dict:
        """This process's counters: ``hits``, ``misses``, ``evictions``, ``corrupt``, ``retries``,
        ``inflight`` (counts), ``bytes_fetched``, ``bytes_served`` (bytes), ``stall_seconds`` (s)."""
        return self._metrics.snapshot()

    @property
    def registry(self):
        """The prometheus ``CollectorRegistry`` of this cache."""
        return self._metrics.registry

    @property
    def index_dir(self) -> str:
        """``CACHE_DIR/shard-index``: the loaders' member indexes of cached shards, node-local beside them
        and outside the cache's ``data/`` accounting."""
        return os.path.join(self.config.path, "shard-index")

    def close(self) -> None:
        """Stop prefetching (waits for running downloads). The directory stays as is."""
        self._prefetcher.close()

    def __enter__(self) -> "ShardCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # pickled into spawned workers: the child opens the same directory with fresh threads and metrics
        return {"config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"], resolve=False)

    def key(self, url: str) -> str:
        """Entry name of ``url`` in this cache."""
        return entry_key(url, self._decompress(url))  # a signed URL's query is not part of the key

    def path_of(self, url: str) -> str | None:
        """Local path of ``url`` if it is cached now (no verification, no download), else ``None``."""
        path = self.store.data_path(self.key(url))
        return path if os.path.exists(path) else None

    # -- internals ----------------------------------------------------------------------
    def _new_prefetcher(self) -> Prefetcher:
        return Prefetcher(self._prefetch_one, 0 if self.read_only else self.config.prefetch_shards)

    def _after_fork(self) -> None:
        """A forked child (e.g. a DataLoader worker) inherits no pool threads: start its own prefetcher."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._prefetcher = self._new_prefetcher()

    def _decompress(self, url: str) -> bool:
        return self.config.decompress and url_name(url).endswith(".zst")

    def _read_only_path(self, key: str, url: str, sha256: str | None, size: int | None) -> str:
        """Path of a valid entry of a read-only cache (checked per the verify policy, nothing written)."""
        path = self._ready(key, url, sha256, size)
        if path is None:
            self._metrics.misses.inc()
            raise CacheReadOnlyError(
                f"shard {split_query(url)[0]} is not in the read-only cache at {self.config.path} (or fails "
                f"its size/sha256 check) and cannot be downloaded there; warm it on a writable mount or "
                f"set cache.dir to a writable folder")
        self._metrics.hits.inc()
        self._metrics.bytes_served.inc(os.path.getsize(path))
        return path

    def _ready(self, key: str, url: str, sha256: str | None, size: int | None,
               hash_policy: bool = True, count_corrupt: bool = True) -> str | None:
        """Path of a usable entry (checked per the verify policy), or ``None`` if it must be fetched.
        A read-only cache hashes an unverified entry on each use and records nothing."""
        url = split_query(url)[0]  # entries record the URL without a signed URL's query
        path = self.store.data_path(key)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        meta = self.store.read_meta(key)
        if meta is None or meta.url != url or meta.size != st.st_size:
            return None
        if size is not None and st.st_size != size:
            return None
        if sha256 and meta.sha256 and sha256.lower() != meta.sha256.lower():
            return None  # the manifest changed under the same URL
        want = (sha256 or meta.sha256 or "").lower()
        fresh = meta.verified and meta.mtime_ns == st.st_mtime_ns
        policy = self.config.verify
        if want and hash_policy and (policy == "always" or (policy == "first" and not fresh)):
            got = hash_file(path, self.config.chunk_bytes_int)
            if got != want:
                if count_corrupt:
                    self._metrics.corrupt.inc()
                    log.warning("cached shard %s (%s) fails sha256 (%s != %s); refetching", url, path, got, want)
                return None
            if not fresh and not self.read_only:
                self.store.write_meta(key, EntryMeta(url, st.st_size, want, True, st.st_mtime_ns))
        if not self.read_only:
            self.store.touch(key)
        return path

    def _materialise(self, key: str, url: str, sha256: str | None, size: int | None, prefetch: bool = False) -> str:
        """Download under the entry's fetch lock (caller holds its pin); returns the data path.
        A ``prefetch`` download may not evict shards other prefetches hold."""
        with self.store.fetch_lock(key):
            path = self._ready(key, url, sha256, size, count_corrupt=False)
            if path is not None:
                return path  # another thread or process fetched it while we waited
            self.store.drop(key)
            decompress = self._decompress(url)
            if size is None and not decompress:
                try:
                    size = remote_size(url, self.config.timeout_s)
                except FileNotFoundError as e:
                    raise ShardFetchError(f"shard {url}: not found at the source ({e}); check the manifest "
                                          f"URL and that the shard was uploaded", url) from e
            cfg = self.config
            downloader = Downloader(
                cfg.retries, cfg.backoff_s, cfg.backoff_max_s, cfg.timeout_s, cfg.chunk_bytes_int,
                reserve=lambda total: self._metrics.evictions.inc(self.store.reserve(key, total, url, prefetch)),
                on_bytes=self._metrics.bytes_fetched.inc, on_retry=self._metrics.retries.inc)
            spec = FetchSpec(url, self.store.part_path(key), size, sha256, decompress,
                             hash=cfg.verify != "never")
            self._metrics.inflight.inc()
            try:
                for _ in range(2):  # the part file changing between the check and the rename: once more
                    result = downloader.fetch(spec)
                    try:
                        return self.store.commit(key, split_query(url)[0], (sha256 or result.sha256 or None),
                                                 result.sha256 is not None, (result.file_id, result.size))
                    except PartialChangedError as e:
                        log.warning("shard %s: %s; downloading it again", url, e)
                        self._metrics.retries.inc()
                raise ShardFetchError(f"shard {url}: its partial file {spec.part} kept changing underneath the "
                                      "download; check what else writes into the cache folder", url)
            finally:
                self.store.release(key)
                self._metrics.inflight.dec()

    def _prefetch_one(self, url: str, sha256: str | None, size: int | None) -> FileLock:
        """Make ``url`` local without the per-hit hash of ``verify: always`` (the reader's get does
        that); returns its hold lock, taken, so that no prefetch on the node evicts it before the
        reader comes (a reader's download still may, when it finds no other room)."""
        key = self.key(url)
        hold = self.store.hold_lock(key)
        with self.store.pin_lock(key):
            if self._ready(key, url, sha256, size, hash_policy=False) is None:
                self._materialise(key, url, sha256, size, prefetch=True)
            hold.wait()  # before the pin goes: the entry is never unprotected in between
        return hold
