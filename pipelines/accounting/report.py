"""The human-readable end-of-job report: ``report.txt`` and ``report.png`` next to ``stats.json``.

Built from ``stats.json`` alone, so it is the same for every runner. The text gives the
record balance, the top filter reasons, PII redactions per source, lines removed by quality rules,
skipped input files, the duplicate rate, tokens, UTF-8 and shard bytes per token, and the
document-length histogram (kept documents per power-of-two token bin). The PNG plots that
histogram, the removed records and the redactions per source, each only when it has something to
show (matplotlib, Agg backend: no display needed); ``report.html`` shows text and picture in a browser.
"""
from __future__ import annotations

import html
import io

import fsspec

from colaflow.wording import count
from pipelines.io.output import DEAD_LETTER_DIR, DUPLICATES_DIR

REPORT_TXT = "report.txt"
REPORT_PNG = "report.png"
REPORT_HTML = "report.html"
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
        f"exact duplicates {t['duplicates']:>12,}  {_pct(t['duplicates'], n)}"
        + (f"  (listed in {DUPLICATES_DIR}/)" if t["duplicates"] else ""),
        f"near duplicates  {near:>12,}  {_pct(near, n)}" + (f"  (listed in {DUPLICATES_DIR}/)" if near else ""),
        f"duplicate rate   {_pct(t['duplicates'] + near, n):>12}",
        f"filtered         {sum(t['filtered'].values()) - near:>12,}  (near duplicates excluded)",
        f"dead letters     {t['dead_letter']:>12,}"
        + (f"  (the records: {DEAD_LETTER_DIR}/)" if t["dead_letter"] else ""),
        f"tokens           {t['tokens']:>12,}",
        f"text bytes       {t['text_bytes']:>12,}",
        f"bytes per token  {bpt:>12.2f}  (UTF-8 text)",
        f"shard bytes/token{stats.get('shard_bytes_per_token', 0.0):>12.2f}  (shards + indexes, "
        f"{stats.get('layout', 'documents')})",
        f"shards           {stats.get('shards', 0):>12,}  vocab {stats.get('vocab_size', 0)}",
        *([shortfall] if (shortfall := shard_shortfall(stats)) else []),
        f"balanced         {'yes' if t['balanced'] else 'NO':>12}",
        "",
        "top filter reasons:",
    ]
    reasons = sorted(t["filtered"].items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    lines += [f"  {reason:<24} {count:>10,}  {_pct(count, n)}" for reason, count in reasons] or ["  none"]
    redacted = redactions_per_source(stats)
    if redacted:
        lines += ["", "PII redactions by source:"]
        lines += [f"  {source:<24} {sum(counts.values()):>10,}  "
                  + ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items()))
                  for source, counts in redacted.items()]
    if t.get("lines_removed"):
        lines += ["", "lines removed from kept documents (quality rules):"]
        lines += [f"  {rule:<24} {c:>10,}" for rule, c in sorted(t["lines_removed"].items(), key=lambda kv: -kv[1])]
    if t.get("decontaminated"):
        lines += ["", "documents cut by decontamination (evaluation set):"]
        lines += [f"  {name:<24} {c:>10,}" for name, c in sorted(t["decontaminated"].items())]
    if t.get("quality_scores"):
        scores = t["quality_scores"]
        peak = max(scores.values())
        lines += ["", "classifier score, kept documents:"]
        lines += [f"  {lo:>4}-{float(lo) + 0.1:.1f} {n:>10,}  {'#' * max(1, round(40 * n / peak))}"
                  for lo, n in sorted(scores.items())]
    if t.get("skipped_files"):
        lines += ["", f"skipped files    {t['skipped_files']:>12,}  (unknown format; see input.unknown_files)"]
    if t.get("skipped_links"):
        lines += ["", f"skipped links    {t['skipped_links']:>12,}  (input links whose target does not exist)"]
    if t.get("empty_files"):
        lines += ["", f"empty files      {t['empty_files']:>12,}  (0 bytes: nothing to read)"]
    if t.get("skipped_records"):
        lines += ["", "WARC records that hold no document (not input records):"]
        lines += [f"  {kind:<24} {c:>10,}" for kind, c in sorted(t["skipped_records"].items(), key=lambda kv: -kv[1])]
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


def shard_shortfall(stats: dict) -> str | None:
    """One report line when fewer shards were written than ``shards.num_shards`` asked for, saying
    why; ``None`` otherwise. A training document goes to bucket ``sha256(key) mod N`` and each
    non-empty bucket is one shard (:mod:`pipelines.stages.write_shards`), so with fewer documents than ``N``,
    or few per bucket, some buckets stay empty and no shard is written for them. With a validation
    split the count is of training documents (``stats["splits"]["train"]["samples"]``)."""
    asked, written = stats.get("shards_requested", 0), stats.get("shards", 0)
    if asked <= written:
        return None
    splits = stats.get("splits", {})
    docs = splits.get("train", {}).get("samples", stats["total"]["kept"])
    noun = "training document" if splits else "document"  # the validation split's are not in these shards
    buckets = f"{written:,} of the {asked:,} buckets (sha256 of the sample key mod {asked:,})"
    if docs < asked:
        why = f"only {count(docs, noun)} {'was' if docs == 1 else 'were'} written and a document never spans two shards"
        why += f"; they fell into {buckets}" if written < docs else ""
    else:
        why = f"the {count(docs, noun)} fell into {buckets}; ask for fewer shards to fill them all"
    return f"  shards.num_shards={asked:,} asked for, {written:,} written: {why}"


def redactions_per_source(stats: dict) -> dict[str, dict[str, int]]:
    """``{source: {kind: count}}`` of PII redactions: ``stats["pii"]["per_source"]`` when present,
    else each ``stats["sources"][source]["redactions"]``; sources without redactions left out."""
    per = (stats.get("pii") or {}).get("per_source")
    if not isinstance(per, dict):
        per = {s: e.get("redactions", {}) for s, e in (stats.get("sources") or {}).items() if isinstance(e, dict)}
    return {s: {k: int(n) for k, n in kinds.items() if n} for s, kinds in sorted(per.items())
            if isinstance(kinds, dict) and any(kinds.values())}


def report_panels(stats: dict) -> list[str]:
    """The panels ``report.png`` draws, in order; a panel with nothing to show is left out:
    ``lengths`` (kept-document length histogram), ``removed`` (filter reasons and exact
    duplicates), ``redactions`` (PII redactions per source and kind), ``scores`` (the classifier's
    score histogram of kept documents)."""
    t = stats["total"]
    panels = []
    if any(t.get("length_tokens", {}).values()):
        panels.append("lengths")
    if any(t["filtered"].values()) or t["duplicates"]:
        panels.append("removed")
    if redactions_per_source(stats):
        panels.append("redactions")
    if any(t.get("quality_scores", {}).values()):
        panels.append("scores")
    return panels


def _draw_lengths(ax, stats: dict) -> None:
    t = stats["total"]
    hist = {int(k): v for k, v in t.get("length_tokens", {}).items()}
    bins = sorted(hist)
    ax.bar(range(len(bins)), [hist[b] for b in bins], color="#4477aa")
    ax.set_xticks(range(len(bins)), [str(b) for b in bins], rotation=60, fontsize=7)
    ax.set_xlabel("document length, tokens (bin lower edge, powers of two)")
    ax.set_ylabel("kept documents")
    ax.set_title(f"{count(t['kept'], 'kept document')}, {count(t['tokens'], 'token')}")


def _draw_removed(ax, stats: dict) -> None:
    t = stats["total"]
    reasons = sorted(((r, c) for r, c in t["filtered"].items() if c), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    if t["duplicates"]:
        reasons = sorted(reasons + [("duplicate (exact)", t["duplicates"])], key=lambda kv: -kv[1])
    ax.barh([r for r, _ in reasons][::-1], [c for _, c in reasons][::-1], color="#cc6677")
    ax.set_xlabel("records")
    ax.set_title(f"removed, of {count(t['input_records'], 'record')} in")


def _draw_redactions(ax, stats: dict) -> None:
    per = redactions_per_source(stats)
    sources = list(per)
    kinds = sorted({k for kinds in per.values() for k in kinds})
    left = [0] * len(sources)
    for i, kind in enumerate(kinds):
        counts = [per[s].get(kind, 0) for s in sources]
        ax.barh(sources, counts, left=left, label=kind, color=f"C{i}")
        left = [a + b for a, b in zip(left, counts)]
    ax.set_xlabel("redactions")
    ax.set_title("PII redactions per source")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(len(kinds), 4), fontsize=8, frameon=False)


def _draw_scores(ax, stats: dict) -> None:
    scores = stats["total"]["quality_scores"]
    bins = sorted(scores)
    ax.bar(range(len(bins)), [scores[b] for b in bins], color="#228833")
    ax.set_xticks(range(len(bins)), bins, fontsize=8)
    ax.set_xlabel("classifier score (bin lower edge)")
    ax.set_ylabel("kept documents")
    ax.set_title(f"quality classifier, {count(stats['total']['filtered'].get('quality_classifier', 0), 'document')} "
                 "below the threshold")


def report_png(stats: dict) -> bytes:
    """PNG bytes: one panel per entry of :func:`report_panels`, side by side (a note instead
    of axes when there is nothing at all to plot)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    panels = report_panels(stats)
    fig = Figure(figsize=(5.5 * max(len(panels), 1), 4), dpi=100)
    draw = {"lengths": _draw_lengths, "removed": _draw_removed, "redactions": _draw_redactions,
            "scores": _draw_scores}
    for i, name in enumerate(panels):
        draw[name](fig.add_subplot(1, len(panels), i + 1), stats)
    if not panels:
        fig.text(0.5, 0.5, "no documents kept, none removed: nothing to plot", ha="center", va="center")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def report_html(text: str) -> str:
    """``report.html``: the text report and ``report.png`` on one page (for a browser)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>colaflow preprocessing "
            "report</title>\n<style>body { font-family: sans-serif; margin: 2em; } img { max-width: 100%; }</style>"
            f"</head>\n<body>\n<h1>colaflow preprocessing report</h1>\n<img src=\"{REPORT_PNG}\" "
            f"alt=\"document lengths, removed records, redactions\">\n<pre>{html.escape(text)}</pre>\n</body>\n</html>\n")


def write_report(output_dir: str, stats: dict) -> str:
    """Write ``report.txt``, ``report.png`` and ``report.html`` into ``output_dir`` (folder or fsspec URL); returns the text."""
    fs, root = fsspec.core.url_to_fs(output_dir)
    text = report_text(stats)
    fs.pipe_file(f"{root}/{REPORT_TXT}", text.encode("utf-8"))
    fs.pipe_file(f"{root}/{REPORT_PNG}", report_png(stats))
    fs.pipe_file(f"{root}/{REPORT_HTML}", report_html(text).encode("utf-8"))
    return text
