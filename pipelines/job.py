"""The preprocessing job: JSONL/text → cleaned, deduplicated, tokenised WebDataset shards.

Graph (each arrow a Beam transform; see ``docs/cluster.md`` for runners)::

    MatchFiles → ReadMatches → split units → Reshuffle → Parse ──dead──▶ dead_letter/*.jsonl
      → Clean (NFC, controls, length, quality, PII) → ExactDedup (CombinePerKey, min id)
      → [NearDedup (MinHash-LSH)] → Tokenizer (sample → train, singleton) ─side input─┐
      → Tokenize ◀────────────────────────────────────────────────────────────────────┘
      → Encode → bucket = sha256(key) mod N → GroupByKey → write bucket tars
      → Finalize (single element): rename shards, indexes, manifest.json, tokenizer.model, stats.json

Every stage also emits ``((source, event), n)`` records that are summed into ``stats.json``.
"""
from __future__ import annotations

import json
import time

import apache_beam as beam
import fsspec
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.runners.runner import PipelineState

from .config import PipelineConfig
from .neardup import NearDedup
from .sharding import WriteShards, finalize
from .stats import EVENTS, NAMESPACE
from .tokenizer import TokenizeFn, build_model
from .transforms import DEAD, CleanFn, ExactDedup, ParseFn, ReadRecords

DEAD_LETTER_DIR = "dead_letter"


def build(p: beam.Pipeline, input_glob: str, output_dir: str, cfg: PipelineConfig) -> None:
    """Add the whole preprocessing graph to pipeline ``p`` (outputs go to ``output_dir``)."""
    out = output_dir.rstrip("/")
    parsed = (p
              | "Read" >> ReadRecords(input_glob, cfg.input)
              | "Parse" >> beam.ParDo(ParseFn(cfg.input)).with_outputs(DEAD, EVENTS, main="docs"))
    cleaned = parsed.docs | "Clean" >> beam.ParDo(CleanFn(cfg)).with_outputs(EVENTS, main="docs")
    docs, events = cleaned.docs, [parsed[EVENTS], cleaned[EVENTS]]
    if cfg.dedup.exact:
        exact = docs | "ExactDedup" >> ExactDedup()
        docs = exact.docs
        events.append(exact[EVENTS])
    if cfg.dedup.near:
        near = docs | "NearDedup" >> NearDedup(cfg.dedup)
        docs = near.docs
        events.append(near[EVENTS])
    model = build_model(docs, cfg.tokenizer)
    tokenized = docs | "Tokenize" >> beam.ParDo(TokenizeFn(), beam.pvalue.AsSingleton(model))
    written = tokenized | "Shards" >> WriteShards(out, cfg.shards)
    events.append(written[EVENTS])
    counts = events | "AllEvents" >> beam.Flatten() | "SumEvents" >> beam.CombinePerKey(sum)
    (parsed[DEAD]
     | "DeadJson" >> beam.Map(lambda d: d.to_json())
     | "DeadWrite" >> beam.io.WriteToText(f"{out}/{DEAD_LETTER_DIR}/records", file_name_suffix=".jsonl",
                                          num_shards=1, shard_name_template="-SSSSS-of-NNNNN"))
    (p
     | "Start" >> beam.Create([None])
     | "Finalize" >> beam.Map(finalize, out, cfg.shards, beam.pvalue.AsList(written.shards),
                              beam.pvalue.AsList(counts), beam.pvalue.AsSingleton(model)))


def counters(result) -> dict[str, int]:
    """Committed Beam counters of namespace ``colaflow`` (event name → count; ``:`` written as ``_``)."""
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except (NotImplementedError, KeyError):  # some runners do not report metrics
        return {}
    out: dict[str, int] = {}
    for c in found:
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + (c.committed or 0)
    return dict(sorted(out.items()))


def run(input_glob: str, output_dir: str, cfg: PipelineConfig | None = None,
        beam_args: list[str] | None = None) -> dict:
    """Run the pipeline to completion and return the contents of ``stats.json``.

    Args:
        input_glob: file pattern (local path or ``gs://``/``s3://``/``hdfs://``), JSONL or text,
            optionally ``.gz``/``.bz2``/``.zst``.
        output_dir: folder or fsspec URL receiving shards, ``manifest.json``, ``tokenizer.model``,
            ``stats.json`` and ``dead_letter/``.
        cfg: pipeline configuration (defaults when ``None``).
        beam_args: Beam pipeline options, e.g. ``["--direct_running_mode=multi_processing",
            "--direct_num_workers=2"]``; default runner is the DirectRunner.
    Returns:
        the stats dict (see :func:`pipelines.stats.aggregate`) plus ``seconds`` (wall time) and
        ``metrics`` (Beam counters, see :func:`counters`).
    Raises:
        FileNotFoundError: no file matches ``input_glob``.
        ValueError / RuntimeError: the tokenizer cannot be trained (e.g. nothing survived cleaning),
            or the pipeline did not finish.
    """
    cfg = cfg or PipelineConfig()
    if not FileSystems.match([input_glob])[0].metadata_list:
        raise FileNotFoundError(f"no input file matches {input_glob!r}")
    options = PipelineOptions(beam_args or [])
    runner = None
    if options.view_as(StandardOptions).runner in (None, "DirectRunner"):
        # The DirectRunner first tries Prism, a binary it downloads from GitHub at run time;
        # marking it interactive skips that, so runs are offline and the same everywhere.
        runner = DirectRunner()
        runner.is_interactive()
    fs, root = fsspec.core.url_to_fs(output_dir)
    fs.makedirs(root, exist_ok=True)
    if fs.exists(f"{root}/{DEAD_LETTER_DIR}"):  # dead letters of an earlier run would be stale
        fs.rm(f"{root}/{DEAD_LETTER_DIR}", recursive=True)
    start = time.perf_counter()
    p = beam.Pipeline(runner=runner, options=options)
    build(p, input_glob, output_dir, cfg)
    result = p.run()
    state = result.wait_until_finish()
    if state != PipelineState.DONE:
        raise RuntimeError(f"pipeline ended in state {state}; see the Beam log above")
    with fsspec.open(f"{output_dir.rstrip('/')}/stats.json", "r", encoding="utf-8") as f:
        stats = json.load(f)
    stats["seconds"] = time.perf_counter() - start
    stats["metrics"] = counters(result)
    return stats
