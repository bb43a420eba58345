"""The document steps (pipelines.stages.step, pipelines.stages.filters): each step's reason on a
crafted document, the first-failing-rule order, and a step added to the list."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.testing.util import assert_that, equal_to

import pipelines.io.resume
from examples.demo.corpus import write_corpus
from pipelines.accounting.stats import EVENTS
from pipelines.config import CleanConfig, GopherQualityConfig, LanguageConfig, PIIConfig, PipelineConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.classifier import ClassifierStep
from pipelines.stages.clean import CleanTextStep, LengthStep, RawLengthStep
from pipelines.stages.decontam import DecontamStep
from pipelines.stages.filters import FilterFn, build_steps
from pipelines.stages.language import LanguageStep
from pipelines.stages.pii import RedactStep
from pipelines.stages.quality.c4 import C4Step
from pipelines.stages.quality.fineweb import FineWebStep
from pipelines.stages.quality.gopher import GopherQualityStep
from pipelines.stages.quality.repetition import RepetitionStep
from pipelines.stages.step import DocumentStep, StepResult, run_steps, run_steps_batch
from tests.support.pipeline import synthetic_config

FRENCH_SHORT = "Bonjour tout le monde, ceci est un texte."  # 41 characters, classified fr (0.996)
FRENCH = "Bonjour, ceci est un texte en français pour le test de la langue, merci beaucoup."
ENGLISH = "The quick brown fox jumps over the lazy dog and runs into the forest."


class RejectWord(DocumentStep):
    """Test-only step: rejects a document whose text holds ``word`` as ``has_<word>``."""

    def __init__(self, word: str):
        self.word = word

    def apply(self, doc: Doc) -> StepResult:
        """Reject when the text holds the word, else keep unchanged."""
        return StepResult.reject(f"has_{self.word}") if self.word in doc.text else StepResult.keep(doc)


def _doc(text: str) -> Doc:
    return Doc("f.jsonl/1", text, "src")


def test_raw_length_step_rejects_before_cleaning():
    step = RawLengthStep(CleanConfig(max_chars=5))
    assert step.apply(_doc("  abc  ")) == StepResult(None, "too_long")  # 7 raw characters, 3 once cleaned
    kept = _doc("abcde")
    assert step.apply(kept) == StepResult(kept, None, {}) and step.apply(kept).doc is kept


def test_clean_text_step_replaces_the_text_and_keeps_id_and_source():
    result = CleanTextStep(CleanConfig()).apply(_doc("Cafe\u0301 \x1b[31mred\x1b[0m  \r\n"))
    assert result == StepResult(Doc("f.jsonl/1", "Caf\u00e9 red", "src"))


@pytest.mark.parametrize("text, reason", [("", "empty"), ("\u200b\u00ad", "empty"), ("ab", "too_short"),
                                          ("abcdefghijk", "too_long"), ("abcd", None)])
def test_length_step_reasons(text, reason):
    result = LengthStep(CleanConfig(min_chars=3, max_chars=10)).apply(_doc(text))
    assert result.reason == reason and (result.doc is None) == (reason is not None)


def test_language_step_reasons_after_setup():
    step = LanguageStep(LanguageConfig(enabled=True, allowed=["en"], threshold=0.5))
    with pytest.raises(RuntimeError, match="before setup"):
        step.apply(_doc(ENGLISH))
    step.setup()
    assert step.apply(_doc(FRENCH)).reason == "lang_fr"
    assert step.apply(_doc("Exit.")).reason == "lang_unsure"  # la at 0.19
    assert step.apply(_doc(ENGLISH)) == StepResult(_doc(ENGLISH))
    off = LanguageStep(LanguageConfig(enabled=False))
    off.setup()
    assert off.apply(_doc(FRENCH)) == StepResult(_doc(FRENCH))


def test_quality_step_reasons():
    on = GopherQualityStep(GopherQualityConfig(min_words=5))
    assert on.apply(_doc("the and of")).reason == "quality_min_words"
    assert on.apply(_doc(ENGLISH)) == StepResult(_doc(ENGLISH))
    assert GopherQualityStep(GopherQualityConfig(), enabled=False).apply(_doc("the")) == StepResult(_doc("the"))
    assert GopherQualityStep(GopherQualityConfig(enabled=False)).apply(_doc("the")) == StepResult(_doc("the"))


def test_redact_step_counts_each_kind_and_keeps_the_document():
    result = RedactStep(PIIConfig()).apply(_doc("mail bob@example.org, host 10.0.0.1, or ann@example.org"))
    assert result.doc == Doc("f.jsonl/1", "mail <EMAIL>, host <IP>, or <EMAIL>", "src") and result.reason is None
    assert list(result.events.items()) == [("redacted:email", 2), ("redacted:ip", 1)]
    plain = _doc("nothing to see here")
    assert RedactStep(PIIConfig()).apply(plain) == StepResult(plain)
    assert RedactStep(PIIConfig(enabled=False)).apply(_doc("bob@example.org")).events == {}


def _cfg() -> PipelineConfig:
    cfg = synthetic_config()
    cfg.clean.min_chars = 60
    cfg.language.enabled = True
    cfg.language.allowed = ["en"]
    return cfg


def _set_up(steps):
    for step in steps:
        step.setup()
    return steps


def test_the_first_failing_rule_is_the_reason_and_later_steps_do_not_run():
    steps = _set_up(build_steps(_cfg()))
    assert [type(s) for s in steps] == [RawLengthStep, CleanTextStep, LengthStep, LanguageStep, GopherQualityStep,
                                        RepetitionStep, C4Step, FineWebStep, ClassifierStep, DecontamStep,
                                        RedactStep]
    assert run_steps(_doc(FRENCH_SHORT), steps) == StepResult(None, "too_short")  # too short and French: once
    assert run_steps(_doc(FRENCH), steps) == StepResult(None, "lang_fr")
    kept = run_steps(_doc(f"  {ENGLISH} Write to bob@example.org.  "), steps)
    assert kept == StepResult(_doc(f"{ENGLISH} Write to <EMAIL>."), None, {"redacted:email": 1})
    # events of a step are not counted for a document a later step rejects
    assert run_steps(_doc("bob@example.org forbidden"), [RedactStep(PIIConfig()), RejectWord("forbidden")]) == \
        StepResult(None, "has_forbidden")


class BatchSeen(DocumentStep):
    """Test-only step: keeps every document, recording the ids of each batch it is given."""

    def __init__(self):
        self.batches: list[list[str]] = []

    def apply(self, doc: Doc) -> StepResult:
        """Keep unchanged."""
        return StepResult.keep(doc)

    def apply_batch(self, docs):
        """Record the batch's ids; keep every document."""
        self.batches.append([d.id for d in docs])
        return [StepResult.keep(d) for d in docs]


def test_a_batch_gives_each_document_its_own_result_and_a_batching_step_the_survivors_at_once():
    steps = _set_up(build_steps(_cfg()))
    seen = BatchSeen()
    steps.insert(-1, seen)  # before PII redaction, as the classifier runs
    docs = [Doc(f"b/{i}", text, "src") for i, text in enumerate(
        [FRENCH_SHORT, f"  {ENGLISH} Write to bob@example.org.  ", FRENCH, ENGLISH, "bob@example.org"])]
    results = run_steps_batch(docs, steps)
    assert results == [run_steps(doc, steps) for doc in docs]
    assert [r.reason for r in results] == ["too_short", None, "lang_fr", None, "too_short"]
    assert results[1].events == {"redacted:email": 1}
    assert seen.batches[0] == ["b/1", "b/3"]  # one call with the documents every earlier step kept


def _check_filter(steps, docs, events: dict, kept: list[str]) -> None:
    """Run FilterFn(steps) over ``docs`` on the DirectRunner; check its summed events
    ``{(source, name): n}`` and the ids of the documents it kept."""
    with beam.Pipeline(runner=DirectRunner()) as p:
        out = p | beam.Create(docs) | beam.ParDo(FilterFn(steps)).with_outputs(EVENTS, main="docs")
        assert_that(out[EVENTS] | beam.CombinePerKey(sum), equal_to(list(events.items())), label="Events")
        assert_that(out.docs | beam.Map(lambda d: d.id), equal_to(kept), label="Kept")


DOCS = [Doc("a/1", FRENCH_SHORT, "fr"), Doc("a/2", FRENCH, "fr"), Doc("b/1", ENGLISH, "en"),
        Doc("b/2", f"{ENGLISH} Mail bob@example.org or ann@example.org.", "en"),
        Doc("b/3", f"{ENGLISH} It is forbidden.", "en"), Doc("b/4", "too short but forbidden", "en")]
EVENTS_WITHOUT = {("fr", "filtered:too_short"): 1, ("fr", "filtered:lang_fr"): 1, ("en", "filtered:too_short"): 1,
                  ("en", "redacted:email"): 2}


def test_filter_fn_counts_each_rejected_document_once_by_its_first_rule():
    _check_filter(build_steps(_cfg()), DOCS, EVENTS_WITHOUT, ["b/1", "b/2", "b/3"])


def test_a_step_added_to_the_list_changes_only_its_own_counter():
    steps = build_steps(_cfg())
    steps.insert(-1, RejectWord("forbidden"))  # before PII redaction
    # b/3 is rejected by the new step; b/4 stays too_short (an earlier rule), nothing else changes
    _check_filter(steps, DOCS, {**EVENTS_WITHOUT, ("en", "filtered:has_forbidden"): 1}, ["b/1", "b/2"])


def test_a_step_added_to_the_job_changes_only_its_counter_in_stats_json(tmp_path, monkeypatch):
    write_corpus(str(tmp_path / "in"), limit_per_source=60)
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size = 500
    cfg.shards.num_shards = 2
    glob = str(tmp_path / "in" / "*.jsonl")
    before = run(glob, str(tmp_path / "before"), cfg, report=False)
    # the job runs the document steps in its per-split Work stage (pipelines.io.resume.SplitWorkFn)
    monkeypatch.setattr(pipelines.io.resume, "build_steps", lambda c: build_steps(c) + [RejectWord("LORD")])
    after = run(glob, str(tmp_path / "after"), cfg, report=False)
    rejected = after["total"]["filtered"].get("has_LORD", 0)
    assert rejected > 0 and before["total"]["kept"] - after["total"]["kept"] == rejected
    for entry in ("input_records", "duplicates", "dead_letter", "dead_letter_reasons", "redactions"):
        assert after["total"][entry] == before["total"][entry], entry
    assert after["total"]["filtered"] == {**before["total"]["filtered"], "has_LORD": rejected}
    assert after["total"]["balanced"] and all(s["balanced"] for s in after["sources"].values())
