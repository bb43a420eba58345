"""The preprocessing job: JSONL/text/Parquet → cleaned, deduplicated, tokenised WebDataset shards.

Graph (each arrow a Beam transform; see ``docs/cluster.md`` for runners, ``docs/preprocessing.md``
for the stages)::

    MatchFiles → plan splits (unknown formats skipped) → Reshuffle → read split → Parse ──dead──▶ dead_letter/*.jsonl
      → Clean (Unicode repair, NFC, controls, whitespace, length, language, quality, PII)
      → UniqueIds (one id, one text) → ExactDedup (CombinePerKey, min id) ──duplicates──▶ duplicates/*.jsonl
      → [NearDedup (MinHash-LSH)]     Tokenizer (sample of cleaned docs → train) ─side input─┐
      → Tokenize ◀────────────────────────────────────────────────────────────────────┘
      → [Split by content hash ──val──▶ the same shard writing into OUT/val/]
      → Encode → bucket = sha256(key) mod N → GroupByKey → write bucket tars
      → Finalize (single element): rename shards, indexes, manifest.json, tokenizer.model, stats.json
    then, on the driver: report.txt + report.png (:mod:`pipelines.accounting.report`)

Every stage also emits ``((source, event), n)`` records that are summed into ``stats.json``.
An output folder holding an earlier run is refused unless ``overwrite`` (:mod:`pipelines.io.output`),
which keeps the earlier run aside until the new one succeeds; a run that fails or is interrupted
removes what it wrote and puts the earlier run back as it was.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
import time

import apache_beam as beam
import fsspec
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.runners.runner import PipelineRunner, PipelineState

from colaflow.config import ConfigError
from colaflow.wording import count, plural

from pipelines.config import PipelineConfig
from pipelines.stages.near_dedup import NearDedup
from pipelines.io.output import (DEAD_LETTER_DIR, DUPLICATES_DIR, WriteJsonl, abort_output, finish_output, prepare_output,
                     refuse_inputs_in_artifacts)
from pipelines.accounting.read_summary import summarize
from pipelines.records import DUPLICATES, file_format
from pipelines.accounting.report import write_report
from pipelines.stages.write_shards import WriteShards, finalize
from pipelines.stages.split import VAL, VAL_DIR, SplitBatchFn, val_shard_config
from pipelines.accounting.stats import EVENTS, NAMESPACE
from pipelines.stages.tokenize import NoRecordsError, TokenizeFn, build_model
from pipelines.stages.transforms import DEAD, CleanFn, ExactDedup, ParseFn, ReadRecords, UniqueIds, key_by_hash


# Beam's own DaskRunner mistranslates the job (pipelines/runners/dask/runner.py); these names get ours
DASK_RUNNER_NAMES = ("DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner")
# what docs/cluster.md shows the job running on; other Beam runners are refused (a dotted class path is not)
SUPPORTED_RUNNERS = ("DirectRunner", "DaskRunner", "PortableRunner", "PrismRunner", "FlinkRunner", "SparkRunner",
                     "DataflowRunner")


class InputError(ValueError):
    """``--input`` names no readable set of files (a folder, files of unknown format under
    ``input.unknown_files: error``, only empty files, or files that hold no record); the message
    says what to pass instead."""


def beam_options(beam_args: list[str]) -> PipelineOptions:
    """Beam's ``PipelineOptions`` for ``beam_args``, refusing any ``--flag`` that no registered
    ``PipelineOptions`` subclass declares (Beam itself drops them silently, so ``--runer=DataflowRunner``
    would quietly run locally). The ``--runner`` is checked and normalised (:func:`check_runner`:
    ``--runner=dask`` becomes ``DaskRunner``); the Dask runner's options are registered when it is
    chosen, and refused with a hint to choose it otherwise.

    Raises:
        colaflow.config.ConfigError: an unknown flag; the message names it and the closest known option,
            or says that a Dask option needs ``--runner=DaskRunner``. Or a ``--runner`` colaflow does not
            run on (:func:`check_runner`).
    """
    options = PipelineOptions(beam_args)
    standard = options.view_as(StandardOptions)
    standard.runner = check_runner(standard.runner)
    if standard.runner == "DaskRunner":
        from pipelines.runners.dask.runner import ColaflowDaskRunner  # noqa: F401 - declares the DaskOptions
    given = {a[2:].split("=", 1)[0] for a in beam_args if a.startswith("--")}
    dask_only = sorted(given & _dask_flags()) if given and standard.runner != "DaskRunner" else []
    if dask_only:  # declared once the Dask runner was imported in this process, yet meaningless here
        raise ConfigError(f"{' '.join('--' + f for f in dask_only)} {plural(len(dask_only), 'is a', 'are')} "
                          f"DaskRunner {plural(len(dask_only), 'option')}; add --runner=DaskRunner to run on Dask "
                          "(see docs/cluster.md)")
    known = set(PipelineOptions([]).get_all_options())  # after _dask_flags, which registers the DaskOptions
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean --{close[0]}? " if close else ""
        raise ConfigError(f"unknown {plural(len(unknown), 'option')} {' '.join('--' + u for u in unknown)}: "
                          f"neither a colaflow flag nor a Beam pipeline option; {hint}see --help and Beam's "
                          "PipelineOptions")
    return options


def _dask_flags() -> set[str]:
    """Flag names (without ``--``) that Beam's ``DaskOptions`` declares; empty without dask installed."""
    try:
        from apache_beam.runners.dask.dask_runner import DaskOptions
    except ImportError:
        return set()
    parser = argparse.ArgumentParser()
    DaskOptions._add_argparse_args(parser)  # how every PipelineOptions subclass declares its flags
    return {flag[2:] for action in parser._actions for flag in action.option_strings if flag.startswith("--")}


def check_runner(name: str | None) -> str | None:
    """The ``--runner`` value as colaflow and Beam should see it, refusing up front one that would
    fail only once the run starts (Beam's own error comes mid-run and lists runners colaflow cannot
    use, without colaflow's ``DaskRunner``).

    Accepted: ``None`` (the DirectRunner, returned as ``None``); a name of :data:`SUPPORTED_RUNNERS`,
    case-insensitive with the ``Runner`` suffix optional as ``apache_beam.runners.runner.create_runner``
    reads it (``dask`` → ``"DaskRunner"``); a name of :data:`DASK_RUNNER_NAMES` (→ ``"DaskRunner"``);
    or the dotted path of an importable ``apache_beam.runners.runner.PipelineRunner`` subclass, which,
    when Beam defines it, must be one of :data:`SUPPORTED_RUNNERS` or derive from one (returned
    as given, or as ``"DirectRunner"`` for Beam's DirectRunner and ``"DaskRunner"`` for its DaskRunner or a
    subclass, so colaflow's own runner setup applies).

    Raises:
        colaflow.config.ConfigError: an unknown name (the message lists :data:`SUPPORTED_RUNNERS` and the
            closest of them, by ``difflib``), a Beam runner colaflow does not support (by name or
            dotted path), or a dotted path
            that does not import or is not a ``PipelineRunner`` class.
    """
    if name is None:
        return None
    if name in DASK_RUNNER_NAMES:
        return "DaskRunner"
    supported = ", ".join(SUPPORTED_RUNNERS)
    if "." in name:
        return _runner_class(name, supported)
    for known in SUPPORTED_RUNNERS:
        if name.lower() in (known.lower(), known.lower()[:-len("runner")]):
            return known
    beam_names = {path.rsplit(".", 1)[-1].lower() for path in StandardOptions.ALL_KNOWN_RUNNERS}
    if name.lower() in beam_names or name.lower() + "runner" in beam_names:
        raise ConfigError(f"--runner={name}: a Beam runner colaflow does not support; use one of {supported} "
                          "(see docs/cluster.md)")
    close = difflib.get_close_matches(name, SUPPORTED_RUNNERS, n=1, cutoff=0.5)
    hint = f"did you mean --runner={close[0]}? " if close else ""
    raise ConfigError(f"unknown runner --runner={name}: {hint}colaflow runs on {supported} "
                      "(see docs/cluster.md), or give the dotted path of a PipelineRunner class")


def _runner_class(path: str, supported: str) -> str:
    """Check that ``path`` (``module.Class``) imports to a ``PipelineRunner`` subclass and, for a
    class defined in ``apache_beam``, that it is one of :data:`SUPPORTED_RUNNERS` or a subclass of
    one (``...direct_runner.BundleBasedDirectRunner`` is refused as ``BundleBasedDirectRunner``
    is); returns the name :func:`check_runner` documents. Raises ``ConfigError`` (one line) otherwise."""
    module, attr = path.rsplit(".", 1)
    fix = f"give the dotted path of a PipelineRunner class, or one of {supported}"
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"--runner={path}: cannot import {module} ({e}); {fix}") from e
    except AttributeError as e:
        raise ConfigError(f"--runner={path}: module {module} has no {attr}; {fix}") from e
    if not (isinstance(cls, type) and issubclass(cls, PipelineRunner)):
        raise ConfigError(f"--runner={path}: {type(cls).__name__} {attr} is not a PipelineRunner class; {fix}")
    # Beam's own runners are held to the list by dotted path as by name (Beam's DirectRunner is
    # an alias of its SwitchingDirectRunner, hence the identity test)
    if cls.__module__.startswith("apache_beam.") and not issubclass(cls, DirectRunner) and not any(
            c.__module__.startswith("apache_beam.") and c.__name__ in SUPPORTED_RUNNERS for c in cls.__mro__):
        raise ConfigError(f"--runner={path}: a Beam runner colaflow does not support; use one of {supported} "
                          "(see docs/cluster.md)")
    if cls is DirectRunner:
        return "DirectRunner"
    dask = any(f"{c.__module__}.{c.__qualname__}" in DASK_RUNNER_NAMES for c in cls.__mro__)
    return "DaskRunner" if dask else path  # ours fixes how Beam's DaskRunner translates the job


def build(p: beam.Pipeline, input_glob: str, output_dir: str, cfg: PipelineConfig, total_bytes: int = 0) -> None:
    """Add the whole preprocessing graph to pipeline ``p`` (outputs go to ``output_dir``;
    ``total_bytes`` of input sizes the progress bar)."""
    out = output_dir.rstrip("/")
    read = p | "Read" >> ReadRecords(input_glob, cfg.input, total_bytes)
    parsed = read["units"] | "Parse" >> beam.ParDo(ParseFn(cfg.input, input_glob)).with_outputs(
        DEAD, EVENTS, main="docs")
    cleaned = parsed.docs | "Clean" >> beam.ParDo(CleanFn(cfg)).with_outputs(EVENTS, main="docs")
    summary = summarize([parsed[EVENTS], cleaned[EVENTS]], parsed[DEAD])  # read only to explain an empty sample
    events, duplicates = [read[EVENTS], parsed[EVENTS], cleaned[EVENTS]], []
    hashed = cleaned.docs | "KeyByHash" >> beam.Map(key_by_hash)  # shared by exact dedup and the tokenizer sample
    unique = hashed | "UniqueIds" >> UniqueIds()
    if cfg.dedup.exact:
        exact = unique | "ExactDedup" >> ExactDedup(cfg.dedup.write_duplicates, keyed_input=True)
        docs = exact["docs"]
        events.append(exact[EVENTS])
        duplicates.append(exact[DUPLICATES])
    else:
        docs = unique | "Docs" >> beam.Values()
    if cfg.dedup.near:
        near = docs | "NearDedup" >> NearDedup(cfg.dedup)
        docs = near.docs
        events.append(near[EVENTS])
        duplicates.append(near[DUPLICATES])
    if duplicates and cfg.dedup.write_duplicates:
        duplicates | "AllDuplicates" >> beam.Flatten() | "DuplicatesWrite" >> WriteJsonl(f"{out}/{DUPLICATES_DIR}")
    # Trained on the cleaned documents before dedup (the sample counts a repeated text once), so
    # the model is ready before dedup ends and tokenising fuses with the last dedup stage.
    model = build_model(hashed, cfg.tokenizer, summary=summary)
    tokenized = (docs
                 | "BatchDocs" >> beam.BatchElements(min_batch_size=64, max_batch_size=1024)
                 | "Tokenize" >> beam.ParDo(TokenizeFn(), beam.pvalue.AsSingleton(model)).with_outputs(
                     EVENTS, main="batches"))
    events.append(tokenized[EVENTS])
    tokenized, val_shards = tokenized.batches, None
    if cfg.split.val_fraction > 0:
        parts = tokenized | "Split" >> beam.ParDo(SplitBatchFn(cfg.split.val_fraction)).with_outputs(VAL, main="train")
        tokenized = parts.train
        val_written = parts[VAL] | "ValShards" >> WriteShards(f"{out}/{VAL_DIR}", val_shard_config(cfg.shards))
        events.append(val_written[EVENTS])
        val_shards = beam.pvalue.AsList(val_written.shards)
    written = tokenized | "Shards" >> WriteShards(out, cfg.shards)
    events.append(written[EVENTS])
    counts = events | "AllEvents" >> beam.Flatten() | "SumEvents" >> beam.CombinePerKey(sum)
    (parsed[DEAD]
     | "DeadJson" >> beam.Map(lambda d: d.to_json())
     | "DeadWrite" >> WriteJsonl(f"{out}/{DEAD_LETTER_DIR}"))
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


def match_input(input_glob: str, cfg: PipelineConfig) -> tuple[list, list[str]]:
    """The files ``input_glob`` matches, split into ``(metadata of files to read, paths skipped)``.

    A skipped file has an unknown format (:func:`pipelines.records.file_format`) under
    ``input.unknown_files: skip``.

    Raises:
        InputError: ``input_glob`` is a folder, unknown files under ``input.unknown_files: error``,
            or every file to read is empty (0 bytes).
        FileNotFoundError: nothing matches ``input_glob``.
    """
    try:
        matched = FileSystems.match([input_glob])[0].metadata_list
        inside = [] if any(ch in input_glob for ch in "*?[") else FileSystems.match(
            [input_glob.rstrip("/") + "/*"])[0].metadata_list
    except OSError as e:  # Beam's BeamIOError: a missing bucket, no permission, no filesystem for the scheme
        raise InputError(f"cannot list --input {input_glob}: {e}") from e
    if inside:
        folder = input_glob.rstrip("/")
        raise InputError(f"--input {input_glob} is a folder; give a quoted glob of its files, e.g. "
                         f"--input '{folder}/*.jsonl' (or '{folder}/**' to include subfolders)")
    if not matched:
        raise FileNotFoundError(f"no input file matches {input_glob!r}")
    skipped = sorted(m.path for m in matched if file_format(m.path, cfg.input) is None)
    if skipped and cfg.input.unknown_files == "error":
        have = "has" if len(skipped) == 1 else "have"
        raise InputError(f"{count(len(skipped), 'input file')} {have} no known format (.jsonl, .ndjson, .txt, .text, "
                         f".parquet, optionally .gz/.bz2/.zst): {', '.join(skipped[:5])}; narrow --input, or set "
                         "input.format=jsonl|text|parquet, or input.unknown_files=skip|text")
    skip = set(skipped)
    to_read = [m for m in matched if m.path not in skip]
    if to_read and not any(m.size_in_bytes for m in to_read):
        which = "its one input file is" if len(to_read) == 1 else f"all {len(to_read)} input files it matches are"
        raise InputError(f"--input {input_glob!r}: {which} empty (0 bytes), "
                         "so there is nothing to preprocess; point --input at the corpus files")
    return to_read, skipped


def _names(paths: list[str], limit: int = 5) -> str:
    """File names of the first ``limit`` of ``paths`` in sorted order (not the filesystem's listing
    order), comma-separated, with how many more there are."""
    more = f" and {len(paths) - limit:,} more" if len(paths) > limit else ""
    return ", ".join(path.rsplit("/", 1)[-1] for path in sorted(paths)[:limit]) + more


def no_records_error(input_glob: str, paths: list[str], cfg: PipelineConfig) -> InputError:
    """The error for input files that hold no record, worded as :func:`match_input`'s empty-file
    error, naming the files and saying what each format holds: a Parquet file no rows, a JSONL or
    text file only blank lines or whitespace, or nothing once decompressed (formats from
    :func:`pipelines.records.file_format` under ``cfg.input``)."""
    one = len(paths) == 1
    which = "its one input file" if one else f"the {len(paths)} input files it matches"
    formats = {file_format(path, cfg.input) for path in paths}
    lines = (f"only blank lines or whitespace, or {'decompresses' if one else 'decompress'} to nothing"
             if formats - {"parquet"} else "")
    rows = "no rows" if "parquet" in formats else ""
    if rows and lines:
        what = f"they hold {rows} (Parquet) or {lines} (JSONL, text)"
    else:
        what = f"{'it holds' if one else 'they hold'} {rows or lines}"
    return InputError(f"--input {input_glob!r}: no record was read from {which} ({_names(paths)}): {what}, so there "
                      "is nothing to preprocess; check those files and input.format, and point --input at the corpus "
                      "files")


def _warn_skipped(skipped: list[str]) -> None:
    """Warn on stderr that the ``skipped`` input paths (unknown format) are not read, naming them."""
    them = plural(len(skipped), "it", "them")
    print(f"warning: skipping {count(len(skipped), 'input file')} of unknown format ({_names(skipped)}); counted as "
          f"skipped_files in stats.json. Set input.unknown_files=text to read {them} as text, or =error to refuse.",
          file=sys.stderr, flush=True)


def run(input_glob: str, output_dir: str, cfg: PipelineConfig | None = None,
        beam_args: list[str] | None = None, overwrite: bool = False, report: bool = True) -> dict:
    """Run the pipeline to completion and return the contents of ``stats.json``.

    Args:
        input_glob: file pattern (local path or ``gs://``/``s3://``/``hdfs://``): JSONL, text or
            Parquet, optionally ``.gz``/``.bz2``/``.zst``; other files follow ``input.unknown_files``.
        output_dir: folder or fsspec URL receiving shards, ``manifest.json``, ``tokenizer.model``,
            ``stats.json``, ``report.txt``/``report.png``, ``dead_letter/`` and ``duplicates/``.
        cfg: pipeline configuration (defaults when ``None``).
        beam_args: Beam pipeline options, e.g. ``["--direct_running_mode=multi_processing",
            "--direct_num_workers=2"]``; default runner is the DirectRunner.
        overwrite: replace an earlier run in ``output_dir`` instead of refusing.
        report: write ``report.txt`` and ``report.png`` (:mod:`pipelines.accounting.report`) at the end.
    Returns:
        the stats dict (see :func:`pipelines.accounting.stats.aggregate`) plus ``seconds`` (wall time) and
        ``metrics`` (Beam counters, see :func:`counters`).
    Raises:
        colaflow.config.ConfigError: a bad config value (:meth:`PipelineConfig.validate`), an unknown
            Beam option (:func:`beam_options`), or a vocabulary too small for the tokenizer sample.
        FileNotFoundError: no file matches ``input_glob``.
        InputError: ``input_glob`` names a folder, unknown files are refused, or the files are all
            empty (see :func:`match_input`), or no record was read from them (no Parquet rows, only
            blank lines or whitespace, or nothing once decompressed: :func:`no_records_error`).
        pipelines.io.output.OutputExistsError: ``output_dir`` holds an earlier run and not ``overwrite``,
            or with ``overwrite`` an input file or the tokenizer lies inside that earlier run
            (:func:`pipelines.io.output.refuse_inputs_in_artifacts`).
        pipelines.io.output.OutputNotWritableError: ``output_dir`` cannot be written.
        ValueError / RuntimeError: the tokenizer cannot be trained (e.g. nothing survived cleaning),
            no document was kept with a given tokenizer (``EmptySampleError``, raised by
            :func:`pipelines.stages.write_shards.finalize` before it commits anything), or the pipeline did
            not finish.
        KeyboardInterrupt: re-raised after the output folder is cleaned.
    With ``overwrite``, the earlier run is moved into ``output_dir/.previous-run/`` and deleted
    only once this run succeeded (:func:`pipelines.io.output.finish_output`). On any error after the
    output folder was prepared, the artifacts this run wrote are removed first and the earlier run
    is moved back as it was (:func:`pipelines.io.output.abort_output`), so a rerun needs no more
    ``overwrite`` than this one; so is the local ``output_dir`` itself when this run created it
    and it is left empty.
    """
    cfg = cfg or PipelineConfig()
    cfg.validate()
    options = beam_options(beam_args or [])
    FileSystems.set_options(options)  # the driver's own listing of s3:// inputs needs e.g. --s3_endpoint_url
    matched, skipped = match_input(input_glob, cfg)
    if skipped:
        _warn_skipped(skipped)
    empty = sorted(m.path for m in matched if not m.size_in_bytes)
    if empty:
        print(f"note: {count(len(empty), 'input file')} {plural(len(empty), 'is', 'are')} empty (0 bytes: "
              f"{_names(empty)}); nothing is read from {plural(len(empty), 'it', 'them')}; counted as empty_files "
              "in stats.json", file=sys.stderr, flush=True)
    if overwrite:
        refuse_inputs_in_artifacts(output_dir, cfg.shards.prefix, [m.path for m in matched], cfg.tokenizer.path)
    prepared = prepare_output(output_dir, cfg.shards.prefix, overwrite)
    total_bytes = sum(m.size_in_bytes for m in matched)
    runner = None
    if options.view_as(StandardOptions).runner in (None, "DirectRunner"):
        # The DirectRunner first tries Prism, a binary it downloads from GitHub at run time;
        # marking it interactive skips that, so runs are offline and the same everywhere.
        runner = DirectRunner()
        runner.is_interactive()
    elif options.view_as(StandardOptions).runner == "DaskRunner":  # normalised by beam_options
        from pipelines.runners.dask.runner import ColaflowDaskRunner  # dask is optional (colaflow[dask])
        runner = ColaflowDaskRunner(total_bytes)
    print(f"reading {count(len(matched), 'file')}, {total_bytes / 1e6:,.1f} MB", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
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
    except BaseException as e:
        abort_output(prepared)
        if isinstance(e, NoRecordsError):
            raise no_records_error(input_glob, [m.path for m in matched], cfg) from e
        raise
    finish_output(prepared)
    stats["seconds"] = time.perf_counter() - start
    stats["metrics"] = counters(result)
    return stats
