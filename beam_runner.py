"""Command line of the preprocessing pipeline.

Usage::

    python beam_runner.py --input 'data/corpus/*.jsonl' --output data/shards [--overwrite] \\
        [--tokenizer PATH] [--config configs/pipeline.yaml] [section.key=value ...] [Beam options]

An output folder that holds an earlier run is refused unless ``--overwrite`` is given.

Anything that is neither one of our flags nor ``key=value`` is passed to Beam, e.g.
``--direct_running_mode=multi_processing --direct_num_workers=2`` or
``--runner=FlinkRunner --flink_master=host:8081`` (see ``docs/cluster.md``).
"""
from __future__ import annotations

import argparse
import logging
import sys

# Importing Beam logs a notice that its optional Google Cloud clients are missing; they are not
# needed unless the job runs on Dataflow, so the notice is held back for the imports alone.
logging.getLogger().setLevel(logging.ERROR)
from pipelines.config import PipelineConfig  # noqa: E402
from pipelines.corpus import CorpusNotInstalled  # noqa: E402
from pipelines.job import run  # noqa: E402
from pipelines.output import OutputExistsError  # noqa: E402
from pipelines.report import REPORT_PNG, REPORT_TXT, report_text  # noqa: E402
from shards.config import ConfigError, load_config  # noqa: E402


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Split ``argv`` into our flags, ``key=value`` config overrides and Beam pipeline options."""
    ap = argparse.ArgumentParser(description="Preprocess JSONL/text/Parquet into tokenised WebDataset shards.")
    ap.add_argument("--input", required=True, help="input file glob (local, gs://, s3://, hdfs://)")
    ap.add_argument("--output", required=True, help="output folder or fsspec URL")
    ap.add_argument("--tokenizer", default=None, help="existing sentencepiece .model (skip training)")
    ap.add_argument("--config", default=None, help="YAML config (pipelines.config.PipelineConfig)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier run in --output (default: refuse to touch it)")
    args, rest = ap.parse_known_args(argv)
    overrides = [a for a in rest if not a.startswith("-") and "=" in a]
    beam_args = [a for a in rest if a not in overrides]
    return args, overrides, beam_args


def main(argv: list[str] | None = None) -> int:
    args, overrides, beam_args = split_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
    try:
        cfg = load_config(PipelineConfig, args.config, overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: config: {e}", file=sys.stderr)
        return 2
    if args.tokenizer:
        cfg.tokenizer.path = args.tokenizer
    print(f"preprocessing {args.input} -> {args.output} (beam options: {' '.join(beam_args) or 'DirectRunner'})",
          file=sys.stderr)
    try:
        stats = run(args.input, args.output, cfg, beam_args, overwrite=args.overwrite)
    except (CorpusNotInstalled, OutputExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}\n(check --input; quote the glob so the shell does not expand it)", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = args.output.rstrip("/")
    print(report_text(stats), end="")
    print(f"done in {stats['seconds']:.1f} s; manifest: {out}/manifest.json; report: {out}/{REPORT_TXT}, "
          f"{out}/{REPORT_PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
