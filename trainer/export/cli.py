"""``python -m trainer export``: the command line of :func:`trainer.export.run_export`."""
from __future__ import annotations

import argparse
import os
import sys

from colaflow.config import ConfigError, load_config
from colaflow.errors import USAGE
from trainer.checkpointing.layout import exists
from trainer.export.config import FORMATS, ExportConfig
from trainer.export.pipeline import run_export
from trainer.llama import NotExpressible


def _single_artifact(out: str, fmt: str) -> tuple[str, str, str]:
    """``(folder, name, report prefix)`` of the one artifact ``OUT.pt`` or the ``hf`` folder ``OUT``
    names: both go into OUT's parent, which other files may share, so the report is named after them.

    Raises:
        ValueError: ``hf`` and OUT is a folder that is not an earlier hf export (it would be replaced).
    """
    from trainer.export.hf import PROVENANCE_FILE
    path = os.path.abspath(out.rstrip("/"))
    if fmt == "hf" and os.path.isdir(path) and os.listdir(path) and not os.path.exists(
            os.path.join(path, PROVENANCE_FILE)):
        raise ValueError(f"{out} exists and is not an earlier hf export, and the export replaces that folder: give "
                         "a new folder name")
    name = os.path.basename(path)
    return os.path.dirname(path), name, f"{name}."


def main(argv: list[str] | None = None, prog: str = "python -m trainer export") -> int:
    """``python -m trainer export CKPT OUT [--format onnx|pt|hf] ...``: :func:`trainer.export.run_export`;
    returns the exit code (0 every variant kept, 1 one exceeds its tolerance or the export failed,
    2 usage/config, no checkpoint, or a model the format cannot express)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Export a checkpoint as ONNX (fp32/fp16/int8), one consolidated .pt file or a Hugging Face "
                    "Llama folder (transformers, vLLM, llama.cpp's converter read it), verify every variant on "
                    "validation data, and keep only those within tolerance (exit 1 otherwise).")
    parser.add_argument("checkpoint", help="checkpoint folder (step_XXXXXX or weights_XXXXXX)")
    parser.add_argument("out", help="output folder (onnx); a file NAME.pt for the consolidated torch.save file; the "
                        "Hugging Face folder to write (hf; its report goes beside it as OUT.conversion_report.json)")
    parser.add_argument("--format", choices=list(FORMATS), help="onnx (default), pt (default for OUT.pt) or hf")
    parser.add_argument("--precision", help="ONNX precisions, comma-separated: fp32,fp16,int8 (default fp32,int8)")
    parser.add_argument("--batch-sizes", help="batch sizes timed on onnxruntime, comma-separated (default 1,8)")
    parser.add_argument("--data", help="dataset or validation manifest (default: the checkpoint's data.manifest)")
    parser.add_argument("--config", help="YAML ExportConfig (tolerances, rows, batches, ...)")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. tolerance.int8.ppl_delta=0.05")
    args = parser.parse_intermixed_args(argv)  # key=value may come before or after the flags
    try:
        cfg = load_config(ExportConfig, args.config, args.overrides)
        legacy_file = args.out.endswith(".pt") and args.format in (None, "pt")
        cfg.format = "pt" if legacy_file else (args.format or cfg.format)
        if args.precision:
            cfg.precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
        if args.batch_sizes:
            cfg.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        cfg.data = args.data or cfg.data
        cfg.validate()
        out_dir, name, prefix = _single_artifact(args.out, cfg.format) if legacy_file or cfg.format == "hf" \
            else (args.out, "", "")
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: export config: {e}", file=sys.stderr)
        return USAGE
    if not exists(args.checkpoint):
        print(f"error: no checkpoint at {args.checkpoint}", file=sys.stderr)
        return USAGE
    try:
        report = run_export(args.checkpoint, out_dir, cfg, name, prefix)
    except NotExpressible as e:
        print(f"error: export: {e}", file=sys.stderr)
        return USAGE
    except (FileNotFoundError, ValueError) as e:
        print(f"error: export: {e}", file=sys.stderr)
        return 1
    print(report.table())
    for note in (n for v in report.variants for n in v.notes):
        print(f"note: {note}", file=sys.stderr)
    if report.validation["validated_on"] == "random_tokens":
        print(f"warning: export NOT verified on validation data: {report.validation['unavailable']}; parity was "
              "checked on random tokens only. Pass --data MANIFEST (a dataset or val manifest) to verify it",
              file=sys.stderr)
    kept = list(dict.fromkeys(v.path for v in report.variants if v.passed))  # hf: two checks of one folder
    print(f"wrote {', '.join(kept) or 'no model'} and {os.path.join(out_dir, prefix + 'conversion_report.json')}")
    if not report.passed:
        print("error: some variants exceed their tolerance and were not written under their final name (see the "
              "table); loosen tolerance.* only if the numbers are acceptable", file=sys.stderr)
        return 1
    return 0
