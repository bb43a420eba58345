"""Background prefetch of the shards a reader will ask for next.

The reader hands its future read order once (``set_order``); each ``get`` of a URL in that
order advances the read position, and the prefetcher keeps at most ``depth`` downloads in
flight, never more than ``depth`` shards ahead of the reader — so prefetched shards are the
most recently used entries and LRU eviction takes older ones first.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

log = logging.getLogger(__name__)

Item = tuple  # (url, sha256 hex or None, size in bytes or None)


class Prefetcher:
    """Bounded read-ahead over a thread pool.

    Args:
        fetch: ``fetch(url, sha256, size)`` makes one shard local (runs in a pool thread).
        depth: downloads in flight and read-ahead window, in shards; 0 disables prefetch.
    """

    def __init__(self, fetch: Callable[[str, str | None, int | None], None], depth: int):
        self._fetch, self.depth = fetch, depth
        self._pool = ThreadPoolExecutor(max_workers=max(depth, 1), thread_name_prefix="colaflow-prefetch")
        self._lock = threading.Lock()
        self._order: list[Item] = []
        self._pos = 0  # index of the first shard the reader has not asked for yet
        self._next = 0  # index of the next shard to schedule
        self._running: dict[str, Future] = {}
        self.errors: dict[str, BaseException] = {}
        self._closed = False

    def set_order(self, items: Sequence[Item]) -> None:
        """Replace the future read order; downloads already running finish."""
        with self._lock:
            self._order = [tuple(i) + (None,) * (3 - len(i)) for i in items]
            self._pos = self._next = 0
            self._pump()

    def consumed(self, url: str) -> None:
        """The reader asked for ``url``: advance the read position past it if it is ahead in the order."""
        with self._lock:
            for i in range(self._pos, len(self._order)):
                if self._order[i][0] == url:
                    self._pos = i + 1
                    self._next = max(self._next, self._pos)
                    self._pump()
                    return

    def _pump(self) -> None:
        """Schedule shards within the window (caller holds the lock)."""
        while (not self._closed and len(self._running) < self.depth and self._next < len(self._order)
               and self._next < self._pos + self.depth):
            url, sha256, size = self._order[self._next]
            self._next += 1
            if url in self._running:
                continue
            fut = self._pool.submit(self._run, url, sha256, size)
            self._running[url] = fut

    def _run(self, url: str, sha256: str | None, size: int | None) -> None:
        try:
            self._fetch(url, sha256, size)
            self.errors.pop(url, None)
        except Exception as e:  # noqa: BLE001 - the reader's own get() retries and raises
            log.warning("prefetch of %s failed (the reader will retry): %s", url, e)
            self.errors[url] = e
        finally:
            with self._lock:
                self._running.pop(url, None)
                self._pump()

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._running)

    def close(self) -> None:
        """Stop scheduling, drop queued work and wait for running downloads."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
