"""Bring your own tokenizer, end to end: the Beam job with a Hugging Face byte-level BPE trained here on
the bundled corpus (70,000 ids, so ``uint32`` tokens), tiktoken's ``cl100k_base`` (offline, 100,277
ids) and sentencepiece; the shards read back with tarfile + numpy as docs/shard-format.md describes;
every document's ids are its cleaned text's and end with EOS; ``transformers.AutoTokenizer`` loads each
shard folder and decodes as colaflow does; 20 training steps on each, the model's vocabulary taken from
the manifest; a tokenizer changed after the job is refused at training time; a byte-level BPE trained by
the pipeline itself."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import beam_runner
from examples.demo.corpus import kjv_records, shakespeare_records
from pipelines.config import CleanConfig
from pipelines.stages.clean import clean_text
from shards.tokenizers import build, read
from tests.support.paths import REPO
from tests.support.pipeline import SYNTHETIC

HF_VOCAB = 70_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The bundled corpus: every record trains the BPE; 300 of them are the job's input."""
    d = tmp_path_factory.mktemp("corpus")
    records = [r for r in list(shakespeare_records()) + list(kjv_records()) if r["text"].strip()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([r["text"] for r in records], trainers.BpeTrainer(
        vocab_size=HF_VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (d / "bpe").mkdir()
    tok.save(str(d / "bpe" / "tokenizer.json"))
    (d / "bpe" / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    picked = records[:150] + records[-150:]
    with open(d / "in.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in picked)
    return d, {f"in.jsonl/{r['id']}": r["text"] for r in picked}  # ids are prefixed with their file


def tokenizer_arg(kind: str, corpus_dir) -> list[str]:
    return {"hf": ["--tokenizer", str(corpus_dir / "bpe")], "tiktoken": ["--tokenizer", "cl100k_base"],
            "sentencepiece": ["tokenizer.vocab_size=1000"]}[kind]


@pytest.fixture(scope="module", params=["hf", "tiktoken", "sentencepiece"])
def job(request, corpus, tmp_path_factory):
    corpus_dir, texts = corpus
    out = tmp_path_factory.mktemp(f"shards-{request.param}") / "out"
    assert beam_runner.main(["--input", str(corpus_dir / "in.jsonl"), "--output", str(out),
                             *tokenizer_arg(request.param, corpus_dir), *SYNTHETIC]) == 0
    return request.param, out, texts


def read_documents(folder) -> dict[str, np.ndarray]:
    """id -> tokens of every document, read with tarfile, zstandard and numpy only (token blocks)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    docs = {}
    for shard in manifest["shards"]:
        with tarfile.open(folder / shard["name"]) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name in sorted(n for n in members if n.endswith(".json.zst")):
            key = name[: -len(".json.zst")]
            meta = json.loads(zstandard.ZstdDecompressor().decompress(members[name]))
            tokens = np.load(io.BytesIO(members[key + ".tokens.npy"]), allow_pickle=False)
            assert tokens.dtype == np.dtype(manifest["token_dtype"]) and meta["dtype"] == manifest["token_dtype"]
            ids = meta["ids"].split("\n")  # a text column: its ids here hold no newline or backslash
            for doc_id, start, n in zip(ids, np.cumsum([0] + meta["lengths"][:-1]), meta["lengths"]):
                docs[doc_id] = tokens[start:start + n]
    return docs


def test_every_document_is_its_cleaned_text_ending_with_eos(job):
    kind, out, texts = job
    manifest = json.loads((out / "manifest.json").read_text())
    ident = manifest["tokenizer_identity"]
    tok = build(read(str(out)))
    assert ident["kind"] == kind == tok.kind and ident["sha256"] == tok.file.sha256
    assert ident["eos_id"] == tok.special.eos is not None and ident["add_eos"] and not ident["add_bos"]
    expected_vocab = {"hf": HF_VOCAB, "tiktoken": 100_277, "sentencepiece": 1000}[kind]
    assert manifest["vocab_size"] == tok.vocab_size == expected_vocab
    assert manifest["token_dtype"] == ("uint16" if kind == "sentencepiece" else "uint32")
    docs = read_documents(out)
    assert len(docs) > 250 and manifest["total_tokens"] == sum(len(t) for t in docs.values())
    for doc_id, tokens in docs.items():
        text = clean_text(texts[doc_id], CleanConfig())
        assert tokens[-1] == ident["eos_id"] and tokens.tolist() == tok.encode_batch([text])[0] + [ident["eos_id"]]
        if kind != "sentencepiece":  # its nmt_nfkc normaliser folds whitespace; the others give the text back
            assert tok.decode(tokens) == text


def test_auto_tokenizer_loads_the_shard_folder_and_decodes_as_colaflow_does(job):
    from transformers import AutoTokenizer

    _, out, texts = job
    tok = build(read(str(out)))
    auto = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert len(auto) == tok.vocab_size and auto.eos_token_id == tok.special.eos
    docs = read_documents(out)
    for doc_id, tokens in docs.items():
        text = clean_text(texts[doc_id], CleanConfig())
        assert auto.decode(tokens.tolist(), skip_special_tokens=True) == tok.decode(tokens)
        assert auto(text, add_special_tokens=False)["input_ids"] == tokens[:-1].tolist()


def test_the_pipeline_trains_a_byte_level_bpe_that_auto_tokenizer_loads(corpus, tmp_path):
    from transformers import AutoTokenizer

    corpus_dir, texts = corpus
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(corpus_dir / "in.jsonl"), "--output", str(out), "tokenizer.kind=hf",
                             "tokenizer.vocab_size=1200", *SYNTHETIC]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    ident = manifest["tokenizer_identity"]
    assert (ident["kind"], ident["eos_id"], ident["bos_id"], ident["pad_id"], ident["add_bos"]) == ("hf", 0, 1, 2, False)
    assert manifest["tokenizer"] == "tokenizer.json" and manifest["vocab_size"] == 1200
    auto = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert (auto.eos_token, auto.bos_token, auto.pad_token) == ("<|endoftext|>", "<|startoftext|>", "<|pad|>")
    for doc_id, tokens in read_documents(out).items():
        assert tokens[-1] == 0 and auto.decode(tokens.tolist(), skip_special_tokens=True) == clean_text(
            texts[doc_id], CleanConfig())


def run_trainer(out, run_dir, cache_dir) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(REPO / "configs" / "demo.yaml"), f"data.manifest={out}",
         f"run_dir={run_dir}", f"cache.dir={cache_dir}", "steps=20", "log_every=10", "model.d_model=32",
         "model.n_layers=1", "model.n_heads=2", "data.seq_len=64", "data.micro_batch_size=2", "precision=fp32",
         "metrics.progress=false", "checkpoint.every=0"],
        cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600)


def test_twenty_steps_train_with_the_manifest_s_vocabulary_and_a_changed_tokenizer_is_refused(job, tmp_path):
    _, out, _ = job
    p = run_trainer(out, tmp_path / "run", tmp_path / "cache")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert summary["train_steps"] == 20
    assert config["model"]["vocab_size"] == json.loads((out / "manifest.json").read_text())["vocab_size"]
    name = json.loads((out / "manifest.json").read_text())["tokenizer"]
    original = (out / name).read_bytes()
    try:
        (out / name).write_bytes(original + b"\n")
        p = run_trainer(out, tmp_path / "run2", tmp_path / "cache")
    finally:
        (out / name).write_bytes(original)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"{name} changed since the shards were written" in p.stderr, p.stderr[-2000:]
