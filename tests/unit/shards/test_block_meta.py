"""Token-block metadata: version 2 (format 3: ids and sources as text columns, lengths formatted by numpy)
round-trips every id and source, and shards written before it (version 1, format 2: JSON lists) are
still read by every reader: the documents iterator, the loader's shard reader, verify and the CLI."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.read.shard_reader import LocalShards, ShardReader
from shards import Manifest, TokenBlockWriter, iter_documents, iter_raw, verify_shard
from shards.format.blocks import (META_SUFFIX, BlockPacker, column_json, decode_meta, decode_meta_dict,
                                  encode_block, json_uint_arrays, split_column, text_column)
from shards.format.keys import escape_key
from shards.format.sample import zstd_decompress
from shards.tools.cli import main

# the documents of golden/format2-token-blocks, a shard that commit c2b71f1 (block metadata version 1) wrote
# with TokenBlockWriter(block_tokens=8), document i holding tokens 100 i .. 100 i + i (none for empty/6)
# and the text "text i" when i % 3 == 0
GOLDEN_V1 = Path(__file__).parent / "golden" / "format2-token-blocks"
IDS = ["plain/0", "uni/\u00e9\u2713 \u6f22\u5b57", "quote/\"q\" 's'", "nl/line1\nline2", "bs/C:\\dir\\n", "tab\tid/5",
       "empty/6", "last/7"]
SOURCES = ["web", "b\u00fccher", "web", "multi\nline", "web", "web", "b\u00fccher", "x\\y"]
TOKENS = [np.arange(100 * i, 100 * i + (0 if doc_id == "empty/6" else i + 1), dtype=np.uint16)
          for i, doc_id in enumerate(IDS)]
TEXTS = [f"text {i}" if i % 3 == 0 else None for i in range(len(IDS))]

awkward_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # no lone surrogates: not UTF-8
awkward_texts = st.lists(st.one_of(awkward_text, st.sampled_from(["\n", "\\", "\\n", "\\\\n", '"', "a\n\\"])),
                         min_size=1, max_size=12)


def documents(folder: Path) -> list[tuple]:
    """Every document of a token-block dataset folder: ``(key, id, source, n_tokens, tokens, text)``."""
    m = Manifest.load(str(folder))
    return [(d["__key__"], d["json"]["id"], d["json"]["source"], d["json"]["n_tokens"], d["tokens"].tolist(),
             d.get("txt")) for s in m.shards for d in iter_documents(str(folder / s.name), schema="text")]


def write_golden_documents(folder: Path) -> Manifest:
    w = TokenBlockWriter(str(folder), block_tokens=8, compression="none", max_samples=100)
    for doc_id, source, tokens, text in zip(IDS, SOURCES, TOKENS, TEXTS):
        w.add(doc_id, source, tokens, text)
    m = Manifest(shards=w.close(), layout="token_blocks", token_dtype="uint16", vocab_size=1000)
    m.save(str(folder))
    return m


EXPECTED = [(escape_key(i), i, s, len(t), t.tolist(), x) for i, s, t, x in zip(IDS, SOURCES, TOKENS, TEXTS)]


@settings(max_examples=200, deadline=None)
@given(awkward_texts, st.data())
def test_ids_and_sources_round_trip_through_a_block(ids, data):
    ids = [i or "x" for i in ids]  # an id cannot be empty; a source can
    sources = data.draw(st.lists(awkward_text, min_size=len(ids), max_size=len(ids)))
    lengths = data.draw(st.lists(st.integers(0, 1200), min_size=len(ids), max_size=len(ids)))
    docs = [(i, s, np.full(k, 7, np.uint16)) for i, s, k in zip(ids, sources, lengths)]
    key, fields = encode_block(docs)
    meta = decode_meta(fields[META_SUFFIX])
    assert (meta.ids, meta.sources, meta.lengths.tolist()) == (ids, sources, lengths)
    assert key == escape_key(ids[0])
    assert json.loads(zstd_decompress(fields[META_SUFFIX]))["version"] == 2


@settings(max_examples=300, deadline=None)
@given(awkward_texts)
def test_column_json_is_the_json_of_the_text_column(values):
    assert column_json(values) == json.dumps(text_column(values), ensure_ascii=False).encode()
    assert split_column(json.loads(column_json(values))) == values


def test_a_text_column_escapes_backslash_and_newline_only():
    values = ["a\nb", "c\\n", "\\", "", "d\te\"f", "\u00e9"]
    assert text_column(values) == "a\\nb\nc\\\\n\n\\\\\n\nd\te\"f\n\u00e9"
    assert split_column(text_column(values)) == values
    assert column_json([3, "x"]) == b'"3\\nx"'  # ids given as numbers are written as str() gives them


@pytest.mark.parametrize("column", ["a\\tb", "trailing\\"])
def test_a_column_with_another_escape_is_refused(column):
    with pytest.raises(ValueError, match="blk: block metadata column holds the escape"):
        split_column(column, "blk")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 12), st.integers(0, 2 ** 62)), max_size=40), st.data())
def test_json_uint_arrays_are_the_json_of_each_run(values, data):
    ends = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=5))) + [len(values)]
    got = json_uint_arrays(np.array(values, np.int64), ends)
    assert got == [json.dumps(values[a:b], separators=(",", ":")).encode() for a, b in zip([0, *ends[:-1]], ends)]


@pytest.mark.parametrize("meta, message", [
    ({"layout": "token_block", "version": 3, "ids": "a", "sources": "s", "lengths": [1]},
     "block metadata version 3 is not supported"),
    ({"layout": "token_block", "version": 2, "ids": ["a"], "sources": ["s"], "lengths": [1]},
     "holds ids and sources as text columns, got list and list"),
    ({"layout": "token_block", "version": 2, "ids": "a\nb", "sources": "s", "lengths": [1, 2]},
     "lists 2 ids, 1 sources and 2 lengths"),
])
def test_metadata_of_an_unknown_version_or_shape_is_refused(meta, message):
    with pytest.raises(ValueError, match=message):
        decode_meta_dict(meta, "blk")


def test_version_1_metadata_still_decodes():
    meta = decode_meta_dict({"layout": "token_block", "dtype": "uint16", "ids": ["a\nb", "c"], "sources": ["s", "t"],
                             "lengths": [2, 0]})
    assert (meta.ids, meta.sources, meta.lengths.tolist()) == (["a\nb", "c"], ["s", "t"], [2, 0])


def test_batched_packing_writes_the_same_metadata_as_one_at_a_time():
    one, many = BlockPacker(8), BlockPacker(8)
    got_one = [b for d in zip(IDS, SOURCES, TOKENS) if (b := one.add(*d)) is not None] + [one.flush()]
    got_many = many.add_many(IDS, SOURCES, TOKENS) + [many.flush()]
    assert [b.fields for b in got_one] == [b.fields for b in got_many]
    metas = [decode_meta(b.fields[META_SUFFIX]) for b in got_many]
    assert [i for m in metas for i in m.ids] == IDS and [s for m in metas for s in m.sources] == SOURCES


def test_the_format_2_shard_reads_as_its_documents(tmp_path):
    folder = tmp_path / "v1"
    shutil.copytree(GOLDEN_V1, folder)
    m = Manifest.load(str(folder))
    assert m.format_version == 2 and m.total_documents == len(IDS)
    for _, fields in iter_raw(str(folder / m.shards[0].name)):  # written before the metadata had a version
        assert "version" not in json.loads(zstd_decompress(fields[META_SUFFIX]))
    assert documents(folder) == EXPECTED
    rep = verify_shard(str(folder / m.shards[0].name), m.shards[0], schema="text", vocab_size=m.vocab_size)
    assert rep.ok and rep.documents == len(IDS) and rep.tokens == sum(map(len, TOKENS))


@pytest.mark.parametrize("which", ["format2", "now"])
def test_the_loaders_shard_reader_reads_both_metadata_versions(tmp_path, which):
    folder = tmp_path / which
    if which == "format2":
        shutil.copytree(GOLDEN_V1, folder)
    else:
        assert write_golden_documents(folder).format_version == 3
    reader = ShardReader(Manifest.load(str(folder)), str(folder), LocalShards(), index_dir=str(tmp_path / "index"))
    handle = reader.handle(0)
    assert handle.docs.ids == IDS and handle.docs.key_list() == [escape_key(i) for i in IDS]
    for i, tokens in enumerate(TOKENS):
        key, got = reader.tokens(0, i)
        assert key == escape_key(IDS[i]) and got.tolist() == tokens.tolist()
    reader.close()


def test_a_shard_written_now_holds_what_the_format_2_shard_holds(tmp_path):
    m = write_golden_documents(tmp_path / "now")
    assert documents(tmp_path / "now") == documents(GOLDEN_V1) == EXPECTED
    assert m.shards[0].documents == len(IDS) and m.shards[0].blocks == Manifest.load(str(GOLDEN_V1)).shards[0].blocks


@pytest.mark.parametrize("which", ["format2", "now"])
def test_verify_stats_and_inspect_read_both_metadata_versions(tmp_path, which, capsys):
    folder = tmp_path / which
    if which == "format2":
        shutil.copytree(GOLDEN_V1, folder)
    else:
        write_golden_documents(folder)
    assert main(["verify", "-q", str(folder)]) == 0
    capsys.readouterr()
    assert main(["stats", str(folder)]) == 0
    assert f"documents: {len(IDS)}" in capsys.readouterr().out
    assert main(["inspect", str(folder / "shard-000000.tar"), "--at", "0"]) == 0
    out = capsys.readouterr().out
    assert "== block plain%2F0: 3 documents, 6 uint16 tokens" in out and json.dumps(IDS[2])[1:-1] in out
