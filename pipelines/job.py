"""The preprocessing job: JSONL/text/Parquet → cleaned, deduplicated, tokenised WebDataset shards.

Graph (each arrow a Beam transform; see ``docs/cluster.md`` for runners, ``docs/preprocessing.md``
for the stages)::

    MatchFiles → plan splits → Reshuffle → read split → Parse ──dead──▶ dead_letter/*.jsonl
      → Clean (Unicode repair, NFC, controls, whitespace, length, language, quality, PII)
      → ExactDedup (CombinePerKey, min id) ──duplicates──▶ duplicates/*.jsonl
      → [NearDedup (MinHash-LSH)]     Tokenizer (sample of cleaned docs → train) ─side input─┐
      → Tokenize ◀────────────────────────────────────────────────────────────────────┘
      → [Split by content hash ──val──▶ the same shard writing into OUT/val/]
      → Encode → bucket = sha256(key) mod N → GroupByKey → write bucket tars
      → Finalize (single element): rename shards, indexes, manifest.json, tokenizer.model, stats.json
    then, on the driver: report.txt + report.png (:mod:`pipelines.report`)

Every stage also emits ``((source, event), n)`` records that are summed into ``stats.json``.
An output folder holding an earlier run is refused unless ``overwrite`` (:mod:`pipelines.output`).
"""
from __future__ import annotations

import json
import sys
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
from .output import DEAD_LETTER_DIR, DUPLICATES_DIR, prepare_output
from .records import DUPLICATES
from .report import write_report
from .sharding import WriteShards, finalize
from .splits import VAL, VAL_DIR, SplitBatchFn, val_shard_config
from .stats import EVENTS, NAMESPACE
from .tokenizer import TokenizeFn, build_model
from .transforms import DEAD, CleanFn, ExactDedup, ParseFn, ReadRecords, key_by_hash


def _write_jsonl(lines, out: str, folder: str, label: str) -> None:
    lines | label >> beam.io.WriteToText(f"{out}/{folder}/records", file_name_suffix=".jsonl", num_shards=1,
                                         shard_name_template="-SSSSS-of-NNNNN")


def build(p: beam.Pipeline, input_glob: str, output_dir: str, cfg: PipelineConfig, total_bytes: int = 0) -> None:
    """Add the whole preprocessing graph to pipeline ``p`` (outputs go to ``output_dir``;
    ``total_bytes`` of input sizes the progress bar)."""
    out = output_dir.rstrip("/")
    parsed = (p
              | "Read" >> ReadRecords(input_glob, cfg.input, total_bytes)
              | "Parse" >> beam.ParDo(ParseFn(cfg.input)).with_outputs(DEAD, EVENTS, main="docs"))
    cleaned = parsed.docs | "Clean" >> beam.ParDo(CleanFn(cfg)).with_outputs(EVENTS, main="docs")
    docs, events, duplicates = cleaned.docs, [parsed[EVENTS], cleaned[EVENTS]], []
    hashed = docs | "KeyByHash" >> beam.Map(key_by_hash)  # shared by exact dedup and the tokenizer sample
    if cfg.dedup.exact:
        exact = hashed | "ExactDedup" >> ExactDedup(cfg.dedup.write_duplicates, keyed_input=True)
        docs = exact["docs"]
        events.append(exact[EVENTS])
        duplicates.append(exact[DUPLICATES])
    if cfg.dedup.near:
        near = docs | "NearDedup" >> NearDedup(cfg.dedup)
        docs = near.docs
        events.append(near[EVENTS])
        duplicates.append(near[DUPLICATES])
    if duplicates and cfg.dedup.write_duplicates:
        _write_jsonl(duplicates | "AllDuplicates" >> beam.Flatten(), out, DUPLICATES_DIR, "DuplicatesWrite")
    # Trained on the cleaned documents before dedup (the sample counts a repeated text once), so
    # the model is ready before dedup ends and tokenising fuses with the last dedup stage.
    model = build_model(hashed, cfg.tokenizer, keyed=True)
    tokenized = (docs
                 | "BatchDocs" >> beam.BatchElements(min_batch_size=64, max_batch_size=1024)
                 | "Tokenize" >> beam.ParDo(TokenizeFn(), beam.pvalue.AsSingleton(model)))
    val_shards = None
    if cfg.split.val_fraction > 0:
        parts = tokenized | "Split" >> beam.ParDo(SplitBatchFn(cfg.split.val_fraction)).with_outputs(VAL, main="train")
        tokenized = parts.train
        val_written = parts[VAL] | "ValShards" >> WriteShards(f"{out}/{VAL_DIR}", val_shard_config(cfg.shards))
        events.append(val_written[EVENTS])
        val_shards = beam.pvalue.AsList(val_written.shards)
    written = tokenized | "Shards" >> WriteShards(out, cfg.shards)
    events.append(written[EVENTS])
    counts = events | "AllEvents" >> beam.Flatten() | "SumEvents" >> beam.CombinePerKey(sum)
    _write_jsonl(parsed[DEAD] | "DeadJson" >> beam.Map(lambda d: d.to_json()), out, DEAD_LETTER_DIR, "DeadWrite")
    (p
     | "Start" >> beam.Create([None])
     | "Finalize" >> beam.Map(finalize, out, cfg.shards, beam.pvalue.AsList(written.shards),
                              beam.pvalue.AsList(counts), beam.pvalue.AsSingleton(model), val_shards))


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
        beam_args: list[str] | None = None, overwrite: bool = False, report: bool = True) -> dict:
    """Run the pipeline to completion and return the contents of ``stats.json``.

    Args:
        input_glob: file pattern (local path or ``gs://``/``s3://``/``hdfs://``), JSONL or text,
            optionally ``.gz``/``.bz2``/``.zst``.
        output_dir: folder or fsspec URL receiving shards, ``manifest.json``, ``tokenizer.model``,
            ``stats.json``, ``report.txt``/``report.png``, ``dead_letter/`` and ``duplicates/``.
        cfg: pipeline configuration (defaults when ``None``).
        beam_args: Beam pipeline options, e.g. ``["--direct_running_mode=multi_processing",
            "--direct_num_workers=2"]``; default runner is the DirectRunner.
        overwrite: replace an earlier run in ``output_dir`` instead of refusing.
        report: write ``report.txt`` and ``report.png`` (:mod:`pipelines.report`) at the end.
    Returns:
        the stats dict (see :func:`pipelines.stats.aggregate`) plus ``seconds`` (wall time) and
        ``metrics`` (Beam counters, see :func:`counters`).
    Raises:
        FileNotFoundError: no file matches ``input_glob``.
        pipelines.output.OutputExistsError: ``output_dir`` holds an earlier run and not ``overwrite``.
        ValueError / RuntimeError: the tokenizer cannot be trained (e.g. nothing survived cleaning),
            or the pipeline did not finish.
    """
    cfg = cfg or PipelineConfig()
    cfg.split.validate()
    matched = FileSystems.match([input_glob])[0].metadata_list
    if not matched:
        raise FileNotFoundError(f"no input file matches {input_glob!r}")
    prepare_output(output_dir, cfg.shards.prefix, overwrite)
    options = PipelineOptions(beam_args or [])
    runner = None
    if options.view_as(StandardOptions).runner in (None, "DirectRunner"):
        # The DirectRunner first tries Prism, a binary it downloads from GitHub at run time;
        # marking it interactive skips that, so runs are offline and the same everywhere.
        runner = DirectRunner()
        runner.is_interactive()
    total_bytes = sum(m.size_in_bytes for m in matched)
    print(f"reading {len(matched)} files, {total_bytes / 1e6:,.1f} MB", file=sys.stderr, flush=True)
    start = time.perf_counter()
    p = beam.Pipeline(runner=runner, options=options)
    build(p, input_glob, output_dir, cfg, total_bytes)
    result = p.run()
    state = result.wait_until_finish()
    if state != PipelineState.DONE:
        raise RuntimeError(f"pipeline ended in state {state}; see the Beam log above")
    with fsspec.open(f"{output_dir.rstrip('/')}/stats.json", "r", encoding="utf-8") as f:
        stats = json.load(f)
    if report:
        write_report(output_dir, stats)
    stats["seconds"] = time.perf_counter() - start
    stats["metrics"] = counters(result)
    return stats
