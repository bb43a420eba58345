"""Hostile and varied inputs through the real pipeline: every bad record is counted and dead-lettered."""
from __future__ import annotations

import bz2
import gzip
import json
import os

import pytest
import sentencepiece as spm
import zstandard

import beam_runner
from pipelines.job import run
from shards import Manifest, iter_documents
from tests.support.pipeline import SYNTHETIC, synthetic_config

GOOD_LINES = [
    b'{"id": "g1", "text": "The first good document about the sea and the sky.", "source": "web"}',
    b'{"id": "g2", "text": "\\u001b[1mBold\\u001b[0m text with a NUL\\u0000 inside and the rest.", "source": "web"}',
    b'{"id": "g3", "text": "   \\n\\t  ", "source": "web"}',
    b'{"id": "g4", "text": "the first GOOD document   about the sea and the sky.", "source": "web"}',
    b'{"id": "g5", "text": "Write to jane.doe@example.com or 10.0.0.1 today.", "source": "web"}',
    b'{"text": "A record without an id but with the text field.", "source": "web"}',
    b"[1, 2, 3]",
    b'{"id": "g8", "body": "wrong field"}',
    b"",
    b"\x00\x01\xff\xfe binary junk",
    b'{"id": "g11", "text": "truncated',
]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    (d / "good.jsonl").write_bytes(b"\n".join(GOOD_LINES))  # no final newline: truncated last line
    (d / "latin1.jsonl").write_bytes('{"id": "l1", "text": "café"}\n{"id": "l2", "text": "naïve"}\n'
                                     '{"id": "l3", "text": "plain ascii text"}\n'.encode("latin-1"))
    with gzip.open(d / "notes.txt.gz", "wb") as f:
        f.write(b"First paragraph line one.\nline two.\n\nSecond paragraph.\n")
    (d / "zst.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        b'{"id": "z1", "text": "zstd compressed record"}\n{"id": "z2", "text": "another one"}\n'))
    (d / "bz.txt.bz2").write_bytes(bz2.compress(b"A bzip2 paragraph.\n"))
    cut = gzip.compress(b"".join(b'{"id": "t%d", "text": "line %d of a file cut short"}\n' % (i, i) for i in range(2000)))
    (d / "cut.jsonl.gz").write_bytes(cut[: len(cut) // 2])  # truncated download
    with open(d / "huge.jsonl", "wb") as f:  # one 20 MB document on one line, over input.max_record_bytes
        f.write(b'{"id": "h1", "text": "' + b"word " * 4_000_000 + b'"}\n{"id": "h2", "text": "after the huge one"}\n')
    out = tmp_path_factory.mktemp("out")
    rc = beam_runner.main(["--input", f"{d}/*", "--output", str(out), "tokenizer.vocab_size=400",
                           "shards.num_shards=2", "shards.store_text=true", *SYNTHETIC])
    assert rc == 0
    with open(out / "stats.json", encoding="utf-8") as f:
        return d, out, json.load(f)


def test_every_record_is_accounted_for(hostile):
    _, _, stats = hostile
    src = stats["sources"]
    assert src["web"] == {**src["web"], "input_records": 6, "kept": 4, "duplicates": 1,
                          "filtered": {"empty": 1}, "dead_letter": 0, "redactions": {"email": 1, "ip": 1}}
    assert src["good"]["input_records"] == 5 and src["good"]["dead_letter_reasons"] == {
        "bad_json": 1, "blank_line": 1, "missing_text": 1, "not_object": 1, "not_utf8": 1}
    assert src["latin1"]["dead_letter_reasons"] == {"not_utf8": 2} and src["latin1"]["kept"] == 1
    assert src["notes"]["kept"] == 2 and src["notes"]["input_records"] == 2
    assert src["zst"]["kept"] == 2 and src["bz"]["kept"] == 1
    cut = src["cut"]
    assert cut["dead_letter_reasons"] == {"unreadable_file": 1} and 0 < cut["kept"] < 2000
    assert cut["input_records"] == cut["kept"] + 1
    assert src["huge"]["dead_letter_reasons"] == {"too_large": 1} and src["huge"]["kept"] == 1
    assert stats["total"]["input_records"] == 21 + cut["input_records"] and stats["total"]["dead_letter"] == 9
    assert all(e["balanced"] for e in [stats["total"], *src.values()])


def test_dead_letters_name_file_and_line(hostile):
    d, out, _ = hostile
    files = os.listdir(out / "dead_letter")
    records = [json.loads(line) for name in files for line in open(out / "dead_letter" / name, encoding="utf-8")]
    where = sorted((os.path.basename(r["file"]), r["line"], r["reason"]) for r in records)
    assert where[0][0] == "cut.jsonl.gz" and where[0][2] == "unreadable_file"
    assert "EOFError" in next(r["error"] for r in records if r["reason"] == "unreadable_file")
    assert where[1:] == [("good.jsonl", 7, "not_object"), ("good.jsonl", 8, "missing_text"),
                     ("good.jsonl", 9, "blank_line"), ("good.jsonl", 10, "not_utf8"),
                     ("good.jsonl", 11, "bad_json"), ("huge.jsonl", 1, "too_large"),
                     ("latin1.jsonl", 1, "not_utf8"), ("latin1.jsonl", 2, "not_utf8")]
    huge = next(r for r in records if r["reason"] == "too_large")
    assert huge["offset"] == 0 and huge["raw"].startswith('{"id": "h1", "text": "word word') and "20000025" in huge["error"]
    junk = next(r for r in records if r["line"] == 10)
    assert junk["raw"].startswith("\x00\x01\\xff\\xfe binary junk")


def test_cleaned_and_redacted_text_reaches_shards(hostile):
    _, out, _ = hostile
    m = Manifest.load(str(out))
    sp = spm.SentencePieceProcessor(model_file=str(out / m.tokenizer))
    docs = {s["json"]["id"]: sp.decode(s["tokens"].tolist())
            for info in m.shards for s in iter_documents(str(out / info.name))}
    assert sorted(d for d in docs if not d.startswith("cut.")) == [
        "bz.txt.bz2#00000001", "good.jsonl#00000006", "good.jsonl/g1", "good.jsonl/g2", "good.jsonl/g5",
        "huge.jsonl/h2", "latin1.jsonl/l3", "notes.txt.gz#00000001", "notes.txt.gz#00000004",
        "zst.jsonl.zst/z1", "zst.jsonl.zst/z2"]
    assert docs["good.jsonl/g2"] == "Bold text with a NUL inside and the rest."
    assert docs["good.jsonl/g5"] == "Write to <EMAIL> or <IP> today."
    assert docs["notes.txt.gz#00000001"] == "First paragraph line one. line two."  # sentencepiece folds newlines
    texts = {s["json"]["id"]: s["txt"] for info in m.shards for s in iter_documents(str(out / info.name))}
    assert texts["notes.txt.gz#00000001"] == "First paragraph line one.\nline two."  # store_text keeps the text


def test_text_field_quality_and_near_dup(hostile, tmp_path):
    _, first, _ = hostile
    words = ("the river ran past old stone walls and into a quiet valley where farmers grew wheat and barley "
             "with care").split()
    long_doc = " ".join(words[i % len(words)] + ("" if i % 7 else ".") for i in range(140))
    near = long_doc.replace("barley", "oats", 1)
    lines = [{"key": "a", "body": long_doc}, {"key": "b", "body": near}, {"key": "c", "body": "Too short."},
             {"key": "d", "text": "no body field"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    cfg = synthetic_config()
    cfg.input.text_field, cfg.input.id_field = "body", "key"
    cfg.quality.enabled, cfg.quality.gopher.min_words = True, 5
    # the long text repeats a 17-word sentence on one line: Gopher's repetition and FineWeb's line rules would drop it
    cfg.quality.repetition.enabled = cfg.quality.fineweb.enabled = False
    cfg.dedup.near = True
    cfg.tokenizer.path = str(first / "tokenizer.model")
    stats = run(str(path), str(tmp_path / "out"), cfg)
    t = stats["total"]
    assert t["filtered"] == {"near_duplicate": 1, "quality_min_words": 1}
    assert t["dead_letter_reasons"] == {"missing_text": 1}
    assert t["kept"] == 1 and t["balanced"]
    kept = [s["json"]["id"] for info in Manifest.load(str(tmp_path / "out")).shards
            for s in iter_documents(str(tmp_path / "out" / info.name))]
    assert kept == ["in.jsonl/a"]  # the smaller id keeps its place
    listed = [json.loads(line) for p in (tmp_path / "out" / "duplicates").iterdir() for line in open(p)]
    assert listed == [{"duplicate_of": "in.jsonl/a", "id": "in.jsonl/b", "kind": "near", "source": "in"}]
