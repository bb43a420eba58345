"""The one shard reader: shards of a dataset opened on demand through a shard source, as the layout's handles."""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile

import numpy as np

from loaders.protocols import ShardHandle, ShardSource
from shards import Manifest, ShardError, shard_url
from shards.format.layouts import get_layout

log = logging.getLogger(__name__)


class LocalShards:
    """:class:`loaders.protocols.ShardSource` for shards already on a local disk (no copy, no
    verification, no read-ahead, no counters)."""

    registry = None  # no counters to export
    index_dir = os.path.join(tempfile.gettempdir(), "colaflow-shard-index")  # member indexes of local shards

    def get(self, url: str, sha256: str | None = None, size: int | None = None) -> str:
        """Local path of ``url``. Raises ``FileNotFoundError`` when it is not a local file."""
        path = url[len("file://"):] if url.startswith("file://") else url
        if "://" in path or not os.path.isfile(path):
            raise FileNotFoundError(f"{url}: not a local shard file; pass a cache.ShardCache for remote shards")
        return path

    @contextlib.contextmanager
    def pinned(self, url: str, sha256: str | None = None, size: int | None = None):
        """Context manager yielding the local path of ``url`` (nothing to pin for local files)."""
        yield self.get(url, sha256, size)

    def prefetch(self, items) -> None:
        """Nothing to fetch ahead: the files are local."""

    def metrics(self) -> dict:
        """No counters: ``{}``."""
        return {}

    def close(self) -> None:
        """Nothing to stop."""


class ShardReader:
    """Open shards on demand through a cache and read samples by ``(shard, index)``.

    Args:
        manifest: the dataset manifest.
        manifest_url: its URL or folder (shard URLs are resolved beside it).
        cache: where local shard files come from (``cache.ShardCache`` or :class:`LocalShards`).
        index_dir: the node's member-index store (default: the shard source's ``index_dir``).
    """

    def __init__(self, manifest: Manifest, manifest_url: str, cache: ShardSource, index_dir: str | None = None):
        self.manifest, self.manifest_url, self.cache = manifest, manifest_url, cache
        self.index_dir = index_dir or cache.index_dir
        self.layout = get_layout(manifest.layout)
        self._open: dict[int, tuple[ShardHandle, contextlib.ExitStack]] = {}
        self._failed: dict[int, str] = {}

    def shard_ref(self, shard: int) -> tuple[str, str, int]:
        """``(url, sha256, bytes)`` of shard ``shard`` (manifest index)."""
        info = self.manifest.shards[shard]
        return shard_url(self.manifest_url, info.name), info.sha256, info.bytes

    def shard_name(self, shard: int) -> str:
        """The shard's file name (as the manifest lists it)."""
        return self.manifest.shards[shard].name

    def prefetch(self, shards: list[int]) -> None:
        """Tell the shard source the future read order."""
        self.cache.prefetch([self.shard_ref(s) for s in shards])

    def handle(self, shard: int) -> ShardHandle:
        """The open shard ``shard`` (the layout's handle, :func:`shards.format.layouts.get_layout`): opened on
        first use and kept until :meth:`retain` lets it go. A small shard is read into memory and its
        cache pin released at once, so thousands can stay open without a file descriptor each.

        Raises:
            ShardError: it cannot be fetched, verified or opened (logged once; its documents count as bad).
        """
        if shard in self._failed:
            raise ShardError(self._failed[shard])
        if shard not in self._open:
            stack = contextlib.ExitStack()
            try:
                path = stack.enter_context(self.cache.pinned(*self.shard_ref(shard)))
                handle = self.layout.open(path, self.manifest.shards[shard], self.manifest.token_dtype, self.index_dir)
                if handle.resident:  # its bytes are in memory: the cache may evict the file (and the pin's lock goes)
                    stack.close()
                self._open[shard] = (handle, stack)
            except Exception as e:  # noqa: BLE001 - any fetch/verify failure: skip the shard's samples, counted
                stack.close()
                url = self.shard_ref(shard)[0]
                self._failed[shard] = f"{url}: {type(e).__name__}: {e}"
                log.error("shard %s cannot be read, its samples are skipped and counted as bad: %s", url, e)
                raise ShardError(self._failed[shard]) from e
        return self._open[shard][0]

    def failed(self, shard: int) -> bool:
        """Whether shard ``shard`` could not be opened (its samples are skipped, counted as bad)."""
        return shard in self._failed

    def key(self, shard: int, index: int) -> str:
        """Sample key of ``(shard, index)`` (from the shard's member index)."""
        return self.handle(shard).key(index)

    def read(self, shard: int, index: int, fields: tuple[str, ...] | None = None) -> dict:
        """Decoded sample (only ``fields`` when given). Raises :class:`ShardError` (shard or member unreadable)."""
        return self.handle(shard).read(index, fields)

    def tokens(self, shard: int, index: int) -> tuple[str, np.ndarray]:
        """``(key, 1-D tokens)`` of a sample. Raises :class:`ShardError` (shard or member unreadable)."""
        return self.handle(shard).tokens(index)

    def retain(self, shards: set[int]) -> None:
        """Close (unpin) every open shard not in ``shards``. Retained shards hold no file descriptor
        when small (see the module docstring), so ``shards`` may number thousands."""
        for s in [s for s in self._open if s not in shards]:
            handle, stack = self._open.pop(s)
            handle.close()
            stack.close()

    def close(self) -> None:
        """Close every open shard and release its cache pin."""
        self.retain(set())
