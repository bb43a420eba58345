"""`python -m shards` commands: ls, inspect (with a sentencepiece tokenizer), stats, index, reshard, cat."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from shards import Manifest, ShardSequenceWriter, encode_text_sample, escape_key, iter_samples
from shards.tools.cli import main
from tests.support.paths import REPO

ROOT = str(REPO)
LINES = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
         "all that glitters is not gold", "to be or not to be that is the question"] * 20


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Six documents tokenised with a tiny sentencepiece model named in the manifest."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("ds")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES), model_writer=model, vocab_size=60,
                                   model_type="bpe", minloglevel=2)
    (d / "tok.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    w = ShardSequenceWriter(str(d), max_samples=4)
    for i, line in enumerate(LINES[:6]):
        ids = np.array(sp.encode(line), dtype=np.uint16)
        w.write(escape_key(f"doc.{i}"), encode_text_sample(ids, {"id": f"doc.{i}"}, text=line), len(ids))
    Manifest(shards=w.close(), tokenizer="tok.model", vocab_size=60).save(str(d))
    return d


def run(capsys, *args) -> tuple[int, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_ls(dataset, capsys):
    rc, out = run(capsys, "ls", dataset)
    assert rc == 0 and "shard-000000.tar  samples=4" in out and "2 shards, 6 samples" in out
    rc, out = run(capsys, "ls", dataset / "shard-000001.tar")
    assert rc == 0 and "doc%2E4.json" in out and "doc%2E5.txt.zst" in out


def test_inspect_detokenises_with_the_manifest_tokenizer(dataset, capsys):
    rc, out = run(capsys, "inspect", dataset / "shard-000000.tar", "-n", "2")
    assert rc == 0 and out.count("== doc%2E") == 2
    assert f"tokens (detokenised): {LINES[1]!r}" in out and '"id": "doc.1"' in out
    rc, out = run(capsys, "inspect", dataset / "shard-000001.tar", "--at", "1", "--tokenizer", dataset / "tok.model")
    assert rc == 0 and "== doc%2E5" in out and LINES[5] in out


def test_stats(dataset, capsys):
    total = Manifest.load(str(dataset)).total_tokens
    rc, out = run(capsys, "stats", dataset)
    assert rc == 0 and "shards: 2  samples: 6" in out and f"tokens: {total} " in out


def test_reshard_keeps_samples_and_verifies(dataset, tmp_path, capsys):
    out_dir = tmp_path / "re"
    rc, out = run(capsys, "reshard", dataset, "--out", out_dir, "--max-samples", "1", "-q")
    assert rc == 0 and "wrote 6 shards, 6 samples" in out
    m = Manifest.load(str(out_dir))
    assert (out_dir / m.tokenizer).resolve() == (dataset / "tok.model").resolve()
    assert m.total_tokens == Manifest.load(str(dataset)).total_tokens
    before = [s["__key__"] for p in sorted(dataset.glob("*.tar")) for s in iter_samples(str(p))]
    after = [s["__key__"] for p in sorted(out_dir.glob("*.tar")) for s in iter_samples(str(p))]
    assert before == after
    assert run(capsys, "verify", "-q", out_dir)[0] == 0
    rc, out = run(capsys, "reshard", dataset, "--out", tmp_path / "x")
    assert rc == 2 and "--max-samples" in out


def test_index_writes_wids_and_dali_files(dataset, tmp_path, capsys):
    out = tmp_path / "idx.json"
    rc, _ = run(capsys, "index", dataset, "--out", out)
    assert rc == 0
    entry = json.loads(out.read_text())["shardlist"][0]
    assert entry["nsamples"] == 4 and (tmp_path / entry["url"]).resolve() == (dataset / "shard-000000.tar").resolve()
    assert (dataset / "shard-000000.idx").read_text().startswith("v1.2 4\n")


def test_cat_as_a_subprocess(dataset):
    shard = str(dataset / "shard-000000.tar")
    raw = subprocess.run([sys.executable, "-m", "shards", "cat", shard, "doc%2E2.txt.zst", "-d"],
                         capture_output=True, check=True, cwd=ROOT).stdout
    assert raw.decode() == LINES[2]
    bad = subprocess.run([sys.executable, "-m", "shards", "verify", "-q", str(dataset / "nope.tar")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and f"path not found: {dataset / 'nope.tar'}" in bad.stderr


@pytest.mark.parametrize("which", ["folder", "manifest"])
def test_inspect_a_dataset_inspects_its_first_shard(dataset, capsys, which):
    path = dataset if which == "folder" else dataset / "manifest.json"
    rc, out = run(capsys, "inspect", path, "-n", "1")
    assert rc == 0 and out.count("== doc%2E0") == 1 and "dataset of 2 shards" in out
    assert "colaflow shards ls" in out and "unpack" not in out


def test_verify_a_path_that_does_not_exist(tmp_path, capsys):
    rc, out = run(capsys, "verify", "-q", tmp_path / "nonexistent")
    assert rc == 1 and out.strip() == f"path not found: {tmp_path / 'nonexistent'}"


@pytest.mark.parametrize("limit", ["-1", "0"])
def test_inspect_limit_below_one_is_a_usage_error(dataset, capsys, limit):
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(dataset / "shard-000000.tar"), "--limit", limit])
    assert e.value.code == 2 and "must be 1 or more" in capsys.readouterr().err


def test_summaries_say_one_shard_and_group_thousands(tmp_path, capsys):
    """"1 shard, 1 sample, 1,500 tokens", not "1 shards, 1 samples, 1500 tokens"."""
    w = ShardSequenceWriter(str(tmp_path), max_samples=4)
    ids = (np.arange(1500) % 60).astype(np.uint16)
    w.write(escape_key("doc.0"), encode_text_sample(ids, {"id": "doc.0"}), len(ids))
    Manifest(shards=w.close(), vocab_size=60).save(str(tmp_path))
    rc, out = run(capsys, "ls", tmp_path)
    assert rc == 0 and "1 shard, 1 sample, 1,500 tokens, " in out
    rc, out = run(capsys, "verify", "-q", tmp_path)
    assert rc == 0 and "verified 1 shard (strict): 1 ok, 0 failed; 1 sample, 1,500 tokens" in out, out
    rc, out = run(capsys, "index", tmp_path)
    assert rc == 0 and "indexed 1 shard, 1 sample: " in out and "and 1 DALI .idx file beside the shard\n" in out
    rc, out = run(capsys, "reshard", tmp_path, "--out", tmp_path / "re", "--max-samples", "2", "-q")
    assert rc == 0 and "wrote 1 shard, 1 sample, 1,500 tokens to " in out


@pytest.mark.parametrize("contents", ["empty", "previous-run"])
@pytest.mark.parametrize("command", ["verify", "ls"])
def test_a_folder_with_no_manifest_and_no_shard_is_an_error(tmp_path, capsys, command, contents):
    """Not "verified 0 shards: 0 ok, 0 failed" with exit 0: nothing to verify is a failure."""
    if contents == "previous-run":
        (tmp_path / ".previous-run").mkdir()
        (tmp_path / "notes.txt").write_text("mine")
    rc, out = run(capsys, command, *(["-q"] if command == "verify" else []), tmp_path)
    assert rc == 1 and out.count("\n") == 1 and f"no manifest.json (and no shard) in {tmp_path}" in out
    assert "beam_runner.py" in out and "verified" not in out and "0 shards" not in out


def test_ls_a_path_that_does_not_exist(tmp_path, capsys):
    for path in (tmp_path / "nonexistent", tmp_path / "nonexistent.tar"):
        rc, out = run(capsys, "ls", path)
        assert rc == 1 and out.strip() == f"path not found: {path}"


def test_shards_without_a_manifest_are_listed_and_verified(tmp_path, capsys):
    w = ShardSequenceWriter(str(tmp_path), max_samples=1)
    for i in range(2):
        ids = np.arange(3, dtype=np.uint16)
        w.write(escape_key(f"doc.{i}"), encode_text_sample(ids, {"id": f"doc.{i}"}), len(ids))
    w.close()
    assert not (tmp_path / "manifest.json").exists()
    rc, out = run(capsys, "ls", tmp_path)
    assert rc == 0 and "shard-000000.tar  (not in a manifest) file bytes=" in out
    assert "2 shards, 0 samples, 0 tokens, 0 bytes (2 shards not in a manifest, not counted;" in out
    rc, out = run(capsys, "verify", "-q", tmp_path)
    assert rc == 0 and "verified 2 shards (strict): 2 ok, 0 failed; 2 samples" in out, out


def test_verify_a_manifest_listing_no_shard_fails(tmp_path, capsys):
    Manifest(shards=[]).save(str(tmp_path))
    rc, out = run(capsys, "verify", "-q", tmp_path)
    assert rc == 1 and "no shard to verify" in out


def test_verify_prints_fault_counts_as_words_not_a_dict(tmp_path, capsys):
    w = ShardSequenceWriter(str(tmp_path), max_samples=4)
    w.write(escape_key("doc.0"), {"tokens.npy": b"not a numpy array", "json": b"{}"}, 3)
    Manifest(shards=w.close()).save(str(tmp_path))
    rc, out = run(capsys, "verify", "-q", "--lenient", tmp_path)
    summary = next(line for line in out.splitlines() if line.startswith("verified"))
    assert "faults: " in summary and "{" not in summary and "'" not in summary, summary
    kind, n = summary.split("faults: ")[1].split(", ")[0].split(" ")
    assert kind.isidentifier() and int(n) == 1, summary


def test_verify_help_describes_paths_schema_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["verify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    assert "Exit 0: all pass; 1: a fault, or nothing to verify; 2: usage error." in text
    assert "dataset folders (holding manifest.json" in text and "auto (default): text when" in text


def test_verify_fails_a_changed_tokenizer_and_inspect_refuses_a_smaller_one_and_notes_another(
        dataset, tmp_path, capsys):
    import shutil

    import sentencepiece as spm

    from pipelines.config import TokenizerConfig
    from pipelines.stages.tokenize import identity
    from shards.tokenizers import build, read

    d = tmp_path / "ds"
    shutil.copytree(dataset, d)
    tok = build(read(str(d / "tok.model")))
    manifest = Manifest.load(str(d))
    manifest.tokenizer_identity = identity(tok, TokenizerConfig(add_eos=False))
    manifest.save(str(d))
    assert run(capsys, "verify", d, "--quiet")[0] == 0
    (d / "tok.model").write_bytes((d / "tok.model").read_bytes() + b"\0")
    rc, out = run(capsys, "verify", d, "--quiet")
    assert rc == 1 and "2 ok, 0 failed" in out and "; the tokenizer failed its check" in out
    assert f"FAIL {d / 'tok.model'} changed since the shards were written" in out
    small = tmp_path / "small.model"
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES[:2] * 5), model_writer=model, vocab_size=30,
                                   model_type="bpe", minloglevel=2, hard_vocab_limit=False)
    small.write_bytes(model.getvalue())
    rc, out = run(capsys, "inspect", dataset / "shard-000000.tar", "-n", "1", "--tokenizer", small)
    assert rc == 0 and "tokens (detokenised): not shown: id " in out
    assert "ids, so it is not the tokenizer these shards were written with" in out
    other = tmp_path / "other.model"  # ids in range, but another tokenizer's: the text is said to be its reading
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES + [line.upper() for line in LINES]),
                                   model_writer=model, vocab_size=90, model_type="bpe", minloglevel=2)
    other.write_bytes(model.getvalue())
    (d / "tok.model").write_bytes(dataset.joinpath("tok.model").read_bytes())
    rc, out = run(capsys, "inspect", d / "shard-000000.tar", "-n", "1", "--tokenizer", other)
    assert rc == 0 and "tokens (detokenised): " in out
    assert (f"note: --tokenizer {other} is not the tokenizer these shards were written with (sha256 "
            f"{build(read(str(other))).file.sha256[:12]}..., the manifest says {tok.file.sha256[:12]}...)") in out
    rc, out = run(capsys, "inspect", d / "shard-000000.tar", "-n", "1", "--tokenizer", d / "tok.model")
    assert rc == 0 and "note:" not in out
