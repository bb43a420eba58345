"""The fastText quality classifier (pipelines.stages.classifier): a tiny model trained here on
prose against spam, its scores on unseen documents, and a real Beam run that filters by it with
the score histogram in stats.json and the report (text and picture), the ledger exact."""
from __future__ import annotations

import json

import pytest

from colaflow.config import ConfigError
from pipelines.accounting.report import report_panels, report_png, report_text
from pipelines.config import ClassifierConfig, TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.classifier import ClassifierStep, score_bin
from pipelines.stages.tokenize import train_sentencepiece
from shards import Manifest, iter_documents
from tests.support.pipeline import synthetic_config

fasttext = pytest.importorskip("fasttext")

SUBJECTS = ["the committee", "our researchers", "the village council", "a small team", "the authors", "the teacher"]
ACTIONS = ["reviewed the annual report", "described a careful method", "explained the results clearly",
           "measured the temperature of the river", "wrote a history of the old mill", "compared two long surveys"]
SPAM = ["click here", "buy now", "cheap deals", "free prize", "win big", "limited offer", "subscribe today"]


def prose(i: int) -> str:
    return " ".join(f"{SUBJECTS[(i + k) % 6].capitalize()} {ACTIONS[(i * 5 + k) % 6]} in week {i}." for k in range(4))


def spam(i: int) -> str:
    return " ".join(f"{SPAM[(i + k) % 7].upper()}!!! {SPAM[(i * 3 + k) % 7]} {i}" for k in range(4))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("fasttext")
    lines = [f"__label__hq {prose(i)}" for i in range(200)] + [f"__label__lq {spam(i)}" for i in range(200)]
    (folder / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = fasttext.train_supervised(str(folder / "train.txt"), epoch=20, thread=1, seed=1, verbose=0)
    model.save_model(str(folder / "quality.bin"))
    return str(folder / "quality.bin")


def test_score_bins():
    assert [score_bin(s) for s in (0.0, 0.05, 0.1, 0.55, 0.99, 1.0)] == ["0.0", "0.0", "0.1", "0.5", "0.9", "0.9"]


def test_unseen_prose_scores_high_and_spam_low(model_path):
    step = ClassifierStep(ClassifierConfig(path=model_path))
    step.setup()
    assert all(step.score(prose(i)) > 0.9 for i in range(1000, 1010))
    assert all(step.score(spam(i)) < 0.1 for i in range(1000, 1010))
    kept = step.apply(Doc("a/1", prose(1000), "s"))
    assert kept.doc.text == prose(1000) and list(kept.events) == [f"quality_score:{score_bin(step.score(prose(1000)))}"]
    assert kept.doc.meta.quality_score == round(step.score(prose(1000)), 4) and kept.doc.meta.url is None
    assert step.apply(Doc("a/2", spam(1000), "s")).reason == "quality_classifier"
    off = ClassifierStep(ClassifierConfig())
    off.setup()
    assert off.apply(Doc("a/2", spam(1000), "s")).doc is not None  # no path: every document kept


def test_a_beam_run_filters_by_the_classifier_with_a_score_histogram(tmp_path, model_path):
    rows = [{"id": f"p{i}", "text": prose(i), "source": "web"} for i in range(1000, 1012)]
    rows += [{"id": f"s{i}", "text": spam(i), "source": "web"} for i in range(1000, 1005)]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    sample = ["alpha beta gamma"] * 50
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(sample, TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.classifier.path = model_path
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    stats = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    total = stats["total"]
    assert total["filtered"] == {"quality_classifier": 5} and total["kept"] == 12 and total["balanced"]
    assert sum(total["quality_scores"].values()) == 12 and set(total["quality_scores"]) == {"0.9"}
    assert "classifier score, kept documents:" in report_text(stats)
    assert report_panels(stats) == ["lengths", "removed", "scores"]
    assert report_png(stats).startswith(b"\x89PNG")
    out = tmp_path / "out"
    scores = {d["json"]["id"]: d["json"]["quality_score"] for info in Manifest.load(str(out)).shards
              for d in iter_documents(str(out / info.name))}  # each kept document's score, in its metadata
    step = ClassifierStep(cfg.classifier)
    step.setup()
    assert scores == {f"in.jsonl/p{i}": round(step.score(prose(i)), 4) for i in range(1000, 1012)}


@pytest.mark.parametrize("name, says", [("nope.bin", "nope.bin: no such file; give a fastText"),
                                        ("train.txt", "train.txt: not a fastText model")])
def test_a_missing_file_or_one_that_is_no_model_is_refused_before_the_run(tmp_path, name, says):
    (tmp_path / "in.jsonl").write_text('{"id": 1, "text": "hello"}\n', encoding="utf-8")
    (tmp_path / "train.txt").write_text("__label__hq some text\n", encoding="utf-8")  # fastText's training format
    cfg = synthetic_config()
    cfg.classifier.path = str(tmp_path / name)
    with pytest.raises(ConfigError, match=f"classifier.path=.*{says}"):
        run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert not (tmp_path / "out").exists()


def test_a_label_the_model_lacks_is_refused_before_the_run(tmp_path, model_path):
    """`classifier.label=hq` (without `__label__`) used to score every document 0 and filter all."""
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": 1, "text": prose(1)}) + "\n", encoding="utf-8")
    cfg = synthetic_config()
    cfg.classifier.path = model_path
    cfg.classifier.label = "hq"
    with pytest.raises(ConfigError, match=r"classifier.label=hq: .* no such label \(its labels: __label__(hq|lq), __label__(hq|lq)\)"):
        run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert not (tmp_path / "out").exists()
