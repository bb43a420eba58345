"""``python -m trainer.observability.report RUN_DIR``: an HTML report of a training run from its ``metrics.jsonl``.

Writes ``RUN_DIR/report/index.html`` with PNG plots (matplotlib, Agg backend) of the loss, the
throughput (tokens/s, and MFU when known), the step-time split (data-wait share, forward+backward,
optimizer) and the cache hit rate (with cache stall seconds), plus a summary table (steps, final
loss, tokens, world size, throughput, ...) and the run's ``config.json``.

Reads ``RUN_DIR/metrics.jsonl`` (the file ``metrics.jsonl`` names in ``config.json`` when set),
``RUN_DIR/config.json`` and ``RUN_DIR/train_summary.json`` when present. Lines that are not JSON
objects with an integer ``step`` are skipped, counted and listed in the report. When a resumed run
logged a step twice the later record wins. Records written before a field existed just leave that
plot out.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from trainer.observability.sources import source_rows  # noqa: E402


@dataclass
class RunMetrics:
    """The records of one run, by step, and the lines that could not be read.

    Attributes:
        records: one dict per logged step, sorted by ``step``.
        bad_lines: ``(line number, reason)`` of skipped lines.
        path: the file read.
    """

    records: list[dict]
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    path: str = ""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of the records whose ``key`` is a finite number."""
        pts = [(r["step"], float(r[key])) for r in self.records
               if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
               and math.isfinite(r[key])]
        return [p[0] for p in pts], [p[1] for p in pts]

    def total(self, key: str) -> float:
        return sum(self.series(key)[1])


def read_metrics(path: str) -> RunMetrics:
    """Read a ``metrics.jsonl``.

    Raises:
        FileNotFoundError: ``path`` does not exist (message says what to run first).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no metrics file; train first (python -m trainer --config ...) "
                                "or point at the run folder holding metrics.jsonl")
    by_step: dict[int, dict] = {}
    bad: list[tuple[int, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append((n, f"not JSON ({e.msg})"))
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                bad.append((n, "not an object with an integer 'step'"))
                continue
            by_step[rec["step"]] = rec
    return RunMetrics([by_step[s] for s in sorted(by_step)], bad, path)


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _figure(title: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name))
    plt.close(fig)
    return name


def plot_loss(m: RunMetrics, out_dir: str) -> str | None:
    x, y = m.series("loss")
    if not x:
        return None
    fig, ax = _figure("Training loss", "loss (nats / token)")
    ax.plot(x, y, marker=".", color="tab:blue")
    return _save(fig, out_dir, "loss.png")


def plot_throughput(m: RunMetrics, out_dir: str) -> str | None:
    x, y = m.series("tokens_per_second")
    if not x:
        return None
    fig, ax = _figure("Throughput (all ranks)", "tokens / s")
    ax.plot(x, y, marker=".", color="tab:green", label="tokens/s")
    ax.set_ylim(bottom=0)
    mx, my = m.series("mfu")
    if mx:
        ax2 = ax.twinx()
        ax2.plot(mx, [100 * v for v in my], color="tab:purple", linestyle="--", label="MFU")
        ax2.set_ylabel("MFU (%)")
        ax2.set_ylim(bottom=0)
        fig.legend(loc="lower right")
    return _save(fig, out_dir, "throughput.png")


def _intervals(recs: list[dict]) -> tuple[list[float], list[float]]:
    """Left edge and width (in steps) of each record's logging interval, for bars that cover it."""
    lefts, widths, prev = [], [], None
    for r in recs:
        n = r.get("steps") if isinstance(r.get("steps"), int) and r["steps"] > 0 else \
            (r["step"] - prev if prev is not None and r["step"] > prev else 1)
        lefts.append(r["step"] - n)
        widths.append(n)
        prev = r["step"]
    return lefts, widths


def plot_step_time(m: RunMetrics, out_dir: str) -> str | None:
    """Stacked shares of each logged interval's wall time (rank 0), one bar per interval: data wait,
    forward+backward, optimizer, other (logging, collectives outside the phases)."""
    recs = [r for r in m.records if isinstance(r.get("interval_s"), (int, float)) and r["interval_s"] > 0
            and isinstance(r.get("data_wait_s"), (int, float))]
    if not recs:
        return None
    lefts, widths = _intervals(recs)
    parts = {name: [min(float(r.get(key) or 0.0) / r["interval_s"], 1.0) for r in recs]
             for name, key in (("data wait", "data_wait_s"), ("forward + backward", "forward_backward_s"),
                               ("optimizer", "optimizer_s"))}
    parts["other"] = [max(0.0, 1.0 - sum(p[i] for p in parts.values())) for i in range(len(recs))]
    fig, ax = _figure("Step time split per logged interval (rank 0)", "share of wall time (%)")
    bottom = [0.0] * len(recs)
    for (name, share), color in zip(parts.items(), ("tab:red", "tab:blue", "tab:orange", "lightgrey")):
        heights = [100 * v for v in share]
        ax.bar(lefts, heights, width=widths, bottom=bottom, align="edge", color=color, label=name,
               edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylim(0, 100)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    return _save(fig, out_dir, "step_time.png")


def plot_cache(m: RunMetrics, out_dir: str) -> str | None:
    """Cumulative cache hit rate (line) and stall seconds per logged interval (bars), all ranks."""
    recs = [r for r in m.records if isinstance(r.get("cache_hits"), int) and isinstance(r.get("cache_misses"), int)]
    if not recs or not sum(r["cache_hits"] + r["cache_misses"] for r in recs):
        return None
    x, rate, hits, lookups = [], [], 0, 0
    for r in recs:
        hits, lookups = hits + r["cache_hits"], lookups + r["cache_hits"] + r["cache_misses"]
        if lookups:
            x.append(r["step"])
            rate.append(100 * hits / lookups)
    fig, ax = _figure("Shard cache (all ranks)", "cumulative hit rate (%)")
    lefts, widths = _intervals(recs)
    ax2 = ax.twinx()
    ax2.bar(lefts, [float(r.get("cache_stall_s") or 0.0) for r in recs], width=widths, align="edge",
            color="tab:red", alpha=0.35, label="stall s per interval")
    ax2.set_ylabel("stall seconds")
    ax2.set_ylim(bottom=0)
    ax.plot(x, rate, marker=".", color="tab:cyan", label="cumulative hit rate")
    ax.set_ylim(-2, 102)
    ax.set_zorder(ax2.get_zorder() + 1)  # the line above the bars
    ax.patch.set_visible(False)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="center right", fontsize=8, framealpha=0.9)
    return _save(fig, out_dir, "cache.png")


def summarize(m: RunMetrics, config: dict, summary: dict) -> list[tuple[str, str]]:
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
    for key in ("parameters", "checkpoint"):
        if summary.get(key) is not None:
            rows.append((key, f"{summary[key]:,}" if isinstance(summary[key], int) else str(summary[key])))
    model = config.get("model", {})
    if model:
        rows.append(("model", ", ".join(f"{k}={model[k]}" for k in ("d_model", "n_layers", "n_heads", "vocab_size")
                                        if k in model)))
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
    plots = ((plot_loss, "loss"), (plot_throughput, "throughput (tokens/s, MFU)"),
             (plot_step_time, "step time split: data-wait share"), (plot_cache, "cache hit rate and stalls"))
    images = [(name, alt) for fn, alt in plots if (name := fn(m, out_dir))]
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(run_dir, summarize(m, config, summary), images, m, config))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.observability.report", description=__doc__,
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
    sys.exit(main())
