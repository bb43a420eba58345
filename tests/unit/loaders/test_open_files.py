"""File descriptors of the loader: a shuffle block over many tiny shards keeps them all open, and
that must not cost a descriptor (nor a cache pin's lock file) per shard; shards above
``shards.access.local_file.RESIDENT_BYTES`` stay memory-mapped (zero copy)."""
from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from cache import CacheConfig, ShardCache
from shards.access.token_blocks import BlockShard
from loaders.config import DataConfig
from loaders.rank.loader import build_text_loader
from shards.access.documents import IndexedShard
from shards.access.local_file import RESIDENT_BYTES
from shards import Manifest, ShardSequenceWriter, TokenBlockWriter, encode_text_sample

N_SHARDS = 150  # one document each, all in one shuffle block


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _tiny_shards(d: str, layout: str) -> dict[str, np.ndarray]:
    """``N_SHARDS`` shards of one 20-token document each; returns ``{key: tokens}``."""
    rng = np.random.default_rng(1)
    docs = {f"doc{i:04d}": rng.integers(0, 60000, 20).astype(np.uint16) for i in range(N_SHARDS)}
    if layout == "token_blocks":
        w = TokenBlockWriter(d, max_samples=1, block_tokens=20)
        for key, toks in docs.items():
            w.add(key, "test", toks)
    else:
        w = ShardSequenceWriter(d, max_samples=1)
        for key, toks in docs.items():
            w.write(key, encode_text_sample(toks, {"id": key}), tokens=len(toks))
    m = Manifest(shards=w.close(), vocab_size=60000, layout=layout)
    assert len(m.shards) == N_SHARDS
    m.save(d)
    return docs


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
@pytest.mark.parametrize("layout", ["token_blocks", "documents"])
@pytest.mark.parametrize("through_cache", [False, True])
def test_a_shuffle_block_over_many_tiny_shards_holds_few_file_descriptors(tmp_path, layout, through_cache):
    d = str(tmp_path / "shards")
    docs = _tiny_shards(d, layout)
    cache = ShardCache(CacheConfig(dir=str(tmp_path / "cache"))) if through_cache else None
    cfg = DataConfig(manifest=d, seq_len=16, micro_batch_size=2, num_workers=0, shuffle_block=4096,
                     index_dir=str(tmp_path / "index"))
    try:
        loader = build_text_loader(cfg, cache, in_process=True)
        before, most = _open_fds(), 0
        for _ in loader:
            most = max(most, _open_fds() - before)
        assert loader.metrics()["doc_tokens"] == sum(len(t) for t in docs.values())  # none skipped as bad
        assert most < 16, f"{most} more descriptors open while reading {N_SHARDS} one-document shards"
    finally:
        if cache is not None:
            cache.close()


def _block_shard(d: str, n_tokens: int) -> BlockShard:
    w = TokenBlockWriter(d, block_tokens=n_tokens)
    w.add("big", "test", np.arange(n_tokens, dtype=np.uint32).astype(np.uint16))
    info = Manifest(shards=w.close(), layout="token_blocks").shards[0]
    return BlockShard(os.path.join(d, info.name), info.samples, None, None, None, "uint16", info.documents)


def test_a_shard_above_the_limit_stays_memory_mapped_and_a_small_one_is_read(tmp_path):
    big = _block_shard(str(tmp_path / "big"), RESIDENT_BYTES // 2 + 1000)  # uint16: just over the limit
    small = _block_shard(str(tmp_path / "small"), 1000)
    assert not big.resident and small.resident
    key, toks = big.tokens(0)
    assert key == "big" and len(toks) == RESIDENT_BYTES // 2 + 1000
    assert np.array_equal(toks[:5], [0, 1, 2, 3, 4]) and not toks.flags.writeable
    base = toks
    while isinstance(base, np.ndarray):  # a view of the shard's memory map: no copy
        base = base.base
    assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)
    assert np.array_equal(small.tokens(0)[1], np.arange(1000))
    big.close()
    small.close()


def test_an_indexed_shard_reads_the_same_from_memory(tmp_path):
    d = str(tmp_path / "s")
    w = ShardSequenceWriter(d, max_samples=4)
    toks = [np.arange(i, i + 7, dtype=np.uint16) for i in range(3)]
    for i, t in enumerate(toks):
        w.write(f"k{i}", encode_text_sample(t, {"id": f"k{i}"}), tokens=len(t))
    info = w.close()[0]
    fds = _open_fds()
    shard = IndexedShard(os.path.join(d, info.name), info.samples)
    assert shard.resident and _open_fds() == fds
    assert [shard.tokens(i)[0] for i in range(3)] == ["k0", "k1", "k2"]
    assert all(np.array_equal(shard.tokens(i)[1], t) for i, t in enumerate(toks))
    assert shard.read(1)["json"] == {"id": "k1"}
    shard.close()
