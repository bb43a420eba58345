"""The loader's read path: the node-local member index (built once, reused, stale ones rebuilt),
fast token decoding (same arrays as ``np.load``), and batches pickled compactly between processes."""
from __future__ import annotations

import os
import pickle
import tarfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.rank.batch import TokenBatch
from shards.access.member_index import list_members, member_table
from tests.support.object_packer import make_batch, split_document
from shards.access.documents import IndexedShard
from shards.format.tokens import TokenDecoder
from shards import Manifest, ShardSequenceWriter, encode_text_sample
from shards.io.index import build_shard_index, dali_index_path, write_dali_index
from shards.format.sample import encode_npy, zstd_compress


def _shard(directory, n=20, seed=0):
    rng = np.random.default_rng(seed)
    w = ShardSequenceWriter(str(directory), max_samples=1000)
    docs = {}
    for i in range(n):
        toks = rng.integers(0, 60000, int(rng.integers(0, 300))).astype(np.uint16)
        docs[f"d{i:03d}"] = toks
        w.write(f"d{i:03d}", encode_text_sample(toks, {"i": i}), tokens=len(toks))
    infos = w.close()
    Manifest(shards=infos, vocab_size=60000).save(str(directory))
    return os.path.join(str(directory), infos[0].name), infos[0], docs


def test_index_is_stored_once_and_reused(tmp_path):
    path, info, docs = _shard(tmp_path / "s")
    store = tmp_path / "index"
    shard = IndexedShard(path, info.samples, info.sha256, info.bytes, str(store))
    assert [shard.tokens(i)[1].tolist() for i in range(len(docs))] == [t.tolist() for t in docs.values()]
    shard.close()
    stored = store / f"{info.sha256}-{info.bytes}.npz"
    assert stored.exists()
    want = list_members(path)
    loaded = _load_stored(str(stored))
    assert [loaded.entry(i) for i in range(len(loaded))] == list(want)
    with open(path, "rb") as f:
        table = member_table(path, f, info.sha256, info.bytes, str(store), info.samples)
    assert [table.entry(i) for i in range(len(table))] == list(want)
    # the stored listing matches what the shards package's own indexer finds
    assert [(e.key, e.members) for e in build_shard_index(path).samples] == [(e.key, e.members) for e in want]


def _load_stored(path):
    from shards.access.member_index import _load
    return _load(path)


def test_stale_index_is_detected_and_rebuilt(tmp_path):
    path, info, docs = _shard(tmp_path / "s", seed=1)
    other, _, _ = _shard(tmp_path / "other", n=20, seed=2)
    write_dali_index(build_shard_index(other), dali_index_path(path))  # a foreign index beside the shard
    os.utime(dali_index_path(path), ns=(os.stat(path).st_mtime_ns + 10**9,) * 2)
    shard = IndexedShard(path, info.samples, info.sha256, info.bytes, str(tmp_path / "index"))
    assert [shard.tokens(i)[1].tolist() for i in range(len(docs))] == [t.tolist() for t in docs.values()]
    shard.close()


def test_sample_count_mismatch_is_an_error(tmp_path):
    from shards import ShardError
    path, info, _ = _shard(tmp_path / "s", n=5)
    with pytest.raises(ShardError, match="manifest says 6"):
        IndexedShard(path, 6, "f" * 64, info.bytes, str(tmp_path / "index"))


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["uint16", "uint32", "int64", ">u2"]), n=st.integers(0, 3000),
       manifest_dtype=st.sampled_from(["uint16", "uint32"]), zst=st.booleans())
def test_fast_decode_equals_np_load(dtype, n, manifest_dtype, zst):
    arr = (np.arange(n) * 7919 % 60000).astype(dtype)
    data = encode_npy(arr)
    got = TokenDecoder(manifest_dtype).tokens("tokens.npy.zst" if zst else "tokens.npy",
                                              zstd_compress(data) if zst else data)
    assert got.dtype == arr.dtype and got.tolist() == arr.tolist()


def test_decoder_rejects_garbage_and_reads_frames_without_content_size():
    import zstandard
    dec = TokenDecoder("uint16")
    with pytest.raises(zstandard.ZstdError):
        dec.tokens("tokens.npy.zst", b"not zstd at all")
    with pytest.raises(ValueError):
        dec.npy(b"\x93NUMPY garbage")
    raw = encode_npy(np.arange(100, dtype=np.uint16))
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert dec.tokens("tokens.npy.zst", frame).tolist() == list(range(100))


def test_batch_pickles_as_arrays_and_round_trips():
    b = make_batch([[c] for c in split_document(3, "k", np.arange(1, 40), 16)], 16, 4, [(9, -1, 0)])
    again = pickle.loads(pickle.dumps(b))
    assert isinstance(again, TokenBatch) and again.keys == b.keys and again.consumed.tolist() == b.consumed.tolist()
    for name in ("input_ids", "labels", "position_ids", "document_ids"):
        x, y = getattr(b, name), getattr(again, name)
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert again.num_doc_tokens == 39 and again.num_real_tokens == 36


def test_tar_offsets_come_from_tarfile(tmp_path):
    path, _, _ = _shard(tmp_path / "s", n=3)
    with tarfile.open(path) as tar:
        want = [(ti.name, ti.offset_data, ti.size) for ti in tar if ti.isfile()]
    got = [(f"{e.key}.{s}", o, n) for e in list_members(path) for s, o, n in e.members]
    assert got == want
