"""Per-shard member offsets, computed once per node and reused by every consumer and epoch.

A consumer reads single members by offset, so it needs each sample's member offsets. Listing
them with :mod:`tarfile` (``TarInfo.offset_data``) parses every 512-byte header of the shard,
which costs more than reading the members a consumer actually wants. The listing is therefore
made once and kept, in this order of preference:

1. this process's memory (an LRU over recently opened shards);
2. the node's index store ``INDEX_DIR/SHA256-SIZE.npz`` (keyed by the manifest's sha256 and
   byte size, so a changed shard never meets a stale index);
3. the DALI ``v1.2`` index beside a local shard (``shard-000000.idx``, written by
   ``python -m shards index``), when it is not older than the shard;
4. the tar headers, listed with :mod:`tarfile`.

Every consumer opens every shard of its blocks (it reads 1/C of each), so loading a listing
must cost far less than per-sample work: the store holds plain numpy arrays
(:class:`MemberTable`, ``np.savez``, no pickle) that load in a fraction of a millisecond
instead of one Python object per sample. Whichever consumer first gets a listing from 3 or 4
writes it to the store (atomic rename).

Whatever the source, the sample count must match the manifest and the first and last samples'
tar headers are checked against the index (``shards.io.index.read_sample(check=True)``), so a
stale or foreign index is caught when the shard is opened: it is rebuilt from the tar headers.
"""
from __future__ import annotations

import collections
import logging
import os
import tarfile
from dataclasses import dataclass

import numpy as np

from shards.format.keys import split_name
from shards.format.sample import field_name
from shards.io.index import SampleEntry, dali_index_path, read_dali_index, read_sample
from shards.io.reader import ShardError

log = logging.getLogger(__name__)

MEMORY_SHARDS = 128  # shards whose tables one process keeps in memory
TABLE_FIELDS = ("keys", "start", "code", "offset", "size", "suffixes")


@dataclass(frozen=True)
class MemberTable:
    """Member offsets of one shard as arrays (members of sample ``i`` are rows ``start[i]:start[i+1]``).

    Attributes:
        keys: ``str`` array ``[samples]``, file order.
        start: ``int64`` ``[samples + 1]``.
        code: ``int32`` ``[members]``: index into ``suffixes``.
        offset, size: ``int64`` ``[members]``: data offset and size in bytes.
        suffixes: ``str`` array of the member suffixes in use (``tokens.npy.zst``, ``json``, ...).
    """

    keys: np.ndarray
    start: np.ndarray
    code: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    suffixes: np.ndarray

    @classmethod
    def from_entries(cls, entries) -> "MemberTable":
        """Build the table from index entries (each with ``key`` and ``members`` ``(suffix, offset, size)``)."""
        suffixes = sorted({s for e in entries for s, _, _ in e.members})
        codes = {s: i for i, s in enumerate(suffixes)}
        rows = [m for e in entries for m in e.members]
        counts = [len(e.members) for e in entries]
        return cls(np.array([e.key for e in entries], dtype=str),
                   np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64),
                   np.array([codes[s] for s, _, _ in rows], dtype=np.int32),
                   np.array([o for _, o, _ in rows], dtype=np.int64), np.array([n for _, _, n in rows], dtype=np.int64),
                   np.array(suffixes, dtype=str))

    def __len__(self) -> int:
        return len(self.keys)

    def entry(self, i: int) -> SampleEntry:
        """Sample ``i`` as a ``shards.io.index.SampleEntry``."""
        lo, hi = int(self.start[i]), int(self.start[i + 1])
        return SampleEntry(str(self.keys[i]), tuple((str(self.suffixes[c]), int(o), int(n)) for c, o, n in
                                                    zip(self.code[lo:hi], self.offset[lo:hi], self.size[lo:hi])))

    def field_rows(self, name: str) -> np.ndarray:
        """``int64`` ``[samples]``: the row of each sample's member of field ``name`` (``-1``: none)."""
        wanted = np.array([field_name(str(s)) == name for s in self.suffixes], dtype=bool)
        rows = np.full(len(self), -1, np.int64)
        hit = np.flatnonzero(wanted[self.code]) if len(self.code) else np.empty(0, np.int64)
        rows[np.repeat(np.arange(len(self)), np.diff(self.start))[hit]] = hit
        return rows


class TableCache(collections.OrderedDict):
    """This process's recently used per-shard tables (least recently used dropped past ``capacity``),
    keyed by :func:`table_key`."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def get_recent(self, key: tuple):
        """The table under ``key`` (now the most recently used), or ``None``."""
        table = self.get(key)
        if table is not None:
            self.move_to_end(key)
        return table

    def keep(self, key: tuple, table) -> None:
        """Keep ``table`` under ``key``, dropping the least recently used past ``capacity``."""
        self[key] = table
        while len(self) > self.capacity:
            self.popitem(last=False)


def table_key(path: str, sha256: str | None, size: int | None) -> tuple:
    """A shard's key in this process's table caches: the manifest's digest and size, else the file's
    path and modification time."""
    return (sha256, size) if sha256 else (path, os.stat(path).st_mtime_ns)


def store_path(index_dir: str | None, sha256: str | None, size: int | None, suffix: str) -> str | None:
    """``INDEX_DIR/SHA256-SIZE.SUFFIX`` in the node's index store, or ``None`` (no store, or no digest)."""
    return os.path.join(index_dir, f"{sha256}-{size}.{suffix}") if index_dir and sha256 and size is not None else None


_memory = TableCache(MEMORY_SHARDS)


def list_members(path: str) -> tuple[SampleEntry, ...]:
    """Sample entries of the tar at ``path`` from its headers (``TarInfo.offset_data``, file order).

    Raises:
        ShardError: unreadable tar, a member without a field suffix, or members of a key not adjacent.
    """
    entries: list[tuple[str, list[tuple[str, int, int]]]] = []
    try:
        with tarfile.open(path, mode="r:") as tar:
            for ti in tar:
                if not ti.isfile():
                    continue
                key, suffix = split_name(ti.name)
                if not suffix:
                    raise ShardError(f"{path}: member {ti.name!r} has no field suffix", "no_suffix")
                if not entries or entries[-1][0] != key:
                    entries.append((key, []))
                entries[-1][1].append((suffix, ti.offset_data, ti.size))
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ShardError(f"{path}: unreadable tar: {e}") from e
    if len({k for k, _ in entries}) != len(entries):
        raise ShardError(f"{path}: a key appears in two places (members of a sample must be adjacent)",
                         "non_adjacent")
    return tuple(SampleEntry(k, tuple(m)) for k, m in entries)


def _matches(path: str, table: MemberTable, expected_samples: int | None, f) -> bool:
    """Cheap staleness check: sample count, and the first/last samples' headers match the index."""
    if expected_samples is not None and len(table) != expected_samples:
        return False
    try:
        for i in {0, len(table) - 1} if len(table) else ():
            read_sample(path, table.entry(i), decode=False, fileobj=f, check=True)
    except ShardError:
        return False
    return True


def _load(idx: str) -> MemberTable | None:
    try:
        if idx.endswith(".npz"):
            with np.load(idx, allow_pickle=False) as z:
                return MemberTable(*(z[k] for k in TABLE_FIELDS))
        return MemberTable.from_entries(read_dali_index(idx))
    except Exception as e:  # noqa: BLE001 - whatever is wrong with an index file (empty, foreign, corrupt), it is rebuilt
        log.warning("shard index %s unreadable (%s: %s); rebuilding it from the tar headers", idx, type(e).__name__, e)
        return None


_unwritable: set[str] = set()  # store folders this process failed to write (warned about once each)


def store_file(path: str, write, what: str) -> None:
    """Write a file of the node's index store: ``write(f)`` fills a temporary file that is then
    renamed to ``path`` (atomic: readers see the old file or the whole new one). A failure only
    costs rebuilding the file when next needed; it is logged as a warning once per store folder and
    process (naming ``what`` and the folder), later ones at debug level."""
    tmp = f"{path}.tmp-{os.getpid()}"
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError as e:
        if folder in _unwritable:
            log.debug("cannot store the %s %s (%s)", what, path, e)
        else:
            _unwritable.add(folder)
            log.warning("cannot store the %s %s (%s); shard tables are rebuilt when next needed (set "
                        "data.index_dir to a writable folder; further failures in %s are not reported)",
                        what, path, e, folder)
        if os.path.exists(tmp):
            os.remove(tmp)


def member_table(path: str, fileobj, sha256: str | None, size: int | None, index_dir: str | None,
                 expected_samples: int | None = None) -> MemberTable:
    """Member offsets of a local shard (see the module docstring for where they come from).

    Args:
        path: the local shard file; ``fileobj``: it, open for binary reading (used for the checks).
        sha256, size: the manifest's digest and byte size (the store key; ``None``: not stored).
        index_dir: the node's index store (``None``: not stored).
        expected_samples: the manifest's sample count.
    Raises:
        ShardError: the tar cannot be listed, or its sample count differs from ``expected_samples``.
    """
    mem_key = table_key(path, sha256, size)
    table = _memory.get_recent(mem_key)
    if table is not None:
        return table
    store = store_path(index_dir, sha256, size, "npz")
    beside = dali_index_path(path)
    candidates = [store] if store and os.path.exists(store) else []
    if os.path.exists(beside) and os.stat(beside).st_mtime_ns >= os.stat(path).st_mtime_ns:
        candidates.append(beside)
    source = None
    for idx in candidates:
        got = _load(idx)
        if got is not None and _matches(path, got, expected_samples, fileobj):
            table, source = got, idx
            break
        log.warning("shard index %s does not match %s; rebuilding it from the tar headers", idx, path)
    if table is None:
        table = MemberTable.from_entries(list_members(path))
        if expected_samples is not None and len(table) != expected_samples:
            raise ShardError(f"{path}: {len(table)} samples but the manifest says {expected_samples};"
                             " the shard or the manifest is stale — rebuild the manifest")
    if store and source != store:
        store_file(store, lambda f: np.savez(f, **{k: getattr(table, k) for k in TABLE_FIELDS}), "shard index")
    _memory.keep(mem_key, table)
    return table
