"""Compatibility: our shards read unchanged by webdataset, wids and DALI (same keys, same bytes),
and colaflow reads shards written by webdataset's ShardWriter and by GNU tar."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from shards import (Manifest, ShardSequenceWriter, encode_image_sample, encode_text_sample, escape_key, iter_raw,
                    read_sample)
from shards.tools.cli import main
from shards.io.index import build_shard_index, dali_index_path, read_dali_index



def png_bytes() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (255, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Three text shards with escaped ids (dots, slashes, non-ASCII), indexed by `python -m shards index`."""
    d = tmp_path_factory.mktemp("ds")
    w = ShardSequenceWriter(str(d), max_samples=5)
    for i in range(12):
        tokens = (np.arange(i * 7 + 1) % 300).astype(np.uint16)
        w.write(escape_key(f"wiki/é.{i}"), encode_text_sample(tokens, {"id": i}, text=f"doc {i}"), len(tokens))
    Manifest(shards=w.close()).save(str(d))
    assert main(["index", str(d), "--name", "compat"]) == 0
    return d


def expected(d) -> dict[str, dict[str, bytes]]:
    """key → {suffix: bytes} as colaflow reads it: the reference every reader is compared with."""
    out = {}
    for s in Manifest.load(str(d)).shards:
        for key, fields in iter_raw(str(d / s.name)):
            out[key] = fields
    return out


def test_webdataset_reads_our_shards(dataset):
    import webdataset as wds

    urls = [str(dataset / s.name) for s in Manifest.load(str(dataset)).shards]
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
           for s in wds.WebDataset(urls, shardshuffle=False)}
    assert got == expected(dataset) and len(got) == 12


def test_wids_reads_our_index_and_shards(dataset, tmp_path):
    import wids

    index = json.loads((dataset / "shardindex.json").read_text())
    assert index["__kind__"] == "wids-shard-index-v1" and index["name"] == "compat"
    for entry in index["shardlist"]:  # our extra fields ride along; wids' own md5 agrees
        assert wids.wids.compute_file_md5sum(str(dataset / entry["url"])) == entry["md5sum"]
        assert entry["filesize"] == os.path.getsize(dataset / entry["url"]) and entry["sha256"]
    ds = wids.ShardListDataset(str(dataset / "shardindex.json"), cache_dir=str(tmp_path), transformations=[])
    assert len(ds) == 12
    got = {}
    for i in range(len(ds)):
        s = ds[i]
        got[s["__key__"]] = {k[1:]: v.getvalue() for k, v in s.items() if k.startswith(".")}
    ds.close()
    assert got == expected(dataset)


def test_dali_reads_our_shards_with_our_index(dataset):
    from nvidia.dali import fn, pipeline_def, types

    shards = [str(dataset / s.name) for s in Manifest.load(str(dataset)).shards]
    exts = ["json", "tokens.npy.zst", "txt.zst"]

    @pipeline_def(batch_size=12, num_threads=1, device_id=None)
    def pipe():
        return tuple(fn.readers.webdataset(paths=shards, index_paths=[dali_index_path(p) for p in shards], ext=exts,
                                           missing_component_behavior="error", dtypes=[types.UINT8] * 3, name="r"))

    p = pipe()
    p.build()
    assert p.reader_meta("r")["epoch_size"] == 12
    outs = p.run()
    got = {}
    for i in range(12):
        key = outs[0][i].source_info().rsplit(":", 1)[1].split(".", 1)[0]  # "path:offset:name"
        got[key] = {ext: np.array(outs[j][i]).tobytes() for j, ext in enumerate(exts)}
    assert got == expected(dataset)


def test_our_dali_index_matches_wds2idx(dataset, tmp_path):
    from wds2idx import IndexCreator

    shard = str(dataset / "shard-000001.tar")
    with IndexCreator(shard, str(tmp_path / "ref.idx"), verbose=False) as ic:
        ic.create_index()
    assert (tmp_path / "ref.idx").read_text() == open(dali_index_path(shard)).read()


def test_image_shards_read_by_webdataset(tmp_path):
    import webdataset as wds

    png = png_bytes()
    w = ShardSequenceWriter(str(tmp_path), max_samples=10)
    w.write("a", encode_image_sample(png, "png", cls=7))
    w.write("b", encode_image_sample(png, "png", caption="two cats", meta={"w": 2}))
    [info] = w.close()
    got = list(wds.WebDataset(str(tmp_path / info.name), shardshuffle=False).decode("pil"))
    assert got[0]["cls"] == 7 and got[1]["txt"] == "two cats" and got[1]["json"] == {"w": 2}
    assert got[0]["png"].size == (3, 2)
    raw = {s["__key__"]: s["png"] for s in wds.WebDataset(str(tmp_path / info.name), shardshuffle=False)}
    assert raw == {"a": png, "b": png}


def test_we_read_webdataset_shardwriter_output(tmp_path):
    """webdataset writes PAX headers (float mtime, uname 'bigdata'): tarfile reads them for us."""
    import webdataset as wds

    ref = {f"s{i:03d}": {"json": json.dumps({"i": i}).encode(), "tokens.npy.zst":
                         encode_text_sample(np.arange(i + 1, dtype=np.uint16), {})["tokens.npy.zst"]}
           for i in range(9)}
    with wds.ShardWriter(str(tmp_path / "w-%03d.tar"), maxcount=4, verbose=0) as sw:
        for key, fields in ref.items():
            sw.write({"__key__": key, **fields})
    paths = sorted(str(p) for p in tmp_path.glob("w-*.tar"))
    assert len(paths) == 3
    got = {k: f for p in paths for k, f in iter_raw(p, schema="text")}
    assert got == ref
    assert main(["verify", "-q", "--schema", "text", str(tmp_path)]) == 0  # a folder without manifest: its .tar files
    ix = build_shard_index(paths[1])
    assert read_sample(paths[1], ix.samples[2], decode=False)["json"] == ref["s006"]["json"]


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar not installed")
def test_we_read_gnu_tar_output_with_long_names(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    long_key = "x" * 120  # needs a GNU longname entry: our writer refuses it, our reader accepts it
    names = []
    for key in ("a", "b", long_key):
        for suffix, data in sorted(encode_text_sample(np.arange(5, dtype=np.uint32), {"k": key}).items()):
            (src / f"{key}.{suffix}").write_bytes(data)
            names.append(f"{key}.{suffix}")
    shard = str(tmp_path / "gnu.tar")
    subprocess.run(["tar", "--format=gnu", "-cf", shard, "-C", str(src), *names], check=True)
    got = {k: f for k, f in iter_raw(shard, schema="text")}
    assert list(got) == ["a", "b", long_key]
    assert got["b"]["json"] == (src / "b.json").read_bytes()
    assert main(["index", shard, "--out", str(tmp_path / "idx.json")]) == 0
    entries = read_dali_index(dali_index_path(shard))
    assert [e.key for e in entries] == ["a", "b", long_key]
    assert read_sample(shard, 2)["json"] == {"k": long_key}
