"""The per-shard document tables of token-block shards (``shards.access.doc_table``): parsed once, kept in
the node's index store, and the same from the store as from the block metadata."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from shards.access import doc_table as dt
from shards.access.token_blocks import BlockShard
from shards import Manifest, TokenBlockWriter
from shards.format.keys import escape_key


def _write(d, compression="none"):
    rng = np.random.default_rng(3)
    docs = [(f"src/dóc {i}/ü", "src", rng.integers(0, 4000, int(rng.integers(1, 60))).astype(np.uint16))
            for i in range(40)]
    w = TokenBlockWriter(str(d), max_samples=3, block_tokens=200, compression=compression)
    for doc_id, source, toks in docs:
        w.add(doc_id, source, toks)
    m = Manifest(shards=w.close(), layout="token_blocks", token_dtype="uint16")
    m.save(str(d))
    return m, docs


def _open(d, info, index_dir):
    return BlockShard(str(d / info.name), info.samples, info.sha256, info.bytes, str(index_dir), "uint16",
                      info.documents)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_table_is_stored_once_and_equal_from_the_store(tmp_path, compression):
    m, docs = _write(tmp_path / "shards", compression)
    info = m.shards[0]
    index = tmp_path / "index"
    dt._memory.clear()
    parsed = _open(tmp_path / "shards", info, index)
    stored = index / f"{info.sha256}-{info.bytes}.docs.npy"
    assert stored.exists()
    dt._memory.clear()  # the next open reads the store, not the metadata
    calls = []
    real_parse = dt._parse
    dt._parse = lambda *a: calls.append(a) or real_parse(*a)
    try:
        loaded = _open(tmp_path / "shards", info, index)
    finally:
        dt._parse = real_parse
    assert calls == []
    for name in ("block", "start", "length", "block_tokens", "id_offsets", "id_bytes"):
        np.testing.assert_array_equal(getattr(loaded.docs, name), getattr(parsed.docs, name))
    n = len(parsed)
    assert loaded.docs.ids == [d[0] for d in docs[:n]]
    assert loaded.docs.key_list() == [escape_key(d[0]) for d in docs[:n]]
    for i in range(n):
        np.testing.assert_array_equal(loaded.tokens(i)[1], docs[i][2])


def _corrupt(stored, how):
    good = np.load(stored)
    if how == "foreign":
        np.save(stored, np.arange(7, dtype=np.int64))
    elif how == "empty":  # a crash between create and write
        stored.write_bytes(b"")
    elif how == "2-d":
        np.save(stored, np.zeros((4, 4), np.int64))
    else:  # right sizes, a document's start moved before its block: would read other tokens
        n = int(good[0])
        good[3 + n] = -5
        np.save(stored, good)


@pytest.mark.parametrize("how", ["foreign", "empty", "2-d", "outside its block"])
def test_a_table_that_does_not_fit_is_rebuilt(tmp_path, caplog, how):
    m, docs = _write(tmp_path / "shards")
    info = m.shards[0]
    index = tmp_path / "index"
    dt._memory.clear()
    _open(tmp_path / "shards", info, index)
    stored = index / f"{info.sha256}-{info.bytes}.docs.npy"
    _corrupt(stored, how)
    dt._memory.clear()
    with caplog.at_level(logging.WARNING, logger="shards.access.doc_table"):
        shard = _open(tmp_path / "shards", info, index)
    assert "rebuilding it from the block metadata" in caplog.text
    assert shard.docs.ids == [d[0] for d in docs[:len(shard)]]
    for i in range(len(shard)):
        np.testing.assert_array_equal(shard.tokens(i)[1], docs[i][2])
    assert dt._load(str(stored), len(shard.docs.block_tokens)) is not None  # written anew
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # a store that cannot be written only costs parsing again
    dt._memory.clear()
    with caplog.at_level(logging.WARNING, logger="shards.access.member_index"):  # the store's writer
        again = _open(tmp_path / "shards", info, blocked)
    assert "cannot store the document table" in caplog.text
    assert again.docs.ids == shard.docs.ids


def test_an_unwritable_store_is_reported_once_not_per_shard(tmp_path, caplog):
    """Each shard has two store files (member and document tables); a store that cannot be written
    used to log two warnings per shard and process."""
    from shards.access import member_index as mi
    m, _ = _write(tmp_path / "shards")
    assert len(m.shards) > 1
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    dt._memory.clear()
    mi._memory.clear()
    mi._unwritable.clear()
    with caplog.at_level(logging.DEBUG, logger="shards.access.member_index"):
        for info in m.shards:
            _open(tmp_path / "shards", info, blocked / "store")
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot store" in r.getMessage()]
    assert len(warned) == 1 and "data.index_dir" in warned[0].getMessage()
    assert sum("cannot store" in r.getMessage() for r in caplog.records) == 2 * len(m.shards)


def test_zstd_blocks_are_read_ahead_and_a_bad_one_is_still_named(tmp_path):
    """Reading a zstd block starts the next one in the background; its tokens are the same, and a
    corrupt block met by the read-ahead fails only when a document of it is read (naming it)."""
    from shards import ShardError
    m, docs = _write(tmp_path / "shards", "zstd")
    info = m.shards[0]
    dt._memory.clear()
    shard = _open(tmp_path / "shards", info, tmp_path / "index")
    blocks = shard.docs.block
    assert blocks.max() >= 2
    first = int(np.flatnonzero(blocks == 0)[0])
    np.testing.assert_array_equal(shard.tokens(first)[1], docs[first][2])
    assert list(shard._ahead) == [1]
    for i in range(len(shard)):
        np.testing.assert_array_equal(shard.tokens(i)[1], docs[i][2])
    shard.close()
    assert shard._ahead == {}

    path = tmp_path / "shards" / info.name
    raw = bytearray(path.read_bytes())
    at, size = int(shard._offset[1]), int(shard._size[1])
    raw[at:at + size] = b"\x00" * size  # block 1 is no zstd frame any more
    path.write_bytes(bytes(raw))
    bad = BlockShard(str(path), info.samples, None, None, None, "uint16", info.documents)
    np.testing.assert_array_equal(bad.tokens(first)[1], docs[first][2])  # block 0 read, block 1 read ahead
    with pytest.raises(ShardError, match="cannot decode block 1"):
        bad.tokens(int(np.flatnonzero(blocks == 1)[0]))
    pools, pool, off, length, ok = bad.locate(np.arange(len(bad)))
    assert not ok[blocks == 1].any() and ok[blocks != 1].all() and "cannot decode block 1" in bad.errors[-1]
    bad.close()


def test_read_aheads_not_asked_for_stay_within_the_kept_bytes(tmp_path, monkeypatch):
    """Documents read from blocks 0, 2, 4, ... read 1, 3, 5, ... ahead; those futures used to be kept,
    decompressed, until the shard closed (the whole shard in memory, beyond ZSTD_KEEP_BYTES)."""
    from shards.access import token_blocks as block_access
    rng = np.random.default_rng(5)
    w = TokenBlockWriter(str(tmp_path / "s"), block_tokens=100, compression="zstd")
    docs = [rng.integers(0, 4000, 50).astype(np.uint16) for _ in range(120)]
    for i, toks in enumerate(docs):
        w.add(f"d{i}", "t", toks)
    m = Manifest(shards=w.close(), layout="token_blocks", token_dtype="uint16")
    m.save(str(tmp_path / "s"))
    monkeypatch.setattr(block_access, "ZSTD_KEEP_BYTES", 5 * 200)  # 5 blocks of 100 uint16 tokens
    shard = _open(tmp_path / "s", m.shards[0], tmp_path / "index")
    assert shard.docs.block.max() == 59
    for b in range(0, 60, 2):
        for i in np.flatnonzero(shard.docs.block == b).tolist():
            np.testing.assert_array_equal(shard.tokens(i)[1], docs[i])
        # the next block's read-ahead, and on a busy machine one still running (it cannot be cancelled;
        # the pool's one thread runs one at a time, so no more than one piles up)
        assert len(shard._ahead) <= 2 and len(shard._blocks) <= 6
        assert shard._kept == sum(a.nbytes for a in shard._blocks.values()) <= 6 * 200
    shard.close()


def test_a_flipped_byte_in_a_zstd_block_is_an_error_not_other_tokens(tmp_path):
    """zstd frames were written without a content checksum, so bytes flipped inside a block's
    compressed tokens decoded, silently, to other tokens."""
    from shards import ShardError
    m, docs = _write(tmp_path / "shards", "zstd")
    info = m.shards[0]
    shard = _open(tmp_path / "shards", info, tmp_path / "index")
    at, size = int(shard._offset[0]), int(shard._size[0])
    shard.close()
    path = tmp_path / "shards" / info.name
    raw = bytearray(path.read_bytes())
    raw[at + size // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    bad = BlockShard(str(path), info.samples, None, None, None, "uint16", info.documents)
    first = int(np.flatnonzero(bad.docs.block == 0)[0])
    with pytest.raises(ShardError, match="cannot decode block 0.*checksum"):
        bad.tokens(first)
    bad.close()


@pytest.mark.parametrize("field, at, value", [(None, 0, 0), ("block", 5, -1), ("block", 6, 2), ("start", 4, -3),
                                              ("length", 7, -1), ("length", 6, 8)])
def test_documents_outside_their_block_are_found_in_any_slice(monkeypatch, field, at, value):
    """The check goes a slice of documents at a time (here 3): a negative or too-large block, a negative
    start or length, or an end past the block's tokens is found in whichever slice it lies."""
    monkeypatch.setattr(dt, "CHECK_DOCUMENTS", 3)
    table = {"block": np.array([0, 0, 0, 1, 1, 1, 1, 1], np.int64), "start": np.array([0, 3, 6, 0, 2, 4, 6, 8]),
             "length": np.array([3, 3, 4, 2, 2, 2, 2, 2], np.int64)}
    if field:
        table[field][at] = value
    assert dt._inside_blocks(table["block"], table["start"], table["length"], np.array([10, 10])) is (field is None)
