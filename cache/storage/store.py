"""The on-disk store of a cache folder: paths, sidecars, space accounting and LRU eviction, shared by every
process of the node (the layout is drawn in ``cache/README.md``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass

from cache.config import format_size
from cache.errors import CacheFullError
from cache.storage.locks import FileLock, is_locked
from shards.format.urls import split_query


@dataclass
class EntryMeta:
    """Sidecar of a cached shard.

    Attributes:
        url: source URL.
        size: file size in bytes.
        sha256: expected (manifest) or computed hex digest; ``None`` if never known.
        verified: the file was hashed and matched ``sha256`` at ``mtime_ns``.
        mtime_ns: data file mtime when the sidecar was written (a changed mtime voids ``verified``).
    """

    url: str
    size: int
    sha256: str | None
    verified: bool
    mtime_ns: int


@dataclass
class Entry:
    """A complete cached shard as seen by a directory scan."""

    key: str
    path: str
    size: int
    atime: float
    meta: EntryMeta | None  # None if not read or missing


def entry_key(url: str, decompress: bool) -> str:
    """File-system-safe, collision-resistant name for a shard URL: ``<16 hex of sha1(url)>-<basename>``.

    A signed URL's query (``?token=...``) is not part of the key, so a rotated token finds the
    same entry."""
    url = split_query(url)[0]
    base = url.rstrip("/").rsplit("/", 1)[-1] or "shard"
    if decompress and base.endswith(".zst"):
        base = base[: -len(".zst")]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base)[-80:]
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:16] + "-" + base


class Store:
    """One cache directory: paths, sidecars, accounting and eviction (all processes share it).

    Every change that moves bytes between ``data/`` and ``tmp/`` (a commit renames the file and drops
    its reservation) happens under ``global.lock``, like the accounting itself: a download finishing
    between the listing of ``data/`` and of ``tmp/`` would otherwise be counted in neither.

    Args:
        root: cache directory.
        max_bytes: usage limit, bytes.
        min_free_bytes: free bytes to keep on the file system, bytes.
        create: create ``root`` and its sub-folders when missing (``False``: only look).

    Attributes:
        read_only: the folder exists and this process cannot write it (read-only mount or
            permissions); only reads of complete entries are possible.

    Raises:
        OSError: ``create`` and the folder cannot be made (e.g. its parent is read-only).
    """

    def __init__(self, root: str, max_bytes: int, min_free_bytes: int, create: bool = True,
                 wait_s: float | None = None):
        self.root, self.max_bytes, self.min_free_bytes = root, max_bytes, min_free_bytes
        self.wait_s = wait_s  # the longest wait on a lock whose holder shows no progress (cache.fetch_wait_s)
        self.read_only = is_read_only(root)
        if create and not self.read_only:
            for sub in ("data", "tmp", "locks"):
                os.makedirs(os.path.join(root, sub), exist_ok=True)

    # -- paths ------------------------------------------------------------------------
    def data_path(self, key: str) -> str:
        """Path of entry ``key``'s bytes (``data/KEY``)."""
        return os.path.join(self.root, "data", key)

    def meta_path(self, key: str) -> str:
        """Path of entry ``key``'s sidecar (``data/KEY.meta``: url, sha256, size, verified)."""
        return os.path.join(self.root, "data", key + ".meta")

    def part_path(self, key: str) -> str:
        """Path of ``key``'s download in progress (``tmp/KEY.part``)."""
        return os.path.join(self.root, "tmp", key + ".part")

    def resv_path(self, key: str) -> str:
        """Path of ``key``'s byte reservation (``tmp/KEY.resv``), counted in usage while downloading."""
        return os.path.join(self.root, "tmp", key + ".resv")

    def pin_lock(self, key: str) -> FileLock:
        """Shared lock held by every reader of ``key``; a pinned entry is never evicted."""
        return FileLock(os.path.join(self.root, "locks", key + ".pin"), shared=True, wait_s=self.wait_s)

    def hold_lock(self, key: str) -> FileLock:
        """Shared lock held on a prefetched, not-yet-read ``key``; other prefetches never evict it."""
        return FileLock(os.path.join(self.root, "locks", key + ".hold"), shared=True, wait_s=self.wait_s)

    def fetch_lock(self, key: str) -> FileLock:
        """Exclusive lock taken by the one process downloading ``key``; a wait for it ends in
        :class:`~cache.errors.CacheLockError` when the holder's partial file has not grown for ``wait_s``."""
        part = self.part_path(key)
        return FileLock(os.path.join(self.root, "locks", key + ".fetch"), wait_s=self.wait_s,
                        progress=lambda: _stat_or_none(part))

    def global_lock(self) -> FileLock:
        """Exclusive lock around accounting: listing usage, reserving, committing and evicting (held
        for moments: a wait longer than ``wait_s`` means its holder is stuck)."""
        return FileLock(os.path.join(self.root, "global.lock"), wait_s=self.wait_s)

    # -- sidecars -----------------------------------------------------------------------
    def read_meta(self, key: str) -> EntryMeta | None:
        """The sidecar of ``key``, or ``None`` if missing or unreadable (treated as unverified)."""
        try:
            with open(self.meta_path(key), encoding="utf-8") as f:
                return EntryMeta(**json.load(f))
        except (OSError, ValueError, TypeError):
            return None

    def write_meta(self, key: str, meta: EntryMeta) -> None:
        """Write the sidecar atomically (temp file + rename)."""
        tmp = os.path.join(self.root, "tmp", f"{key}.meta.{os.getpid()}.{time.monotonic_ns()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(asdict(meta), f)
        os.replace(tmp, self.meta_path(key))

    def commit(self, key: str, url: str, sha256: str | None, verified: bool,
               checked: tuple[tuple[int, int], int] | None = None) -> str:
        """Move a finished ``tmp/KEY.part`` into ``data/KEY`` atomically, drop its reservation and
        write its sidecar.

        The caller holds ``KEY``'s fetch lock and has checked size and (per policy) sha256 of the
        file ``checked`` names (``(file id, size)``, :func:`cache.storage.fetch.file_id`): only that
        file is renamed, so a partial file replaced or removed underneath a download is never
        committed as verified. The rename and the reservation's removal happen under the global
        lock, so an accounting pass (``reserve``) sees the bytes either in ``tmp/`` or in ``data/``,
        never in neither. Returns the data path.

        Raises:
            cache.storage.fetch.PartialChangedError: ``tmp/KEY.part`` is no longer the checked file.
        """
        from cache.storage.fetch import check_same_file

        part, path = self.part_path(key), self.data_path(key)
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        with self.global_lock():
            if checked is not None:
                check_same_file(part, *checked)
            os.replace(part, path)
            self.release(key)
        st = os.stat(path)
        self.write_meta(key, EntryMeta(url, st.st_size, sha256, verified, st.st_mtime_ns))
        self.touch(key)
        return path

    def drop(self, key: str) -> None:
        """Delete ``KEY``'s data file and sidecar (caller holds its pin exclusively or its fetch lock)."""
        for p in (self.data_path(key), self.meta_path(key)):
            try:
                os.remove(p)
            except FileNotFoundError:
                pass

    def touch(self, key: str) -> None:
        """Mark ``KEY`` most recently used (atime = now, mtime kept)."""
        try:
            st = os.stat(self.data_path(key))
            os.utime(self.data_path(key), ns=(time.time_ns(), st.st_mtime_ns))
        except FileNotFoundError:
            pass

    # -- scanning ---------------------------------------------------------------------
    def entries(self, meta: bool = False) -> list[Entry]:
        """Complete entries, least recently used first; sidecars are read only if ``meta``."""
        out = []
        for name in _listdir(os.path.join(self.root, "data")):
            if name.endswith(".meta"):
                continue
            try:
                st = os.stat(self.data_path(name))
            except FileNotFoundError:
                continue
            out.append(Entry(name, self.data_path(name), st.st_size, st.st_atime,
                             self.read_meta(name) if meta else None))
        out.sort(key=lambda e: e.atime)
        return out

    def partials(self) -> dict[str, tuple[int, int, bool]]:
        """Partial downloads: ``{key: (bytes written, bytes reserved, live)}``; live = a process holds its fetch lock."""
        keys = {n.rsplit(".", 1)[0] for n in _listdir(os.path.join(self.root, "tmp"))
                if n.endswith((".part", ".resv"))}
        out = {}
        for key in keys:
            written = _size(self.part_path(key))
            live = is_locked(self.fetch_lock(key).path)
            reserved = _read_int(self.resv_path(key)) if live else 0
            out[key] = (written, reserved, live)
        return out

    def usage(self) -> int:
        """Bytes counted against ``max_bytes`` (entries + partial downloads with their reservations)."""
        return (sum(e.size for e in self.entries())
                + sum(max(w, r) for w, r, _ in self.partials().values()))

    def cleanup(self, partial_ttl_s: float) -> int:
        """Start-of-day cleanup: drop stale reservations, temp sidecars, sidecars without data, and
        partial downloads nobody holds that are older than ``partial_ttl_s``. Returns files removed."""
        removed = 0
        now = time.time()
        with self.global_lock():
            tmp = os.path.join(self.root, "tmp")
            for name in os.listdir(tmp):
                path = os.path.join(tmp, name)
                key = name.rsplit(".", 1)[0]
                if name.endswith(".resv"):
                    stale = not is_locked(self.fetch_lock(key).path)
                elif name.endswith(".part"):
                    stale = now - _mtime(path) > partial_ttl_s and not is_locked(self.fetch_lock(key).path)
                else:  # temp sidecar or reservation written by a process that died mid-write
                    stale = now - _mtime(path) > 60
                if stale:
                    removed += _remove(path)
            data = os.path.join(self.root, "data")
            for name in os.listdir(data):
                if name.endswith(".meta") and not os.path.exists(os.path.join(data, name[:-5])):
                    removed += _remove(os.path.join(data, name))
        return removed

    # -- space ------------------------------------------------------------------------
    def reserve(self, key: str, total: int, url: str, prefetch: bool = False) -> int:
        """Reserve ``total`` bytes for ``KEY``'s download, evicting LRU unpinned entries as needed:
        first those no prefetcher holds; then, for a reader's download only (``prefetch=False``),
        held ones too (a reader waiting now beats a shard needed later; a prefetch never pushes
        out another prefetched, unread shard).

        The caller holds ``KEY``'s fetch lock. Returns the number of entries evicted.

        Raises:
            CacheFullError: the limit (``max_bytes``) or the free-space floor (``min_free_bytes``)
                cannot be met even after evicting every unpinned entry.
        """
        with self.global_lock():
            written = _size(self.part_path(key))
            current = max(written, _read_int(self.resv_path(key)))
            if total <= current:
                return 0
            entries = self.entries()
            others = sum(e.size for e in entries)
            pending_others = 0
            for k, (w, r, _) in self.partials().items():
                if k != key:
                    others += max(w, r)
                    pending_others += max(0, r - w)
            evicted = 0
            passes = (False,) if prefetch else (False, True)  # allow_held per pass over the LRU order
            candidates = ((e, held) for held in passes for e in entries)
            while True:
                free = shutil.disk_usage(self.root).free - pending_others - (total - written)
                if others + total <= self.max_bytes and free >= self.min_free_bytes:
                    break
                victim, allow_held = next(candidates, (None, False))
                if victim is None:
                    raise CacheFullError(
                        f"shard {url}: needs {format_size(total)} but the cache at {self.root} holds "
                        f"{format_size(others)} it cannot evict (pinned or downloading) of max_bytes="
                        f"{format_size(self.max_bytes)}, and the disk has {format_size(max(free, 0))} free "
                        f"after this download vs min_free_bytes={format_size(self.min_free_bytes)}; raise "
                        f"cache.max_bytes, free disk space, or lower cache.min_free_bytes / prefetch_shards")
                if victim.key != key and self.try_evict(victim.key, allow_held):
                    others -= victim.size
                    evicted += 1
            _write_int(self.resv_path(key), total)
            return evicted

    def release(self, key: str) -> None:
        """Drop ``KEY``'s reservation (after commit or failure)."""
        _remove(self.resv_path(key))

    def try_evict(self, key: str, allow_held: bool = False) -> bool:
        """Delete ``KEY`` unless a reader pins it or (unless ``allow_held``) a prefetcher holds it,
        in any process. Returns whether it was removed."""
        probes = [FileLock(self.pin_lock(key).path)]  # exclusive probes of the shared locks
        if not allow_held:
            probes.append(FileLock(self.hold_lock(key).path))
        taken = []
        try:
            for probe in probes:
                if not probe.acquire(blocking=False):
                    return False
                taken.append(probe)
            existed = os.path.exists(self.data_path(key))
            self.drop(key)
            return existed
        finally:
            for probe in taken:
                probe.release()

    def evict_to(self, target_bytes: int) -> tuple[int, int]:
        """Evict LRU unpinned entries until usage <= ``target_bytes``. Returns (entries, bytes) evicted."""
        n = freed = 0
        with self.global_lock():
            used = self.usage()
            for e in self.entries():
                if used <= target_bytes:
                    break
                if self.try_evict(e.key):
                    n, freed, used = n + 1, freed + e.size, used - e.size
        return n, freed


def is_read_only(path: str) -> bool:
    """Whether the existing folder ``path`` cannot be written by this process: a read-only mount
    (``ST_RDONLY``, which root cannot bypass) or missing write permission. ``False`` if missing."""
    try:
        st = os.statvfs(path)
    except FileNotFoundError:
        return False
    data = os.path.join(path, "data")
    return (bool(st.f_flag & os.ST_RDONLY) or not os.access(path, os.W_OK)
            or (os.path.isdir(data) and not os.access(data, os.W_OK)))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return time.time()


def _stat_or_none(path: str) -> tuple[int, int] | None:
    """``(size, mtime in ns)`` of ``path``, ``None`` when it does not exist: a download's progress."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def _read_int(path: str) -> int:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _write_int(path: str, value: int) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(str(value))
    os.replace(tmp, path)


def _remove(path: str) -> int:
    try:
        os.remove(path)
        return 1
    except FileNotFoundError:
        return 0
