"""The Grafana dashboard of a training run, and a preview of its panels drawn from a ``metrics.jsonl``.

:data:`PANELS` is the one definition: each panel's PromQL targets over the series the trainer
serves (:mod:`trainer.metrics.sinks`: ``colaflow_train_<field>``,
``colaflow_train_layer_<stat>{layer=...}``, the cache's ``colaflow_cache_*``) and the
``metrics.jsonl`` field each target reads.

- ``python -m trainer.report.dashboard grafana OUT.json``: the Grafana dashboard model
  (Grafana's JSON model, ``schemaVersion`` 39; import it under Dashboards > New > Import and pick
  the Prometheus data source). ``docs/grafana/colaflow-dashboard.json`` is this output.
- ``python -m trainer.report.dashboard preview METRICS.jsonl OUT_DIR``: the same panels drawn
  with matplotlib from a run's ``metrics.jsonl`` into ``OUT_DIR/dashboard-preview.png`` and an HTML
  page around it; this is not Grafana, it shows what the panels plot.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys
from dataclasses import dataclass

from colaflow.errors import run_cli
from colaflow.wording import help_text

SELECTOR = '{job=~"$job"}'


@dataclass(frozen=True)
class Target:
    """One series of a panel: the PromQL ``expr`` (``{sel}`` stands for the job selector), its
    legend, and how to read it from ``metrics.jsonl``: ``field`` (a record key, or a per-layer
    statistic when ``layer`` is true), divided by the record's ``divide_by`` when set."""

    expr: str
    legend: str
    field: str
    divide_by: str | None = None
    layer: bool = False


@dataclass(frozen=True)
class Panel:
    """A time-series panel: ``title``, Grafana ``unit``, ``targets``, ``gpu_only`` (series exist
    only with NVML), ``log`` (log-scale y) and ``stack`` (stacked areas)."""

    title: str
    unit: str
    targets: tuple[Target, ...]
    gpu_only: bool = False
    log: bool = False
    stack: bool = False


def _t(field: str, legend: str, **kw) -> Target:
    return Target(f"colaflow_train_{field}{{sel}}", legend, field, **kw)


def _share(field: str, legend: str) -> Target:
    return Target(f"colaflow_train_{field}{{sel}} / colaflow_train_interval_s{{sel}}", legend, field,
                  divide_by="interval_s")


def _layer(stat: str) -> Target:
    return Target(f"colaflow_train_layer_{stat}{{sel}}", "{{layer}}", stat, layer=True)


PANELS: tuple[Panel, ...] = (
    Panel("Loss", "none", (_t("loss", "train loss"), _t("val_loss", "validation loss"))),
    Panel("Learning rate", "none", (_t("lr", "lr"),)),
    Panel("Gradient norm (pre-clip)", "none", (_t("grad_norm", "global"),), log=True),
    Panel("Throughput", "none", (_t("tokens_per_second", "tokens/s (all ranks)"),)),
    Panel("MFU", "percentunit", (_t("mfu", "MFU"),)),
    Panel("Step time split (rank 0)", "percentunit",
          (_share("data_wait_s", "data wait"), _share("comm_s", "communication"),
           _share("forward_backward_s", "forward + backward"), _share("optimizer_s", "optimizer")), stack=True),
    Panel("Data queue depth", "none", (_t("data_queue_depth", "batches ready"),)),
    Panel("Per-layer gradient norm", "none", (_layer("grad_norm"),), log=True),
    Panel("Per-layer update / weight ratio", "none", (_layer("update_ratio"),), log=True),
    Panel("Per-layer activation RMS", "none", (_layer("act_rms"),), log=True),
    Panel("Memory (rank 0)", "bytes", (_t("hw_rss_bytes", "process RSS"),
                                       _t("hw_cuda_allocated_bytes", "CUDA allocated"),
                                       _t("hw_gpu_memory_used_bytes", "GPU memory used"))),
    Panel("GPU utilisation (rank 0)", "percent", (_t("hw_gpu_util_pct", "utilisation %"),), gpu_only=True),
    Panel("GPU power and temperature (rank 0)", "none", (_t("hw_gpu_power_w", "power W"),
                                                         _t("hw_gpu_temperature_c", "temperature °C")),
          gpu_only=True),
    Panel("Shard cache", "percentunit", (_t("cache_hit_rate", "hit rate"),)),
)


def promql(target: Target, job: str = "$job") -> str:
    """The target's PromQL with the job selector filled in (``$job`` is Grafana's variable)."""
    return target.expr.replace("{sel}", SELECTOR.replace("$job", job))


def grafana_dashboard() -> dict:
    """The Grafana dashboard model (dict, JSON-able): a ``datasource`` and a ``job`` variable and
    one time-series panel per :data:`PANELS` entry, two per row."""
    ds = {"type": "prometheus", "uid": "${datasource}"}
    panels = []
    for i, p in enumerate(PANELS):
        custom = {"stacking": {"mode": "normal" if p.stack else "none"}, "fillOpacity": 60 if p.stack else 0,
                  "scaleDistribution": {"type": "log", "log": 10} if p.log else {"type": "linear"}}
        panels.append({
            "id": i + 1, "type": "timeseries", "title": p.title, "datasource": ds,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}},
            "targets": [{"refId": chr(ord("A") + j), "datasource": ds, "expr": promql(t), "legendFormat": t.legend}
                        for j, t in enumerate(p.targets)],
        })
    return {
        "title": "colaflow training", "uid": "colaflow-training", "schemaVersion": 39, "version": 1,
        "editable": True, "tags": ["colaflow"], "time": {"from": "now-3h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
            {"name": "job", "label": "job", "type": "query", "datasource": ds, "refresh": 2, "includeAll": True,
             "multi": True, "query": {"query": "label_values(colaflow_train_step, job)", "refId": "job"},
             "definition": "label_values(colaflow_train_step, job)"}]},
        "panels": panels,
    }


def _series(records: list[dict], t: Target) -> dict[str, tuple[list[int], list[float]]]:
    """``{legend: (steps, values)}`` of a target in ``metrics.jsonl`` records (one legend per layer for layer targets)."""
    out: dict[str, tuple[list[int], list[float]]] = {}

    def add(name, step, value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            xs, ys = out.setdefault(name, ([], []))
            xs.append(step)
            ys.append(float(value))

    for r in records:
        if t.layer:
            for layer, stats in sorted((r.get("layers") or {}).items()):
                add(layer, r["step"], (stats or {}).get(t.field))
        elif t.divide_by:
            den = r.get(t.divide_by)
            if isinstance(r.get(t.field), (int, float)) and isinstance(den, (int, float)) and den > 0:
                add(t.legend, r["step"], r[t.field] / den)
        else:
            add(t.legend, r["step"], r.get(t.field))
    return out


def render_preview(metrics_path: str, out_dir: str, title: str = "") -> str:
    """Draw :data:`PANELS` from the records of ``metrics_path`` (a ``metrics.jsonl``) in a dark,
    two-column grid like the Grafana dashboard; writes ``dashboard-preview.png`` and
    ``dashboard-preview.html`` into ``out_dir`` and returns the HTML path. Panels with no data
    in the file (e.g. GPU panels of a CPU run) show "no data", as Grafana does.

    Raises:
        FileNotFoundError: no ``metrics_path``.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.report.run_metrics import read_metrics
    records = read_metrics(metrics_path).records
    rows = (len(PANELS) + 1) // 2
    with plt.style.context("dark_background"):
        fig, axes = plt.subplots(rows, 2, figsize=(14, 2.6 * rows), dpi=100)
        fig.patch.set_facecolor("#111217")
        for ax, panel in zip(axes.flat, PANELS):
            ax.set_facecolor("#181b1f")
            ax.set_title(panel.title, loc="left", fontsize=10)
            ax.grid(True, alpha=0.15)
            scale = 100.0 if panel.unit == "percentunit" else 2.0 ** -30 if panel.unit == "bytes" else 1.0
            lines = [(legend, xs, [y * scale for y in ys]) for t in panel.targets
                     for legend, (xs, ys) in _series(records, t).items()]
            if panel.stack and lines and all(xs == lines[0][1] for _, xs, _ in lines):
                ax.stackplot(lines[0][1], *[ys for _, _, ys in lines], labels=[n for n, _, _ in lines], alpha=0.8)
            else:
                for legend, xs, ys in lines:
                    ax.plot(xs, ys, linewidth=1.4, label=legend)
            if not lines:
                ax.text(0.5, 0.5, "no data" + (" (GPU only)" if panel.gpu_only else ""), ha="center", va="center",
                        transform=ax.transAxes, color="#8e8e8e")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            if panel.log:
                ax.set_yscale("log")
            ax.set_ylabel({"percentunit": "%", "bytes": "GiB", "percent": "%"}.get(panel.unit, ""), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
        for ax in list(axes.flat)[len(PANELS):]:
            ax.set_visible(False)
        fig.tight_layout()
        os.makedirs(out_dir, exist_ok=True)
        fig.savefig(os.path.join(out_dir, "dashboard-preview.png"), facecolor=fig.get_facecolor())
        plt.close(fig)
    page = os.path.join(out_dir, "dashboard-preview.html")
    note = (f"The panels of docs/grafana/colaflow-dashboard.json drawn with matplotlib from {len(records)} records "
            f"of {os.path.basename(metrics_path)}{' (' + title + ')' if title else ''}. Not a Grafana screenshot.")
    with open(page, "w", encoding="utf-8") as f:
        f.write("<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>colaflow dashboard preview"
                "</title>\n<style>body { background: #111217; color: #ccccdc; font-family: sans-serif; margin: 1em; }"
                " img { max-width: 100%; }</style></head>\n<body>\n<h2>colaflow training</h2>\n"
                f"<p>{html.escape(note)}</p>\n<img src=\"dashboard-preview.png\" alt=\"dashboard panels\">\n"
                "</body>\n</html>\n")
    return page


def main(argv: list[str] | None = None, prog: str = "python -m trainer.report.dashboard") -> int:
    """CLI (see the module docstring; ``prog`` in its usage): exit 0 on success, 2 on usage errors or a
    missing metrics file."""
    ap = argparse.ArgumentParser(prog=prog, description=help_text(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grafana", help="write the Grafana dashboard JSON")
    g.add_argument("out", help="output file, e.g. colaflow-dashboard.json")
    p = sub.add_parser("preview", help="draw the panels from a metrics.jsonl")
    p.add_argument("metrics", help="a run's metrics.jsonl")
    p.add_argument("out_dir", help="folder for dashboard-preview.png and .html")
    p.add_argument("--title", default="", help="what run this is, shown on the page")
    args = ap.parse_args(argv)
    if args.command == "grafana":
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(grafana_dashboard(), f, indent=2, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {args.out} ({len(PANELS)} panels)")
        return 0
    try:
        print(f"wrote {render_preview(args.metrics, args.out_dir, args.title)}")
    except FileNotFoundError as e:
        print(f"dashboard: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    run_cli(main)
