"""Background prefetch of the shards a reader will ask for next.

The reader hands its future read order once (``set_order``); each ``get`` of a URL in that
order advances the read position, and the prefetcher keeps at most ``depth`` shards ahead of
the reader, downloading or downloaded. A downloaded shard the reader has not asked for yet
stays *held* (a shared lock) until the reader takes it: no prefetch on the node evicts it, so a
later prefetch never pushes out an earlier one and no shard is fetched twice in one pass (the
cache caps ``depth`` so that held shards plus the one in hand fit in ``max_bytes``).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Protocol, Sequence

log = logging.getLogger(__name__)

Item = tuple  # (url, sha256 hex or None, size in bytes or None)


class Hold(Protocol):
    """What a prefetch returns: a held lock on the downloaded shard, dropped with ``release()``."""

    def release(self) -> None:
        """Drop the hold; the shard becomes evictable again."""


class Prefetcher:
    """Bounded read-ahead over a thread pool.

    Args:
        fetch: ``fetch(url, sha256, size) -> Hold`` makes one shard local and returns its hold,
            taken (runs in a pool thread).
        depth: most shards ahead of the reader (downloading or held); also the pool size; 0
            disables prefetch.
    """

    def __init__(self, fetch: Callable[[str, str | None, int | None], Hold], depth: int):
        self._fetch, self.depth, self._pool_size = fetch, depth, max(depth, 1)
        self._pool = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix="colaflow-prefetch")
        self._lock = threading.Lock()
        self._order: list[Item] = []
        self._pos = 0  # index of the first shard the reader has not asked for yet
        self._next = 0  # index of the next shard to schedule
        self._running: dict[str, Future] = {}
        self._held: dict[str, Hold] = {}
        self.errors: dict[str, BaseException] = {}
        self._closed = False

    def set_order(self, items: Sequence[Item], depth: int | None = None) -> None:
        """Replace the future read order (and, if given, lower ``depth``; never above the pool size).
        Downloads already running finish; shards held for the old order are released."""
        with self._lock:
            if depth is not None:
                self.depth = min(depth, self._pool_size)
            self._order = [tuple(i) + (None,) * (3 - len(i)) for i in items]
            self._pos = self._next = 0
            self._release_outside_window()
            self._pump()

    def consumed(self, url: str) -> None:
        """The reader asked for ``url`` (and pinned it itself): release its hold and those of skipped
        shards, advance the read position past it if it is ahead in the order, schedule more."""
        with self._lock:
            for i in range(self._pos, len(self._order)):
                if self._order[i][0] == url:
                    self._pos = i + 1
                    self._next = max(self._next, self._pos)
                    break
            hold = self._held.pop(url, None)
            if hold is not None:
                hold.release()
            self._release_outside_window()
            self._pump()

    def release_holds(self) -> int:
        """Release every held shard. Returns how many were held."""
        with self._lock:
            n = len(self._held)
            for hold in self._held.values():
                hold.release()
            self._held.clear()
            return n

    def _window(self) -> set[str]:
        return {item[0] for item in self._order[self._pos:self._next]}

    def _release_outside_window(self) -> None:
        """Drop holds of shards no longer ahead of the reader (caller holds the lock)."""
        window = self._window()
        for url in [u for u in self._held if u not in window]:
            self._held.pop(url).release()

    def _pump(self) -> None:
        """Schedule shards within the window (caller holds the lock)."""
        while (not self._closed and len(self._running) < self.depth and self._next < len(self._order)
               and self._next < self._pos + self.depth):
            url, sha256, size = self._order[self._next]
            self._next += 1
            if url in self._running or url in self._held:
                continue
            fut = self._pool.submit(self._run, url, sha256, size)
            self._running[url] = fut

    def _run(self, url: str, sha256: str | None, size: int | None) -> None:
        hold = None
        try:
            hold = self._fetch(url, sha256, size)
            self.errors.pop(url, None)
        except Exception as e:  # noqa: BLE001 - the reader's own get() retries and raises
            log.warning("prefetch of %s failed (the reader will retry): %s", url, e)
            self.errors[url] = e
        finally:
            with self._lock:
                self._running.pop(url, None)
                if hold is not None:
                    if self._closed or url not in self._window() or url in self._held:
                        hold.release()  # the reader got there first, or the order changed
                    else:
                        self._held[url] = hold
                self._pump()

    @property
    def inflight(self) -> int:
        """Downloads running now."""
        with self._lock:
            return len(self._running)

    @property
    def held(self) -> int:
        """Downloaded shards held for the reader now."""
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        """Stop scheduling, drop queued work, wait for running downloads and release every hold."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.release_holds()
