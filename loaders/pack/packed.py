"""The compact form of a batch: what a loader worker builds and sends (numpy only, no torch).

A packed batch of B rows of T tokens holds only the token ids (``uint16`` when the vocabulary
fits, else ``int32``), each chunk's length and each row's chunk count, plus the keys and the
resume records. Labels, position ids and document ids follow from these and are
derived on the consumer side (:func:`loaders.rank.batch.expand`), so a worker sends about ``2 B T`` bytes instead
of four ``int64`` ``[B, T]`` arrays (16x less), and worker processes never import torch.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from shards.access.doc_table import gather_segments
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

    has_ids: bool  # whether :meth:`take_bytes` gives raw document ids (escaped later, on read) rather than keys

    def take(self, index: np.ndarray) -> list[str]:
        """Sample keys of documents ``index`` (``int64``)."""

    def take_bytes(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw ids (``has_ids``) or keys of documents ``index`` as UTF-8 ``(uint8 data, int64 offsets
        [len(index) + 1])`` (:func:`encode_strings`' form)."""

    def one_shard(self) -> tuple[object, np.ndarray] | None:
        """``(handle, local)`` when every document is in one shard with ids (``local``: ``int64`` index
        there, by document), else ``None``."""

    def refs(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where documents ``index`` (``int64``) are: ``int64`` ``(shard, local)``, the reader's shard
        number and the document's index in that shard."""


def encode_strings(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as their UTF-8 bytes concatenated (``uint8``) and where each starts (``int64 [len + 1]``)."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


def _interleave(parts: list[tuple[np.ndarray, np.ndarray]], at: list[np.ndarray], n: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` encoded strings gathered from several sources: source ``j`` gives, in order, the items at
    positions ``at[j]`` (``int64``) of the result. Sources and result are :func:`encode_strings`'
    ``(data, offsets)``; one gather, no string made."""
    starts, lengths = np.zeros(n, np.int64), np.zeros(n, np.int64)
    base = 0
    for (data, offsets), where in zip(parts, at):
        starts[where] = base + offsets[:-1]
        lengths[where] = np.diff(offsets)
        base += len(data)
    data = np.concatenate([d for d, _ in parts]) if parts else np.zeros(0, np.uint8)
    return gather_segments(data, starts, lengths)


class KeyList:
    """A :class:`KeyTable` over a list of keys (no raw ids)."""

    has_ids = False

    def __init__(self, keys: list[str]):
        self.keys = keys

    def take(self, index: np.ndarray) -> list[str]:
        """The keys at ``index``."""
        return [self.keys[i] for i in index.tolist()]

    def take_bytes(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys at ``index``, encoded (:func:`encode_strings`)."""
        return encode_strings(self.take(index))

    def one_shard(self) -> None:
        """``None``: keys, not a shard's documents."""
        return None

    def refs(self, index: np.ndarray):
        """Never: keys given as a list are in no shard.

        Raises:
            TypeError: always.
        """
        raise TypeError("keys given as a list have no shard references (only a consumer's read loop sends batches)")


class GroupKeys:
    """The :class:`KeyTable` of documents gathered from several shards (one group of a consumer's read loop).

    Args:
        handles: the shards' open handles (``None``: an unreadable shard, whose documents have the key
            ``""``); each gives ``key_list()``, ``has_ids`` and, when it has ids, ``id_bytes_of(index)``.
        shards: ``int64`` ``[handles]``: each handle's shard number in the reader.
        handle, local: ``int64`` ``[documents]``: each document's handle and its index in that shard.
    """

    def __init__(self, handles: list, shards: np.ndarray, handle: np.ndarray, local: np.ndarray):
        self.handles, self.shards, self.handle, self.local = handles, shards, handle, local
        self.has_ids = all(h is None or h.has_ids for h in handles)

    def refs(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``int64`` ``(shard, local)`` of documents ``docs`` (``int64``)."""
        return self.shards[self.handle[docs]], self.local[docs]

    def take(self, docs: np.ndarray) -> list[str]:
        """Sample keys of documents ``docs`` (``int64`` array), in bulk."""
        which, local = self.handle[docs], self.local[docs]
        out: list[str] = [""] * len(docs)
        for t in np.unique(which).tolist():
            handle = self.handles[t]
            if handle is None:
                continue
            at = np.flatnonzero(which == t)
            keys = handle.key_list()
            for i, j in zip(at.tolist(), local[at].tolist()):
                out[i] = keys[j]
        return out

    def one_shard(self) -> tuple[object, np.ndarray] | None:
        """``(handle, local)`` when every document is in one readable shard with ids, else ``None``."""
        one = len(self.handles) == 1 and self.handles[0] is not None and self.has_ids
        return (self.handles[0], self.local) if one else None

    def take_bytes(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw ids (every handle has them) or keys of documents ``docs``, encoded; no id is decoded."""
        if not self.has_ids:
            return encode_strings(self.take(docs))
        which, local = self.handle[docs], self.local[docs]
        if self.one_shard() is not None:  # no interleave
            return self.handles[0].id_bytes_of(local)
        parts, at = [], []
        for t in np.unique(which).tolist():
            where = np.flatnonzero(which == t)
            handle = self.handles[t]
            parts.append(handle.id_bytes_of(local[where]) if handle is not None
                         else (np.zeros(0, np.uint8), np.zeros(len(where) + 1, np.int64)))
            at.append(where)
        return _interleave(parts, at, len(docs)) if parts else encode_strings([])


def _runs_of(values: list[str]) -> list[str]:
    """``values`` with consecutive repeats dropped (one key per run of chunks of one document)."""
    out: list[str] = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


def _document_starts(group: np.ndarray, index: np.ndarray, cuts: np.ndarray | None = None) -> np.ndarray:
    """Chunks (``int64`` rows) that start a run of chunks of one document: the first, each change of
    ``(group, index)``, and each of ``cuts`` (batch starts: a run never crosses a batch)."""
    if not len(group):
        return np.zeros(0, np.int64)
    new = np.concatenate([[True], (group[1:] != group[:-1]) | (index[1:] != index[:-1])])
    if cuts is not None:
        new[cuts[cuts < len(group)]] = True
    return np.flatnonzero(new)


class PackingKeys:
    """The key references of every chunk of one packing's batches, and their raw ids encoded for all
    of them at once on first need (a worker sends every batch's keys: one gather per packing, not per batch).

    Args:
        tables: :class:`KeyTable` s by group (:meth:`loaders.pack.packer.ArrayPacker.add` call; shared
            with the packer, not copied).
        group, index: ``int64`` ``[chunks]``: each chunk's group and its document's index in that
            group's table, in row order.
        bounds: ``int`` ``[batches + 1]``: the chunks of batch ``i`` are ``bounds[i]:bounds[i + 1]``.
    """

    def __init__(self, tables: dict, group: np.ndarray, index: np.ndarray, bounds: list[int]):
        self.tables, self.group, self.index, self.bounds = tables, group, index, bounds
        self._encoded: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._refs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(first, group, index)``: the chunks starting a run of one document (runs split at batch
        bounds), and their groups and document indices (``int64``)."""
        first = _document_starts(self.group, self.index, np.asarray(self.bounds, np.int64))
        return first, self.group[first], self.index[first]

    def refs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``i``'s keys as references, one per run of chunks of one document: ``int64``
        ``(shard, local)`` (:meth:`KeyTable.refs`), found for the whole packing at once, no id read."""
        if self._refs is None:
            first, g, k = self._runs()
            shard, local = np.empty(len(g), np.int64), np.empty(len(g), np.int64)
            for gi in distinct_ints(g):
                where = np.flatnonzero(g == gi)
                shard[where], local[where] = self.tables[gi].refs(k[where])
            self._refs = shard, local, np.searchsorted(first, np.asarray(self.bounds, np.int64))
        shard, local, runs = self._refs
        a, b = int(runs[i]), int(runs[i + 1])
        return shard[a:b], local[a:b]

    @functools.cached_property
    def has_ids(self) -> bool:
        """Whether every group's table gives raw ids (:attr:`KeyTable.has_ids`; found on first need)."""
        return all(self.tables[g].has_ids for g in distinct_ints(self.group))

    def encoded(self, i: int) -> "EncodedKeys":
        """Batch ``i``'s raw ids (:attr:`has_ids` must hold), one entry per run of chunks of one document."""
        if self._encoded is None:
            first, g, k = self._runs()
            groups = distinct_ints(g)
            at = [np.flatnonzero(g == gi) for gi in groups]
            shards = [self.tables[gi].one_shard() for gi in groups]
            if shards and all(s is not None and s[0] is shards[0][0] for s in shards):
                # every group reads one and the same shard (the usual case): one gather of its ids
                local = np.empty(len(g), np.int64)
                for (_, group_local), where in zip(shards, at):
                    local[where] = group_local[k[where]]
                data, offsets = shards[0][0].id_bytes_of(local)
            else:
                parts = [self.tables[gi].take_bytes(k[where]) for gi, where in zip(groups, at)]
                data, offsets = (parts[0] if len(parts) == 1 else _interleave(parts, at, len(g))) \
                    if parts else encode_strings([])
            self._encoded = data, offsets, np.searchsorted(first, np.asarray(self.bounds, np.int64))
        data, offsets, runs = self._encoded
        a, b = int(runs[i]), int(runs[i + 1])
        return EncodedKeys(data[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], raw_ids=True)


def distinct_ints(values: np.ndarray) -> list[int]:
    """The distinct values of an ``int64`` array of numbers >= 0 spanning a small range (group, src and
    shard numbers), ascending, as ints: a set of a short array; else one value when the least and the
    greatest agree, or one counting pass (``np.unique`` sorts or hashes: ~0.3 ms per packing's keys;
    a set of a few thousand ints ~0.1 ms)."""
    if len(values) < 64:
        return sorted(set(values.tolist()))
    low, high = int(values.min()), int(values.max())
    if low == high:
        return [low]
    if high - low > 4 * len(values):  # not a small range after all: counting would cost more than sorting
        return np.unique(values).tolist()
    return (np.flatnonzero(np.bincount(values - low)) + low).tolist()


class BatchKeys(_Keys):
    """The sample keys of one batch of a packing (:class:`PackingKeys`), looked up only when read
    (most batches' keys never are).

    Reads as a list of ``str`` with one key per run of chunks of the same document. A worker sends
    it through its ring as references (:meth:`refs`); it pickles as :class:`EncodedKeys` (:meth:`encoded`).
    """

    def __init__(self, packing: PackingKeys, i: int):
        self._packing, self._i = packing, i

    def _list(self) -> list[str]:
        if self._keys is None:
            p, a, b = self._packing, self._packing.bounds[self._i], self._packing.bounds[self._i + 1]
            g, k = p.group[a:b], p.index[a:b]
            first = _document_starts(g, k)
            g, k = g[first], k[first]
            found: list = [None] * len(g)
            for gi in distinct_ints(g):  # one look-up per group (add call), in bulk
                at = np.flatnonzero(g == gi)
                for j, key in zip(at.tolist(), p.tables[gi].take(k[at])):
                    found[j] = key
            self._keys = _runs_of(found)
            self._packing = None
        return self._keys

    def refs(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys as ``int64`` ``(shard, local)`` references, one per run of chunks of one document
        (:meth:`PackingKeys.refs`); only before the keys are read."""
        return self._packing.refs(self._i)

    def encoded(self) -> "EncodedKeys":
        """The keys as bytes: raw ids when every table has them (escaped only if ever read), gathered
        for the whole packing at once; else the keys."""
        if self._keys is not None or not self._packing.has_ids:
            return EncodedKeys(*encode_strings(self._list()), raw_ids=False)
        return self._packing.encoded(self._i)

    def __reduce__(self):
        return self.encoded().__reduce__()


def _decode(data: np.ndarray, offsets: np.ndarray, raw_ids: bool) -> list[str]:
    """Entries of :func:`encode_strings`' ``(data, offsets)`` as strings; raw ids escaped into keys
    (:func:`shards.format.keys.escape_keys`; raises ValueError on an empty one)."""
    text, cut = data.tobytes(), offsets.tolist()
    values = [text[a:b].decode("utf-8") for a, b in zip(cut[:-1], cut[1:])]
    return escape_keys(values) if raw_ids else values


class EncodedKeys(_Keys):
    """Sample keys carried as UTF-8 bytes, decoded (and, for raw ids, escaped with
    :func:`shards.format.keys.escape_keys`) on first read.

    Args:
        data: ``uint8`` bytes of every entry, concatenated; ``offsets``: ``int64 [entries + 1]``.
        raw_ids: entries are documents' raw ids (else already keys).
    Raises (when read):
        ValueError: a raw id is empty.
    """

    def __init__(self, data: np.ndarray, offsets: np.ndarray, raw_ids: bool):
        self.data, self.offsets, self.raw_ids = data, offsets, raw_ids

    def _list(self) -> list[str]:
        if self._keys is None:
            self._keys = _runs_of(_decode(self.data, self.offsets, self.raw_ids))
        return self._keys

    def __reduce__(self):
        return EncodedKeys, (self.data, self.offsets, self.raw_ids)


def key_refs(keys) -> tuple[np.ndarray, np.ndarray]:
    """A worker batch's keys (:class:`BatchKeys`, or none: a records-only batch) as ``int64``
    ``(shard, local)`` references (:meth:`BatchKeys.refs`).

    Raises:
        TypeError: keys given as a list of strings (not from a consumer's read loop).
    """
    if isinstance(keys, BatchKeys):
        return keys.refs()
    if len(keys):
        raise TypeError("a worker sends keys as shard references: a batch of listed keys cannot go through its ring")
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


class KeyLookup:
    """Sample keys of ``(shard, local)`` references, looked up through a reader of this process's own,
    opened on first need; its shards are let go after each look-up, so it pins nothing in the cache.

    Args:
        open_reader: makes the reader (:meth:`loaders.worker.stream.TextStream.open_reader`: the shard
            numbers of the references are its own).
    """

    def __init__(self, open_reader: Callable[[], object]):
        self._open_reader, self._reader = open_reader, None
        self._lock = threading.Lock()  # keys may be read from more than one thread

    def keys(self, shard: np.ndarray, local: np.ndarray) -> list[str]:
        """The key of each reference (``int64`` ``[n]`` each): raw ids of only these documents, decoded
        and escaped, where the shard has ids; else its key list.

        Raises:
            shards.ShardError: a shard cannot be opened here; ValueError: an empty raw id.
        """
        out: list[str] = [""] * len(shard)
        with self._lock:
            if self._reader is None:
                self._reader = self._open_reader()
            try:
                for s in distinct_ints(shard):
                    at = np.flatnonzero(shard == s)
                    handle = self._reader.handle(s)
                    if handle.has_ids:
                        found = _decode(*handle.id_bytes_of(local[at]), raw_ids=True)
                    else:
                        listed = handle.key_list()
                        found = [listed[j] for j in local[at].tolist()]
                    for i, key in zip(at.tolist(), found):
                        out[i] = key
            finally:
                self._reader.retain(set())
        return out


class RefKeys(_Keys):
    """Sample keys carried as ``(shard, local)`` references (what a worker's ring holds), looked up
    through ``lookup`` on first read; pickled, they go as the list of keys.

    Args:
        shard, local: ``int64`` ``[entries]``, one per run of chunks of one document.
        lookup: the :class:`KeyLookup` of the process reading them.
    """

    def __init__(self, shard: np.ndarray, local: np.ndarray, lookup: KeyLookup):
        self.shard, self.local, self._lookup = shard, local, lookup

    def _list(self) -> list[str]:
        if self._keys is None:
            self._keys = _runs_of(self._lookup.keys(self.shard, self.local))
            self._lookup = None
        return self._keys

    def __reduce__(self):
        return list, (self._list(),)


@dataclass
class PackedBatch:
    """A micro-batch in compact form.

    Attributes:
        ids: ``uint16``/``int32`` ``[B, T]`` token ids, 0 on padding.
        lens: ``int32`` ``[chunks]``: chunk lengths in row order (each chunk is its own document).
        row_chunks: ``int32`` ``[B]``: chunks per row (rows are filled from the left).
        keys: sample keys of the documents that contributed tokens (a list, :class:`BatchKeys`, or
            :class:`RefKeys` from a worker's ring).
        consumed: ``int64`` ``[k, 3]``: ``(global position, chunk, n_chunks)`` records (see
            :mod:`loaders.order.progress`); a list of such tuples is converted.
        worker: the loader worker (of its rank) that packed it: where the workers' round-robin
            goes on after a resume.
        doc_tokens: tokens of documents, when the packer counted them (else :attr:`num_doc_tokens` sums ``lens``).
        one_document: whether every row is one chunk filling it or empty, when the packer knows
            (else :func:`loaders.rank.batch.one_document_rows` finds out).
    """

    ids: np.ndarray
    lens: np.ndarray
    row_chunks: np.ndarray
    keys: list[str] = field(default_factory=list)
    consumed: np.ndarray = field(default_factory=lambda: consumed_array(None))
    worker: int = 0
    doc_tokens: int | None = None
    one_document: bool | None = None

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
        return self.doc_tokens if self.doc_tokens is not None else int(self.lens.sum())

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
