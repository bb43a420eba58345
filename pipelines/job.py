"""The preprocessing job: :func:`build` adds the graph (``pipelines/README.md`` draws it) to a
Beam pipeline, :func:`run` checks the input and output, runs it and returns ``stats.json``."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import apache_beam as beam
import fsspec
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.runner import PipelineState

from colaflow.wording import count, plural
from pipelines.accounting.read_summary import summarize
from pipelines.accounting.report import write_report
from pipelines.accounting.stats import EVENTS, NAMESPACE
from pipelines.config import PipelineConfig
from pipelines.io.output import (
    DEAD_LETTER_DIR,
    DECONTAMINATED_DIR,
    DUPLICATES_DIR,
    WriteJsonl,
    abort_output,
    finish_output,
    prepare_output,
    refuse_inputs_in_artifacts,
)
from pipelines.io.listing import InputFile, InputListing, ListingError, list_inputs
from pipelines.io.read import DEAD, ReadRecords
from pipelines.io.resume import (JobIdentity, SplitWorkFn, WorkFolder, check_resume, keeps_work, remove_work,
                                 start_work)
from pipelines.records import file_format
from pipelines.runners.selection import beam_options, make_runner
from pipelines.stages.classifier import check_model
from pipelines.stages.exact_dedup import ExactDedup
from pipelines.stages.decontam import load_eval_sets
from pipelines.stages.filters import LISTED
from pipelines.stages.quality.c4 import bad_words_pattern
from pipelines.stages.near_dedup import NearDedup
from pipelines.stages.keys import KeyStats, sample_sizes
from pipelines.stages.payload import BANDS, Candidates, HotDocs, NearDocs, PayloadFn, SampleTexts, by_split
from pipelines.stages.split import VAL, VAL_DIR, val_shard_config
from pipelines.stages.tokenize import NoRecordsError, build_model
from pipelines.stages.write_shards import WriteShards, finalize
from shards.tokenizers import TokenizerFile


@dataclass(frozen=True)
class InputSelection:
    """The input of one run (:func:`match_input`).

    Attributes:
        listing: what ``--input`` names, broken links included.
        to_read: the files read (known format, or ``input.unknown_files: text``).
        skipped: paths of the files of unknown format that are not read.
    """

    listing: InputListing
    to_read: list[InputFile]
    skipped: list[str]


class InputError(ValueError):
    """``--input`` names no readable set of files (a folder, files of unknown format under
    ``input.unknown_files: error``, only empty files, or files that hold no record); the message
    says what to pass instead."""


def build(p: beam.Pipeline, inputs: InputListing, output_dir: str, cfg: PipelineConfig, work: WorkFolder,
          total_bytes: int = 0, tokenizer: TokenizerFile | None = None) -> None:
    """Add the whole preprocessing graph to pipeline ``p``: it reads the files and counts the broken
    links of ``inputs`` (:func:`match_input`), its outputs go to ``output_dir``, each finished split's
    documents to ``work`` (:mod:`pipelines.io.resume`); ``total_bytes`` of input sizes the progress bar;
    ``tokenizer``: the one at ``cfg.tokenizer.path``, read already."""
    out = output_dir.rstrip("/")
    read = p | "Read" >> ReadRecords(inputs, cfg.input)
    kept = read.splits | "Work" >> beam.ParDo(SplitWorkFn(work, cfg, inputs.root, total_bytes)).with_outputs(
        DEAD, EVENTS, LISTED, main="docs")
    if cfg.decontam.eval_sets:  # the only step that lists
        kept[LISTED] | "DecontaminatedWrite" >> WriteJsonl(f"{out}/{DECONTAMINATED_DIR}", work.spill)
    summary = summarize([kept[EVENTS]], kept[DEAD])  # read only to explain an empty sample
    events, duplicates = [read.events, kept[EVENTS]], []
    # From here on the documents are one row each in an array per split (KEY_ROW): their text and
    # their DocKeys stay in the split records of OUT/.work/
    stats = beam.pvalue.AsSingleton(kept.docs | "KeyStats" >> beam.CombineGlobally(KeyStats(work.spill)))
    dedups, docs, dropped = [], None, None
    if cfg.dedup.exact or cfg.dedup.near:  # the documents a global step decides on, read back per split
        found = read.splits | "Candidates" >> beam.ParDo(
            Candidates(work, cfg.dedup.exact, cfg.dedup.bands if cfg.dedup.near else 0), stats).with_outputs(
                BANDS, main="repeated")
    if cfg.dedup.exact:
        def hot_docs(hot):  # read back from the records, where Work put them
            return read.splits | "HotDocs" >> beam.ParDo(HotDocs(work), stats, hot)

        dedups.append(found.repeated | "ExactDedup" >> ExactDedup(cfg.dedup.write_duplicates, keyed_input=True,
                                                                  hot_docs=hot_docs))
        docs = dedups[-1].docs
    if docs is None:  # no exact dedup: the final pass keeps every document itself
        docs = p | "NoneListed" >> beam.Create([])
    if cfg.dedup.near:
        def near_docs(candidates):  # read from the records, where Work put the signatures
            return by_split(read.splits, docs, "JoinNear") | "NearDocs" >> beam.ParDo(
                NearDocs(work, cfg.dedup.exact), stats, candidates)

        dedups.append(found[BANDS] | "NearDedup" >> NearDedup(cfg.dedup, work.spill, near_docs))
        dropped = dedups[-1].dropped
    for dedup in dedups:
        events.append(dedup.events)
        duplicates += dedup.duplicates
    if duplicates and cfg.dedup.write_duplicates:  # each stage's lines spilled where they are made
        tuple(duplicates) | "DuplicatesWrite" >> WriteJsonl(f"{out}/{DUPLICATES_DIR}", work.spill)
    # Trained on the kept documents before dedup (the sample counts a repeated text once), so
    # the model is ready before dedup ends; its texts are read back from the records.
    sizes = kept.docs | "SampleSizes" >> beam.FlatMap(sample_sizes)
    model = build_model(
        sizes, lambda limit: read.splits | "Tokenizer/Select" >> beam.ParDo(
            SampleTexts(work), limit, cfg.tokenizer.sample_fraction),
        cfg.tokenizer, summary=summary, given=tokenizer)
    # The final pass: each split's kept documents read back from its record (those exact dedup
    # listed and those no global step decided on, less those near dedup dropped), tokenised and spilled.
    payload = (by_split(read.splits, docs, "JoinKept", dropped)
               | "Payload" >> beam.ParDo(PayloadFn(work, cfg), beam.pvalue.AsSingleton(model), stats).with_outputs(
                   EVENTS, VAL, main="train"))
    events.append(payload[EVENTS])
    tokenized, val_shards = payload.train, None
    if cfg.split.val_fraction > 0:
        val_written = payload[VAL] | "ValShards" >> WriteShards(f"{out}/{VAL_DIR}", val_shard_config(cfg.shards),
                                                                work.spill)
        events.append(val_written[EVENTS])
        val_shards = beam.pvalue.AsList(val_written.shards)
    written = tokenized | "Shards" >> WriteShards(out, cfg.shards, work.spill)
    events.append(written[EVENTS])
    counts = events | "AllEvents" >> beam.Flatten() | "SumEvents" >> beam.CombinePerKey(sum)
    (kept[DEAD]
     | "DeadJson" >> beam.Map(lambda d: d.to_json())
     | "DeadWrite" >> WriteJsonl(f"{out}/{DEAD_LETTER_DIR}", work.spill))
    (p
     | "Start" >> beam.Create([None])
     | "Finalize" >> beam.Map(finalize, out, cfg.shards, cfg.tokenizer, beam.pvalue.AsList(written.shards),
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


def match_input(input_glob: str, cfg: PipelineConfig) -> InputSelection:
    """What ``input_glob`` names (:func:`pipelines.io.listing.list_inputs`: an existing path literally,
    else the glob, following links), split into the files to read and those skipped.

    A skipped file has an unknown format (:func:`pipelines.records.file_format`) under
    ``input.unknown_files: skip``; a skipped link has no target.

    Raises:
        InputError: ``input_glob`` is a folder, unknown files under ``input.unknown_files: error``,
            or every file to read is empty (0 bytes), or its folder cannot be listed.
        FileNotFoundError: nothing matches ``input_glob`` (not even a broken link).
    """
    try:
        listing = list_inputs(input_glob)
    except ListingError as e:
        raise InputError(str(e)) from e
    if listing.folder:
        folder = input_glob.rstrip("/")
        raise InputError(f"--input {input_glob} is a folder; give a quoted glob of its files, e.g. "
                         f"--input '{folder}/*.jsonl' (or '{folder}/**' to include subfolders)")
    if not listing.files and not listing.broken_links:
        raise FileNotFoundError(f"no input file matches {input_glob!r}")
    skipped = sorted(m.path for m in listing.files if file_format(m.path, cfg.input) is None)
    if skipped and cfg.input.unknown_files == "error":
        have = "has" if len(skipped) == 1 else "have"
        raise InputError(f"{count(len(skipped), 'input file')} {have} no known format (.jsonl, .ndjson, .txt, .text, "
                         f".parquet, .warc, optionally .gz/.bz2/.zst): {', '.join(skipped[:5])}; narrow --input, or "
                         "set input.format=jsonl|text|parquet|warc, or input.unknown_files=skip|text")
    skip = set(skipped)
    to_read = [m for m in listing.files if m.path not in skip]
    if not to_read:
        links = f" (only broken links: {_names(list(listing.broken_links))})" if listing.broken_links else ""
        raise InputError(f"--input {input_glob!r}: no file to read{links}; point --input at the corpus files")
    if not any(m.size_in_bytes for m in to_read):
        which = "its one input file is" if len(to_read) == 1 else f"all {len(to_read)} input files it matches are"
        raise InputError(f"--input {input_glob!r}: {which} empty (0 bytes), "
                         "so there is nothing to preprocess; point --input at the corpus files")
    return InputSelection(listing, to_read, skipped)


def _names(paths: list[str], limit: int = 5) -> str:
    """File names of the first ``limit`` of ``paths`` in sorted order (not the filesystem's listing
    order), comma-separated, with how many more there are."""
    more = f" and {len(paths) - limit:,} more" if len(paths) > limit else ""
    return ", ".join(path.rsplit("/", 1)[-1] for path in sorted(paths)[:limit]) + more


def no_records_error(input_glob: str, paths: list[str], cfg: PipelineConfig) -> InputError:
    """The error for input files that hold no record, worded as :func:`match_input`'s empty-file
    error, naming the files and saying what each format holds: a Parquet file no rows, a JSONL or
    text file only blank lines or whitespace, or nothing once decompressed, a WARC file no response
    record (formats from
    :func:`pipelines.records.file_format` under ``cfg.input``)."""
    one = len(paths) == 1
    which = "its one input file" if one else f"the {len(paths)} input files it matches"
    formats = {file_format(path, cfg.input) for path in paths}
    held = [(text, kind) for text, kind, present in (
        ("no rows", "Parquet", "parquet" in formats),
        (f"only blank lines or whitespace, or {'decompresses' if one else 'decompress'} to nothing", "JSONL, text",
         bool(formats - {"parquet", "warc"})),
        ("no WARC response record", "WARC", "warc" in formats)) if present]
    if len(held) > 1:
        what = "they hold " + " or ".join(f"{text} ({kind})" for text, kind in held)
    else:
        what = f"{'it holds' if one else 'they hold'} {held[0][0]}"
    return InputError(f"--input {input_glob!r}: no record was read from {which} ({_names(paths)}): {what}, so there "
                      "is nothing to preprocess; check those files and input.format, and point --input at the corpus "
                      "files")


def _warn_skipped(skipped: list[str]) -> None:
    """Warn on stderr that the ``skipped`` input paths (unknown format) are not read, naming them."""
    them = plural(len(skipped), "it", "them")
    print(f"warning: skipping {count(len(skipped), 'input file')} of unknown format ({_names(skipped)}); counted as "
          f"skipped_files in stats.json. Set input.unknown_files=text to read {them} as text, or =error to refuse.",
          file=sys.stderr, flush=True)


def _warn_broken(links: list[str]) -> None:
    """Warn on stderr that the ``links`` among the inputs point at nothing, naming them."""
    print(f"warning: skipping {count(len(links), 'input link')} whose target does not exist ({_names(links)}); "
          "counted as skipped_links in stats.json. Fix or remove the links to read what they pointed at.",
          file=sys.stderr, flush=True)


def run(input_glob: str, output_dir: str, cfg: PipelineConfig | None = None,
        beam_args: list[str] | None = None, overwrite: bool = False, report: bool = True,
        tokenizer: TokenizerFile | None = None, resume: bool = False) -> dict:
    """Run the pipeline to completion and return the contents of ``stats.json``.

    Args:
        input_glob: file pattern (local path or ``gs://``/``s3://``/``hdfs://``): JSONL, text or
            Parquet or WARC, optionally ``.gz``/``.bz2``/``.zst``; other files follow ``input.unknown_files``.
        output_dir: folder or fsspec URL receiving shards, ``manifest.json``, ``tokenizer.model``,
            ``stats.json``, ``report.txt``/``report.png``, ``dead_letter/``, ``duplicates/`` and
            ``decontaminated/``.
        cfg: pipeline configuration (defaults when ``None``).
        beam_args: Beam pipeline options, e.g. ``["--direct_running_mode=multi_processing",
            "--direct_num_workers=2"]``; default runner is the DirectRunner.
        overwrite: replace an earlier run in ``output_dir`` instead of refusing.
        report: write ``report.txt`` and ``report.png`` (:mod:`pipelines.accounting.report`) at the end.
        tokenizer: the tokenizer at ``cfg.tokenizer.path`` as the caller read it
            (:func:`pipelines.stages.tokenize.given_tokenizer`), used as it is; ``None``: read here.
        resume: reuse the finished input splits of an unfinished run of the same job in ``output_dir``
            (:mod:`pipelines.io.resume`); a fresh run when there is none.
    Returns:
        the stats dict (see :func:`pipelines.accounting.stats.aggregate`) plus ``seconds`` (wall time) and
        ``metrics`` (Beam counters, see :func:`counters`).
    Raises:
        colaflow.config.ConfigError: a bad config value (:meth:`PipelineConfig.validate`), an unknown
            Beam option (:func:`beam_options`), or a vocabulary too small for the tokenizer sample.
        FileNotFoundError: no file matches ``input_glob``.
        colaflow.config.ConfigError: also ``classifier.path`` or ``quality.c4.bad_words`` names no file
            (or an empty list), or a ``decontam.eval_sets`` entry matches no file, has a file of unknown
            format, or holds no n-gram (``pipelines.stages.decontam.EvalSetError``).
        InputError: ``input_glob`` names a folder, unknown files are refused, or the files are all
            empty (see :func:`match_input`), or no record was read from them (no Parquet rows, only
            blank lines or whitespace, or nothing once decompressed: :func:`no_records_error`).
        pipelines.io.output.OutputExistsError: ``output_dir`` holds an earlier run and not ``overwrite``,
            or with ``overwrite`` an input file or the tokenizer lies inside that earlier run
            (:func:`pipelines.io.output.refuse_inputs_in_artifacts`).
        pipelines.io.output.OutputNotWritableError: ``output_dir`` cannot be written.
        pipelines.io.resume.ResumeError: ``resume``, and the unfinished run in ``output_dir`` had
            another config or other input files (:func:`pipelines.io.resume.check_resume`).
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
    and it is left empty. The finished splits in ``output_dir/.work/`` are kept for ``resume``
    when the run fails (but for an error that says to change the config or the input:
    :func:`pipelines.io.resume.keeps_work`) and removed when it succeeds.
    """
    cfg = cfg or PipelineConfig()
    cfg.validate()
    check_model(cfg.classifier)  # given files are checked here, each error in one line
    c4 = cfg.quality.c4
    if cfg.quality.enabled and c4.enabled and c4.bad_words:
        bad_words_pattern(c4.bad_words)
    load_eval_sets(cfg.decontam)
    options = beam_options(beam_args or [])
    FileSystems.set_options(options)  # the driver's own listing of s3:// inputs needs e.g. --s3_endpoint_url
    selection = match_input(input_glob, cfg)
    matched, skipped = selection.to_read, selection.skipped
    if skipped:
        _warn_skipped(skipped)
    if selection.listing.broken_links:
        _warn_broken(list(selection.listing.broken_links))
    empty = sorted(m.path for m in matched if not m.size_in_bytes)
    if empty:
        print(f"note: {count(len(empty), 'input file')} {plural(len(empty), 'is', 'are')} empty (0 bytes: "
              f"{_names(empty)}); nothing is read from {plural(len(empty), 'it', 'them')}; counted as empty_files "
              "in stats.json", file=sys.stderr, flush=True)
    if overwrite:
        refuse_inputs_in_artifacts(output_dir, cfg.shards.prefix, [m.path for m in matched], cfg.tokenizer.path)
    identity = JobIdentity.of(cfg, selection.listing)
    if resume:
        check_resume(output_dir, identity)
    prepared = prepare_output(output_dir, cfg.shards.prefix, overwrite, resume)
    total_bytes = sum(m.size_in_bytes for m in matched)
    runner = make_runner(options, total_bytes)
    print(f"reading {count(len(matched), 'file')}, {total_bytes / 1e6:,.1f} MB", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        work = start_work(output_dir, identity, resume)
        p = beam.Pipeline(runner=runner, options=options)
        build(p, selection.listing, output_dir, cfg, work, total_bytes, tokenizer)
        result = p.run()
        state = result.wait_until_finish()
        if state != PipelineState.DONE:
            raise RuntimeError(f"pipeline ended in state {state}; see the Beam log above")
        with fsspec.open(f"{output_dir.rstrip('/')}/stats.json", "r", encoding="utf-8") as f:
            stats = json.load(f)
        if stats["run"]["near_unresolved_pairs"]:  # the worker logged it too, maybe on another machine
            print(f"warning: near-dedup clustering did not converge in dedup.near_rounds={cfg.dedup.near_rounds} "
                  f"rounds; {stats['run']['near_unresolved_pairs']} label pairs were settled after them "
                  f"(stats.json run.near_unresolved_pairs); raise dedup.near_rounds", file=sys.stderr, flush=True)
        if report:
            write_report(output_dir, stats)
    except BaseException as e:
        if not keeps_work(e):
            remove_work(output_dir)
        abort_output(prepared)
        if isinstance(e, NoRecordsError):
            raise no_records_error(input_glob, [m.path for m in matched], cfg) from e
        raise
    finish_output(prepared)
    remove_work(output_dir)
    stats["seconds"] = time.perf_counter() - start
    stats["metrics"] = counters(result)
    return stats
