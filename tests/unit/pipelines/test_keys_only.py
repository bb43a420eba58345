"""Issue 38: the job's global steps move compact per-document keys, never the text or the tokens.

The DirectRunner (in memory) buffers every PCollection that crosses a grouping or is read as a
side input whole, and the main input of a step while its side inputs are not ready, so anything
there that carries text grows the job's memory with the corpus. The text stays in the split
records of ``OUT/.work/`` and is read back one split at a time; these tests fail when a grouping's
input, a side input or such a main input carries a document's text or tokens again, or one element
per document instead of one per split or per repeated (or, near dedup on, near-duplicate candidate)
document."""
from __future__ import annotations

import json
import pickle
import random

import apache_beam as beam
from apache_beam.pipeline import PipelineVisitor

import pipelines.job as job
from pipelines.config import TokenizerConfig
from pipelines.stages.tokenize import train_sentencepiece
from tests.support.pipeline import synthetic_config

MARK = "zebrafinch"  # in every document's text, in no id
FORBIDDEN = (MARK.encode(), b"TokenizedDoc", b"EncodedDocument")  # text, tokens, encoded samples
checked: dict[str, int] = {}  # label → elements checked (the DirectRunner runs the checks in this process)


class _Crossings(PipelineVisitor):
    """Collects the input of every GroupByKey, every side input's PCollection and the main input
    of every step that reads a side input."""

    def __init__(self):
        self.found: dict[str, beam.PCollection] = {}

    def visit_transform(self, node):
        if isinstance(node.transform, beam.GroupByKey):
            self.found[f"{node.full_label} input"] = node.inputs[0]
        for side in node.side_inputs:
            self.found[f"{node.full_label} side input"] = side.pvalue
        if node.side_inputs and node.inputs:
            self.found[f"{node.full_label} main input"] = node.inputs[0]


def _check(element, label: str):
    data = pickle.dumps(element)
    bad = [f.decode() for f in FORBIDDEN if f in data]
    assert not bad, f"{label} carries {bad}: {str(element)[:200]}"
    checked[label] = checked.get(label, 0) + 1


def _build_checked(p, *args, **kwargs):
    build(p, *args, **kwargs)
    visitor = _Crossings()
    p.visit(visitor)
    for n, (label, pcoll) in enumerate(sorted(visitor.found.items())):
        pcoll | f"Check{n}" >> beam.Map(_check, label)


build = job.build


TEXTS = [f"{MARK} note {i} tells of {'apples ' * (i % 5)}and item {i * 7 % 13} in the garden by the river."
         for i in range(80)]


def _corpus(tmp_path):
    """80 texts under their own ids, and 10 of them again under other ids; a tokenizer for them."""
    rows = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    rows += [{"id": f"copy{i}", "text": TEXTS[i]} for i in range(0, 80, 8)]  # exact duplicates
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece([t.replace(MARK, "bird") for t in TEXTS] * 4,
                                                             TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()  # the quality rules off: the texts are short
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    return cfg


def test_no_grouping_or_side_input_carries_a_documents_text_or_tokens(tmp_path, monkeypatch):
    cfg = _corpus(tmp_path)
    cfg.dedup.near, cfg.dedup.num_perm, cfg.dedup.bands = True, 16, 4
    cfg.split.val_fraction = 0.2
    checked.clear()
    monkeypatch.setattr(job, "build", _build_checked)
    stats = job.run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    total = stats["total"]
    assert total["balanced"] and total["duplicates"] == 10 and total["kept"] > 0
    assert stats["splits"]["val"]["samples"] > 0
    # not vacuous: the key statistics saw every split's rows, exact dedup the keys of the 10 repeated
    # texts (each one key per copy, or one partial per hash), the shard grouping the runs
    assert checked["KeyStats/CombinePerKey/GroupByKey input"] >= 1
    assert checked["Candidates/ParDo(Candidates) side input"] >= 1
    assert 10 <= checked["ExactDedup/KeepSmallestId/GroupByKey input"] <= 20
    assert any(label.startswith("JoinKept/") for label in checked)
    assert checked["Shards/GroupBucket input"] >= 1


def test_without_near_dedup_no_crossing_carries_one_element_per_document(tmp_path, monkeypatch):
    """Only the 20 documents of the 10 repeated texts cross a step as elements of their own (exact
    dedup's input, its listing); the 70 others lie in their split's rows and records alone."""
    cfg = _corpus(tmp_path)
    cfg.dedup.near = False
    checked.clear()
    monkeypatch.setattr(job, "build", _build_checked)
    stats = job.run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert stats["total"]["balanced"] and stats["total"]["duplicates"] == 10 and stats["total"]["kept"] == 80
    assert checked["ExactDedup/KeepSmallestId/GroupByKey input"] == 20  # not vacuous: the candidates, one each
    assert checked["KeyStats/CombinePerKey/GroupByKey input"] >= 1 and checked["Shards/GroupBucket input"] >= 1
    per_document = {label: n for label, n in checked.items() if n > 20}
    assert not per_document, per_document


def test_duplicate_lines_cross_no_step_boundary(tmp_path, monkeypatch):
    """The DirectRunner holds whole every Flatten's inputs and every grouping's: duplicates/ lines (one
    per dropped document) went through two Flattens (exact dedup's listed and hot keys, then every
    dedup stage's) before they were split into runs; now each stage spills its own lines."""
    cfg = _corpus(tmp_path)
    cfg.dedup.near = False
    seen: dict[str, beam.PCollection] = {}

    class Flattens(PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, (beam.Flatten, beam.GroupByKey)):
                for i, pcoll in enumerate(node.inputs):
                    seen[f"{node.full_label} input {i}"] = pcoll

    def build_checked(p, *args, **kwargs):
        build(p, *args, **kwargs)
        p.visit(Flattens())
        for n, (label, pcoll) in enumerate(sorted(seen.items())):
            pcoll | f"Check{n}" >> beam.Map(_check_no_line, label)

    checked.clear()
    monkeypatch.setattr(job, "build", build_checked)
    stats = job.run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert stats["total"]["duplicates"] == 10
    lines = (tmp_path / "out" / "duplicates").glob("*.jsonl")
    assert sum(len(f.read_text().splitlines()) for f in lines) == 10
    assert checked["DuplicatesWrite/GroupPart input 0"] >= 1  # not vacuous: the runs' paths crossed


def _check_no_line(element, label: str):
    assert b"duplicate_of" not in pickle.dumps(element), f"{label} carries a duplicates/ line: {str(element)[:200]}"
    checked[label] = checked.get(label, 0) + 1


def _near_corpus(tmp_path, docs: int):
    """``docs`` texts of 80 words drawn at random (no two alike), 10 of them again under other ids and
    5 of them again with one word changed (near-copies); a tokenizer for them."""
    rng = random.Random(38)
    vocab = [f"word{i}" for i in range(2000)]
    texts = [" ".join([MARK] + rng.choices(vocab, k=79)) for _ in range(docs)]
    rows = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    rows += [{"id": f"copy{i}", "text": texts[i]} for i in range(0, 100, 10)]  # exact duplicates
    rows += [{"id": f"near{i}", "text": texts[i].replace(texts[i].split()[40], "changed", 1)}
             for i in range(5, 100, 20)]  # near-copies, Jaccard about 0.88 on 5-grams
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece([t.replace(MARK, "bird") for t in texts[:100]],
                                                             TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    cfg.dedup.near, cfg.dedup.num_perm, cfg.dedup.bands = True, 16, 4
    return cfg


def test_with_near_dedup_no_crossing_carries_one_element_per_document(tmp_path, monkeypatch):
    """Near dedup's band buckets cross as one array per split and are found on disk; only the
    candidates (documents in a band bucket of two texts or more: the 5 near-copies and their
    originals; a text's exact copies make none) cross a step as elements of their own, never the
    300 others (before, every document crossed as a DocKey, its memberships and its signature)."""
    cfg = _near_corpus(tmp_path, 300)
    checked.clear()
    monkeypatch.setattr(job, "build", _build_checked)
    stats = job.run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    total = stats["total"]
    near = total["filtered"]["near_duplicate"]  # 16 MinHash values estimate Jaccard coarsely
    assert total["balanced"] and total["duplicates"] == 10 and 1 <= near <= 5 and total["kept"] == 305 - near
    # not vacuous: the band arrays crossed, the candidates were compared with their bucket's keeper
    assert checked["NearDedup/Buckets/CombinePerKey/GroupByKey input"] >= 1
    assert 10 <= checked["NearDedup/Keepers/GroupByKey input"] <= 4 * 20
    per_document = {label: n for label, n in checked.items() if n >= 100}
    assert not per_document, per_document
