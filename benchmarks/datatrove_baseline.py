"""The datatrove baseline of ``bench_preprocess.py --near``: equivalent cleaning, filters and MinHash dedup.

datatrove (Hugging Face, https://github.com/huggingface/datatrove) runs: JsonlReader → FTFY
repair → PII formatter (e-mail, IP) → length filter → exact dedup is not part of it →
MinHash signature (5-grams, 14 bands x 8 rows = 112 hashes, the same parameters as ours) →
buckets (one task per band, as datatrove requires) → clusters → filter → JsonlWriter, with
one worker (one core, like the in-memory DirectRunner). Given a ``tokenizer`` (a Hugging Face
``tokenizer.json``), the last step is datatrove's ``DocumentTokenizer`` with it instead of the
JsonlWriter: the kept documents tokenised with an EOS each and written as token files, the
equivalent of colaflow's tokenising and shard writing when colaflow is brought the same tokenizer.
Exact dedup stays out: its copies are near duplicates too (similarity 1), which MinHash drops,
so the ratio understates our speed by colaflow's exact-dedup pass. Words are split on whitespace
(datatrove's default English tokenizer needs NLTK data downloads).

Where datatrove's optional speed-ups are not installed, the baseline says so (:func:`substitutes`)
and runs without them: without ``xxhash`` MinHash hashes each shingle with datatrove's own
``sha1`` hash function (``HashConfig(hash_fc="sha1")``), and without ``orjson`` its JSONL reader
and writer are subclasses that read and write each line with the standard library's ``json``
(``_StdlibJsonl*`` in :func:`run_datatrove`). Both make datatrove slower than with them installed.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import time


def available() -> str | None:
    """``None`` when datatrove can run, else why not (printed by the benchmark)."""
    missing = [m for m in ("datatrove", "regex", "tokenizers") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"datatrove baseline skipped: {', '.join(missing)} not installed "
                "(pip install datatrove regex tokenizers 'xxhash<4' orjson; none pulls torch)")
    return None


def substitutes() -> list[str]:
    """What the baseline runs in place of datatrove's optional packages that are not installed
    (empty when ``xxhash`` and ``orjson`` are): say it beside any number it gives."""
    out = []
    if importlib.util.find_spec("xxhash") is None:
        out.append("MinHash with sha1 (xxhash not installed)")
    if importlib.util.find_spec("orjson") is None:
        out.append("JSONL through the standard library's json (orjson not installed)")
    return out


def run_datatrove(input_dir: str, glob_pattern: str, work: str, tokenizer: str | None = None) -> tuple[float, int]:
    """Run the datatrove pipeline on ``input_dir/glob_pattern``.

    Args:
        input_dir: folder of JSONL files (``text`` and ``id`` keys).
        glob_pattern: which files of it to read.
        work: empty folder for datatrove's signatures, buckets, clusters, logs and output.
        tokenizer: a Hugging Face ``tokenizer.json`` (beside its ``tokenizer_config.json``, which
            names the EOS token): tokenise the kept documents into token files instead of writing JSONL.

    Returns:
        ``(wall seconds, documents kept)``.
    """
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

    from datatrove.utils.hashing import HashConfig

    hashing = HashConfig(hash_fc="xxhash" if importlib.util.find_spec("xxhash") else "sha1")
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, hash_config=hashing)
    words = SplitTokenizer()

    class _StdlibJsonlReader(JsonlReader):
        """datatrove's reader, lines parsed by :mod:`json` (its own check refuses to build without orjson)."""

        def __new__(cls, *args, **kwargs):
            return object.__new__(cls)

        def read_file(self, filepath: str):
            with self.data_folder.open(filepath, "r", compression=self.compression) as f:
                for li, line in enumerate(f):
                    with self.track_time():
                        document = self.get_document_from_dict(json.loads(line), filepath, li)
                    if document:
                        yield document

    class _StdlibJsonlWriter(JsonlWriter):
        """datatrove's writer, lines written by :mod:`json`."""

        def __new__(cls, *args, **kwargs):
            return object.__new__(cls)

        def _write(self, document: dict, file_handler, _filename: str):
            file_handler.write((json.dumps(document, ensure_ascii=False) + "\n").encode("utf-8"))

    std = importlib.util.find_spec("orjson") is None
    reader_class, writer_class = (_StdlibJsonlReader, _StdlibJsonlWriter) if std else (JsonlReader, JsonlWriter)

    def reader():
        return reader_class(input_dir, glob_pattern=glob_pattern, text_key="text", id_key="id")

    def executor(steps, name, depends=None, tasks=1):
        return LocalPipelineExecutor(steps, tasks=tasks, workers=1, logging_dir=os.path.join(work, "logs", name),
                                     depends=depends)

    sigs, buckets, clusters = (os.path.join(work, d) for d in ("sigs", "buckets", "clusters"))
    stage1 = executor([reader(), FTFYFormatter(), PIIFormatter(), LambdaFilter(lambda d: 0 < len(d.text) <= 5_000_000),
                       MinhashDedupSignature(sigs, config=cfg, language=words)], "sigs")
    stage2 = executor([MinhashDedupBuckets(sigs, buckets, config=cfg)], "buckets", stage1, tasks=cfg.num_buckets)
    stage3 = executor([MinhashDedupCluster(buckets, clusters, config=cfg)], "clusters", stage2)
    if tokenizer:
        from datatrove.pipeline.tokens import DocumentTokenizer

        config = os.path.join(os.path.dirname(tokenizer), "tokenizer_config.json")
        with open(config, encoding="utf-8") as f:
            eos = json.load(f)["eos_token"]
        last = DocumentTokenizer(os.path.join(work, "out"), tokenizer, eos_token=eos, shuffle_documents=False)
    else:
        last = writer_class(os.path.join(work, "out"))
    stage4 = executor([reader(), FTFYFormatter(), PIIFormatter(), LambdaFilter(lambda d: 0 < len(d.text) <= 5_000_000),
                       MinhashDedupFilter(clusters), last], "filter", stage3)
    start = time.perf_counter()
    stage4.run()
    seconds = time.perf_counter() - start
    kept = 0
    for root, _, files in os.walk(os.path.join(work, "out")):
        for name in files:
            if name.endswith(".ds.index"):  # one uint64 end offset per document
                kept += os.path.getsize(os.path.join(root, name)) // 8
            elif name.endswith(".jsonl.gz"):
                with gzip.open(os.path.join(root, name), "rt", encoding="utf-8") as f:
                    kept += sum(1 for _ in f)
    return seconds, kept
