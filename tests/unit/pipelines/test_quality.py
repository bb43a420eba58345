"""The quality rules (pipelines.stages.quality): each rule's reason on small hand-made texts, kept
and rejected, the C4 line filter's output text, n-gram fractions against a plain-Python count
(hypothesis), and the ledger on a real Beam run with every quality step on."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colaflow.config import ConfigError, load_config
from pipelines.accounting.report import report_text
from pipelines.config import (C4Config, FineWebConfig, GopherQualityConfig, PipelineConfig, QualityConfig,
                              RepetitionConfig, TokenizerConfig)
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.quality import quality_steps
from pipelines.stages.quality.c4 import C4Step, bad_words_pattern, c4_filter, count_sentences
from pipelines.stages.quality.fineweb import FineWebStep
from pipelines.stages.quality.gopher import GopherQualityStep
from pipelines.stages.quality.repetition import RepetitionStep, dup_ngram_fraction, top_ngram_fraction
from pipelines.stages.quality.rules import TextView
from pipelines.stages.quality.word_lists import NAMED_LISTS, NamedList, word_list_path
from pipelines.stages.step import StepResult, run_steps
from pipelines.stages.tokenize import train_sentencepiece
from shards import Manifest, iter_documents
from tests.support.pipeline import synthetic_config

GOOD = """The river ran past the old stone walls and into a quiet valley below the hills.
Farmers there grew wheat and barley with care through every long and patient season.
In spring the children walked to school along the muddy road beside the water mill.
Each evening the baker sold warm bread to travellers who had come from distant towns.
Nobody in the village could remember a winter as cold as the one that had just passed.
Still, the people shared what they had and waited together for the thaw to come."""


def _reason(step, text: str) -> str | None:
    return step.apply(Doc("t/1", text, "s")).reason


def test_good_prose_passes_every_rule_unchanged():
    doc = Doc("t/1", GOOD, "s")
    assert run_steps(doc, quality_steps(QualityConfig(enabled=True))) == StepResult(doc)
    assert run_steps(doc, quality_steps(QualityConfig(enabled=False))) == StepResult(doc)  # off: nothing runs


LOW = GopherQualityConfig(min_words=5)


@pytest.mark.parametrize("cfg, text, reason", [
    (GopherQualityConfig(), "The cat sat on the mat.", "quality_min_words"),
    (GopherQualityConfig(max_words=20), GOOD, "quality_max_words"),
    (LOW, "the and of to a an is it by be", "quality_mean_word_len"),
    (LOW, "the incomprehensibilities of notwithstanding antidisestablishmentarianism", "quality_mean_word_len"),
    (LOW, "#the #cat #and #dog #sat #to #be #with #that #of", "quality_hash_ratio"),
    (LOW, "the cat... and the dog... sat to be with that of", "quality_ellipsis_ratio"),
    (LOW, "the and of to 123 456 789 1011 1213 1415", "quality_alpha_words"),
    (LOW, "banana apple cherry melon grape kiwi", "quality_stop_words"),
    (LOW, "\n".join(f"• the apple and the pear and the plum number {i}" for i in range(10)), "quality_bullet_lines"),
    (LOW, "\n".join(f"the apple and the pear and the plum number {i}{'…' if i < 3 else '.'}" for i in range(5)),
     "quality_ellipsis_lines"),
])
def test_gopher_quality_rules(cfg, text, reason):
    assert _reason(GopherQualityStep(cfg), text) == reason


def test_hash_and_ellipsis_ratios_have_their_own_thresholds():
    # 0.08 '#' and 0.08 ellipses per word: each under 0.1 (the old summed count, 0.16, rejected it)
    words = GOOD.split()[:50]
    for i in (0, 12, 24, 36):
        words[i] = "#" + words[i]
        words[i + 6] = words[i + 6] + "..."
    text = " ".join(words)
    assert _reason(GopherQualityStep(GopherQualityConfig()), text) is None
    assert _reason(GopherQualityStep(GopherQualityConfig(max_hash_ratio=0.05)), text) == "quality_hash_ratio"
    assert _reason(GopherQualityStep(GopherQualityConfig(max_ellipsis_ratio=0.05)), text) == "quality_ellipsis_ratio"


LINES = GOOD.split("\n")
LONG = " ".join(LINES)  # one paragraph of one line, 85 words


@pytest.mark.parametrize("text, reason", [
    ("\n\n".join([LINES[0], LINES[1], LINES[0], LINES[0]]), "quality_dup_paragraphs"),  # 2 of 4
    ("\n\n".join([LONG, "A short one.", "Another.", "A third.", LONG]), "quality_dup_paragraph_chars"),  # 1 of 5
    ("\n".join([LINES[0], LINES[1], LINES[0], LINES[0]]), "quality_dup_lines"),
    ("\n".join([LONG, "A short one.", "Another.", "A third.", LONG]), "quality_dup_line_chars"),
    (" ".join(f"of course w{i}" for i in range(20)), "quality_top_2gram"),
    (GOOD, None),
])
def test_repetition_rules(text, reason):
    assert _reason(RepetitionStep(RepetitionConfig()), text) == reason


def test_ngram_fractions_and_their_reasons():
    view = TextView("a b c a b c a b d")  # 9 one-letter words, 17 characters
    assert top_ngram_fraction(view, 2) == pytest.approx(6 / 17)  # "a b" three times
    assert top_ngram_fraction(view, 3) == pytest.approx(6 / 17)  # "a b c" (or "b c a"...) twice
    assert top_ngram_fraction(TextView("a b c d"), 2) == 0.0  # nothing occurs twice
    assert dup_ngram_fraction(view, 3) == pytest.approx(5 / 17)  # repeats start at words 3, 4, 5: words 3-7
    assert dup_ngram_fraction(view, 6) == 0.0
    assert dup_ngram_fraction(TextView("x y"), 5) == 0.0
    assert top_ngram_fraction(view, 4) == pytest.approx(8 / 17)  # "a b c a" twice
    for n in (2, 3, 4):  # each size has its own threshold
        cfg = RepetitionConfig(max_top_ngram={n: 0.3}, max_dup_ngram={})
        assert _reason(RepetitionStep(cfg), view.text) == f"quality_top_{n}gram"
        assert _reason(RepetitionStep(RepetitionConfig(max_top_ngram={n: 0.5}, max_dup_ngram={})), view.text) is None
    cfg = RepetitionConfig(max_top_ngram={}, max_dup_ngram={5: 1.0, 3: 0.25})
    assert _reason(RepetitionStep(cfg), view.text) == "quality_dup_3gram"
    # a sentence said twice in 85 words: its 5- to 10-grams repeat, over each size's threshold
    twice = LONG + " " + " ".join(LONG.split()[:24])
    assert dup_ngram_fraction(TextView(twice), 5) > 0.15
    assert _reason(RepetitionStep(RepetitionConfig(max_top_ngram={})), twice) == "quality_dup_5gram"


def _naive_fractions(words: list[str], n: int) -> tuple[float, float]:
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    total = len(" ".join(words))
    counts = Counter(grams)
    top = max((c * sum(map(len, g)) for g, c in counts.items() if c == max(counts.values()) and c > 1), default=0)
    seen, covered = set(), set()
    for i, g in enumerate(grams):
        if g in seen:
            covered.update(range(i, i + n))
        seen.add(g)
    return (top / total if total else 0.0), (sum(len(words[i]) for i in covered) / total if total else 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "bb", "ccc", "a.", "dd"]), max_size=40), st.integers(1, 6))
def test_ngram_fractions_match_a_plain_count(words, n):
    view = TextView(" ".join(words))
    top, dup = _naive_fractions(words, n)
    assert top_ngram_fraction(view, n) == pytest.approx(top)
    assert dup_ngram_fraction(view, n) == pytest.approx(dup) and 0.0 <= dup <= 1.0
    grams, naive = view.ngrams(n), [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    assert sorted(grams.counts) == sorted(Counter(naive).values())
    assert all((grams.ids[i] == grams.ids[j]) == (naive[i] == naive[j]) for i in range(len(naive)) for j in range(i))
    assert [naive.index(g) for g in naive] == [int(grams.first[k]) for k in grams.ids]


PAGE = f"""{LINES[0]}
Home
Please enable JavaScript in your browser to view this site.

{LINES[1]}
   {LINES[2]}
By using this site you agree to our privacy policy and terms of use.
main() {{

{LINES[3]}
{LINES[4]}"""


def test_c4_line_filter_keeps_the_rest_of_the_document():
    out = c4_filter(PAGE, C4Config())
    assert out.reason is None
    assert out.text == f"{LINES[0]}\n\n{LINES[1]}\n   {LINES[2]}\n\n{LINES[3]}\n{LINES[4]}"
    assert out.lines_removed == {"c4_short_line": 2, "c4_javascript": 1, "c4_policy": 1}
    result = C4Step(C4Config()).apply(Doc("p/1", PAGE, "web"))
    assert result == StepResult(Doc("p/1", out.text, "web"), None, {"lines_removed:c4_short_line": 2,
                                                                    "lines_removed:c4_javascript": 1,
                                                                    "lines_removed:c4_policy": 1})
    assert C4Step(C4Config()).apply(Doc("g/1", GOOD, "s")) == StepResult(Doc("g/1", GOOD, "s"))
    assert C4Step(C4Config(), enabled=False).apply(Doc("p/1", PAGE, "web")) == StepResult(Doc("p/1", PAGE, "web"))


def test_c4_terminal_punctuation_and_long_words():
    text = "\n".join([*LINES[:5], "A heading without any final mark", "He said it all, “and then he left.”",
                      "And so the story trails off...", "A " + "x" * 30 + " word."])
    out = c4_filter(text, C4Config(terminal_punct=True, max_word_len=20))
    assert out.text == "\n".join([*LINES[:5], "He said it all, “and then he left.”"])
    assert out.lines_removed == {"c4_no_terminal_punct": 2, "c4_long_word": 1}
    assert c4_filter(text, C4Config()).text == text  # off by default (FineWeb)


@pytest.mark.parametrize("cfg, text, reason", [
    (C4Config(), GOOD + "\nLorem ipsum dolor sit amet, consectetur.", "quality_c4_lorem_ipsum"),
    (C4Config(), GOOD + "\nThe function returns { x } to the caller.", "quality_c4_curly_brace"),
    (C4Config(), "\n".join(LINES[:4]), "quality_c4_few_sentences"),  # 4 sentences
    (C4Config(min_sentences=0), "Home\nAbout us\nJavaScript is required here.", "quality_c4_no_lines"),
    (C4Config(curly_brace=False), GOOD + "\nThe function returns { x } to the caller.", None),
    # a brace in a removed line does not drop the page (C4 tests the lines it keeps)
    (C4Config(), GOOD + "\nif(x) {\nEnable javascript: function f() { return 1; }", None),
])
def test_c4_document_rules(cfg, text, reason):
    assert _reason(C4Step(cfg), text) == reason


def test_c4_bad_words_drop_a_document_holding_a_listed_word_in_a_kept_line(tmp_path):
    (tmp_path / "words.txt").write_text("barley\nstone walls\n\nzz-top\n", encoding="utf-8")
    cfg = C4Config(bad_words=str(tmp_path / "words.txt"))
    step = C4Step(cfg)
    step.setup()
    assert _reason(step, GOOD) == "quality_c4_bad_words"  # "barley", and "stone walls" as a phrase
    assert _reason(step, GOOD.replace("barley", "BARLEY")) == "quality_c4_bad_words"  # case ignored
    clean = GOOD.replace("barley", "barleycorn").replace("stone walls", "stone wall")
    assert _reason(step, clean) is None  # whole words only
    # in a line C4 removes, a listed word does not drop the page
    assert _reason(step, clean + "\nEnable javascript for barley.") is None
    assert _reason(step, clean + "\nWe sell zz-top here every day.") == "quality_c4_bad_words"
    with pytest.raises(RuntimeError, match="before setup"):
        C4Step(cfg).apply(Doc("t/1", GOOD, "s"))
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="the list holds no word; give one word"):
        bad_words_pattern(str(tmp_path / "empty.txt"))
    with pytest.raises(ConfigError, match=r"quality.c4.bad_words=.*none.txt: no such file and no named list; give a word list"):
        bad_words_pattern(str(tmp_path / "none.txt"))


def test_c4_bad_words_from_the_named_better_profanity_list():
    """``quality.c4.bad_words=better-profanity`` reads the list inside the installed package."""
    path = word_list_path("better-profanity")
    with open(path, encoding="utf-8") as f:
        listed = [w.strip() for w in f if w.strip()]
    assert path.endswith("better_profanity/profanity_wordlist.txt") and len(listed) == 916  # 0.7.0, pinned
    word = next(w for w in listed if w.isalpha())  # taken from the list, not spelled in this file
    step = C4Step(C4Config(bad_words="better-profanity"))
    step.setup()
    assert _reason(step, GOOD) is None
    assert _reason(step, GOOD + f"\nThe old sign by the mill said {word} in large letters.") == "quality_c4_bad_words"


def test_a_bad_words_name_is_checked_where_the_setting_is_declared(tmp_path, monkeypatch):
    """An unknown name, or a named list whose package is missing, is one line saying what to give or install."""
    cfg = load_config(PipelineConfig, None, ["quality.c4.bad_words=ldnoobw"])
    with pytest.raises(ConfigError, match="quality.c4.bad_words=ldnoobw: no such file and no named list; give "
                                          "a word list .*, one of better-profanity, or null"):
        cfg.validate()
    monkeypatch.setitem(NAMED_LISTS, "gone", NamedList("colaflow_no_such_package", "w.txt", "gone-words"))
    cfg.quality.c4.bad_words = "gone"
    with pytest.raises(ConfigError, match="quality.c4.bad_words=gone needs the colaflow_no_such_package package: "
                                          "pip install gone-words"):
        cfg.validate()
    (tmp_path / "w.txt").write_text("barley\n", encoding="utf-8")
    cfg.quality.c4.bad_words = str(tmp_path / "w.txt")
    cfg.validate()  # a file
    cfg.quality.c4.bad_words = "better-profanity"
    cfg.validate()


def test_count_sentences():
    assert count_sentences("Hi. Bye.") == 2
    assert count_sentences("no mark at all") == 1
    assert count_sentences("Really?! Yes… “Quite.” Fine") == 4
    assert count_sentences("") == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["", "   ", *LINES, "Home", "Enable javascript now please.", "x = {1: 2}",
                                 "Read the cookie policy here.", "  indented but fine and long enough."]), max_size=12))
def test_c4_output_is_a_fixed_point_of_kept_lines(lines):
    text = "\n".join(lines)
    out = c4_filter(text, C4Config(min_sentences=1))
    if out.text is None:
        return
    kept = [line for line in out.text.split("\n") if line.strip()]
    assert kept == [line for line in lines if line in kept]  # the input's lines, in order
    assert c4_filter(out.text, C4Config(min_sentences=1)) == (out.text, None, {})


@pytest.mark.parametrize("cfg, text, reason", [
    (FineWebConfig(), "\n".join(f"A line of words that never ends with a mark {i}" for i in range(10)),
     "quality_fineweb_line_punct"),
    (FineWebConfig(), "\n".join(f"Line number {i} is short." for i in range(10)), "quality_fineweb_short_lines"),
    (FineWebConfig(), "\n".join([*LINES, LINES[2]]), "quality_fineweb_dup_line_chars"),  # 1 of 7 lines, 14 %
    (FineWebConfig(max_dup_line_chars=0.2), "\n".join([*LINES, LINES[2]]), None),
    (FineWebConfig(), "\n".join(f"Incomprehensibilities notwithstanding{i}." for i in range(10)),
     "quality_fineweb_newlines"),  # 9 newlines, 20 words
    (FineWebConfig(), GOOD, None),
])
def test_fineweb_rules(cfg, text, reason):
    assert _reason(FineWebStep(cfg), text) == reason


COLOURS = ["red", "blue", "green", "black", "white", "brown", "grey"]
ANIMALS = ["cats", "dogs", "birds", "fish", "mice", "goats", "sheep", "cows", "hens", "ducks", "bees"]
VERBS = ["sleep", "run", "swim", "fly", "eat", "sing", "hide", "jump", "dig", "climb", "rest", "play", "wait"]


def test_the_ledger_stays_exact_with_every_quality_step(tmp_path):
    """Input = kept + filtered + duplicates + dead letters on a real Beam run, per source and reason,
    with documents that each quality step keeps, changes or rejects."""
    docs = {"good": GOOD, "page": PAGE, "short": "Too short to keep.", "dups": "\n".join([LINES[0]] * 5),
            "lorem": GOOD + "\nLorem ipsum dolor sit amet, consectetur.",
            "list": "\n".join(f"{COLOURS[i % 7]} {ANIMALS[i % 11]} {VERBS[i % 13]}." for i in range(60)) + "\n" + GOOD}
    rows = [json.dumps({"id": k, "text": v, "source": "web" if k != "good" else "books"}) for k, v in docs.items()]
    rows += [json.dumps({"id": "again", "text": GOOD, "source": "books"}), '{"id": "broken", "text": ']
    (tmp_path / "in.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(["alpha beta gamma"] * 50, TokenizerConfig(vocab_size=300)))
    cfg = synthetic_config()
    cfg.quality.enabled = True  # near dedup stays off: PAGE holds GOOD's lines
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    cfg.shards.store_text = True
    stats = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False)
    web, books, total = stats["sources"]["web"], stats["sources"]["books"], stats["total"]
    assert web["filtered"] == {"quality_min_words": 1, "quality_dup_lines": 1, "quality_c4_lorem_ipsum": 1,
                               "quality_fineweb_short_lines": 1}
    assert web["kept"] == 1 and web["lines_removed"] == {"c4_javascript": 1, "c4_policy": 1, "c4_short_line": 2}
    assert books["kept"] == 1 and books["duplicates"] == 1
    assert total["input_records"] == 8 and total["dead_letter"] == 1
    assert all(e["balanced"] for e in (web, books, total, *stats["sources"].values()))
    assert "  c4_short_line                     2" in report_text(stats)
    out = tmp_path / "out"
    texts = {s["json"]["id"]: s["txt"] for info in Manifest.load(str(out)).shards
             for s in iter_documents(str(out / info.name))}
    assert texts["in.jsonl/page"] == c4_filter(PAGE, C4Config()).text and texts["in.jsonl/again"] == GOOD  # the smallest id of the two


@pytest.mark.parametrize("override, message", [
    ("quality.repetition.max_top_ngram={2: 1.5}", "quality.repetition.max_top_ngram={2: 1.5}: use a mapping"),
    ("quality.repetition.max_dup_ngram={five: 0.1}", "quality.repetition.max_dup_ngram={'five': 0.1}: use a mapping"),
    ("quality.fineweb.max_short_lines=2", r"quality.fineweb.max_short_lines=2.0: use a number in \[0.0, 1.0\]"),
    ("quality.gopher.min_stop_words=9", r"quality.gopher.min_stop_words=9: use a number in \[0, 8\]"),
])
def test_quality_settings_are_checked_naming_the_key(override, message):
    cfg = load_config(PipelineConfig, None, [override, "quality.enabled=true"])
    with pytest.raises(ConfigError, match=message):
        cfg.validate()
    assert load_config(PipelineConfig, None, ["quality.repetition.max_top_ngram={3: 0.1}"]).quality.repetition \
        .max_top_ngram == {3: 0.1}
