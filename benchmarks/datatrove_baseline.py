"""The datatrove baseline of ``bench_preprocess.py --near``: equivalent cleaning, filters and MinHash dedup.

datatrove (Hugging Face, https://github.com/huggingface/datatrove) runs: JsonlReader → FTFY
repair → PII formatter (e-mail, IP) → length filter → exact dedup is not part of it →
MinHash signature (5-grams, 14 bands x 8 rows = 112 hashes, the same parameters as ours) →
buckets (one task per band, as datatrove requires) → clusters → filter → JsonlWriter, with
one worker (one core, like the in-memory DirectRunner). It neither trains a tokenizer nor writes shards, which our pipeline
also does, so the ratio understates our speed. Words are split on whitespace (datatrove's
default English tokenizer needs NLTK data downloads).
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import time


def available() -> str | None:
    """``None`` when datatrove can run, else why not (printed by the benchmark)."""
    missing = [m for m in ("datatrove", "regex", "tokenizers", "xxhash", "orjson") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"datatrove baseline skipped: {', '.join(missing)} not installed "
                "(pip install datatrove regex tokenizers 'xxhash<4' orjson; none pulls torch)")
    return None


def run_datatrove(input_dir: str, glob_pattern: str, work: str) -> tuple[float, int]:
    """Run the datatrove pipeline on ``input_dir/glob_pattern``; returns ``(seconds, documents kept)``."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.filters import LambdaFilter
    from datatrove.pipeline.formatters import FTFYFormatter, PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.word_tokenizers import WordTokenizer

    class SplitTokenizer(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return text.split("\n")

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            raise NotImplementedError

    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)
    words = SplitTokenizer()

    def reader():
        return JsonlReader(input_dir, glob_pattern=glob_pattern, text_key="text", id_key="id")

    def executor(steps, name, depends=None, tasks=1):
        return LocalPipelineExecutor(steps, tasks=tasks, workers=1, logging_dir=os.path.join(work, "logs", name),
                                     depends=depends)

    sigs, buckets, clusters = (os.path.join(work, d) for d in ("sigs", "buckets", "clusters"))
    stage1 = executor([reader(), FTFYFormatter(), PIIFormatter(), LambdaFilter(lambda d: 0 < len(d.text) <= 5_000_000),
                       MinhashDedupSignature(sigs, config=cfg, language=words)], "sigs")
    stage2 = executor([MinhashDedupBuckets(sigs, buckets, config=cfg)], "buckets", stage1, tasks=cfg.num_buckets)
    stage3 = executor([MinhashDedupCluster(buckets, clusters, config=cfg)], "clusters", stage2)
    stage4 = executor([reader(), FTFYFormatter(), PIIFormatter(), LambdaFilter(lambda d: 0 < len(d.text) <= 5_000_000),
                       MinhashDedupFilter(clusters), JsonlWriter(os.path.join(work, "out"))], "filter", stage3)
    start = time.perf_counter()
    stage4.run()
    seconds = time.perf_counter() - start
    kept = 0
    for root, _, files in os.walk(os.path.join(work, "out")):
        for name in files:
            with gzip.open(os.path.join(root, name), "rt", encoding="utf-8") as f:
                kept += sum(1 for _ in f)
    return seconds, kept
