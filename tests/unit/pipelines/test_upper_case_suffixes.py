"""Upper-case file names (`A.JSONL.GZ`, `CRAWL.WARC.GZ`, as some Windows tools and crawlers write
them) are read like lower-case ones: `input.format: auto` recognised them, but the reader then did
not decompress `A.JSONL.GZ` (every line a `not_utf8` dead letter) and read `CRAWL.WARC.GZ` through
FastWARC's gzip reader, which stops silently at a truncated member (no `unreadable_file` dead
letter). A real Beam run on both, with the lower-case copies beside them as the reference."""
from __future__ import annotations

import gzip
import json

from pipelines.config import TokenizerConfig
from pipelines.job import run
from pipelines.stages.tokenize import train_sentencepiece
from tests.support.pipeline import synthetic_config
from tests.support.warc import PARAGRAPHS, Page, article, write_warc


def test_upper_case_compressed_names_are_decompressed_and_a_truncated_warc_is_a_dead_letter(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    rows = [{"id": str(i), "text": f"{PARAGRAPHS[i % len(PARAGRAPHS)]} number {i}"} for i in range(3)]
    (data / "A.JSONL.GZ").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    pages = [Page(f"https://town.example/{i}", article(f"T{i}", [PARAGRAPHS[(i + k) % len(PARAGRAPHS)]
                                                                 for k in range(3)]).encode(), "text/html")
             for i in range(4)]
    write_warc(data / "whole.warc.gz", pages, requests=False)
    full = (data / "whole.warc.gz").read_bytes()
    (data / "whole.warc.gz").unlink()
    for name in ("CUT.WARC.GZ", "cut2.warc.gz"):  # the last member cut short, upper and lower case
        (data / name).write_bytes(full[:-60])
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(PARAGRAPHS * 5, TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    cfg.dedup.exact = False  # the two WARC copies are counted apart
    stats = run(str(data / "*"), str(tmp_path / "out"), cfg, report=False)
    src = stats["sources"]
    assert set(src) == {"A", "CUT", "cut2"}  # stems without the upper-case suffixes
    assert src["A"]["kept"] == 3 and src["A"]["dead_letter"] == 0
    for name in ("CUT", "cut2"):
        assert (src[name]["input_records"], src[name]["kept"], src[name]["filtered"]) == (4, 3, {})
        assert src[name]["dead_letter_reasons"] == {"unreadable_file": 1}
    letters = [json.loads(line) for p in (tmp_path / "out" / "dead_letter").iterdir()
               for line in p.read_text().splitlines()]
    assert sorted(r["file"].rsplit("/", 1)[-1] for r in letters) == ["CUT.WARC.GZ", "cut2.warc.gz"]
    assert all("truncated" in r["error"] for r in letters)
    assert stats["total"]["balanced"]
