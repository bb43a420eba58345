"""Token-block shards (formats 2 and 3, layout token_blocks): writing, reading, validation, CLI, and
webdataset / wids / DALI reading them unchanged."""
from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shards import Manifest, TokenBlockWriter, iter_documents, iter_raw, read_sample, verify_shard
from shards.format.blocks import META_SUFFIX, RAW_SUFFIX, ZSTD_SUFFIX, decode_meta, decode_meta_dict, npy_data_offset
from shards.tools.cli import main
from shards.io.index import build_shard_index, dali_index_path
from shards.format.keys import escape_key


def make_docs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(f"src{i % 3}/doc.{i}", f"src{i % 3}", rng.integers(0, 4000, int(rng.integers(1, 90))).astype(np.uint16))
            for i in range(n)]


def write(d, docs, compression="none", block_tokens=256, max_samples=4):
    w = TokenBlockWriter(str(d), max_samples=max_samples, block_tokens=block_tokens, compression=compression)
    for doc_id, source, toks in docs:
        w.add(doc_id, source, toks)
    m = Manifest(shards=w.close(), layout="token_blocks", token_dtype="uint16")
    m.save(str(d))
    return m


@pytest.fixture(scope="module", params=["none", "zstd"])
def blocks(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"blocks-{request.param}")
    docs = make_docs(60)
    m = write(d, docs, request.param)
    assert main(["index", str(d), "--name", "blocks"]) == 0
    return d, docs, m, request.param


def read_docs(d, m):
    return [doc for s in m.shards for doc in iter_documents(str(d / s.name), schema="text")]


def test_blocks_round_trip_and_manifest_counts(blocks):
    d, docs, m, compression = blocks
    got = read_docs(d, m)
    assert [g["json"]["id"] for g in got] == [i for i, _, _ in docs]
    assert [g["__key__"] for g in got] == [escape_key(i) for i, _, _ in docs]
    assert all(np.array_equal(g["tokens"], t) and g["json"]["source"] == s for g, (_, s, t) in zip(got, docs))
    assert m.total_documents == 60 and m.total_tokens == sum(len(t) for _, _, t in docs)
    assert sum(s.blocks for s in m.shards) == m.total_samples > 1
    for s in m.shards:  # every block holds whole documents of at most block_tokens (or one longer doc)
        for key, fields in iter_raw(str(d / s.name)):
            assert set(fields) == {META_SUFFIX, RAW_SUFFIX if compression == "none" else ZSTD_SUFFIX}
            meta = decode_meta(fields[META_SUFFIX])
            assert meta.tokens <= 256 or len(meta.ids) == 1
    loaded = Manifest.load(str(d))
    assert loaded.layout == "token_blocks" and loaded.format_version == 3
    assert loaded.document_counts() == [s.documents for s in m.shards]


def test_raw_block_tokens_memory_map_straight_out_of_the_tar(tmp_path):
    m = write(tmp_path, make_docs(60), "none")  # zstd blocks are decompressed, so raw ones only
    d = tmp_path
    shard = str(d / m.shards[0].name)
    entry = build_shard_index(shard).samples[1]
    (off, size), = [(o, n) for s, o, n in entry.members if s == RAW_SUFFIX]
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        start = off + npy_data_offset(mm[off:off + 16])
        assert start % 64 == 0
        view = np.frombuffer(mm, np.uint16, (off + size - start) // 2, start)
        sample = read_sample(shard, entry)
        assert np.array_equal(view, sample["tokens"])
        del view


def test_verify_stats_inspect_cat_reshard(blocks, tmp_path, capsys):
    d, docs, m, _ = blocks
    assert main(["verify", "-q", str(d)]) == 0
    assert "60 samples" not in capsys.readouterr().out  # blocks are the samples; documents are inside
    assert main(["stats", str(d)]) == 0
    out = capsys.readouterr().out
    assert "documents: 60" in out and "shard bytes per token" in out
    shard = str(d / m.shards[0].name)
    key = escape_key(docs[2][0])
    assert main(["inspect", shard, "--key", key]) == 0
    out = capsys.readouterr().out
    assert f"== {key}" in out and "uint16" in out
    assert main(["reshard", str(d), "--out", str(tmp_path / "r"), "--max-samples", "2", "-q"]) == 0
    r = Manifest.load(str(tmp_path / "r"))
    assert r.layout == "token_blocks" and r.total_documents == 60 and r.total_tokens == m.total_tokens
    assert main(["verify", "-q", str(tmp_path / "r")]) == 0
    assert [g["json"]["id"] for g in read_docs(tmp_path / "r", r)] == [i for i, _, _ in docs]


def test_cat_writes_a_documents_tokens(blocks, capfdbinary):
    d, docs, m, _ = blocks
    shard = str(d / m.shards[0].name)
    assert main(["cat", shard, escape_key(docs[3][0])]) == 0
    assert capfdbinary.readouterr().out == docs[3][2].astype("<u2").tobytes()
    # a block's first document has the block's key: the key still means the document
    assert main(["cat", shard, escape_key(docs[0][0])]) == 0
    assert capfdbinary.readouterr().out == docs[0][2].astype("<u2").tobytes()
    # a member of the block by its full name
    assert main(["cat", shard, f"{escape_key(docs[0][0])}.{META_SUFFIX}", "-d"]) == 0
    assert decode_meta_dict(json.loads(capfdbinary.readouterr().out)).ids[0] == docs[0][0]


def test_cat_of_a_key_not_in_the_shard_is_an_error(blocks, capfdbinary):
    d, docs, m, _ = blocks
    shard = str(d / m.shards[0].name)
    assert main(["cat", shard, "no-such-document"]) == 1
    err = capfdbinary.readouterr().err.decode()
    assert "no sample, document or member 'no-such-document'" in err
    assert main(["inspect", shard, "--key", "no-such-document"]) == 1
    assert "no document with key or id 'no-such-document'" in capfdbinary.readouterr().err.decode()


def test_inspect_finds_a_document_by_its_id_too(blocks, capsys):
    """`--key` with the id printed in a sample's json (`a.jsonl/cont`, a URL) found nothing: only the
    escaped key (`a%2Ejsonl%2Fcont`, or a hash for a long id) matched."""
    d, docs, m, _ = blocks
    shard = str(d / m.shards[0].name)
    doc_id = docs[2][0]
    assert escape_key(doc_id) != doc_id
    assert main(["inspect", shard, "--key", doc_id]) == 0
    out = capsys.readouterr().out
    assert out.count("== ") == 1 and f"== {escape_key(doc_id)}" in out and f'"id": "{doc_id}"' in out


def test_verify_catches_metadata_that_disagrees_with_tokens(tmp_path):
    import zstandard

    docs = make_docs(10)
    m = write(tmp_path, docs, block_tokens=10_000)
    shard = str(tmp_path / m.shards[0].name)
    [(key, fields)] = list(iter_raw(shard))
    meta = json.loads(zstandard.ZstdDecompressor().decompress(fields[META_SUFFIX]))
    meta["lengths"][0] += 1
    bad = zstandard.ZstdCompressor().compress(json.dumps(meta).encode())
    from shards import TarShardWriter
    with TarShardWriter(str(tmp_path / "bad.tar")) as w:
        w.write(key, {**fields, META_SUFFIX: bad}, int(sum(meta["lengths"])), 10)
    rep = verify_shard(str(tmp_path / "bad.tar"), schema="text")
    assert not rep.ok and rep.stats.counts["undecodable"] == 1 and key in rep.messages[0]
    assert verify_shard(shard, m.shards[0], schema="text").documents == 10


def test_manifest_refuses_unknown_version_and_layout(tmp_path):
    m = Manifest(layout="token_blocks")
    d = json.loads(m.to_json())
    for bad in ({**d, "format_version": 4}, {**d, "layout": "pages"}):
        with pytest.raises(ValueError):
            Manifest.from_dict(bad)
    assert Manifest.from_dict({**d, "format_version": 1, "layout": "documents"}).layout == "documents"


def expected(d, m) -> dict[str, dict[str, bytes]]:
    return {k: f for s in m.shards for k, f in iter_raw(str(d / s.name))}


def test_webdataset_reads_blocks(blocks):
    import webdataset as wds

    d, docs, m, _ = blocks
    urls = [str(d / s.name) for s in m.shards]
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
           for s in wds.WebDataset(urls, shardshuffle=False)}
    assert got == expected(d, m)
    if blocks[3] == "none":  # webdataset's own decoders give the block's token array
        arrays = [s["tokens.npy"] for s in wds.WebDataset(urls, shardshuffle=False).decode()]
        assert np.array_equal(np.concatenate(arrays), np.concatenate([t for _, _, t in docs]))


def test_wids_reads_blocks(blocks, tmp_path):
    import wids

    d, docs, m, _ = blocks
    ds = wids.ShardListDataset(str(d / "shardindex.json"), cache_dir=str(tmp_path), transformations=[])
    assert len(ds) == m.total_samples
    got = {}
    for i in range(len(ds)):
        s = ds[i]
        got[s["__key__"]] = {k[1:]: v.getvalue() for k, v in s.items() if k.startswith(".")}
    ds.close()
    assert got == expected(d, m)


def test_dali_reads_blocks(blocks):
    from nvidia.dali import fn, pipeline_def, types

    d, docs, m, compression = blocks
    shards = [str(d / s.name) for s in m.shards]
    exts = [META_SUFFIX, RAW_SUFFIX if compression == "none" else ZSTD_SUFFIX]
    n = m.total_samples

    @pipeline_def(batch_size=n, num_threads=1, device_id=None)
    def pipe():
        return tuple(fn.readers.webdataset(paths=shards, index_paths=[dali_index_path(p) for p in shards], ext=exts,
                                           missing_component_behavior="error", dtypes=[types.UINT8] * 2, name="r"))

    p = pipe()
    p.build()
    assert p.reader_meta("r")["epoch_size"] == n
    outs = p.run()
    got = {}
    for i in range(n):
        key = outs[0][i].source_info().rsplit(":", 1)[1].split(".", 1)[0]
        got[key] = {ext: np.array(outs[j][i]).tobytes() for j, ext in enumerate(exts)}
    assert got == expected(d, m)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aZ09_-./~ %é")), min_size=1, max_size=40))
def test_escape_key_fast_path_equals_percent_encoding(doc_id):
    """The loader's fast path for plain ids gives exactly the RFC 3986 escape."""
    import hashlib
    from urllib.parse import quote

    ref = quote(doc_id, safe="-_").replace(".", "%2E").replace("~", "%7E")
    hashed = "~" + hashlib.sha256(doc_id.encode()).hexdigest()[:40]
    assert escape_key(doc_id) == (ref if len(ref) <= 80 else hashed)


def test_writer_refuses_an_empty_document_id(tmp_path):
    """An empty id could never be a sample key: refused when written, not when a trainer reads keys."""
    w = TokenBlockWriter(str(tmp_path), max_samples=4)
    w.add("a", "s", np.arange(3, dtype=np.uint16))
    with pytest.raises(ValueError, match="empty id"):
        w.add("", "s", np.arange(3, dtype=np.uint16))
