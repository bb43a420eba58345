"""One open shard of the ``documents`` layout (one sample per document): samples by index, as decoded members.

The member offsets come from the node's member index (:func:`shards.access.member_index.member_table`);
members are sliced out of the shard's bytes (:func:`shards.access.local_file.read_or_map`: in memory when
small, else memory-mapped), so an open shard holds no file descriptor of its own when small.
"""
from __future__ import annotations

import numpy as np

from shards.access.local_file import is_resident, read_or_map
from shards.access.member_index import member_table
from shards.format.sample import field_name
from shards.format.tokens import TokenDecoder
from shards.io.reader import ShardError, decode_sample


class IndexedShard:
    """One open shard: its member table (keys in file order, each member's data offset and size in bytes).

    The member offsets come from :func:`shards.access.member_index.member_table` (computed once per
    node, keyed by the manifest's sha256); members are sliced out of the shard's bytes
    (:func:`shards.access.local_file.read_or_map`: in memory when small, else memory-mapped).

    Args:
        path: the local shard file.
        expected_samples, sha256, size: the manifest's sample count, digest and byte size.
        index_dir: the node's index store (``None``: listings are not stored).
        token_dtype: the manifest's token dtype (fast decoding path).
    Raises:
        ShardError: unreadable tar, members of a key not adjacent, or a sample count that
            differs from the manifest's ``expected_samples``.
        OSError: the file cannot be opened, read or mapped.
    """

    def __init__(self, path: str, expected_samples: int | None = None, sha256: str | None = None,
                 size: int | None = None, index_dir: str | None = None, token_dtype: str = "uint16"):
        self.path = path
        with open(path, "rb") as f:  # only while opening: see the module docstring
            self.table = member_table(path, f, sha256, size, index_dir, expected_samples)
            self._data = read_or_map(f)
        self._tokens = self.table.field_rows("tokens")
        self._decoder = TokenDecoder(token_dtype)
        self._keys: list[str] | None = None
        self.errors: list[str] = []  # unreadable documents met by locate(), for the caller to log

    def __len__(self) -> int:
        return len(self.table)

    @property
    def resident(self) -> bool:
        """Whether the shard is read whole into memory (needs neither its file nor a cache pin any more)."""
        return is_resident(self._data)

    def key(self, index: int) -> str:
        """Key of sample ``index`` (file order)."""
        return str(self.table.keys[index])

    def key_list(self) -> list[str]:
        """Every sample's key, in file order."""
        if self._keys is None:
            self._keys = [str(k) for k in self.table.keys]
        return self._keys

    has_ids, ids = False, None  # the member table holds keys, not the raw ids (an over-long id's key is hashed)

    def _member(self, key: str, suffix: str, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` (bytes) of the shard. Raises ShardError when the shard is shorter."""
        data = self._data[offset:offset + size]
        if len(data) != size:
            raise ShardError(f"{self.path}: member {key}.{suffix} truncated ({len(data)} of {size} bytes)",
                             "truncated")
        return data

    def read(self, index: int, fields: tuple[str, ...] | None = None) -> dict:
        """Decoded sample ``index`` (file order): ``{"__key__", "tokens", "json", ...}``.

        Args:
            fields: read only these fields (e.g. ``("json",)``); ``None`` reads all.
        Raises:
            ShardError: a member cannot be read or decoded (names shard and member).
        """
        entry = self.table.entry(index)
        wanted = [m for m in entry.members if fields is None or field_name(m[0]) in fields]
        return decode_sample(self.path, entry.key, {s: self._member(entry.key, s, o, n) for s, o, n in wanted})

    def tokens(self, index: int) -> tuple[str, np.ndarray]:
        """``(key, tokens)`` of sample ``index``: the 1-D token array (read-only, the dataset's dtype).

        Raises:
            ShardError: no tokens member, or it cannot be read or decoded (names shard and member).
        """
        key, row = str(self.table.keys[index]), int(self._tokens[index])
        if row < 0:
            raise ShardError(f"{self.path}: sample {key!r} has no tokens member", "missing_field")
        t = self.table
        suffix = str(t.suffixes[t.code[row]])
        data = self._member(key, suffix, int(t.offset[row]), int(t.size[row]))
        try:
            return key, self._decoder.tokens(suffix, data)
        except Exception as e:  # noqa: BLE001 - any decoder failure is reported with its location
            raise ShardError(f"{self.path}: cannot decode member {key}.{suffix}: {type(e).__name__}: {e}",
                             "undecodable") from e

    def locate(self, index: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Documents ``index`` (``int64``) decoded into one token array, as
        :meth:`shards.access.token_blocks.BlockShard.locate` returns them: ``(pools, pool, offset, length, ok)``.

        A document whose tokens member is missing, undecodable or not a 1-D integer array is not ``ok``
        (its error is in :attr:`errors` for the caller to log as bad); an empty one is ``ok`` with length 0.
        """
        arrays, ok = [], np.ones(len(index), bool)
        for k, i in enumerate(index.tolist()):
            try:
                key, toks = self.tokens(i)
            except ShardError as e:
                self.errors.append(f"sample {i}: {e}")
                ok[k] = False
                continue
            if toks.ndim != 1 or toks.dtype.kind not in "iu":
                self.errors.append(f"{self.path}: sample {key} has no 1-D integer 'tokens' member")
                ok[k] = False
                continue
            arrays.append(toks)
        length = np.zeros(len(index), np.int64)
        length[ok] = [len(a) for a in arrays]
        offset = np.zeros(len(index), np.int64)
        offset[ok] = np.cumsum(length[ok]) - length[ok]
        pool = np.concatenate(arrays) if arrays else np.zeros(0, self._decoder.dtype)
        return [pool], np.zeros(len(index), np.int64), offset, length, ok

    def close(self) -> None:
        """Let go of the shard's bytes (a memory map, and its descriptor, goes when garbage-collected)."""
        self._data = None
