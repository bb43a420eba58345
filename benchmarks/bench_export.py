"""Export benchmark: perplexity and latency of the ONNX fp32/fp16/int8 variants of a checkpoint
against the PyTorch fp32 model (the baseline) on the same validation batches, one run.

Uses the newest checkpoint of ``make demo`` (``runs/demo/train/checkpoints``) and its validation
split (``runs/demo/shards`` → ``val/``) unless told otherwise. Prints the conversion table and, per
batch size, PyTorch eager latency / onnxruntime latency, both with ``--threads`` threads (1 by
default: on a shared machine OpenMP threads that spin-wait for busy cores inflate PyTorch's
latency many times over).

Run: ``.venv/bin/python benchmarks/bench_export.py [--checkpoint DIR --data MANIFEST --batch-sizes 1,8]``
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from colaflow.wording import help_text  # noqa: E402
from trainer.checkpointing import latest_checkpoint  # noqa: E402
from trainer.export import ExportConfig, run_export  # noqa: E402


def main() -> int:
    """Export the demo checkpoint in each precision and print perplexity and latency per batch size."""
    ap = argparse.ArgumentParser(description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="", help="checkpoint folder (default: newest of runs/demo)")
    ap.add_argument("--data", default="runs/demo/shards", help="dataset manifest with a val split")
    ap.add_argument("--precisions", default="fp32,fp16,int8")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--batches", type=int, default=4, help="validation batches of 8 rows compared")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per batch size (median)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of onnxruntime and of PyTorch (same for both; 0 = defaults)")
    args = ap.parse_args()
    ckpt = args.checkpoint or latest_checkpoint("runs/demo/train/checkpoints")
    if not ckpt or not os.path.isdir(ckpt):
        print("no checkpoint: run `make demo` first (or pass --checkpoint and --data); skipping")
        return 0
    cfg = ExportConfig(format="onnx", precisions=args.precisions.split(","),
                       batch_sizes=[int(b) for b in args.batch_sizes.split(",")], data=args.data,
                       batches=args.batches, latency_runs=args.runs, threads=args.threads)
    with tempfile.TemporaryDirectory(prefix="colaflow-export-") as out:
        report = run_export(ckpt, out, cfg)
    print(f"checkpoint {ckpt}, validation {report.validation['tokens']:,} tokens "
          f"({report.validation['rows']} x {report.validation['seq_len']} per batch, held out: "
          f"{report.validation['held_out']})")
    print(report.table())
    ref = report.reference["latency_ms"]
    for v in report.variants:
        if v.latency_ms:
            ratios = ", ".join(f"b={b}: {ref[b] / v.latency_ms[b]:.2f}x" for b in sorted(v.latency_ms))
            print(f"{v.name}: speed vs PyTorch eager fp32 {ratios}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
