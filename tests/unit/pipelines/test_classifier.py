"""The quality classifier (pipelines.stages.classifier), for each kind of model: a tiny fastText
model and a tiny Hugging Face BERT classifier (built from a config, word-level tokenizer built
here: no downloads), both trained here on prose against spam; their scores on unseen documents,
and a real Beam run that filters by them with the score histogram in stats.json and the report
(text and picture), the ledger exact."""
from __future__ import annotations

import json

import pytest

from colaflow.config import ConfigError, load_config
from pipelines.accounting.report import report_panels, report_png, report_text
from pipelines.config import ClassifierConfig, PipelineConfig, TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.classifier import ClassifierStep, score_bin
from pipelines.stages.tokenize import train_sentencepiece
from shards import Manifest, iter_documents
from tests.support.hf import save_tiny_text_classifier
from tests.support.pipeline import synthetic_config

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
    fasttext = pytest.importorskip("fasttext")
    folder = tmp_path_factory.mktemp("fasttext")
    lines = [f"__label__hq {prose(i)}" for i in range(200)] + [f"__label__lq {spam(i)}" for i in range(200)]
    (folder / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = fasttext.train_supervised(str(folder / "train.txt"), epoch=20, thread=1, seed=1, verbose=0)
    model.save_model(str(folder / "quality.bin"))
    return str(folder / "quality.bin")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> str:
    """A tiny BERT sequence classifier with the labels ``hq`` and ``lq``, in a folder."""
    pytest.importorskip("torch")
    folder = str(tmp_path_factory.mktemp("hf_classifier"))
    texts, labels = [prose(i) for i in range(40)] + [spam(i) for i in range(40)], ["hq"] * 40 + ["lq"] * 40
    assert save_tiny_text_classifier(folder, texts, labels) == ["hq", "lq"]
    return folder


@pytest.fixture(params=["fasttext", "hf"])
def classifier(request) -> ClassifierConfig:
    """The ``classifier`` section of each kind of model (hf: batches of 4, so a run makes several)."""
    if request.param == "fasttext":
        return ClassifierConfig(path=request.getfixturevalue("model_path"))
    return ClassifierConfig(kind="hf", path=request.getfixturevalue("hf_model"), label="hq", batch_size=4)


def test_score_bins():
    assert [score_bin(s) for s in (0.0, 0.05, 0.1, 0.55, 0.99, 1.0)] == ["0.0", "0.0", "0.1", "0.5", "0.9", "0.9"]


def test_unseen_prose_scores_high_and_spam_low(classifier):
    step = ClassifierStep(classifier)
    step.setup()
    good, bad = step.scores([prose(i) for i in range(1000, 1010)]), step.scores([spam(i) for i in range(1000, 1010)])
    assert all(s > 0.9 for s in good) and all(s < 0.1 for s in bad)
    # scored together or one at a time: the same (hf: padding in a batch does not change a score)
    assert good == pytest.approx([step.scores([prose(i)])[0] for i in range(1000, 1010)], abs=1e-6)
    kept = step.apply(Doc("a/1", prose(1000), "s"))
    assert kept.doc.text == prose(1000) and list(kept.events) == [f"quality_score:{score_bin(good[0])}"]
    assert kept.doc.meta.quality_score == pytest.approx(good[0], abs=5e-5) and kept.doc.meta.url is None
    assert step.apply(Doc("a/2", spam(1000), "s")).reason == "quality_classifier"
    docs = [Doc("a/3", spam(1001), "s"), Doc("a/4", prose(1001), "s")]
    assert [r.reason for r in step.apply_batch(docs)] == ["quality_classifier", None]
    # hf: a text longer than the model's 64 positions is scored on its first tokens
    assert step.scores([" ".join(prose(i) for i in range(2000, 2010))])[0] > 0.9
    off = ClassifierStep(ClassifierConfig())
    off.setup()
    assert off.apply(Doc("a/2", spam(1000), "s")).doc is not None  # no path: every document kept


def test_a_beam_run_filters_by_the_classifier_with_a_score_histogram(tmp_path, classifier):
    rows = [{"id": f"p{i}", "text": prose(i), "source": "web"} for i in range(1000, 1012)]
    rows += [{"id": f"s{i}", "text": spam(i), "source": "web"} for i in range(1000, 1005)]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    sample = ["alpha beta gamma"] * 50
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(sample, TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.classifier = classifier
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
    want = step.scores([prose(i) for i in range(1000, 1012)])
    assert scores == pytest.approx({f"in.jsonl/p{i}": s for i, s in zip(range(1000, 1012), want)}, abs=5e-5)


@pytest.mark.parametrize("kind, name, says", [
    ("fasttext", "nope.bin", "nope.bin: no such file; give a fastText"),
    ("fasttext", "train.txt", "train.txt: not a fastText model"),
    ("hf", "train.txt", "train.txt: no Hugging Face model folder; give a local folder"),
])
def test_a_missing_file_or_one_that_is_no_model_is_refused_before_the_run(tmp_path, kind, name, says):
    if kind == "fasttext":
        pytest.importorskip("fasttext")
    (tmp_path / "in.jsonl").write_text('{"id": 1, "text": "hello"}\n', encoding="utf-8")
    (tmp_path / "train.txt").write_text("__label__hq some text\n", encoding="utf-8")  # fastText's training format
    cfg = synthetic_config()
    cfg.classifier.kind, cfg.classifier.path = kind, str(tmp_path / name)
    with pytest.raises(ConfigError, match=f"classifier.path=.*{says}"):
        run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind, label, labels", [("fasttext", "hq", r"__label__(hq|lq), __label__(hq|lq)"),
                                                  ("hf", "__label__hq", "hq, lq")])
def test_a_label_the_model_lacks_is_refused_before_the_run(tmp_path, request, kind, label, labels):
    """`classifier.label=hq` (without `__label__`) used to score every document 0 and filter all."""
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": 1, "text": prose(1)}) + "\n", encoding="utf-8")
    cfg = synthetic_config()
    cfg.classifier.kind, cfg.classifier.label = kind, label
    cfg.classifier.path = request.getfixturevalue("model_path" if kind == "fasttext" else "hf_model")
    with pytest.raises(ConfigError, match=rf"classifier.label={label}: .* no such label \(its labels: {labels}\)"):
        run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    assert not (tmp_path / "out").exists()


def test_an_unknown_kind_is_refused_naming_the_kinds():
    cfg = load_config(PipelineConfig, None, ["classifier.kind=onnx"])
    with pytest.raises(ConfigError, match="classifier.kind='onnx': use one of fasttext, hf"):
        cfg.validate()
