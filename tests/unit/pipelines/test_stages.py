"""Unit tests of the pure pipeline pieces: parsing, cleaning, dedup keeper, PII, MinHash, stats."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.stages.clean import clean_text, content_hash, dedup_text, hash_fraction, length_reason, stable_bucket
from pipelines.config import CleanConfig, DedupConfig, InputConfig, PIIConfig, TokenizerConfig
from pipelines.stages.near_dedup import band_keys, minhash, similarity
from pipelines.stages.pii import redact
from pipelines.io.reading import iter_units
from pipelines.records import DeadLetter, Doc, file_format, file_stem, parse_unit
from pipelines.accounting.stats import RUN_SOURCE, aggregate
from pipelines.stages.tokenize import SmallestHashSample, token_dtype
from pipelines.stages.exact_dedup import KeepSmallestId
from pipelines.stages.keys import doc_keys
from tests.support.paths import REPO

CLEAN = CleanConfig()
INPUT = InputConfig()


def test_clean_text_normalises_and_strips():
    assert clean_text("Cafe\u0301", CLEAN) == "Caf\u00e9"  # NFC composes e + combining acute
    assert clean_text("\x1b[31mred\x1b[0m text", CLEAN) == "red text"
    assert clean_text("a\x00b\x07c\ufeff", CLEAN) == "abc"
    assert clean_text("  line one  \r\nline two\t\r\n\n", CLEAN) == "line one\nline two"
    assert clean_text("tab\tkept", CLEAN) == "tab\tkept"
    assert clean_text(" \t\n \r\n", CLEAN) == ""


def test_length_reasons():
    cfg = CleanConfig(min_chars=3, max_chars=5)
    assert length_reason("", cfg) == "empty"
    assert length_reason("ab", cfg) == "too_short"
    assert length_reason("abcdef", cfg) == "too_long"
    assert length_reason("abcd", cfg) is None


def test_content_hash_ignores_case_and_whitespace():
    assert dedup_text("  Exeunt\n  OMNES. ") == "exeunt omnes."
    assert content_hash("Exeunt omnes.") == content_hash("EXEUNT\tomnes.")
    assert content_hash("Exeunt.") != content_hash("[Exeunt.]")
    assert len(content_hash("x")) == 32
    assert 0.0 <= hash_fraction(content_hash("x")) < 1.0


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_clean_is_idempotent(text):
    once = clean_text(text, CLEAN)
    assert clean_text(once, CLEAN) == once
    assert "\x00" not in once and "\x1b" not in once


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1), st.integers(min_value=1, max_value=50))
def test_stable_bucket_in_range_and_repeatable(key, n):
    assert 0 <= stable_bucket(key, n) < n
    assert stable_bucket(key, n) == stable_bucket(key, n)


def _combine(fn, items, split):
    """Run a CombineFn over two partial accumulators, as a distributed runner would."""
    accs = [fn.create_accumulator(), fn.create_accumulator()]
    for i, x in enumerate(items):
        accs[i < split] = fn.add_input(accs[i < split], x)
    return fn.extract_output(fn.merge_accumulators(accs))


def test_keeper_is_smallest_id_whatever_the_partitioning():
    docs = [key for key, _ in doc_keys([Doc("b/2", "Exit.", "s1"), Doc("a/9", "exit.", "s2"), Doc("c/1", "EXIT.", "s1")],
                                       "s0", 0, DedupConfig(near=False))]
    for split in range(4):
        keeper, counts, members = _combine(KeepSmallestId(), docs, split)
        assert keeper == docs[1]
        assert counts == {"s1": 2, "s2": 1}
        assert members == [("a/9", "s2"), ("b/2", "s1"), ("c/1", "s1")]
        assert _combine(KeepSmallestId(list_max=2), docs, split)[2] is None  # a hot key lists nothing


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=60), st.integers(0, 60),
       st.integers(1, 400))
def test_tokenizer_sample_is_partition_independent(texts, split, budget):
    items = [(content_hash(t), t) for t in texts]
    fn = SmallestHashSample(budget)
    expected, used = [], 0
    for _, text in sorted(set(items)):  # reference: hash-ordered prefix within the budget (at least one text)
        if expected and used + len(text.encode()) > budget:
            break
        expected.append(text)
        used += len(text.encode())
    assert _combine(fn, items, split) == expected


def test_parse_unit_hostile_inputs():
    def parse(raw, fmt="jsonl", cfg=INPUT):
        return parse_unit("gs://b/in/web.jsonl.gz", 7, raw, fmt, cfg)

    assert parse(b'{"id": "x", "text": "hi", "source": "s"}') == Doc("web.jsonl.gz/x", "hi", "s")
    assert parse(b'{"text": "hi"}') == Doc("web.jsonl.gz#00000007", "hi", "web")
    cases = {
        b'{"id": "x", "text": "caf\xe9"}': "not_utf8",
        b'{"id": "x", "text": "trunc': "bad_json",
        b"\x00\x01\x02binary": "bad_json",
        b"[1, 2]": "not_object",
        b'{"id": "x", "body": "hi"}': "missing_text",
        b'{"id": "x", "text": 5}': "text_not_string",
        b"   ": "blank_line",
    }
    for raw, reason in cases.items():
        dead = parse(raw)
        assert isinstance(dead, DeadLetter) and dead.reason == reason, raw
        assert (dead.file, dead.line, dead.source) == ("gs://b/in/web.jsonl.gz", 7, "web")
        assert json.loads(dead.to_json())["reason"] == reason
    null, absent = parse(b'{"id": "x", "text": null}'), parse(b'{"id": "x", "body": "hi"}')
    assert (null.reason, null.error) == ("missing_text", "'text' is null")  # not "no 'text' field (fields: id, text)"
    assert (absent.reason, absent.error) == ("missing_text", "no 'text' field (fields: body, id)")
    assert parse(b'{"id": 1, "body": "hi"}', cfg=InputConfig(text_field="body")) == Doc("web.jsonl.gz/1", "hi", "web")
    assert parse(b"plain paragraph", fmt="text") == Doc("web.jsonl.gz#00000007", "plain paragraph", "web")
    assert parse_unit("gs://b/in/sub/web.jsonl", 0, b'{"id": "a#1%", "text": "t"}', "jsonl", INPUT, 120,
                      name="sub/web.jsonl").id == "sub/web.jsonl/a%231%25"  # '#' only ever separates


def test_units_and_formats():
    def units(data, fmt, cfg=INPUT):
        return [(u[1], u[2], u[3], u[5]) for u in iter_units(io.BytesIO(data), "f", fmt, cfg)]

    assert units(b'{"a":1}\r\n{"b":2}\n{"c"', "jsonl") == [
        (1, 0, b'{"a":1}', 9), (2, 9, b'{"b":2}', 8), (3, 17, b'{"c"', 4)]
    assert units(b"p1 l1\np1 l2\n\n \n\np2\n", "text") == [(1, 0, b"p1 l1\np1 l2", 12), (6, 16, b"p2", 3)]
    assert units(b"a\nb\n%\nc\n%\n", "text", InputConfig(separator="%")) == [(1, 0, b"a\nb", 4), (4, 6, b"c", 2)]
    assert file_stem("/x/kjv.jsonl.gz") == "kjv" and file_stem("s3://b/a.txt") == "a"
    assert file_format("a.jsonl.zst", INPUT) == "jsonl" and file_format("a.txt.gz", INPUT) == "text"
    assert file_format("a.txt", InputConfig(format="jsonl")) == "jsonl"
    assert [file_format(p, INPUT) for p in ("README.md", "t.csv", "m.json", "noext")] == [None] * 4
    assert file_format("README.md", InputConfig(unknown_files="text")) == "text"


def test_pii_redaction():
    text, counts = redact("Mail ann.lee+x@mail.example.org or call +44 20 7946 0958, host 192.168.1.20 "
                          "and 2001:db8::8a2e:370:7334; (555) 123-4567. Act 3.1.2 and 10:30.", PIIConfig())
    assert text == "Mail <EMAIL> or call <PHONE>, host <IP> and <IP>; <PHONE>. Act 3.1.2 and 10:30."
    assert counts == {"email": 1, "ip": 2, "phone": 2}
    assert redact("a@b.co", PIIConfig(enabled=False)) == ("a@b.co", {})
    assert redact("999.999.1.1 is not an address", PIIConfig()) == ("999.999.1.1 is not an address", {})


def test_minhash_similarity():
    cfg = DedupConfig(num_perm=112, bands=14, ngram=3)
    words = [f"w{i}" for i in range(200)]
    a = minhash(" ".join(words), cfg)
    b = minhash(" ".join(words[:-2] + ["x", "y"]), cfg)
    c = minhash(" ".join(reversed(words)), cfg)
    assert a.dtype == np.uint32 and a.shape == (112,)
    assert np.array_equal(a, minhash(" ".join(words), cfg))
    assert similarity(a, b) > 0.85 and similarity(a, c) < 0.2
    assert len(band_keys(a, 14)) == 14 and len(set(band_keys(a, 14)) & set(band_keys(b, 14))) > 0


def test_token_dtype_and_config_defaults():
    assert token_dtype(4096) == np.uint16 and token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    assert TokenizerConfig().vocab_size == 4096


def test_stats_aggregate_balances():
    events = [(("a", "input"), 10), (("a", "kept"), 5), (("a", "duplicate"), 2), (("a", "filtered:empty"), 1),
              (("a", "dead:bad_json"), 2), (("b", "input"), 1), (("b", "kept"), 1), (("a", "redacted:email"), 3)]
    stats = aggregate(events)
    assert stats["total"]["input_records"] == 11 and stats["total"]["kept"] == 6
    assert stats["sources"]["a"]["dead_letter_reasons"] == {"bad_json": 2}
    assert stats["sources"]["a"]["redactions"] == {"email": 3}
    assert stats["total"]["balanced"] and stats["sources"]["b"]["balanced"]
    assert not aggregate([(("a", "input"), 2), (("a", "kept"), 1)])["total"]["balanced"]
    assert stats["run"] == {"near_unresolved_pairs": 0}


def test_run_level_events_count_in_the_run_section_only():
    stats = aggregate([(("a", "input"), 1), (("a", "kept"), 1), ((RUN_SOURCE, "near_unresolved"), 3)])
    assert stats["run"] == {"near_unresolved_pairs": 3} and list(stats["sources"]) == ["a"]
    assert stats["total"]["balanced"] and stats["total"]["input_records"] == 1
    with pytest.raises(ValueError, match="unknown run-level event name 'kept'"):
        aggregate([((RUN_SOURCE, "kept"), 1)])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
                     st.sampled_from(["id", "text", "source", "x"]),
                     st.one_of(st.none(), st.integers(), st.text(max_size=30), st.lists(st.integers())))),
                 ), st.sampled_from(["jsonl", "text"]))
def test_parse_never_raises(raw, fmt):
    parsed = parse_unit("in.jsonl", 3, raw, fmt, INPUT)
    assert isinstance(parsed, (Doc, DeadLetter))
    if isinstance(parsed, Doc):
        assert isinstance(parsed.text, str) and parsed.id and parsed.source
        clean_text(parsed.text, CLEAN)
    else:
        json.loads(parsed.to_json())


def test_yaml_config_mirrors_defaults_and_overrides():

    from pipelines.config import PipelineConfig
    from colaflow.config import load_config

    path = REPO / "configs" / "pipeline.yaml"
    assert load_config(PipelineConfig, str(path)) == PipelineConfig()
    cfg = load_config(PipelineConfig, str(path), ["tokenizer.vocab_size=8192", "dedup.near=false"])
    assert cfg.tokenizer.vocab_size == 8192 and cfg.dedup.near is False


def test_defaults_are_finewebs_curation():
    """Issue 35: the default run applies FineWeb's rules (Gopher quality and repetition, C4 without
    its terminal-punctuation rule and bad words, FineWeb's own) and MinHash near dedup with its settings."""
    from pipelines.config import PipelineConfig

    cfg = PipelineConfig()
    q = cfg.quality
    assert q.enabled and q.gopher.enabled and q.repetition.enabled and q.c4.enabled and q.fineweb.enabled
    assert q.c4.terminal_punct is False and q.c4.bad_words is None
    assert (cfg.dedup.near, cfg.dedup.ngram, cfg.dedup.num_perm, cfg.dedup.bands) == (True, 5, 112, 14)
