"""Reading documents out of token-block shards (``layout: token_blocks``, see ``shards.format.blocks``).

A shard is opened once per consumer: its blocks' member offsets come from the node's member
index (:func:`shards.access.member_index.member_table`) and its documents' blocks, offsets and
lengths from the node's document tables (:func:`shards.access.doc_table.doc_table`). A document is
then a slice:

* raw blocks (``tokens.npy``): the whole shard file is memory-mapped (or, when small, read into
  memory: :mod:`shards.access.local_file`) and viewed as one token array (block data is 64-byte aligned
  inside the tar), so a document's tokens are a zero-copy view
  ``tokens[base + start : base + start + length]`` — no read call, no copy, no decode;
* zstd blocks (``tokens.npy.zst``): the block is decompressed once into memory (one frame) and
  documents are slices of it; the most recently used blocks are kept (up to 64 MiB per shard).
  When a block is first needed, the next one is read and decompressed ahead in a background
  thread (zstd releases the GIL), as documents are read in roughly increasing block order.

The shard's file object is closed once it is open (:func:`shards.access.local_file.read_or_map`): an
open shard holds no descriptor of its own when small, else only its memory map's.
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading

import numpy as np

from shards.access.doc_table import doc_table
from shards.access.local_file import is_resident, read_or_map
from shards.access.member_index import member_table
from shards.format.blocks import npy_data_offset
from shards.format.tokens import TokenDecoder
from shards.io.reader import ShardError

# Decompressed zstd blocks kept per open shard: a shuffle block's documents span several token
# blocks and are visited in random order, so the whole span must stay decompressed.
ZSTD_KEEP_BYTES = 64 << 20


_ahead_pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None  # (pid, pool): none survives a fork
_ahead_lock = threading.Lock()


def _read_ahead_pool() -> concurrent.futures.ThreadPoolExecutor:
    """This process's one read-ahead thread (made anew after a fork: threads do not survive one)."""
    global _ahead_pool
    with _ahead_lock:
        if _ahead_pool is None or _ahead_pool[0] != os.getpid():
            _ahead_pool = (os.getpid(), concurrent.futures.ThreadPoolExecutor(1, "colaflow-block-read-ahead"))
        return _ahead_pool[1]


class BlockShard:
    """One open token-block shard: documents by index (file order), as read-only token arrays.

    Args:
        path: the local shard file.
        expected_blocks, expected_documents: the manifest's ``samples`` and ``documents``.
        sha256, size: the manifest's digest and byte size (index store key).
        index_dir: the node's member-index store.
        token_dtype: the manifest's token dtype.
    Raises:
        ShardError: unreadable tar or block metadata, block or document counts that differ from
            the manifest, or raw token data that does not match a block's metadata.
        OSError: the file cannot be opened, read or mapped.
    """

    def __init__(self, path: str, expected_blocks: int | None = None, sha256: str | None = None,
                 size: int | None = None, index_dir: str | None = None, token_dtype: str = "uint16",
                 expected_documents: int | None = None):
        self.path = path
        self.dtype = np.dtype(token_dtype).newbyteorder("<")
        with open(path, "rb") as f:  # only while opening: see the module docstring
            self._open(f, sha256, size, index_dir, expected_blocks, expected_documents)

    @property
    def resident(self) -> bool:
        """Whether the shard is read whole into memory (needs neither its file nor a cache pin any more)."""
        return is_resident(self._data)

    def _open(self, f, sha256, size, index_dir, expected_blocks, expected_documents) -> None:
        t = member_table(self.path, f, sha256, size, index_dir, expected_blocks)
        self.docs = doc_table(self.path, f.fileno(), t.field_rows("json"), t.offset, t.size, sha256, size,
                              index_dir)
        if expected_documents and len(self.docs) != expected_documents:
            raise ShardError(f"{self.path}: {len(self.docs)} documents but the manifest says {expected_documents};"
                             " the shard or the manifest is stale — rebuild the manifest", "count_mismatch")
        rows = t.field_rows("tokens")
        if (rows < 0).any():
            raise ShardError(f"{self.path}: block {int(np.argmax(rows < 0))} has no tokens member", "missing_field")
        self._suffix = [str(t.suffixes[t.code[r]]) for r in rows.tolist()]
        self._offset, self._size = t.offset[rows], t.size[rows]
        self._raw = not any(s.endswith(".zst") for s in self._suffix)
        self._blocks: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._kept = 0
        self._decoder = TokenDecoder(self.dtype.name)
        self._ahead_decoder = TokenDecoder(self.dtype.name)  # used by the read-ahead thread only
        self._ahead: dict[int, concurrent.futures.Future] = {}  # block -> its read-ahead
        self._ahead_pid = os.getpid()
        self._data = read_or_map(f)
        if self._raw and len(rows):
            mm = self._data
            item = self.dtype.itemsize
            heads = [npy_data_offset(mm[o:o + 16]) for o in self._offset.tolist()]
            data_off = self._offset + np.asarray(heads, np.int64)
            if (data_off % item).any() or ((self._offset + self._size - data_off) // item != self.docs.block_tokens).any():
                raise ShardError(f"{self.path}: raw token data does not match the blocks' metadata (dtype "
                                 f"{self.dtype.name}); rewrite the shard", "undecodable")
            self._all = np.frombuffer(mm, self.dtype, len(mm) // item)  # the mapping lives as long as a view does
            self._at_arr = (data_off // item)[self.docs.block] + self.docs.start  # per document, in _all
        else:
            self._at_arr = self.docs.start
        self.errors: list[str] = []  # undecodable blocks met by gather(), for the caller to log

    def __len__(self) -> int:
        return len(self.docs)

    def key(self, index: int) -> str:
        """Sample key of document ``index`` (:func:`shards.escape_key` of its id)."""
        return self.docs.key(index)

    def key_list(self) -> list[str]:
        """Every document's sample key, in file order (computed on first use)."""
        return self.docs.key_list()

    has_ids = True  # the block metadata holds every document's raw id

    @property
    def ids(self) -> list[str]:
        """Every document's raw id, in file order (a key is :func:`shards.escape_key` of it; decoded on first use)."""
        return self.docs.ids

    def id_bytes_of(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw ids of documents ``index`` as UTF-8 bytes, undecoded (:meth:`.doc_table.DocTable.id_bytes_of`)."""
        return self.docs.id_bytes_of(index)

    def _decode(self, b: int, decoder: TokenDecoder) -> np.ndarray:
        """Block ``b``'s tokens, read and decompressed (``decoder``: one per thread, zstd contexts are
        not shared). Raises ShardError naming the shard and block."""
        at, zst = int(self._offset[b]), self._suffix[b].endswith(".zst")
        # a zstd frame is decompressed straight from the mapping, so its page faults happen in
        # zstd's C code without the GIL (this runs in the read-ahead thread); .npy bytes are copied
        data = (memoryview(self._data) if zst else self._data)[at:at + int(self._size[b])]
        if len(data) != int(self._size[b]):
            raise ShardError(f"{self.path}: block {b} truncated ({len(data)} of {int(self._size[b])} bytes)",
                             "truncated")
        try:
            got = decoder.tokens(self._suffix[b], data)
        except Exception as e:  # noqa: BLE001 - any decoder failure is reported with its location
            raise ShardError(f"{self.path}: cannot decode block {b} ({self._suffix[b]}): {type(e).__name__}: {e}",
                             "undecodable") from e
        if len(got) != self.docs.block_tokens[b]:
            raise ShardError(f"{self.path}: block {b} holds {len(got)} tokens, its metadata says "
                             f"{int(self.docs.block_tokens[b])}; rewrite the shard", "undecodable")
        return got

    def _block(self, b: int) -> np.ndarray:
        got = self._blocks.get(b)
        if got is not None:
            self._blocks.move_to_end(b)
            return got
        if self._ahead_pid != os.getpid():  # futures of a parent process never finish here
            self._ahead, self._ahead_pid = {}, os.getpid()
        ahead = self._ahead.pop(b, None)
        got = ahead.result() if ahead is not None else self._decode(b, self._decoder)
        nxt = b + 1
        self._settle_ahead(nxt)
        if nxt < len(self._suffix) and nxt not in self._blocks and nxt not in self._ahead:
            self._ahead[nxt] = _read_ahead_pool().submit(self._decode, nxt, self._ahead_decoder)
        self._blocks[b] = got
        self._kept += got.nbytes
        while self._kept > ZSTD_KEEP_BYTES and len(self._blocks) > 1:
            self._kept -= self._blocks.popitem(last=False)[1].nbytes
        return got

    def _settle_ahead(self, wanted: int) -> None:
        """Read-aheads of blocks not asked for (other than ``wanted``, the next one) are cancelled when
        not started, and join the kept blocks when finished, first in line to be dropped: left as
        futures they would pile up, decompressed, beyond ``ZSTD_KEEP_BYTES`` (documents read from
        blocks 0, 2, 4, ... read 1, 3, 5, ... ahead). A failed one is dropped: its block fails again,
        naming it, if it is ever read."""
        for k in [k for k, f in self._ahead.items() if k != wanted and (f.done() or f.cancel())]:
            f = self._ahead.pop(k)
            if f.cancelled():
                continue
            if f.exception() is None and k not in self._blocks:
                self._blocks[k] = f.result()
                self._blocks.move_to_end(k, last=False)
                self._kept += self._blocks[k].nbytes

    def tokens(self, index: int) -> tuple[str, np.ndarray]:
        """``(key, tokens)`` of document ``index``: a read-only 1-D view (the manifest's dtype).

        Raises:
            ShardError: its block cannot be read or decoded (names shard and block).
        """
        a, n = int(self._at_arr[index]), int(self.docs.length[index])
        src = self._all if self._raw else self._block(int(self.docs.block[index]))
        return self.key(index), src[a:a + n]

    def locate(self, index: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Where documents ``index`` (``int64`` array) are, without copying a token.

        Returns ``(pools, pool, offset, length, ok)``: token arrays (the manifest's dtype: the shard's
        memory map for raw blocks, one decompressed array per zstd block) and per document the
        ``int64`` index of its pool, its first token there and its token count, plus a ``bool`` mask
        of the readable ones (documents of a zstd block that fails to decode are not; the error is
        in :attr:`errors` for the caller to log as bad).
        """
        n = self.docs.length[index]
        if self._raw:
            return [self._all], np.zeros(len(index), np.int64), self._at_arr[index], n, np.ones(len(index), bool)
        blocks = self.docs.block[index]
        wanted = np.unique(blocks)
        pools, slot = [], np.full(len(wanted), -1, np.int64)
        for i, b in enumerate(wanted.tolist()):
            try:
                pools.append(self._block(b))
            except ShardError as e:
                self.errors.append(str(e))
                continue
            slot[i] = len(pools) - 1
        pool = slot[np.searchsorted(wanted, blocks)]
        ok = pool >= 0
        return pools, np.maximum(pool, 0), self.docs.start[index], np.where(ok, n, 0), ok

    def read(self, index: int, fields: tuple[str, ...] | None = None) -> dict:
        """Document ``index`` as a sample: ``{"__key__", "json": {"id", "block"}, "tokens"}``."""
        key, toks = self.tokens(index)
        return {"__key__": key, "json": {"id": self.docs.ids[index], "block": int(self.docs.block[index])},
                "tokens": toks}

    def close(self) -> None:
        """Let go of the shard's bytes (after any read-ahead of them); a memory map (and its
        descriptor) stays valid until the last token view of it is gone."""
        if self._ahead_pid == os.getpid():
            concurrent.futures.wait(list(self._ahead.values()))
        self._ahead = {}
        self._data = self._all = None
