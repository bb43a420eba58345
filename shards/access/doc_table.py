"""Per-shard document tables of token-block shards, read once per node and kept as arrays.

A consumer needs, for every document of a shard it reads, the block holding it, its offset in
the block and its length. They come from every block's ``json.zst`` metadata, which also holds
the document ids; parsing that JSON costs about 15 ms per 60,000 documents, paid by every
consumer process of every epoch. So, like the member offsets (:mod:`shards.access.member_index`), the
table is made once and kept, in this order of preference:

1. this process's memory (an LRU over recently opened shards);
2. the node's index store ``INDEX_DIR/SHA256-SIZE.docs.npy`` (keyed by the manifest's sha256 and
   byte size, so a changed shard never meets a stale table): one ``int64`` ``.npy`` (no pickle,
   no zip), memory-mapped, or read into memory when at most
   :data:`shards.access.local_file.RESIDENT_BYTES` (so the tables this process keeps, up to
   :data:`MEMORY_TABLES`, of many tiny shards hold no file descriptor each); it holds the
   counts ``[documents, blocks, id bytes]`` then ``block``,
   ``start``, ``length``, ``block_tokens``, ``id_offsets`` and the ids as one UTF-8 buffer
   (padded to 8 bytes), decoded only when a sample key is asked for;
3. the blocks' metadata, parsed (then written to the store, atomic rename).
"""
from __future__ import annotations

import logging
import os

import numpy as np

from shards.access.local_file import RESIDENT_BYTES
from shards.access.member_index import TableCache, store_file, store_path, table_key
from shards.format.blocks import META_SUFFIX, decode_meta
from shards.format.keys import escape_keys
from shards.io.reader import ShardError

log = logging.getLogger(__name__)

MEMORY_TABLES = 128  # shards whose document tables one process keeps


class DocTable:
    """Documents of one token-block shard, in file order.

    Attributes:
        block: ``int64`` ``[documents]``: the block holding each document.
        start: ``int64`` ``[documents]``: its first token's offset inside the block (tokens).
        length: ``int64`` ``[documents]``: its token count.
        block_tokens: ``int64`` ``[blocks]``: tokens per block (from the metadata).
        id_bytes: ``uint8`` ``[bytes]``: every document id, UTF-8, concatenated.
        id_offsets: ``int64`` ``[documents + 1]``: where each id starts in ``id_bytes``.
    """

    def __init__(self, block: np.ndarray, start: np.ndarray, length: np.ndarray, block_tokens: np.ndarray,
                 id_bytes: np.ndarray, id_offsets: np.ndarray):
        self.block, self.start, self.length, self.block_tokens = block, start, length, block_tokens
        self.id_bytes, self.id_offsets = id_bytes, id_offsets
        self._ids: list[str] | None = None
        self._keys: list[str] | None = None

    @classmethod
    def from_ids(cls, block, start, length, block_tokens, ids: list[str]) -> "DocTable":
        """A table from arrays and the document ids as strings."""
        encoded = [i.encode("utf-8") for i in ids]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(block, start, length, block_tokens, np.frombuffer(b"".join(encoded), np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.length)

    @property
    def ids(self) -> list[str]:
        """Every document's id, in file order (decoded on first use)."""
        if self._ids is None:
            data, off = self.id_bytes.tobytes(), self.id_offsets.tolist()
            self._ids = [data[a:b].decode("utf-8") for a, b in zip(off[:-1], off[1:])]
        return self._ids

    def id_bytes_of(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The raw ids of documents ``index`` (``int64``) as ``(data, offsets)``: their UTF-8 bytes
        concatenated (``uint8``) and where each starts (``int64 [len(index) + 1]``); nothing decoded."""
        starts = self.id_offsets[index]
        return gather_segments(self.id_bytes, starts, self.id_offsets[index + 1] - starts)

    def key_list(self) -> list[str]:
        """Every document's sample key, in file order; computed on the first call
        (:func:`shards.format.keys.escape_keys`): most runs never ask (keys are read for anomalies and logs).

        Raises:
            ShardError: an id cannot be a key (empty).
        """
        if self._keys is None:
            try:
                self._keys = escape_keys(self.ids) if len(self) else []
            except ValueError as e:
                raise ShardError(f"a document id cannot be a sample key: {e}", "undecodable") from e
        return self._keys

    def key(self, index: int) -> str:
        """Sample key of document ``index`` (see :meth:`key_list`)."""
        return self.key_list()[index]


def gather_segments(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments ``data[starts[i] : starts[i] + lengths[i]]`` one after another, in one gather.

    Returns:
        ``(out, offsets)``: the segments concatenated (``data``'s dtype) and ``int64 [len(starts) + 1]``
        where each starts in ``out``.
    """
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    return data[index], offsets


_memory = TableCache(MEMORY_TABLES)


def _parse(path: str, fd: int, meta_rows: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> DocTable:
    """The table from the blocks' ``json.zst`` members (rows ``meta_rows`` of the member table)."""
    blocks, starts, lengths, ids, totals = [], [], [], [], []
    for b, row in enumerate(meta_rows.tolist()):
        if row < 0:
            raise ShardError(f"{path}: block {b} has no {META_SUFFIX} member", "missing_field")
        data = os.pread(fd, int(sizes[row]), int(offsets[row]))
        try:
            meta = decode_meta(data, f"{path}: block {b}")
        except ValueError as e:
            raise ShardError(str(e), "undecodable") from e
        blocks.append(np.full(len(meta.ids), b, np.int64))
        starts.append(meta.offsets[:-1])
        lengths.append(meta.lengths)
        ids.extend(meta.ids)
        totals.append(meta.tokens)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return DocTable.from_ids(cat(blocks), cat(starts), cat(lengths), np.asarray(totals, np.int64), ids)


def _store(table: DocTable, path: str) -> None:
    """Write ``table`` to the store as one ``int64`` ``.npy`` (see the module docstring; atomic rename);
    a failure is logged and only costs parsing the metadata again later."""
    ids = table.id_bytes.tobytes()
    ids += b"\0" * (-len(ids) % 8)
    flat = np.concatenate([[len(table), len(table.block_tokens), len(table.id_bytes)], table.block, table.start,
                           table.length, table.block_tokens, table.id_offsets]).astype(np.int64)
    store_file(path, lambda f: np.save(f, np.concatenate([flat, np.frombuffer(ids, np.int64)])), "document table")


CHECK_DOCUMENTS = 1 << 16  # documents checked at a time by _inside_blocks: its temporaries stay in the CPU cache


def _inside_blocks(block: np.ndarray, start: np.ndarray, length: np.ndarray, block_tokens: np.ndarray) -> bool:
    """Whether every document (``int64`` ``block``, ``start``, ``length``, ``[documents]``) lies inside
    its block (``block_tokens``: ``int64`` ``[blocks]``). Checked a slice at a time with no mask
    array: every process opening the table pays it (whole-array masks took 3x as long: 30 against 10 ms
    for 1.75 M documents)."""
    for lo in range(0, len(block), CHECK_DOCUMENTS):
        b, s, n = (x[lo:lo + CHECK_DOCUMENTS] for x in (block, start, length))
        # block as uint64: a negative one is huge, so one max covers both bounds
        if int(b.view(np.uint64).max()) >= len(block_tokens) or min(int(s.min()), int(n.min())) < 0 \
                or (s + n > block_tokens[b]).any():
            return False
    return True


def _load(path: str, blocks: int) -> DocTable | None:
    """The stored table (views of its memory map, or of its content read into memory when the file
    has at most ``RESIDENT_BYTES`` bytes), or ``None`` when it is unreadable or does not fit the shard
    (then rebuilt): sizes that do not add up, or a document outside its block."""
    try:
        small = os.path.getsize(path) <= RESIDENT_BYTES  # a memory map would keep a descriptor per table
        # a plain ndarray over the mapping: np.memmap's Python-level __getitem__ costs ~20 us per index
        # operation, paid several times per group of documents the loader reads
        a = np.load(path, mmap_mode=None if small else "r", allow_pickle=False).view(np.ndarray)
        if a.dtype != np.int64 or a.ndim != 1 or len(a) < 3:
            raise ValueError(f"not a table ({a.dtype}, shape {a.shape})")
        n, nb, n_bytes = (int(x) for x in a[:3])
        at = np.cumsum([3, n, n, n, nb, n + 1])
        if min(n, nb, n_bytes) < 0 or nb != blocks or len(a) != at[-1] + -(-n_bytes // 8):
            raise ValueError(f"sizes do not add up (documents {n}, blocks {nb}, id bytes {n_bytes})")
        block, start, length, block_tokens, id_offsets = (a[lo:hi] for lo, hi in zip(at[:-1], at[1:]))
        if not _inside_blocks(block, start, length, block_tokens) or (id_offsets[1:] < id_offsets[:-1]).any() \
                or (n and (id_offsets[0] != 0 or id_offsets[-1] != n_bytes)):
            raise ValueError("a document lies outside its block, or the ids overlap")
    except Exception as e:  # noqa: BLE001 - whatever is wrong with a store file (empty, foreign, corrupt), it is rebuilt
        log.warning("document table %s unreadable (%s: %s); rebuilding it from the block metadata", path,
                    type(e).__name__, e)
        return None
    return DocTable(block, start, length, block_tokens, a[at[-1]:].view(np.uint8)[:n_bytes], id_offsets)


def doc_table(path: str, fd: int, meta_rows: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
              sha256: str | None, size: int | None, index_dir: str | None) -> DocTable:
    """The document table of the local shard ``path`` (see the module docstring for where it comes from).

    Args:
        path: the shard file; ``fd``: it, open for reading.
        meta_rows: ``int64`` ``[blocks]``: each block's ``json.zst`` row in the member table (``-1``: none).
        offsets, sizes: ``int64`` member data offsets and sizes (bytes) of the member table.
        sha256, size: the manifest's digest and byte size (the store key; ``None``: not stored).
        index_dir: the node's index store (``None``: not stored).
    Raises:
        ShardError: a block without metadata, or metadata that does not decode.
    """
    key = table_key(path, sha256, size)
    table = _memory.get_recent(key)
    if table is not None:
        return table
    store = store_path(index_dir, sha256, size, "docs.npy")
    if store and os.path.exists(store):
        table = _load(store, len(meta_rows))
    if table is None:
        table = _parse(path, fd, meta_rows, offsets, sizes)
        if store:
            _store(table, store)
    _memory.keep(key, table)
    return table
