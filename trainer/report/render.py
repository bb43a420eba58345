"""``python -m trainer report RUN_DIR`` (or ``python -m trainer.report.render``): an HTML report
of a training run from its ``metrics.jsonl``.

Writes ``RUN_DIR/report/index.html`` with the PNG plots of :mod:`trainer.report.plots`
(loss with validation loss and resume/rollback/skip markers, learning rate, gradient norm,
throughput and MFU, step-time split, cache, per-layer statistics, hardware), a summary table
(steps, final loss, tokens, world size, throughput, resumes, rollbacks, ...) and the run's ``config.json``.

Reads ``RUN_DIR/metrics.jsonl`` (the file ``metrics.jsonl`` names in ``config.json`` when set),
``RUN_DIR/events.jsonl``, ``RUN_DIR/config.json`` and ``RUN_DIR/train_summary.json`` when present.
Lines that are not JSON objects with an integer ``step`` are skipped, counted and listed in the
report. When a resumed run logged a step twice the later fields win. Plots whose fields the run
did not log are left out (no empty plots).
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys

from colaflow.errors import run_cli
from colaflow.wording import help_text
from trainer.metrics.sources import source_rows
from trainer.report.plots import PLOTS
from trainer.report.run_metrics import Markers, RunMetrics, read_markers, read_metrics

__all__ = ["read_metrics", "summarize", "write_report", "main"]


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def summarize(m: RunMetrics, config: dict, summary: dict, markers: Markers | None = None) -> list[tuple[str, str]]:
    """The report's summary table as ``(label, value)`` strings."""
    rows: list[tuple[str, str]] = []
    steps, losses = m.series("loss")
    last = m.records[-1] if m.records else {}
    if "final_step" in summary:
        rows.append(("steps", f"{summary['final_step']} ({summary.get('train_steps', '?')} in the last process run)"))
    rows.append(("logged steps", f"{len(m.records)} records, steps {m.records[0]['step']}–{last['step']}"
                 if m.records else "none"))
    if steps:
        rows.append(("loss", f"{losses[0]:.4f} (step {steps[0]}) → {losses[-1]:.4f} (step {steps[-1]})"))
        rows.append(("final loss", f"{losses[-1]:.4f}"))
    tokens = int(m.total("tokens"))
    rows.append(("tokens", f"{tokens:,}"))
    world = last.get("world_size", summary.get("world_size"))
    rows.append(("world size", str(world) if world is not None else "unknown"))
    interval, tps = m.total("interval_s"), m.series("tokens_per_second")[1]
    if interval > 0:
        rows.append(("throughput", f"{tokens / interval:,.0f} tokens/s over {interval:.1f} s logged"))
    elif tps:
        rows.append(("throughput", f"{sum(tps) / len(tps):,.0f} tokens/s (mean of records)"))
    mfu = m.series("mfu")[1]
    if mfu:
        rows.append(("MFU", f"{100 * sum(mfu) / len(mfu):.1f}% mean ({last.get('flops_per_token', 0):.3g} "
                     "model FLOPs/token, PaLM appendix B)"))
    if interval > 0 and m.series("data_wait_s")[0]:
        rows.append(("data wait share", f"{100 * m.total('data_wait_s') / interval:.1f}% (rank 0)"))
    lookups = m.total("cache_hits") + m.total("cache_misses")
    if lookups:
        rows.append(("cache hit rate", f"{100 * m.total('cache_hits') / lookups:.1f}% of {int(lookups):,} lookups, "
                     f"{m.total('cache_stall_s'):.2f} s stalled"))
    pad = m.series("padding_efficiency")[1]
    if pad:
        rows.append(("padding efficiency", f"{100 * sum(pad) / len(pad):.1f}% (mean)"))
    rows.extend(source_rows(m.records, config))  # per-source tokens and shares of a data.mixture run
    mem = m.series("memory_max_bytes")[1]
    if mem:
        rows.append(("peak memory", f"{max(mem) / 2**20:,.0f} MiB ({last.get('memory_kind', '?')}, max over ranks)"))
    if "skipped_steps" in last:
        rows.append(("skipped steps", str(last["skipped_steps"])))
    vx, vloss = m.series("val_loss")
    if vx:
        rows.append(("validation loss", f"{vloss[-1]:.4f} (step {vx[-1]}; best {min(vloss):.4f})"))
    comm = m.total("comm_s")
    if interval > 0 and comm:
        rows.append(("communication share", f"{100 * comm / interval:.1f}% (rank 0, collectives outside backward)"))
    depth = m.series("data_queue_depth")[1]
    if depth:
        rows.append(("data queue depth", f"{sum(depth) / len(depth):.2f} batches ready (mean)"))
    if markers is not None and markers.resumes:
        rows.append(("resumes", ", ".join(f"step {s}" for s in markers.resumes)))
    if markers is not None and markers.rollbacks:
        rows.append(("rollbacks", ", ".join(f"step {a} → {b}" for a, b in markers.rollbacks)))
    for key in ("parameters", "checkpoint"):
        if summary.get(key) is not None:
            rows.append((key, f"{summary[key]:,}" if isinstance(summary[key], int) else str(summary[key])))
    model = config.get("model", {})
    if model:
        rows.append(("model", ", ".join(f"{k}={model[k]}" for k in ("d_model", "n_layers", "n_heads", "n_kv_heads",
                                                                     "vocab_size") if model.get(k))))
        if model.get("init_from"):
            origin = summary.get("init_from") or {}
            rows.append(("init_from", f"{model['init_from']}" + (f" (sha256 {origin['sha256'][:12]}...)"
                                                                 if origin.get("sha256") else "")))
    for key in ("precision", "zero"):
        if key in config:
            value = config[key]
            rows.append((key, f"stage {value.get('stage')}" if isinstance(value, dict) else str(value)))
    return rows


def _page(run_dir: str, rows, images, m: RunMetrics, config: dict) -> str:
    esc = html.escape
    table = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    figs = "\n".join(f'<figure><img src="{esc(name)}" alt="{esc(alt)}"><figcaption>{esc(alt)}</figcaption></figure>'
                     for name, alt in images)
    bad = ""
    if m.bad_lines:
        items = "".join(f"<li>line {n}: {esc(why)}</li>" for n, why in m.bad_lines[:50])
        bad = f"<h2>Skipped lines</h2><p>{len(m.bad_lines)} unreadable lines in {esc(m.path)}</p><ul>{items}</ul>"
    cfg = f"<h2>Config</h2><pre>{esc(json.dumps(config, indent=2))}</pre>" if config else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>colaflow run report: {esc(run_dir)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1500px; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; }}
.plots {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1em; }}
figure {{ margin: 0; }}
figure img {{ max-width: 100%; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
</style>
</head>
<body>
<h1>colaflow run report</h1>
<p>{esc(os.path.abspath(run_dir))}</p>
<h2>Summary</h2>
<table>
{table}
</table>
<h2>Plots</h2>
<div class="plots">
{figs}
</div>
{bad}
{cfg}
</body>
</html>
"""


def write_report(run_dir: str, out_dir: str | None = None) -> str:
    """Render the report of ``run_dir``; returns the path of ``index.html``.

    Args:
        run_dir: a training run folder (holding ``metrics.jsonl``).
        out_dir: where to write (default ``run_dir/report``); created.

    Raises:
        FileNotFoundError: no metrics file in ``run_dir``.
    """
    config = _load_json(os.path.join(run_dir, "config.json"))
    summary = _load_json(os.path.join(run_dir, "train_summary.json"))
    jsonl = config.get("metrics", {}).get("jsonl", "metrics.jsonl") if isinstance(config.get("metrics"), dict) \
        else "metrics.jsonl"
    m = read_metrics(os.path.join(run_dir, jsonl))
    out_dir = out_dir or os.path.join(run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    markers = read_markers(os.path.join(run_dir, "events.jsonl"))
    images = [(name, alt) for fn, alt in PLOTS if (name := fn(m, markers, out_dir))]
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(run_dir, summarize(m, config, summary, markers), images, m, config))
    return path


def main(argv: list[str] | None = None, prog: str = "python -m trainer.report.render") -> int:
    """``python -m trainer report RUN_DIR [--out DIR]``: render the report; returns the exit code.
    ``prog`` is the command line shown in ``--help`` and usage errors (``python -m trainer report``
    when the trainer dispatches here)."""
    ap = argparse.ArgumentParser(prog=prog, description=help_text(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="training run folder (run_dir of the config), holding metrics.jsonl")
    ap.add_argument("--out", help="output folder (default RUN_DIR/report)")
    args = ap.parse_args(argv)
    try:
        path = write_report(args.run_dir, args.out)
    except FileNotFoundError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(f"report written: {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)
