"""Shard format: keys, writer limits and headers, streaming and random-access reading, config typing."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shards import (Manifest, ReadStats, ShardError, ShardSequenceWriter, TarShardWriter, encode_image_sample,
                    encode_text_sample, escape_key, iter_raw, iter_samples, read_sample, unescape_key)
from colaflow.config import ConfigError, apply_overrides, from_dict
from shards.io.index import build_shard_index, dali_index_path, read_dali_index, write_dali_index
from shards.format.keys import MAX_KEY_CHARS, MAX_NAME_BYTES, escape_keys, is_hashed_key, member_name
from shards.format.sample import encode_npy, npy_concat
from shards.io.writer import TMP_SUFFIX, _member_header

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
JPG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 3


def text_fields(i: int, n: int | None = None) -> dict[str, bytes]:
    n = i % 50 + 1 if n is None else n
    return encode_text_sample(np.arange(n, dtype=np.uint16) + i, {"id": f"doc.{i}"}, text=f"text {i}")


def write_shard(path: str, n: int = 10) -> None:
    with TarShardWriter(path) as w:
        for i in range(n):
            w.write(escape_key(f"doc.{i}"), text_fields(i), tokens=i % 50 + 1)


@given(st.text(min_size=1, max_size=200))
@settings(max_examples=200)
def test_escape_key_is_safe_and_reversible(doc_id):
    key = escape_key(doc_id)
    assert len(key) <= MAX_KEY_CHARS and "." not in key and "/" not in key and key.isascii()
    member_name(key, "tokens.npy.zst")  # always fits one header
    if is_hashed_key(key):
        assert key == escape_key(doc_id) and len(key) == 41
    else:
        assert unescape_key(key) == doc_id


@given(st.lists(st.text(min_size=1, max_size=120), min_size=1, max_size=8))
@settings(max_examples=200)
def test_escape_keys_in_bulk_equals_escape_key_per_id(doc_ids):
    """The loader's bulk escaping gives exactly escape_key's keys (spaces, %, ~, dots, non-ASCII,
    newlines, lone surrogates, over-long ids), or escape_key's error."""
    try:
        want = [escape_key(i) for i in doc_ids]
    except (ValueError, UnicodeEncodeError) as e:
        with pytest.raises(type(e)):
            escape_keys(doc_ids)
        return
    assert escape_keys(doc_ids) == want


def test_member_names_need_no_longname_or_pax_header(tmp_path):
    """Every member, even at the longest allowed key, has exactly one 512-byte header (no GNU
    longname, no PAX): TarInfo.offset_data - TarInfo.offset == 512 for each."""
    path = str(tmp_path / "s.tar")
    long_id = "é/ü." * 40  # non-ASCII, slashes and dots, long: escaped then hashed
    with TarShardWriter(path) as w:
        w.write("k" * MAX_KEY_CHARS, text_fields(0))
        w.write(escape_key(long_id), text_fields(1))
        w.write(escape_key("ç.x")[:MAX_KEY_CHARS], text_fields(2))
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    assert len(members) == 9
    for ti in members:
        assert ti.offset_data - ti.offset == 512 and not ti.pax_headers
        assert len(ti.name) <= MAX_NAME_BYTES and ti.mtime == 0 and ti.mode == 0o444 and ti.uid == 0


@pytest.mark.parametrize("key, suffix", [("a.b", "json"), ("a/b", "json"), ("a b", "json"), ("é", "json"),
                                         ("", "json"), ("k", "JSON"), ("k", ""), ("k" * 81, "json"),
                                         ("k" * 80, "a_very_long_suffix.npy.zst")])
def test_bad_member_names_are_refused_clearly(tmp_path, key, suffix):
    w = TarShardWriter(str(tmp_path / "s.tar"))
    with pytest.raises(ValueError, match="s.tar: (invalid|member name)"):
        w.write(key, {suffix: b"x"})
    w.abort()
    assert os.listdir(tmp_path) == []


def test_writer_commits_atomically_and_never_leaves_empty_shard(tmp_path):
    path = str(tmp_path / "s.tar")
    w = TarShardWriter(path)
    w.write("a", text_fields(0))
    [tmp] = os.listdir(tmp_path)  # readers never see a partial shard
    assert tmp.startswith("s.tar.") and tmp.endswith(TMP_SUFFIX)
    info = w.close()
    assert os.listdir(tmp_path) == ["s.tar"] and info.bytes == os.path.getsize(path) and info.samples == 1
    with pytest.raises(ValueError, match="empty shard"):
        TarShardWriter(str(tmp_path / "e.tar")).close()
    with pytest.raises(RuntimeError):
        with TarShardWriter(str(tmp_path / "x.tar")) as w2:
            w2.write("a", text_fields(0))
            raise RuntimeError("job failed")
    assert os.listdir(tmp_path) == ["s.tar"]


def test_shard_byte_limit_is_refused_clearly(tmp_path):
    w = TarShardWriter(str(tmp_path / "s.tar"), limit_bytes=20480)
    w.write("a", {"bin": b"x" * 5000})
    with pytest.raises(ValueError, match="past 20480 bytes"):
        w.write("b", {"bin": b"x" * 15000})
    w.write("c", {"bin": b"x" * 100})  # the refused sample left the shard usable
    info = w.close()
    assert info.samples == 2 and info.bytes <= 20480
    with pytest.raises(ValueError, match="shard limit"):
        ShardSequenceWriter(str(tmp_path), max_bytes=5 << 30)


@given(sizes=st.lists(st.integers(0, 6000), min_size=1, max_size=25), max_bytes=st.integers(10240, 40960))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_sequence_writer_counts_real_tar_bytes(tmp_path_factory, sizes, max_bytes):
    d = str(tmp_path_factory.mktemp("seq"))
    w = ShardSequenceWriter(d, max_bytes=max_bytes)
    for i, n in enumerate(sizes):
        w.write(f"k{i}", {"bin": bytes(n), "json": b"{}"})
    shards = w.close()
    assert sum(s.samples for s in shards) == len(sizes)
    for s in shards:
        size = os.path.getsize(os.path.join(d, s.name))
        assert size == s.bytes and s.samples >= 1
        assert size <= max_bytes or s.samples == 1  # a single over-sized sample still gets its shard
    keys = [k for s in shards for k, _ in iter_raw(os.path.join(d, s.name))]
    assert keys == [f"k{i}" for i in range(len(sizes))]


@given(samples=st.lists(st.lists(st.sampled_from([0, 1, 511, 512, 513, 1024, 10240, 20000]), min_size=1, max_size=3),
                        min_size=1, max_size=12))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_writer_bytes_are_what_tarfile_writes(tmp_path_factory, samples):
    """The writer emits tar headers itself; the shard is byte for byte the GNU tar :mod:`tarfile` writes
    from the same members (fixed mtime, mode and owner), end-of-archive record padding included."""
    d = tmp_path_factory.mktemp("tar")
    rng = np.random.default_rng(len(samples))
    members = [(f"k{i}", {f"m{j}.bin": rng.bytes(n) for j, n in enumerate(sizes)}) for i, sizes in enumerate(samples)]
    with TarShardWriter(str(d / "ours.tar")) as w:
        for key, fields in members:
            w.write(key, fields)
    with tarfile.open(d / "tarfile.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for key, fields in members:
            for suffix, data in sorted(fields.items()):
                ti = tarfile.TarInfo(f"{key}.{suffix}")
                ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = len(data), 0, 0o444, 0, 0, "", ""
                t.addfile(ti, io.BytesIO(data))
    ours = (d / "ours.tar").read_bytes()
    assert ours == (d / "tarfile.tar").read_bytes()
    assert w.info.bytes == len(ours) and w.info.sha256 == hashlib.sha256(ours).hexdigest()


@pytest.mark.parametrize("name", ["a", "doc%2E1.tokens.npy", "x" * 100])
@pytest.mark.parametrize("size", [0, 511, 512, 4 << 30, 8 ** 11 - 1])
def test_member_header_is_tarfiles_gnu_header(name, size):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o444, 0, 0, "", ""
    assert _member_header(name, size) == ti.tobuf(tarfile.GNU_FORMAT, tarfile.ENCODING, "surrogateescape")


@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<u4", ">u4", "<i8", "<f4", "|u1", "|b1"])
@pytest.mark.parametrize("shape", [(0,), (1,), (70001,), (3, 4)])
def test_encode_npy_is_what_np_save_writes(dtype, shape):
    array = (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)
    for a in (array, array[::2]):  # contiguous and strided
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)
        assert encode_npy(a) == buf.getvalue()


@pytest.mark.parametrize("dtype", ["<u2", "<u4", ">u2"])
def test_npy_concat_is_np_save_of_the_concatenation(dtype):
    whole = (np.arange(5000) % 4093).astype(dtype)
    pieces = [whole[:0], whole[:7], whole[7:7], whole[7:3001:2], whole[3001:]]  # empty, contiguous and strided
    buf = io.BytesIO()
    np.save(buf, np.concatenate(pieces).astype(dtype), allow_pickle=False)  # concatenate gives native order
    assert npy_concat(pieces, np.dtype(dtype)) == buf.getvalue()


def test_streaming_and_random_access_agree(tmp_path):
    path = str(tmp_path / "shard-000000.tar")
    write_shard(path, 12)
    streamed = list(iter_samples(path, schema="text"))
    assert [s["__key__"] for s in streamed] == [escape_key(f"doc.{i}") for i in range(12)]
    ix = build_shard_index(path)
    assert ix.nsamples == 12 and ix.filesize == os.path.getsize(path)
    assert ix.tokens == sum(i % 50 + 1 for i in range(12))
    write_dali_index(ix, dali_index_path(path))
    assert read_dali_index(dali_index_path(path)) == ix.samples
    for i in (0, 5, 11, -1):
        got = read_sample(path, i)
        want = streamed[i]
        assert got["__key__"] == want["__key__"] and got["json"] == want["json"] and got["txt"] == want["txt"]
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
    assert read_sample(path, ix.samples[3], decode=False)["tokens.npy.zst"] == text_fields(3)["tokens.npy.zst"]
    with pytest.raises(IndexError, match="shard-000000.tar"):
        read_sample(path, 12)


def test_random_access_detects_stale_index(tmp_path):
    path = str(tmp_path / "s.tar")
    write_shard(path, 3)
    entry = build_shard_index(path).samples[1]
    write_shard(path, 1)  # shard rewritten: the old offsets point past its end
    with pytest.raises(ShardError, match=r"s.tar: member 'doc%2E1\.json': (truncated|no tar header)"):
        read_sample(path, entry)
    with TarShardWriter(path) as w:  # rewritten with other sizes: the old offsets land mid-data
        w.write("other", {"bin": bytes(4000), "json": b"{}"})
    with pytest.raises(ShardError, match=r"s.tar: member 'doc%2E1\.json': (no tar header|index says)"):
        read_sample(path, entry)


def test_image_samples_round_trip(tmp_path):
    path = str(tmp_path / "img.tar")
    with TarShardWriter(path) as w:
        w.write("a", encode_image_sample(JPG, "jpeg", cls=3, meta={"src": "x"}))
        w.write("b", encode_image_sample(PNG, "png", caption="a cat ☺"))
    samples = list(iter_samples(path, schema="image"))
    assert samples[0] == {"__key__": "a", "cls": 3, "jpg": JPG, "json": {"src": "x"}}
    assert samples[1] == {"__key__": "b", "png": PNG, "txt": "a cat ☺"}
    with pytest.raises(ValueError, match="signature"):
        encode_image_sample(PNG, "jpg", cls=1)
    with pytest.raises(ValueError, match="cls"):
        encode_image_sample(PNG, "png")


def test_zst_members_decode_transparently_and_lenient_reader_counts(tmp_path):
    path = str(tmp_path / "s.tar")
    with TarShardWriter(path) as w:
        w.write("good", text_fields(1))
        w.write("bad", {"json": b"{}", "tokens.npy.zst": b"not zstd"})
        w.write("tail", text_fields(2))
    with pytest.raises(ShardError, match=r"s.tar: cannot decode member bad\.tokens\.npy\.zst") as e:
        list(iter_samples(path))
    assert e.value.kind == "undecodable"
    stats = ReadStats()
    assert [s["__key__"] for s in iter_samples(path, stats=stats)] == ["good", "tail"]
    assert stats.counts == {"undecodable": 1} and stats.samples == 2


def test_manifest_round_trip(tmp_path):
    w = ShardSequenceWriter(str(tmp_path), max_samples=4)
    for i in range(10):
        w.write(f"k{i}", text_fields(i), tokens=i % 50 + 1)
    m = Manifest(shards=w.close(), tokenizer="tok.model", vocab_size=300)
    m.save(str(tmp_path))
    back = Manifest.load(str(tmp_path))
    assert back == m and back.total_samples == 10 and [s.samples for s in back.shards] == [4, 4, 2]


@dataclasses.dataclass
class _Opt:
    lr: float = 1.0
    steps: int = 1
    name: str = "x"
    on: bool = False


@dataclasses.dataclass
class _Cfg:
    optim: _Opt = dataclasses.field(default_factory=_Opt)
    size: int | str = 1


def test_config_converts_yaml_numbers_and_rejects_wrong_types():
    cfg = from_dict(_Cfg, apply_overrides({}, ["optim.lr=3e-4", "optim.steps=1e3", "size=10GiB", "optim.on=true"]))
    assert cfg.optim.lr == 3e-4 and cfg.optim.steps == 1000 and cfg.size == "10GiB" and cfg.optim.on is True
    for bad in (["optim.steps=1.5"], ["optim.on=maybe"], ["optim.lr=fast"], ["optim.nope=1"]):
        with pytest.raises(ConfigError, match="optim."):
            from_dict(_Cfg, apply_overrides({}, bad))


def test_two_attempts_of_one_shard_do_not_collide(tmp_path):
    # A speculative retry of a bucket writes the same shard path while the first attempt runs
    # (pipelines.stages.write_shards on a shared filesystem): neither may truncate or steal the other's file.
    path = str(tmp_path / "bucket-000001")
    first = TarShardWriter(path)
    for i in range(40):
        first.write(f"k{i:03d}", text_fields(i))
    second = TarShardWriter(path)  # starts while the first is half written
    for i in range(40, 80):
        first.write(f"k{i:03d}", text_fields(i))
    info_first = first.close()
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == info_first.sha256  # committed bytes are whole
    for i in range(80):
        second.write(f"k{i:03d}", text_fields(i))
    info_second = second.close()
    assert info_second.sha256 == info_first.sha256 and info_second.samples == 80
    with tarfile.open(path) as tar:
        assert len(tar.getnames()) == 80 * len(text_fields(0))
    assert os.listdir(tmp_path) == ["bucket-000001"]  # no temporary file left behind


def test_kept_zstd_compressors_write_the_frames_a_new_one_writes():
    """zstd_compress keeps a compressor per thread and level for members up to KEEP_COMPRESSOR_BYTES;
    its frames must be those of a new compressor, in every thread, interleaved with other levels."""
    import threading

    import zstandard

    from shards.format.sample import KEEP_COMPRESSOR_BYTES, zstd_compress

    rng = np.random.default_rng(5)
    members = [(level, rng.integers(0, 300, size).astype(np.uint16).tobytes())
               for level in (1, 3, 9) for size in (0, 7, 5000, KEEP_COMPRESSOR_BYTES // 2 + 1)]
    expected = [zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True).compress(data)
                for level, data in members]
    got: dict[int, list[bytes]] = {}
    threads = [threading.Thread(target=lambda t=t: got.__setitem__(t, [zstd_compress(d, lv) for lv, d in members]))
               for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {t: expected for t in range(3)}
