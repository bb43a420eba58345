"""The human-readable end-of-job report: ``report.txt`` and ``report.png`` next to ``stats.json``.

Built from ``stats.json`` alone, so it is the same for every runner. The text gives the
record balance, the top filter reasons, PII redactions per source, skipped input files, the
duplicate rate, tokens and UTF-8 bytes per token, and the document-length histogram (kept documents per power-of-two token bin); the PNG plots
that histogram and the filter reasons (matplotlib, Agg backend: no display needed).
"""
from __future__ import annotations

import io

import fsspec

REPORT_TXT = "report.txt"
REPORT_PNG = "report.png"
TOP_REASONS = 10


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "-"


def report_text(stats: dict) -> str:
    """The report as text (lines end with ``\\n``); ``stats`` is the content of ``stats.json``."""
    t = stats["total"]
    n = t["input_records"]
    near = t["filtered"].get("near_duplicate", 0)
    bpt = t["text_bytes"] / t["tokens"] if t["tokens"] else 0.0
    lines = [
        "colaflow preprocessing report",
        f"records in       {n:>12,}",
        f"kept             {t['kept']:>12,}  {_pct(t['kept'], n)}",
        f"exact duplicates {t['duplicates']:>12,}  {_pct(t['duplicates'], n)}",
        f"near duplicates  {near:>12,}  {_pct(near, n)}",
        f"duplicate rate   {_pct(t['duplicates'] + near, n):>12}",
        f"filtered         {sum(t['filtered'].values()) - near:>12,}  (near duplicates excluded)",
        f"dead letters     {t['dead_letter']:>12,}",
        f"tokens           {t['tokens']:>12,}",
        f"text bytes       {t['text_bytes']:>12,}",
        f"bytes per token  {bpt:>12.2f}",
        f"shards           {stats.get('shards', 0):>12,}  vocab {stats.get('vocab_size', 0)}",
        f"balanced         {'yes' if t['balanced'] else 'NO':>12}",
        "",
        "top filter reasons:",
    ]
    reasons = sorted(t["filtered"].items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    lines += [f"  {reason:<24} {count:>10,}  {_pct(count, n)}" for reason, count in reasons] or ["  none"]
    redacted = {source: entry["redactions"] for source, entry in stats.get("sources", {}).items()
                if entry.get("redactions")}
    if redacted:
        lines += ["", "PII redactions by source:"]
        lines += [f"  {source:<24} " + ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items()))
                  for source, counts in sorted(redacted.items())]
    if t.get("skipped_files"):
        lines += ["", f"skipped files    {t['skipped_files']:>12,}  (unknown format; see input.unknown_files)"]
    if t["dead_letter_reasons"]:
        lines += ["", "dead-letter reasons:"]
        lines += [f"  {r:<24} {c:>10,}" for r, c in sorted(t["dead_letter_reasons"].items(), key=lambda kv: -kv[1])]
    hist = {int(k): v for k, v in t.get("length_tokens", {}).items()}
    lines += ["", "document length (tokens), kept documents:"]
    peak = max(hist.values(), default=0)
    for lo in sorted(hist):
        label = f"{lo}" if lo < 2 else f"{lo}-{2 * lo - 1}"
        lines.append(f"  {label:>15} {hist[lo]:>10,}  {'#' * max(1, round(40 * hist[lo] / peak))}")
    return "\n".join(lines) + "\n"


def report_png(stats: dict) -> bytes:
    """PNG bytes: the length histogram (log-2 bins) and the top filter reasons, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    t = stats["total"]
    hist = {int(k): v for k, v in t.get("length_tokens", {}).items()}
    fig = Figure(figsize=(11, 4), dpi=100)
    ax1, ax2 = fig.subplots(1, 2)
    bins = sorted(hist)
    ax1.bar(range(len(bins)), [hist[b] for b in bins], color="#4477aa")
    ax1.set_xticks(range(len(bins)), [str(b) for b in bins], rotation=60, fontsize=7)
    ax1.set_xlabel("document length, tokens (bin lower edge, powers of two)")
    ax1.set_ylabel("kept documents")
    ax1.set_title(f"{t['kept']:,} kept documents, {t['tokens']:,} tokens")
    reasons = sorted(t["filtered"].items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    if t["duplicates"]:
        reasons = sorted(reasons + [("duplicate (exact)", t["duplicates"])], key=lambda kv: -kv[1])
    ax2.barh([r for r, _ in reasons][::-1], [c for _, c in reasons][::-1], color="#cc6677")
    ax2.set_xlabel("records")
    ax2.set_title(f"removed, of {t['input_records']:,} records in")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def write_report(output_dir: str, stats: dict) -> str:
    """Write ``report.txt`` and ``report.png`` into ``output_dir`` (folder or fsspec URL); returns the text."""
    fs, root = fsspec.core.url_to_fs(output_dir)
    text = report_text(stats)
    fs.pipe_file(f"{root}/{REPORT_TXT}", text.encode("utf-8"))
    fs.pipe_file(f"{root}/{REPORT_PNG}", report_png(stats))
    return text
