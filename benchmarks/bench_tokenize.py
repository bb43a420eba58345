"""Tokenisation speed: each tokenizer library called directly vs colaflow's Beam Tokenize stage, same text.

Text: the demo corpus (Shakespeare paragraphs and KJV chapters, ``examples.demo.corpus``). Kinds:
a 4096-piece sentencepiece model trained on half of it, a Hugging Face byte-level BPE (32,000 ids,
``tokenizers``) trained on it, and tiktoken's ``cl100k_base`` (offline). For each kind, interleaved
over ``--rounds`` rounds:

* the bare library: its batch call over the texts, 64 at a time (``encode``, ``encode_batch_fast``,
  ``encode_ordinary_batch``), ids kept as ``uint16``/``uint32`` arrays, as a user's own loop would;
* the stage's code: :class:`pipelines.stages.tokenize.TokenizeFn` called on the documents in
  batches of 256 (EOS appended, arrays, counted events), as a Beam worker calls it;
* the stage in Beam: a DirectRunner pipeline (in memory) of those batches through ``TokenizeFn``,
  and the same pipeline with a pass-through step instead (what Beam itself costs to move the
  documents and results).

Reported: input MB per CPU second (all threads of the process: the Rust libraries use several
cores) and each side's cost against the bare library (goal: the stage at most 1.3x).

    python benchmarks/bench_tokenize.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH_DOCS = 256


def tokenizers_under_test(texts: list[str], work: str) -> dict:
    """kind -> :class:`shards.tokenizers.TokenizerFile` of the three kinds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipelines.config import TokenizerConfig
    from pipelines.stages.tokenize import trained_file
    from shards.tokenizers import read

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=32_000, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    bpe.save(os.path.join(work, "tokenizer.json"))
    return {"sentencepiece": trained_file(texts[::2], TokenizerConfig(vocab_size=4096)),
            "hf": read(os.path.join(work, "tokenizer.json")), "tiktoken": read("cl100k_base")}


def bare(file, texts: list[str]) -> int:
    """The library's batch call over ``texts``, 64 at a time, ids as arrays; returns tokens made."""
    from pipelines.stages.tokenize import ENCODE_DOCS, token_dtype
    from shards.tokenizers import build

    tok = build(file)
    dtype = token_dtype(tok.vocab_size)
    n = 0
    for start in range(0, len(texts), ENCODE_DOCS):
        for ids in tok.encode_batch(texts[start:start + ENCODE_DOCS]):
            n += np.asarray(ids, dtype=dtype).size
    return n


def _batches(texts: list[str]) -> list:
    from pipelines.records import Doc

    return [[Doc(f"d{i + j}", t, "demo") for j, t in enumerate(texts[i:i + BATCH_DOCS])]
            for i in range(0, len(texts), BATCH_DOCS)]


def dofn(file, texts: list[str]) -> None:
    """``TokenizeFn`` called on the documents' batches, as a Beam worker calls it."""
    from pipelines.config import TokenizerConfig
    from pipelines.stages.tokenize import TokenizeFn

    fn = TokenizeFn(TokenizerConfig())
    fn.setup()
    fn.start_bundle()
    for batch in _batches(texts):
        for _ in fn.process(batch, file):
            pass
    list(fn.finish_bundle())
    fn.teardown()


def pipeline(file, texts: list[str], tokenize: bool = True) -> None:
    """The documents' batches through ``TokenizeFn`` (or a pass-through) in a DirectRunner pipeline."""
    import apache_beam as beam
    from apache_beam.runners.direct.direct_runner import DirectRunner

    from pipelines.config import TokenizerConfig
    from pipelines.stages.tokenize import TokenizeFn

    with beam.Pipeline(runner=DirectRunner()) as p:
        files = p | "File" >> beam.Create([file])
        batches = p | beam.Create(_batches(texts), reshuffle=False)
        if tokenize:
            batches = batches | beam.ParDo(TokenizeFn(TokenizerConfig()), beam.pvalue.AsSingleton(files))
        batches | beam.Map(len) | beam.combiners.Count.Globally()


def passthrough(file, texts: list[str]) -> None:
    """:func:`pipeline` without the tokenizer: what Beam costs to move the documents."""
    pipeline(file, texts, tokenize=False)


def cpu(fn, *args) -> float:
    """CPU seconds (every thread of this process) of ``fn(*args)``."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def main() -> int:
    """Time the bare libraries and the stage, interleaved, and print MB per CPU second and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from examples.demo.corpus import kjv_records, shakespeare_records

    texts = [r["text"] for r in list(shakespeare_records()) + list(kjv_records()) if r["text"].strip()]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    with tempfile.TemporaryDirectory() as work:
        files = tokenizers_under_test(texts, work)
    print(f"{len(texts):,} documents, {mb:.1f} MB; {os.cpu_count()} cores", flush=True)
    sides = {"bare": bare, "stage code": dofn, "stage in Beam": pipeline, "Beam pass-through": passthrough}
    times: dict = {(k, side): [] for k in files for side in sides}
    for r in range(args.rounds):
        for kind, file in files.items():
            for side, fn in sides.items():
                times[kind, side].append(cpu(fn, file, texts))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"MB per CPU second (median of {args.rounds}), and CPU time against the bare library:")
    for kind in files:
        b = statistics.median(times[kind, "bare"])
        row = "   ".join(f"{side} {mb / statistics.median(times[kind, side]):5.2f} "
                         f"({statistics.median(times[kind, side]) / b:.2f}x)" for side in sides)
        print(f"{kind:14s} {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
