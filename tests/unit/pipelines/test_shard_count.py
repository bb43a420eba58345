"""``shards.num_shards=N`` writes one shard per non-empty bucket: when fewer than N are written,
the job's summary says so and why, and ``stats.json`` records both counts."""
from __future__ import annotations

import json

import beam_runner
from pipelines.config import TokenizerConfig
from pipelines.accounting.report import report_text, shard_shortfall
from pipelines.stages.tokenize import train_sentencepiece
from tests.support.pipeline import SYNTHETIC

TEXTS = ["The river ran cold and clear under the old stone bridge near the mill all winter long.",
         "A merchant sold bright cloth and copper pots in the square every market day of the year.",
         "Three sailors mended their nets on the quay while gulls circled over the grey harbour."]


def test_fewer_documents_than_num_shards_is_said_in_the_summary_and_recorded(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(TEXTS)))
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(TEXTS * 30, TokenizerConfig(vocab_size=300)))
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(tmp_path / "in.jsonl"), "--output", str(out),
                             "--tokenizer", str(tmp_path / "tok.model"), "shards.num_shards=8", *SYNTHETIC]) == 0
    line = ("shards.num_shards=8 asked for, 2 written: only 3 documents were written and a document never spans "
            "two shards; they fell into 2 of the 8 buckets (sha256 of the sample key mod 8)")  # two ids hash alike
    assert line in capsys.readouterr().out
    assert line in (out / "report.txt").read_text()
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["shards_requested"], stats["shards"]) == (8, 2)
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) == 2


def _stats(kept: int, shards: int, requested: int) -> dict:
    total = {"input_records": kept, "kept": kept, "filtered": {}, "duplicates": 0, "dead_letter": 0,
             "dead_letter_reasons": {}, "tokens": kept, "text_bytes": kept, "balanced": True}
    return {"total": total, "sources": {}, "shards": shards, "shards_requested": requested, "vocab_size": 300}


def test_empty_hash_buckets_are_named_as_the_reason():
    assert shard_shortfall(_stats(kept=3, shards=3, requested=8)) == (
        "  shards.num_shards=8 asked for, 3 written: only 3 documents were written and a document never spans "
        "two shards")
    line = shard_shortfall(_stats(kept=10, shards=7, requested=8))
    assert line == ("  shards.num_shards=8 asked for, 7 written: the 10 documents fell into 7 of the 8 buckets "
                    "(sha256 of the sample key mod 8); ask for fewer shards to fill them all")
    assert line in report_text(_stats(kept=10, shards=7, requested=8))


def test_the_count_is_of_training_documents_with_a_validation_split_and_reads_right_for_one():
    """The report's "kept" counts validation documents too; the shortfall line must not seem to
    contradict it, and one document is "1 document was", not "1 documents were"."""
    stats = _stats(kept=200, shards=150, requested=256)
    stats["splits"] = {"train": {"shards": 150, "samples": 183, "tokens": 183},
                       "val": {"shards": 1, "samples": 17, "tokens": 17}}
    assert "only 183 training documents were written" in shard_shortfall(stats)
    assert "only 1 document was written and" in shard_shortfall(_stats(kept=1, shards=1, requested=2))
    assert "the 1,000 documents fell into" in shard_shortfall(_stats(kept=1000, shards=7, requested=8))


def test_no_line_when_every_shard_asked_for_was_written_or_none_was_asked_for():
    assert shard_shortfall(_stats(kept=10, shards=8, requested=8)) is None
    assert shard_shortfall(_stats(kept=10, shards=2, requested=0)) is None
    assert "num_shards" not in report_text(_stats(kept=10, shards=2, requested=0))
