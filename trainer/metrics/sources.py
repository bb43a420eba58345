"""Tokens per data source of a mixture (``data.mixture``): metrics fields and report rows.

:func:`source_fields` adds, at each log step, per source ``source_<name>_tokens`` (tokens delivered
so far, all ranks, resumes included), ``source_<name>_share`` (their share), ``source_<name>_weight``
(the share asked for) and ``source_<name>_epoch`` (the source's epoch) to the metrics record.
:func:`source_rows` turns the records into the report's rows, including the largest deviation of
the realised share from the weight over every window of 1,000 batches.
"""
from __future__ import annotations

import re

import torch.distributed as dist

from loaders.protocols import RankLoader

WINDOW_BATCHES = 1000


def field_key(name: str) -> str:
    """A source name as a metrics field fragment (``[A-Za-z0-9_]``, valid in Prometheus names)."""
    return re.sub(r"\W", "_", name)


def source_fields(loader: RankLoader, world_size: int) -> dict:
    """Per-source fields of a mixture loader (``{}`` for one dataset). A collective when
    ``torch.distributed`` is initialised with ``world_size`` > 1 (one small ``all_gather_object``)."""
    c = loader.source_counts()
    if c is None:
        return {}
    parts = [c]
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        parts = [None] * world_size
        dist.all_gather_object(parts, c)
    tokens = [b + sum(p["tokens_new"][i] for p in parts) for i, b in enumerate(c["tokens_base"])]
    total = sum(tokens)
    out = {}
    for i, name in enumerate(c["names"]):
        key = field_key(name)
        out[f"source_{key}_tokens"] = tokens[i]
        out[f"source_{key}_share"] = tokens[i] / total if total else 0.0
        out[f"source_{key}_weight"] = c["shares"][i]
        out[f"source_{key}_epoch"] = max(p["epochs"][i] for p in parts)
    return out


def _window_deviation(records: list[dict], keys: list[str], batches_per_step: int) -> tuple[float, int] | None:
    """Largest |realised share - weight| over windows of >= 1,000 batches of consecutive intervals, and
    how many windows were checked (``None`` when the run holds fewer than 1,000 batches after its first record)."""
    cum = [[r[f"source_{k}_tokens"] for k in keys] for r in records]
    batches = [r.get("steps", 0) * batches_per_step for r in records]
    worst, windows = 0.0, 0
    for i in range(len(records)):
        n, j = 0, i + 1
        while j < len(records) and n < WINDOW_BATCHES:
            n += batches[j]
            j += 1
        if n < WINDOW_BATCHES:
            break
        delta = [b - a for a, b in zip(cum[i], cum[j - 1])]
        total = sum(delta)
        if total:
            weights = [records[j - 1][f"source_{k}_weight"] for k in keys]
            worst = max(worst, max(abs(d / total - w) for d, w in zip(delta, weights)))
            windows += 1
    return (worst, windows) if windows else None


def source_rows(records: list[dict], config: dict) -> list[tuple[str, str]]:
    """The report rows of a mixture run: per source tokens, share vs weight and epoch; then the
    1,000-batch window check (``[]`` for a run on one dataset)."""
    recs = [r for r in records if any(k.startswith("source_") for k in r)]
    if not recs:
        return []
    last = recs[-1]
    keys = [k[len("source_"):-len("_tokens")] for k in sorted(last) if k.startswith("source_") and k.endswith("_tokens")]
    rows = [(f"source {k}", f"{last[f'source_{k}_tokens']:,} tokens, share {100 * last[f'source_{k}_share']:.2f}% "
             f"(weight {100 * last[f'source_{k}_weight']:.2f}%), source epoch {last[f'source_{k}_epoch']}")
            for k in keys]
    accum = int(config.get("optim", {}).get("grad_accum_steps", 1) or 1)
    world = int(last.get("world_size", 1) or 1)
    dev = _window_deviation(recs, keys, accum * world)
    rows.append(("source shares, 1,000-batch windows",
                 f"max |share - weight| {100 * dev[0]:.2f} points over {dev[1]} windows" if dev else
                 "run shorter than 1,000 batches: see the shares over the whole run above"))
    return rows
