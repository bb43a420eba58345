"""The PNG plots of the run report (matplotlib, Agg backend), one function per plot.

Each ``plot_*(m, markers, out_dir)`` writes one PNG into ``out_dir`` and returns its file name, or
``None`` when the run logged nothing it could draw (so the report never shows an empty plot).
Legends sit below the axes, outside the data, so they never cover a line. Resumes (dotted grey),
rollbacks (dashed orange, with an arrow back to the step training continued from) and skipped
steps (red ticks on the x axis) are marked on the plots over steps.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from trainer.report.run_metrics import Markers, RunMetrics  # noqa: E402

LAYER_STATS = (("grad_norm", "gradient norm"), ("update_ratio", "update / weight norm"),
               ("act_rms", "activation RMS"))


def _figure(title: str, ylabel: str, nrows: int = 1):
    """A 7-inch-wide figure of ``nrows`` stacked axes sharing the step axis; returns ``(fig, ax or [axes])``."""
    fig, axes = plt.subplots(nrows, 1, figsize=(7, 4.2 + 2.6 * (nrows - 1)), dpi=100, squeeze=False, sharex=True)
    axes = [row[0] for row in axes]
    for ax in axes:
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("optimizer step")
    fig.suptitle(title)
    return fig, axes if nrows > 1 else axes[0]


def _legend(fig, axes) -> None:
    """One legend for all ``axes`` of ``fig``, below the plot area (never over the data)."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels and not lab.startswith("_"):
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)


def _save(fig, out_dir: str, name: str, legend_rows: int = 1) -> str:
    inches = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.25 * legend_rows + 0.1) / inches, 1, 1))
    fig.savefig(os.path.join(out_dir, name))
    plt.close(fig)
    return name


def _mark(ax, markers: Markers) -> None:
    """Resume, rollback and skipped-step markers on an axis over optimizer steps."""
    for i, step in enumerate(markers.resumes):
        ax.axvline(step, color="grey", linestyle=":", linewidth=1.2, label="resume" if i == 0 else "_")
    for i, (src, dst) in enumerate(markers.rollbacks):
        ax.axvline(src, color="tab:orange", linestyle="--", linewidth=1.2, label="rollback" if i == 0 else "_")
        ax.annotate("", xy=(dst, 0.92), xytext=(src, 0.92), xycoords=("data", "axes fraction"),
                    arrowprops={"arrowstyle": "->", "color": "tab:orange"})
    if markers.skipped:
        ax.plot([s for s, _ in markers.skipped], [0.0] * len(markers.skipped), "|", color="tab:red", markersize=12,
                markeredgewidth=2, transform=ax.get_xaxis_transform(), clip_on=False, label="skipped step")


def _legend_rows(n: int) -> int:
    return 1 + (n - 1) // 4


def plot_loss(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Training loss and, when logged, validation loss (``val_loss``) per step."""
    x, y = m.series("loss")
    vx, vy = m.series("val_loss")
    if not x and not vx:
        return None
    fig, ax = _figure("Loss", "loss (nats / token)")
    if x:
        ax.plot(x, y, marker=".", color="tab:blue", label="train loss")
    if vx:
        ax.plot(vx, vy, marker="o", color="tab:green", label="validation loss")
    _mark(ax, markers)
    _legend(fig, [ax])
    return _save(fig, out_dir, "loss.png")


def plot_lr(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Learning rate at each logged step (the rollback factor included)."""
    x, y = m.series("lr")
    if not x:
        return None
    fig, ax = _figure("Learning rate", "learning rate")
    ax.plot(x, y, marker=".", color="tab:brown", label="lr")
    ax.set_ylim(bottom=0)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    _mark(ax, markers)
    _legend(fig, [ax])
    return _save(fig, out_dir, "lr.png")


def plot_grad_norm(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Pre-clip global gradient norm (log scale), with the clipping threshold when known."""
    x, y = m.series("grad_norm")
    if not x:
        return None
    fig, ax = _figure("Gradient norm (pre-clip, global)", "L2 norm")
    ax.plot(x, y, marker=".", color="tab:olive", label="grad norm")
    if all(v > 0 for v in y):
        ax.set_yscale("log")
    _mark(ax, markers)
    _legend(fig, [ax])
    return _save(fig, out_dir, "grad_norm.png")


def plot_throughput(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Tokens per second (all ranks) and MFU when known (right axis)."""
    x, y = m.series("tokens_per_second")
    if not x:
        return None
    fig, ax = _figure("Throughput (all ranks)", "tokens / s")
    ax.plot(x, y, marker=".", color="tab:green", label="tokens/s")
    ax.set_ylim(bottom=0)
    axes = [ax]
    mx, my = m.series("mfu")
    if mx:
        ax2 = ax.twinx()
        ax2.plot(mx, [100 * v for v in my], color="tab:purple", linestyle="--", label="MFU")
        ax2.set_ylabel("MFU (%)")
        ax2.set_ylim(bottom=0)
        axes.append(ax2)
    _mark(ax, markers)
    _legend(fig, axes)
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


def plot_step_time(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Stacked shares of each logged interval's wall time (rank 0), one bar per interval: data wait,
    communication, forward+backward, optimizer, other (logging, checkpoints, Python overhead)."""
    recs = [r for r in m.records if isinstance(r.get("interval_s"), (int, float)) and r["interval_s"] > 0
            and isinstance(r.get("data_wait_s"), (int, float))]
    if not recs:
        return None
    lefts, widths = _intervals(recs)
    parts = {name: [min(float(r.get(key) or 0.0) / r["interval_s"], 1.0) for r in recs]
             for name, key in (("data wait", "data_wait_s"), ("communication", "comm_s"),
                               ("forward + backward", "forward_backward_s"), ("optimizer", "optimizer_s"))}
    parts["other"] = [max(0.0, 1.0 - sum(p[i] for p in parts.values())) for i in range(len(recs))]
    fig, ax = _figure("Step time split per logged interval (rank 0)", "share of wall time (%)")
    bottom = [0.0] * len(recs)
    colors = ("tab:red", "tab:purple", "tab:blue", "tab:orange", "lightgrey")
    for (name, share), color in zip(parts.items(), colors):
        heights = [100 * v for v in share]
        ax.bar(lefts, heights, width=widths, bottom=bottom, align="edge", color=color, label=name,
               edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylim(0, 100)
    _legend(fig, [ax])
    return _save(fig, out_dir, "step_time.png", _legend_rows(len(parts)))


def plot_cache(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
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
    _legend(fig, [ax, ax2])
    return _save(fig, out_dir, "cache.png")


def plot_layers(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Per-layer gradient norm, update-to-weight ratio and activation RMS (the ``layers`` field), log scale."""
    recs = [r for r in m.records if isinstance(r.get("layers"), dict) and r["layers"]]
    if not recs:
        return None
    names = sorted({n for r in recs for n in r["layers"]}, key=lambda n: (len(n), n))
    fig, axes = _figure("Per-layer statistics on logged steps", "", nrows=len(LAYER_STATS))
    drawn = False
    for ax, (stat, label) in zip(axes, LAYER_STATS):
        ax.set_ylabel(label)
        for i, name in enumerate(names):
            pts = [(r["step"], r["layers"][name][stat]) for r in recs
                   if isinstance(r["layers"].get(name), dict)
                   and isinstance(r["layers"][name].get(stat), (int, float)) and r["layers"][name][stat] > 0]
            if pts:
                drawn = True
                ax.plot(*zip(*pts), marker=".", color=f"C{i % 10}", label=name)
        ax.set_yscale("log")
    if not drawn:
        plt.close(fig)
        return None
    _legend(fig, axes)
    return _save(fig, out_dir, "layers.png", _legend_rows(len(names)))


def plot_hardware(m: RunMetrics, markers: Markers, out_dir: str) -> str | None:
    """Memory (RSS, CUDA allocator, GPU used; GiB) and, with NVML, GPU utilisation (%) on the right axis."""
    series = [(key, label) for key, label in (("hw_rss_bytes", "process RSS"),
                                              ("hw_cuda_allocated_bytes", "CUDA allocated"),
                                              ("hw_cuda_reserved_bytes", "CUDA reserved"),
                                              ("hw_cuda_fragmentation_bytes", "CUDA reserved, unused"),
                                              ("hw_gpu_memory_used_bytes", "GPU memory used")) if m.series(key)[0]]
    util = m.series("hw_gpu_util_pct")
    if not series and not util[0]:
        return None
    fig, ax = _figure("Hardware (rank 0)", "memory (GiB)")
    for key, label in series:
        x, y = m.series(key)
        ax.plot(x, [v / 2**30 for v in y], marker=".", label=label)
    ax.set_ylim(bottom=0)
    axes = [ax]
    if util[0]:
        ax2 = ax.twinx()
        ax2.plot(util[0], util[1], color="tab:red", linestyle="--", label="GPU utilisation (%)")
        ax2.set_ylabel("GPU utilisation (%)")
        ax2.set_ylim(0, 105)
        axes.append(ax2)
    _legend(fig, axes)
    return _save(fig, out_dir, "hardware.png", _legend_rows(len(series) + bool(util[0])))


PLOTS = ((plot_loss, "loss (train, validation when logged) with resume, rollback and skipped-step markers"),
         (plot_lr, "learning rate"), (plot_grad_norm, "gradient norm"),
         (plot_throughput, "throughput (tokens/s, MFU)"),
         (plot_step_time, "step time split: data wait, communication, compute, optimizer"),
         (plot_cache, "cache hit rate and stalls"), (plot_layers, "per-layer statistics"),
         (plot_hardware, "hardware: memory and GPU utilisation"))
