"""Hostile documents and real dirty corpora: huge and space-less lines, CJK mixed with Latin,
NUL bytes and colour codes; Debian's ``fortunes-zh`` (Tang and Song poems with ANSI colours)
and man pages when the machine has them (CI: ``apt-get install -y fortunes-zh man-db``)."""
from __future__ import annotations

import glob
import json
import os

import pytest
import sentencepiece as spm

from pipelines.stages.clean import clean_text
from pipelines.config import CleanConfig, DedupConfig, PIIConfig, QualityConfig, TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.near_dedup import minhash, shingle_hashes
from pipelines.stages.pii import redact
from pipelines.stages.quality import quality_steps
from pipelines.stages.step import run_steps
from pipelines.stages.tokenize import train_sentencepiece
from shards import Manifest, iter_documents
from colaflow.config import ConfigError
from tests.support.pipeline import synthetic_config

FORTUNES = sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                  if os.path.basename(p) in ("tang300", "song100", "chinese"))
MAN_PAGES = sorted(glob.glob("/usr/share/man/man1/*.1.gz"))[:40]
CJK = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。床前明月光，疑是地上霜。举头望明月，低头思故乡。"


@pytest.mark.timeout(120)  # a quadratic step would take hours on these sizes
def test_big_spaceless_line_is_linear_everywhere():
    text = "\x1b[31m" + "a" * 4_000_000 + "@" + "x.yz" * 225_000 + "\x00" + " " * 1_000_000 + "1" * 500_000 + "\x1b[0m"
    cleaned = clean_text(text, CleanConfig())
    assert "\x00" not in cleaned and "\x1b" not in cleaned and cleaned.startswith("aaaa")
    assert len(cleaned) == 4_000_001 + 900_000 + 1_000_000 + 500_000
    redacted, counts = redact(cleaned, PIIConfig())
    assert counts.get("email", 0) == 1 and len(redacted) < len(cleaned)
    assert run_steps(Doc("big", cleaned, "s"), quality_steps(QualityConfig(enabled=True))).reason == "quality_min_words"
    assert len(shingle_hashes(cleaned, 5)) == 1 and minhash(cleaned, DedupConfig()).shape == (112,)
    words = " ".join(f"w{i % 5000}" for i in range(1_000_000))  # 1M words: signature in bounded chunks
    assert minhash(words, DedupConfig()).shape == (112,)
    collapsed = clean_text("a \t\u3000 b" + " " * 2_000_000 + "c\n\n\n\nd", CleanConfig(whitespace="collapse"))
    assert collapsed == "a b c\n\nd"


def test_cjk_and_latin_round_trip_with_character_coverage():
    texts = [f"{CJK[i % 40:] + CJK[:i % 40]} The river ran past old stone walls, number {i}." for i in range(200)]
    probes = texts[:20] + ["罕见字：龘齉 mixed with café and naïve", "ＡＢＣ full width\nnext line"]
    exact = TokenizerConfig(vocab_size=600, character_coverage=0.9995, normalization_rule="identity",
                            remove_extra_whitespaces=False)
    sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(texts, exact))
    for text in probes:
        assert sp.decode(sp.encode(text)) == text  # byte fallback covers characters outside the coverage
    nfkc = spm.SentencePieceProcessor(model_proto=train_sentencepiece(texts, TokenizerConfig(vocab_size=600)))
    assert nfkc.decode(nfkc.encode(probes[-1])) == "ABC full width next line"  # the default folds forms
    with pytest.raises(ConfigError, match=r"needs tokenizer.vocab_size > \d+"):
        train_sentencepiece(texts, TokenizerConfig(vocab_size=300, character_coverage=1.0))


def test_repair_then_normalise_and_strip():
    assert clean_text("The Mona Lisa doesnÃ¢â‚¬â„¢t have eyebrows.", CleanConfig()) == \
        "The Mona Lisa doesn\u2019t have eyebrows."
    assert clean_text("\x1b[32m《静夜思》\x1b[m\r\n床前明月光\x00", CleanConfig()) == "《静夜思》\n床前明月光"
    assert clean_text("ＡＢＣ  \n", CleanConfig()) == "ＡＢＣ"  # full-width forms are not folded
    assert clean_text("Cafe\u0301", CleanConfig(fix_unicode=False)) == "Caf\u00e9"


@pytest.mark.skipif(not FORTUNES, reason="fortunes-zh not installed (apt-get install -y fortunes-zh)")
def test_fortunes_zh_and_man_pages(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    for path in FORTUNES + MAN_PAGES:
        os.symlink(path, inp / os.path.basename(path))
    cfg = synthetic_config()
    cfg.input.format, cfg.input.separator = "text", "%"  # fortune entries end at a "%" line
    cfg.tokenizer.vocab_size, cfg.tokenizer.character_coverage = 3000, 0.98  # CJK: thousands of characters
    stats = run(str(inp / "*"), str(tmp_path / "out"), cfg)
    t = stats["total"]
    assert t["balanced"] and t["dead_letter"] == 0 and t["kept"] > 300
    assert stats["sources"]["tang300"]["input_records"] > 300
    out = tmp_path / "out"
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    docs = {s["json"]["id"]: sp.decode(s["tokens"].tolist())
            for info in Manifest.load(str(out)).shards for s in iter_documents(str(out / info.name))}
    poems = [text for doc_id, text in docs.items() if doc_id.startswith("tang300#")]
    assert poems and not any("\x1b" in p or "[32m" in p for p in poems)
    assert any("床前明月光" in p for p in poems)  # 《静夜思》, colour codes gone, characters intact
    report = (out / "report.txt").read_text()
    assert f"{t['kept']:,}" in report
    assert json.loads((out / "stats.json").read_text())["total"]["length_tokens"]
