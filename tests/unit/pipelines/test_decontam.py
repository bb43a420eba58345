"""Benchmark decontamination (pipelines.stages.decontam): evaluation passages (JSONL, text and
Parquet sets) planted in a corpus are each found, per evaluation set, and nothing else is removed,
on a real Beam run, in both actions (drop the document, cut the spans); the listing names every
matched document."""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from colaflow.config import ConfigError, load_config
from pipelines.config import DecontamConfig, PipelineConfig, TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.decontam import DecontamStep, EvalSetError, cut_spans, eval_ngrams
from pipelines.stages.tokenize import train_sentencepiece
from shards import Manifest, iter_documents
from tests.support.pipeline import synthetic_config

WORDS = ("the a of to and in is it that was for on with as his he be at by this had not are but from or have an "
         "they which one you were her all she there would their we him been has when who will more no if out so "
         "said what up its about into than them can only other new some could time these two may then do first").split()


FILLER = "river stone valley barley wheat mill bread winter school road hill farmer".split()


def sentence(rng: random.Random, n: int, words=WORDS) -> str:
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


@pytest.fixture
def corpus(tmp_path):
    """Evaluation sets (JSONL with question/choices, text, Parquet) and a corpus with passages planted
    between sentences of other words (so a cut's edges are known): ``{doc id: (text, eval set or None)}``."""
    rng = random.Random(7)
    qa = [{"question": sentence(rng, 20), "choices": [sentence(rng, 3), sentence(rng, 4)], "answer": 1}
          for _ in range(5)]
    stories = [sentence(rng, 30) for _ in range(4)]
    summaries = [sentence(rng, 16) for _ in range(3)]
    (tmp_path / "evals").mkdir()
    pq.write_table(pa.table({"summary": summaries, "id": [1, 2, 3]}), tmp_path / "evals" / "summaries.parquet")
    (tmp_path / "evals" / "qa.jsonl").write_text("\n".join(json.dumps(q) for q in qa) + "\n", encoding="utf-8")
    (tmp_path / "evals" / "stories.txt").write_text("\n\n".join(stories) + "\n", encoding="utf-8")
    docs = {f"clean{i}": (" ".join(sentence(rng, 15) for _ in range(6)), None) for i in range(30)}
    for i, q in enumerate(qa):  # a whole question, mid-document
        docs[f"qa{i}"] = (f"{sentence(rng, 12, FILLER)} {q['question']} {sentence(rng, 12, FILLER)}", "qa")
    for i, story in enumerate(stories):  # 13 words of the story, punctuation and case changed
        excerpt = " ".join(story.rstrip(".").split()[5:18]).upper().replace(" ", ", ", 2)
        docs[f"story{i}"] = (f"{sentence(rng, 10, FILLER)} {excerpt}! {sentence(rng, 10, FILLER)}", "stories")
    for i, summary in enumerate(summaries[:2]):  # the whole text of a Parquet row
        docs[f"summary{i}"] = (f"{summary} {sentence(rng, 14, FILLER)}", "summaries")
    docs["near_miss"] = (f"{sentence(rng, 10)} {' '.join(stories[0].split()[:12])} {sentence(rng, 10)}", None)
    rows = [json.dumps({"id": k, "text": text, "source": "web"}) for k, (text, _) in docs.items()]
    (tmp_path / "in.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece([" ".join(WORDS)] * 50, TokenizerConfig(vocab_size=300)))
    return docs


def _run(tmp_path, action: str) -> tuple[dict, dict, list[dict]]:
    cfg = synthetic_config()
    evals = tmp_path / "evals"
    cfg.decontam.eval_sets = {"qa": str(evals / "*.jsonl"), "stories": str(evals / "stories.txt"),
                              "summaries": str(evals / "summaries.parquet")}
    cfg.decontam.action = action
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    cfg.shards.store_text = True
    out = tmp_path / f"out-{action}"
    stats = run(str(tmp_path / "in.jsonl"), str(out), cfg, report=False)
    texts = {s["json"]["id"].split("/")[-1]: s["txt"] for info in Manifest.load(str(out)).shards
             for s in iter_documents(str(out / info.name))}
    listed = [json.loads(line) for part in sorted((out / "decontaminated").glob("*.jsonl"))
              for line in part.read_text().splitlines()]
    return stats, texts, listed


def test_drop_finds_every_planted_passage_per_eval_set_and_nothing_else(tmp_path, corpus):
    stats, texts, listed = _run(tmp_path, "drop")
    total = stats["total"]
    assert total["filtered"] == {"decontam_qa": 5, "decontam_stories": 4, "decontam_summaries": 2} and total["balanced"]
    planted = {k for k, (_, s) in corpus.items() if s}
    assert set(texts) == set(corpus) - planted  # nothing else removed: clean documents and the 12-word near miss
    assert all(texts[k] == corpus[k][0] for k in texts)
    assert {r["id"].split("/")[-1]: (r["action"], list(r["eval_sets"])) for r in listed} == \
        {k: ("dropped", [corpus[k][1]]) for k in planted}


def test_cut_removes_only_the_matching_spans(tmp_path, corpus):
    stats, texts, listed = _run(tmp_path, "cut")
    total = stats["total"]
    assert total["filtered"] == {} and total["kept"] == len(corpus) and total["balanced"]
    assert total["decontaminated"] == {"qa": 5, "stories": 4, "summaries": 2}
    step = DecontamStep(DecontamConfig(eval_sets={"qa": str(tmp_path / "evals" / "qa.jsonl"),
                                                  "stories": str(tmp_path / "evals" / "stories.txt"),
                                                  "summaries": str(tmp_path / "evals" / "summaries.parquet")}))
    step.setup()
    for k, (text, eval_set) in corpus.items():
        if eval_set is None:
            assert texts[k] == text
        elif eval_set == "summaries":  # the passage opened the document: the sentence after it stays
            assert texts[k] == text.split(". ", 1)[1]
            assert step.apply(Doc(k, texts[k], "web")).listing is None
        else:  # the passage is gone, the sentences around it stay, and nothing matches any more
            assert len(texts[k].split("\n")) == 2 and texts[k].split("\n")[0] == text.split(". ")[0] + "."
            assert step.apply(Doc(k, texts[k], "web")).listing is None
    assert sorted(r["id"].split("/")[-1] for r in listed if r["action"] == "cut") == \
        sorted(k for k, (_, s) in corpus.items() if s)


def test_cut_spans_and_a_fully_matched_document():
    assert cut_spans("a b c d e", [(2, 3), (6, 7)]) == "a\nc\ne"
    assert cut_spans("a b", [(0, 3)]) == ""


def test_bad_eval_sets_are_refused_in_one_line(tmp_path):
    with pytest.raises(EvalSetError, match="no file matches; give a path"):
        eval_ngrams(str(tmp_path / "none*.jsonl"), 13)
    (tmp_path / "short.jsonl").write_text('{"q": "too short"}\n', encoding="utf-8")
    with pytest.raises(EvalSetError, match="no text has 13 words; lower decontam.ngram"):
        eval_ngrams(str(tmp_path / "short.jsonl"), 13)
    (tmp_path / "torn.jsonl").write_text('{"q": "a"}\n{"q": \n', encoding="utf-8")
    with pytest.raises(EvalSetError, match=r"torn.jsonl, line 2: not JSON"):
        eval_ngrams(str(tmp_path / "torn.jsonl"), 13)
    cfg = load_config(PipelineConfig, None, ["decontam.eval_sets={'a b': x.jsonl}"])
    with pytest.raises(ConfigError, match=r"decontam.eval_sets=\{'a b': 'x.jsonl'\}: use a mapping of names"):
        cfg.validate()
