"""The compact form of a batch: what a loader worker builds and sends (numpy only, no torch).

A packed batch of B rows of T tokens holds only the token ids (``uint16`` when the vocabulary
fits, else ``int32``), each chunk's length and each row's chunk count, plus the keys and the
resume records. Labels, position ids and document ids follow from these and are
derived on the consumer side (:func:`loaders.rank.batch.expand`), so a worker sends about ``2 B T`` bytes instead
of four ``int64`` ``[B, T]`` arrays (16x less), and worker processes never import torch.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from shards.format.keys import escape_keys

IGNORE = -100


class _Keys(Sequence):
    """A list of sample keys built on first read (:meth:`_list`)."""

    _keys: list[str] | None = None

    def _list(self) -> list[str]:
        raise NotImplementedError

    def __getitem__(self, i):
        return self._list()[i]

    def __len__(self) -> int:
        return len(self._list())

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and self._list() == list(other)

    def __repr__(self) -> str:
        return repr(self._list())


class KeyTable(Protocol):
    """Sample keys of a group of documents, looked up in bulk when a batch's keys are read."""

    has_ids: bool  # whether ``take(..., escaped=False)`` gives raw document ids (escaped later, on read)

    def take(self, index: np.ndarray, escaped: bool = True) -> list[str]:
        """Keys (``escaped``) or raw ids of documents ``index`` (``int64``)."""


class KeyList:
    """A :class:`KeyTable` over a list of keys (no raw ids)."""

    has_ids = False

    def __init__(self, keys: list[str]):
        self.keys = keys

    def take(self, index: np.ndarray, escaped: bool = True) -> list[str]:
        """The keys at ``index`` (``escaped`` has no effect: they are keys already)."""
        return [self.keys[i] for i in index.tolist()]


class GroupKeys:
    """The :class:`KeyTable` of documents gathered from several shards (one group of a consumer's read loop).

    Args:
        handles: the shards' open handles (``None``: an unreadable shard, whose documents have the key
            ``""``); each gives ``key_list()``, ``has_ids`` and ``ids`` (raw ids, when it has them).
        handle, local: ``int64`` ``[documents]``: each document's handle and its index in that shard.
    """

    def __init__(self, handles: list, handle: np.ndarray, local: np.ndarray):
        self.handles, self.handle, self.local = handles, handle, local
        self.has_ids = all(h is None or h.has_ids for h in handles)

    def take(self, docs: np.ndarray, escaped: bool = True) -> list[str]:
        """Sample keys (``escaped``) or raw ids of documents ``docs`` (``int64`` array), in bulk."""
        which, local = self.handle[docs], self.local[docs]
        out: list[str] = [""] * len(docs)
        for t in np.unique(which).tolist():
            handle = self.handles[t]
            if handle is None:
                continue
            at = np.flatnonzero(which == t)
            keys = handle.key_list() if escaped else handle.ids
            for i, j in zip(at.tolist(), local[at].tolist()):
                out[i] = keys[j]
        return out


def _runs_of(values: list[str]) -> list[str]:
    """``values`` with consecutive repeats dropped (one key per run of chunks of one document)."""
    out: list[str] = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


class BatchKeys(_Keys):
    """The sample keys of a batch's documents, looked up only when read (most batches' keys never are).

    Args:
        tables: :class:`KeyTable` s by group (:meth:`loaders.pack.packer.ArrayPacker.add` call; shared
            with the packer, not copied).
        group, index: ``int64`` ``[chunks]``: each chunk's group and its document's index in that
            group's table, in row order.

    Reads as a list of ``str`` with one key per run of chunks of the same document. It pickles
    as the documents' ids (:class:`IdKeys`, escaped when read on the other side) when its tables
    give ids, else as the key list.
    """

    def __init__(self, tables: dict, group: np.ndarray, index: np.ndarray):
        self._tables, self._group, self._index = tables, group, index

    def _lookup(self, escaped: bool) -> list[str]:
        g, k = self._group, self._index
        first = np.flatnonzero(np.concatenate([[True], (g[1:] != g[:-1]) | (k[1:] != k[:-1])])) if len(g) else g
        g, k = g[first], k[first]
        found: list = [None] * len(first)
        for gi in np.unique(g).tolist():  # one look-up per group (add call), in bulk
            at = np.flatnonzero(g == gi)
            table = self._tables[gi]
            for i, key in zip(at.tolist(), table.take(k[at], escaped)):
                found[i] = key
        return _runs_of(found)

    def _list(self) -> list[str]:
        if self._keys is None:
            self._keys = self._lookup(escaped=True)
            self._tables = {}
        return self._keys

    def __reduce__(self):
        if self._keys is None and all(t.has_ids for t in self._tables.values()):
            return IdKeys, (self._lookup(escaped=False),)  # no escaping in the worker: the reader does it, if ever
        return list, (self._list(),)


class IdKeys(_Keys):
    """Sample keys of documents given by id, escaped (:func:`shards.format.keys.escape_keys`) on first read.

    Raises (when read):
        ValueError: an id is empty.
    """

    def __init__(self, ids: list[str]):
        self._ids = ids

    def _list(self) -> list[str]:
        if self._keys is None:
            self._keys = _runs_of(escape_keys(self._ids))
        return self._keys

    def __reduce__(self):
        return IdKeys, (self._ids,)


@dataclass
class PackedBatch:
    """A micro-batch in compact form.

    Attributes:
        ids: ``uint16``/``int32`` ``[B, T]`` token ids, 0 on padding.
        lens: ``int32`` ``[chunks]``: chunk lengths in row order (each chunk is its own document).
        row_chunks: ``int32`` ``[B]``: chunks per row (rows are filled from the left).
        keys: sample keys of the documents that contributed tokens (a list, or :class:`BatchKeys`).
        consumed: ``int64`` ``[k, 3]``: ``(global position, chunk, n_chunks)`` records (see
            :mod:`loaders.order.progress`); a list of such tuples is converted.
        worker: the loader worker (of its rank) that packed it: where the workers' round-robin
            goes on after a resume.
    """

    ids: np.ndarray
    lens: np.ndarray
    row_chunks: np.ndarray
    keys: list[str] = field(default_factory=list)
    consumed: np.ndarray = field(default_factory=lambda: consumed_array(None))
    worker: int = 0

    def __post_init__(self):
        self.consumed = consumed_array(self.consumed)

    def __reduce__(self):
        # raw bytes, not pickled arrays: a few bytes of framing instead of ~120 per array; resume
        # records as int32 when they fit (nearly always): 12 bytes per chunk, not 24
        c = self.consumed
        wide = len(c) and (int(c.max()) >= 1 << 31 or int(c.min()) < -(1 << 31))
        c = c if wide else c.astype(np.int32)
        return _unpack, (self.ids.tobytes(), self.ids.dtype.str, self.ids.shape, self.lens.astype(np.int32).tobytes(),
                         self.row_chunks.astype(np.int32).tobytes(), c.tobytes(), c.dtype.str, self.keys, self.worker)

    @property
    def num_doc_tokens(self) -> int:
        """Tokens of documents (padding excluded)."""
        return int(self.lens.sum())

    @property
    def num_slots(self) -> int:
        """B x T."""
        return int(self.ids.size)


def _unpack(ids: bytes, ids_dtype: str, shape, lens: bytes, row_chunks: bytes, consumed: bytes, consumed_dtype: str,
            keys: list[str], worker: int) -> PackedBatch:
    """Inverse of :meth:`PackedBatch.__reduce__`."""
    # bytearray: writable arrays (torch.from_numpy warns on read-only ones)
    return PackedBatch(np.frombuffer(bytearray(ids), ids_dtype).reshape(shape), np.frombuffer(bytearray(lens), np.int32),
                       np.frombuffer(bytearray(row_chunks), np.int32), keys,
                       np.frombuffer(consumed, consumed_dtype).astype(np.int64).reshape(-1, 3), worker)


def consumed_array(records) -> np.ndarray:
    """``records`` (``(position, chunk, n_chunks)`` tuples, an array, or ``None``) as ``int64 [k, 3]``."""
    if isinstance(records, np.ndarray) and records.dtype == np.int64 and records.ndim == 2:
        return records
    return np.asarray(records if records is not None and len(records) else np.empty((0, 3)), np.int64).reshape(-1, 3)


def records_only(records, row_len: int) -> PackedBatch:
    """A batch of no rows that only carries resume ``records`` (empty or unreadable documents met after
    a consumer's last batch): the loader notes them in its resume state and does not deliver it,
    so every document of the epoch is accounted for."""
    return PackedBatch(np.zeros((0, row_len), np.uint16), np.zeros(0, np.int32), np.zeros(0, np.int32), [],
                       consumed_array(records))


def compact_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` as ``uint16`` when every id fits, else ``int32`` (token ids are < 2**31)."""
    if ids.size and int(ids.max()) >= 1 << 16:
        return ids.astype(np.int32)
    return ids.astype(np.uint16)
