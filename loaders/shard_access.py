"""Random access to samples inside shards, through the node cache.

A consumer reads only its own samples: it opens a shard (a local file from the cache), lists
the tar headers once with :mod:`tarfile` (seeking over the data), and then reads the members of
a sample by offset. The shard stays pinned in the cache while open.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tarfile

from shards import Manifest, ShardError, shard_url
from shards.reader import decode_sample

log = logging.getLogger(__name__)


class LocalShards:
    """Shard source for shards already on a local disk (no copy, no verification).

    Implements the subset of the cache contract the loader uses: ``get`` and ``pinned``.
    """

    def get(self, url: str, sha256: str | None = None, size: int | None = None) -> str:
        """Local path of ``url``. Raises ``FileNotFoundError`` when it is not a local file."""
        path = url[len("file://"):] if url.startswith("file://") else url
        if "://" in path or not os.path.isfile(path):
            raise FileNotFoundError(f"{url}: not a local shard file; pass a cache.ShardCache for remote shards")
        return path

    @contextlib.contextmanager
    def pinned(self, url: str, sha256: str | None = None, size: int | None = None):
        yield self.get(url, sha256, size)


class IndexedShard:
    """One open shard: keys in file order and each member's data offset and size.

    Raises:
        ShardError: unreadable tar, members of a key not adjacent, or a sample count that
            differs from the manifest's ``expected_samples``.
    """

    def __init__(self, path: str, expected_samples: int | None = None):
        self.path = path
        self.keys: list[str] = []
        self.members: list[dict[str, tuple[int, int]]] = []
        try:
            with tarfile.open(path, mode="r:") as tar:
                for ti in tar:
                    if not ti.isfile():
                        continue
                    key, _, suffix = ti.name.partition(".")
                    if not suffix:
                        raise ShardError(f"{path}: member {ti.name!r} has no field suffix")
                    if not self.keys or self.keys[-1] != key:
                        self.keys.append(key)
                        self.members.append({})
                    self.members[-1][suffix] = (ti.offset_data, ti.size)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ShardError(f"{path}: unreadable tar: {e}") from e
        if len(set(self.keys)) != len(self.keys):
            raise ShardError(f"{path}: a key appears in two places (members of a sample must be adjacent)")
        if expected_samples is not None and len(self.keys) != expected_samples:
            raise ShardError(f"{path}: {len(self.keys)} samples but the manifest says {expected_samples};"
                             " the shard or the manifest is stale — rebuild the manifest")
        self._f = open(path, "rb")

    def read(self, index: int, fields: tuple[str, ...] | None = None) -> dict:
        """Decoded sample ``index`` (file order): ``{"__key__", "tokens", "json", ...}``.

        Args:
            fields: read only these fields (e.g. ``("tokens",)``); ``None`` reads all.
        Raises:
            ShardError: a member cannot be read or decoded (names shard and member).
        """
        key = self.keys[index]
        wanted = self.members[index].items()
        if fields is not None:
            wanted = [(s, m) for s, m in wanted if s.split(".", 1)[0] in fields]
        out = {}
        for suffix, (offset, size) in wanted:
            self._f.seek(offset)
            data = self._f.read(size)
            if len(data) != size:
                raise ShardError(f"{self.path}: member {key}.{suffix} truncated ({len(data)} of {size} bytes)")
            out[suffix] = data
        return decode_sample(self.path, key, out)

    def close(self) -> None:
        self._f.close()


class ShardReader:
    """Open shards on demand through a cache and read samples by ``(shard, index)``.

    Args:
        manifest: the dataset manifest.
        manifest_url: its URL or folder (shard URLs are resolved beside it).
        cache: an object with ``pinned(url, sha256, size)`` (context manager giving a local path)
            — ``cache.ShardCache`` or :class:`LocalShards`; ``prefetch([(url, sha256, size)])``
            is used when present.
    """

    def __init__(self, manifest: Manifest, manifest_url: str, cache):
        self.manifest, self.manifest_url, self.cache = manifest, manifest_url, cache
        self._open: dict[int, tuple[IndexedShard, contextlib.ExitStack]] = {}
        self._failed: dict[int, str] = {}

    def shard_ref(self, shard: int) -> tuple[str, str, int]:
        """``(url, sha256, bytes)`` of shard ``shard`` (manifest index)."""
        info = self.manifest.shards[shard]
        return shard_url(self.manifest_url, info.name), info.sha256, info.bytes

    def prefetch(self, shards: list[int]) -> None:
        """Tell the cache the future read order (no-op without ``cache.prefetch``)."""
        if hasattr(self.cache, "prefetch"):
            self.cache.prefetch([self.shard_ref(s) for s in shards])

    def _shard(self, shard: int) -> IndexedShard:
        if shard in self._failed:
            raise ShardError(self._failed[shard])
        if shard not in self._open:
            stack = contextlib.ExitStack()
            try:
                path = stack.enter_context(self.cache.pinned(*self.shard_ref(shard)))
                self._open[shard] = (IndexedShard(path, self.manifest.shards[shard].samples), stack)
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
        """Sample key of ``(shard, index)`` (reads the shard's tar headers only)."""
        return self._shard(shard).keys[index]

    def read(self, shard: int, index: int, fields: tuple[str, ...] | None = None) -> dict:
        """Decoded sample (only ``fields`` when given). Raises :class:`ShardError` (shard or member unreadable)."""
        return self._shard(shard).read(index, fields)

    def retain(self, shards: set[int]) -> None:
        """Close (unpin) every open shard not in ``shards``."""
        for s in [s for s in self._open if s not in shards]:
            handle, stack = self._open.pop(s)
            handle.close()
            stack.close()

    def close(self) -> None:
        self.retain(set())
