"""Command line of the preprocessing pipeline.

Usage::

    python beam_runner.py --input 'data/corpus/*.jsonl' --output data/shards [--overwrite] [--resume] \\
        [--tokenizer PATH] [--config configs/pipeline.yaml] [section.key=value ...] [Beam options]

Quote the --input glob, so the shell does not expand it into many files. A ``section.key=value``
argument overrides one value of the config (``--config``, else the defaults of
``pipelines.config.PipelineConfig``), e.g. ``shards.num_shards=64 split.val_fraction=0.1``. Any
other ``--name=value`` goes to Beam, e.g. ``--direct_running_mode=multi_processing
--direct_num_workers=2`` or ``--runner=DaskRunner --dask_client_address=HOST:PORT`` (runners and
their options: ``docs/cluster.md``; config knobs: ``docs/preprocessing.md``).

Exit codes: 0 done, 1 runtime/data error, 2 usage/config error, 130 interrupted (Ctrl-C), 143
terminated (SIGTERM, as sent by ``timeout``, Slurm, ``docker stop`` or Kubernetes). An
output folder that holds an earlier run is refused unless ``--overwrite`` is given, which
replaces it only once the new run succeeds; a run that fails or is interrupted removes what it
wrote and keeps the earlier run as it was. It keeps the work of its finished input splits in
OUT/.work/: a rerun of the same job with ``--resume`` reuses it and recomputes the rest, with the
same output as an uninterrupted run (other config or inputs: refused, exit 2).

A ``--flag`` no Beam ``PipelineOptions`` declares (a typo such as ``--runer``) is refused with
exit 2, as are a ``--runner`` colaflow does not run on (``--runner=DaskRuner``, a Beam runner it
does not support, a dotted path that is no ``PipelineRunner`` class), Dask options without
``--runner=DaskRunner``, and config values outside their allowed set or range. Any other bare
word is refused: it is nearly always the second file of an unquoted ``--input`` glob that the
shell expanded.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import signal
import sys
import threading

# Importing Beam logs a notice that its optional Google Cloud clients are missing; they are not
# needed unless the job runs on Dataflow, so the notice is held back for the imports alone.
logging.getLogger().setLevel(logging.ERROR)
from colaflow.wording import help_text, plural  # noqa: E402
from pipelines.accounting.report import REPORT_PNG, REPORT_TXT, report_text  # noqa: E402
from pipelines.config import PipelineConfig  # noqa: E402
from pipelines.io.output import OutputExistsError, OutputNotWritableError  # noqa: E402
from pipelines.io.resume import ResumeError  # noqa: E402
from pipelines.job import InputError, run  # noqa: E402
from pipelines.records import input_root  # noqa: E402
from pipelines.runners.selection import beam_options  # noqa: E402
from pipelines.stages.tokenize import EmptySampleError, given_tokenizer  # noqa: E402
from shards.format.tokens import TokenRangeError  # noqa: E402
from shards.tokenizers import TokenizerError  # noqa: E402

# --help's epilog: the docstring's paragraphs on overrides, Beam options and exit codes
EPILOG = help_text("\n\n".join(__doc__.split("\n\n")[3:5]))
from colaflow.config import ConfigError, load_config  # noqa: E402
from colaflow.errors import io_cause, io_failure, run_cli  # noqa: E402


def split_args(argv: list[str], prog: str | None = None) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Split ``argv`` into our flags, ``key=value`` config overrides and Beam pipeline options;
    ``prog`` is the command line usage errors show (``None``: the script's name).

    Raises:
        SystemExit: (code 2, argparse's usage error) a required flag is missing, or a bare word
            that is neither ``key=value`` nor a ``--flag`` remains (an unquoted glob's extra files).
    """
    ap = argparse.ArgumentParser(prog=prog,
                                 description="Preprocess JSONL/text/Parquet/WARC into tokenised WebDataset shards.",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="input file glob (local, gs://, s3://, hdfs://)")
    ap.add_argument("--output", required=True, help="output folder or fsspec URL")
    ap.add_argument("--tokenizer", default=None, help="existing tokenizer (skip training): a sentencepiece .model, a Hugging Face tokenizer.json or "
                    "its folder, a tiktoken .tiktoken file or a bundled encoding name (cl100k_base); tokenizer.kind "
                    "picks the kind when the name does not tell")
    ap.add_argument("--config", default=None, help="YAML config (pipelines.config.PipelineConfig)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier run in --output (default: refuse to touch it)")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the finished input splits of an unfinished run of the same job in --output (kept in "
                    "OUT/.work/ when a run fails or is killed) and compute only the rest; the output is the same as "
                    "an uninterrupted run's. Refused (exit 2) when the config or an input file changed; without an "
                    "unfinished run, a fresh run")
    args, rest = ap.parse_known_args(argv)
    stray = [a for i, a in enumerate(rest) if _is_stray(a, rest[i - 1] if i else "", args.input)]
    keys = [a for a in stray if _looks_like_key(a)]
    if keys:  # tokenizer.vocab_size: an override that lost its =VALUE, not a file of the glob
        ap.error(f"{keys[0]}: an override needs a value: {keys[0]}=VALUE")
    if stray:
        folder, name = os.path.split(args.input)
        example = os.path.join(folder, "*" + ("." + name.split(".", 1)[1] if "." in name else ""))
        ap.error(f"unexpected {plural(len(stray), 'argument')} {' '.join(stray[:3])}"
                 f"{' ...' if len(stray) > 3 else ''}: quote the --input glob (e.g. --input '{example}') so the "
                 "shell does not expand it into many files; write Beam options as --name=value")
    overrides = [a for a in rest if not a.startswith("-") and "=" in a]
    beam_args = [a for a in rest if a not in overrides]
    return args, overrides, beam_args


def _looks_like_key(word: str) -> bool:
    """Whether a bare word is a dotted config key (``tokenizer.vocab_size``) rather than a path
    (``b.jsonl``): identifiers joined by dots, the first a section of :class:`PipelineConfig`, and
    no file of that name."""
    sections = {f.name for f in dataclasses.fields(PipelineConfig)}
    return (re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", word) is not None
            and word.split(".", 1)[0] in sections and not os.path.exists(word))


def _is_stray(word: str, before: str, input_glob: str) -> bool:
    """Whether a leftover argument is a file the shell expanded from an unquoted ``--input`` glob:
    a bare word that is not the value of a preceding ``--flag`` (Beam allows ``--flag value``),
    or that sits in the same folder as a wildcard-free ``--input`` (what an expanded glob gives)."""
    if word.startswith("-") or "=" in word:
        return False
    if not (before.startswith("-") and "=" not in before):
        return True
    plain = not any(ch in input_glob for ch in "*?[")
    return plain and os.path.dirname(os.path.abspath(word)) == os.path.dirname(os.path.abspath(input_glob))


def _os_error_hint(e: OSError, input_glob: str, output: str) -> str:
    """Which flag an ``OSError`` from the run points at, from the path it names."""
    name = str(e.filename or "")
    if name and name.startswith(output.rstrip("/")):
        return " (check --output: it must be a writable folder)"
    if name and name.startswith(input_root(input_glob) or input_glob):
        return " (check --input)"
    return ""


class _QuietKnownErrors(logging.Filter):
    """Drops the traceback Beam logs (``apache_beam.runners.common``) for an error raised inside a
    step that says what to do next in its message, which :func:`_failure` prints in one line: a
    ``ConfigError`` (exit code 2), an :class:`~pipelines.stages.tokenize.EmptySampleError` (no
    document reached the tokenizer, exit code 1), a :class:`~shards.format.tokens.TokenRangeError`
    (the tokenizer gave an id outside its vocabulary, exit code 1) or an expected I/O failure (no
    space, read-only, no permission: :func:`colaflow.errors.io_cause`, exit code 1)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` (drop) for a record carrying one of the errors above."""
        known = (ConfigError, EmptySampleError, TokenRangeError)
        error = record.exc_info[1] if record.exc_info else None
        return not (error is not None and (isinstance(error, known) or io_cause(error) is not None))


class _Interrupt:
    """SIGINT and SIGTERM handler for one clean exit: remember which signal came, silence logging
    (Beam logs the ``KeyboardInterrupt`` it catches inside a DoFn with a traceback, then re-raises
    it wrapped), and raise ``KeyboardInterrupt`` so :func:`pipelines.job.run` removes its partial
    output and puts the earlier run back. A second signal of either kind interrupts at once.

    Attributes:
        signum: the signal received (``signal.SIGINT`` or ``signal.SIGTERM``), or ``None``.
    """

    signum: int | None = None

    def __call__(self, signum, frame):
        self.signum = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt


KEPT = " (its finished input splits are kept for --resume)"  # what an interrupted run leaves
_STEP_SUFFIX = re.compile(r" \[while running '.*?'\]")  # what Beam appends to an error raised in a step


def one_line(e: BaseException) -> str:
    """The message of ``e`` without the `` [while running 'Step/Name']`` Beam appends for an error
    raised inside a step: the step name means nothing to the user, and the traceback Beam logs
    for an unknown error still names it."""
    return _STEP_SUFFIX.sub("", str(e))


def _failure(e: BaseException, args: argparse.Namespace) -> int:
    """Print the one-line error for an exception of :func:`pipelines.job.run`; return the exit code
    (2 usage, 1 runtime/data). Re-raises exceptions it does not know (a bug: keep the traceback)."""
    if isinstance(e, (OutputExistsError, InputError, ConfigError, ResumeError)):
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    if isinstance(e, FileNotFoundError) and e.filename is None:  # nothing matches the glob
        print(f"error: {one_line(e)} (check --input, and quote the glob)", file=sys.stderr)
        return 2
    if isinstance(e, OutputNotWritableError):
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    io = io_cause(e)  # no space, read-only, no permission: also when Beam wrapped it in its own error
    if io is not None:
        print(f"error: {io_failure(io, args.output)}{_os_error_hint(io, args.input, args.output)}", file=sys.stderr)
        return 1
    if isinstance(e, OSError):
        print(f"error: {one_line(e)}{_os_error_hint(e, args.input, args.output)}", file=sys.stderr)
        return 1
    if isinstance(e, (ValueError, RuntimeError)):
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    raise e


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the command line (``argv`` without the program name; ``sys.argv[1:]`` when ``None``;
    ``prog``: the command line its usage shows, ``colaflow preprocess`` when run as that); returns the
    exit code: 0 done, 1 runtime/data error, 2 usage/config error, 130 interrupted (SIGINT), 143
    terminated (SIGTERM)."""
    args, overrides, beam_args = split_args(sys.argv[1:] if argv is None else argv, prog)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
    try:
        cfg = load_config(PipelineConfig, args.config, overrides)
        if args.tokenizer is not None:  # before validation: tokenizer.kind=hf is valid with --tokenizer PATH
            cfg.tokenizer.path = args.tokenizer
        cfg.validate()
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: config: {e}", file=sys.stderr)
        return 2
    try:
        beam_options(beam_args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    quiet = _QuietKnownErrors()
    logging.getLogger("apache_beam.runners.common").addFilter(quiet)
    tokenizer = None
    if cfg.tokenizer.path is not None:  # read once, before the output folder is touched; one line names flag and file
        try:
            tokenizer = given_tokenizer(cfg.tokenizer)
        except TokenizerError as e:
            flag = "--tokenizer" if args.tokenizer is not None else "tokenizer.path"
            print(f"error: {flag} {cfg.tokenizer.path or repr('')}: {str(e).removeprefix(cfg.tokenizer.path + ': ')}",
                  file=sys.stderr)
            return 2
    print(f"preprocessing {args.input} -> {args.output} (beam options: {' '.join(beam_args) or 'DirectRunner'})",
          file=sys.stderr)
    interrupt = _Interrupt()
    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    try:
        stats = run(args.input, args.output, cfg, beam_args, overwrite=args.overwrite, tokenizer=tokenizer,
                    resume=args.resume)
    except BaseException as e:  # noqa: B036 - Ctrl-C arrives wrapped in whatever Beam raises
        if interrupt.signum == signal.SIGTERM:
            print(f"terminated; removed this run's partial output from {args.output}{KEPT}", file=sys.stderr)
            return 128 + signal.SIGTERM
        if interrupt.signum is not None or isinstance(e, KeyboardInterrupt):
            print(f"interrupted; removed this run's partial output from {args.output}{KEPT}", file=sys.stderr)
            return 130
        return _failure(e, args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.disable(logging.NOTSET)
        logging.getLogger("apache_beam.runners.common").removeFilter(quiet)
    out = args.output.rstrip("/")
    print(report_text(stats), end="")
    print(f"done in {stats['seconds']:.1f} s; manifest: {out}/manifest.json; report: {out}/{REPORT_TXT}, "
          f"{out}/{REPORT_PNG}")
    return 0


if __name__ == "__main__":
    run_cli(main)
