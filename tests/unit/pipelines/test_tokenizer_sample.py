"""The tokenizer sample in two steps (pipelines.stages.tokenize): a cutoff from hashes and sizes, then
the texts it admits. The sample must be the one SmallestHashSample gives over every text, and
no combine over the whole corpus may hold texts."""
from __future__ import annotations

import hashlib
import json
import os

import apache_beam as beam
import pytest
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.stages.clean import content_hash
from pipelines.config import TokenizerConfig
from pipelines.job import run
from pipelines.records import Doc
from pipelines.stages.tokenizer_sample import SampleCutoff, SmallestHashSample, sample_key, sample_text
from pipelines.stages.tokenize import build_model, train_byte_level_bpe, train_sentencepiece, trained_file
from shards.tokenizers import build
from tests.support.pipeline import synthetic_config


def _combine(fn, items, cuts):
    """``fn`` over ``items`` cut into partitions at the sorted positions ``cuts``, merged once."""
    bounds = [0] + sorted(c % (len(items) + 1) for c in cuts) + [len(items)]
    accs = []
    for lo, hi in zip(bounds, bounds[1:]):
        acc = fn.create_accumulator()
        for x in items[lo:hi]:
            acc = fn.add_input(acc, x)
        accs.append(fn.compact(acc))  # as Beam's lifted combine does before a partial is sent
    return fn.merge_accumulators(accs)


def _two_step(items, budget, fraction, cuts):
    """The job's sample: the limit from (hash, size) pairs, then the sample of the admitted texts."""
    limit = SampleCutoff(budget, fraction).extract_output(
        _combine(SampleCutoff(budget, fraction), [sample_key((h, Doc("i", t, "s"))) for h, t in items], cuts))
    admitted = [(h, t) for h, t in items if limit.admits(h, fraction)]
    sample = SmallestHashSample(budget, fraction)
    return sample.extract_output(_combine(sample, admitted, cuts[::-1])), admitted


# Case and spacing variants share a content hash (dedup_text casefolds and collapses spaces), so
# different texts with one hash, one size or both, and repeats of one text, are all common here.
TEXTS = st.text(alphabet="aAbB \u00e9", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXTS, min_size=0, max_size=40), st.integers(1, 60), st.sampled_from([1e-12, 0.3, 0.6, 1.0]),
       st.lists(st.integers(0, 40), max_size=4))
def test_two_step_sample_equals_the_sample_of_all_texts(texts, budget, fraction, cuts):
    items = [(content_hash(t), t) for t in texts]
    reference = SmallestHashSample(budget, fraction)
    expected = reference.extract_output(_combine(reference, items, []))
    sample, admitted = _two_step(items, budget, fraction, cuts)
    assert sample == expected
    # what the second step combines is the sample plus the other texts of its cutoff's hash
    assert len({h for h, _ in admitted} - {content_hash(t) for t in expected}) <= 1


def test_cutoff_partials_hold_one_compact_row_per_document_not_texts():
    fn = SampleCutoff(5000)
    docs = [Doc("i", f"text number {i} " * (1 + i % 9), "s") for i in range(3000)]
    acc = fn.compact(_combine(fn, [sample_key((content_hash(d.text), d)) for d in docs], [1000, 2000]))
    assert acc[0] == [] and acc[1].dtype.itemsize == 33 and not acc[1].dtype.hasobject
    assert 0 < acc[1]["size"].sum() <= 5000  # trimmed to the budget: 33 bytes per document it holds
    partial = fn.create_accumulator()
    for d in docs[:1000]:
        partial = fn.add_input(partial, sample_key((content_hash(d.text), d)))
    assert len(fn.compact(partial)[1]) < 1000 / 4


def test_job_combines_only_the_admitted_texts_and_trains_the_same_model():
    docs = [Doc(f"d{i}", f"document {i} says {'word ' * (i % 7)}about item {i * 37 % 101}", "s") for i in range(400)]
    cfg = TokenizerConfig(vocab_size=300, sample_max_bytes=2000)
    pairs = [(content_hash(d.text), d.text) for d in docs]
    reference = SmallestHashSample(cfg.sample_max_bytes, cfg.sample_fraction)
    expected = reference.extract_output(_combine(reference, pairs, []))
    with beam.Pipeline(runner=DirectRunner()) as p:
        hashed = p | beam.Create([(content_hash(d.text), d) for d in docs])
        model = build_model(hashed | beam.Map(sample_key), lambda limit: hashed | "Tokenizer/Select" >> beam.FlatMap(
            sample_text, limit, cfg.sample_fraction), cfg)
        select = next(t for t in p.transforms_stack[0].parts if t.full_label == "Tokenizer/Select")
        combined = select.outputs[None] | beam.combiners.Count.Globally()
        assert_that(combined, equal_to([len(expected) + 1]), label="CountAdmitted")
        assert_that(model, equal_to([trained_file(expected, cfg)]), label="SameModel")
    assert 0 < len(expected) < 60  # the budget takes a small share of the 400 documents


def test_two_step_sample_with_many_rows_per_partial():
    # more rows than a partial folds at once (8192), in 2 partials, with repeats and case variants
    texts = [f"{'Line' if i % 3 else 'line'} {i % 9000} of the corpus" for i in range(20000)]
    items = [(content_hash(t), t) for t in texts]
    reference = SmallestHashSample(40_000, 0.5)
    expected = reference.extract_output(_combine(reference, items, []))
    sample, admitted = _two_step(items, 40_000, 0.5, [10000])
    assert sample == expected and len(expected) > 1000
    assert len(expected) <= len(set(admitted)) <= len(expected) + 2  # + the texts of one hash: 'Line k', 'line k'


def test_a_first_text_larger_than_the_budget_is_the_sample_not_none(tmp_path):
    """The prefix used to stop before its first text when that text alone passed
    ``sample_max_bytes``: no sample, and the job failed with 'no document reached the tokenizer'."""
    texts = [f"a long document number {i} " * 8 for i in range(6)]
    items = [(content_hash(t), t) for t in texts]
    first = min(items)[1]
    for cuts in ([], [2], [1, 4]):
        sample, admitted = _two_step(items, 50, 1.0, cuts)
        assert sample == [first] and len(admitted) == 2  # the sample and the text that ended it
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                                               for i, t in enumerate(texts)))
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size, cfg.tokenizer.sample_max_bytes = 300, 50
    assert run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg)["total"]["kept"] == 6


def test_the_byte_level_bpe_is_the_same_file_at_any_thread_count(tmp_path):
    import subprocess
    import sys

    from tests.support.paths import REPO

    texts = [f"line {i} of the river that ran past {i % 7} old stone walls" for i in range(300)]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    code = ("import json,sys,hashlib; from pipelines.config import TokenizerConfig; "
            "from pipelines.stages.tokenize import train_byte_level_bpe; "
            f"t=json.load(open({str(tmp_path / 'texts.json')!r})); "
            "print(hashlib.sha256(train_byte_level_bpe(t, TokenizerConfig(vocab_size=400))).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "RAYON_NUM_THREADS": str(n),
                                                                 "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, check=True).stdout.split()[-1] for n in (1, 2)}
    assert digests == {hashlib.sha256(train_byte_level_bpe(texts, TokenizerConfig(vocab_size=400))).hexdigest()}


def test_a_tokenizer_read_up_front_is_the_one_the_job_uses_not_read_again(tmp_path):
    """The command line reads ``--tokenizer`` once (to refuse a bad one before the output folder is
    touched) and hands that file to the job: the job does not read the path a second time."""
    from pipelines.stages.tokenize import given_tokenizer
    from shards.format.manifest import Manifest

    texts = [f"line {i} of the river that ran past {i % 7} old stone walls" for i in range(60)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                                               for i, t in enumerate(texts)))
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(texts, TokenizerConfig(vocab_size=400)))
    cfg = synthetic_config()
    cfg.tokenizer.path = str(tmp_path / "tok.model")
    read_once = given_tokenizer(cfg.tokenizer)
    (tmp_path / "tok.model").write_bytes(train_sentencepiece(texts, TokenizerConfig(vocab_size=350)))  # changed since
    run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg, report=False, tokenizer=read_once)
    manifest = Manifest.load(str(tmp_path / "out"))
    assert manifest.tokenizer_identity.sha256 == read_once.sha256 and manifest.vocab_size == 400
    assert (tmp_path / "out" / "tokenizer.model").read_bytes() == read_once.data


@pytest.mark.parametrize("kind", ["sentencepiece", "hf"])
def test_a_tokenizer_smaller_than_asked_for_says_so(kind, capsys):
    """A new user asked for 4,096 pieces, got 565 from a small corpus, and was told nothing."""
    texts = [f"the cat sat on mat number {i % 7}" for i in range(50)]
    file = trained_file(texts, TokenizerConfig(kind=kind, vocab_size=4096))
    got = build(file).vocab_size
    assert got < 4096
    assert f"note: the trained tokenizer has {got:,} pieces, fewer than tokenizer.vocab_size=4,096" \
        in capsys.readouterr().err
    trained_file(texts, TokenizerConfig(kind=kind, vocab_size=got))
    assert "note:" not in capsys.readouterr().err
