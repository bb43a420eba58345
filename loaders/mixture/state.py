"""Resume state of a data mixture, per source (independent of world size, workers and shares).

While an epoch runs, the loader tracks consumed *positions* of the mixture epoch with
:class:`loaders.order.progress.Progress`, as for one dataset. A saved state speaks of *source items*
instead (item ``n`` of a source = position ``n % N`` of its epoch ``n // N``): per source a
``cursor`` (every item below it consumed), ``done`` (consumed items above it, a compressed
bitmap: :mod:`loaders.order.positions`) and ``partial`` (items with some chunks delivered), plus the
plan (:class:`loaders.mixture.plan.MixturePlan`).
Positions depend on the shares; items do not, so a resume may change the shares and every source
still continues exactly where it stopped: :func:`to_progress` maps the items back onto the
positions of the (possibly re-planned) epoch.

Per-source token counts are kept as ``tokens`` (restored, the same on every rank) plus
``tokens_new`` (delivered by this rank since), so merging ranks adds each token once.
"""
from __future__ import annotations

import numpy as np

from loaders.mixture.plan import MixturePlan
from loaders.order.positions import decode_positions, encode_positions
from loaders.order.progress import Progress, partial_rows

STATE_KIND = "mixture"
STATE_VERSION = 2  # 2: per-source done items as a compressed bitmap (1: a list; still read)


def _normalise(cursor: int, items: np.ndarray) -> tuple[int, np.ndarray]:
    """Move ``cursor`` past the consumed ``items`` that directly follow it; returns the new cursor and
    the consumed items above it (sorted unique ``int64``)."""
    items = np.unique(np.asarray(items, np.int64))
    items = items[items >= cursor]
    gaps = np.flatnonzero(items != cursor + np.arange(len(items)))
    k = int(gaps[0]) if len(gaps) else len(items)
    return cursor + k, items[k:]


def source_states(progress: Progress, plan: MixturePlan, names: list[str], tokens: list[int],
                  tokens_new: list[int]) -> list[dict]:
    """Per-source ``{"name", "cursor", "done", "partial", "tokens", "tokens_new"}`` of ``progress``
    (one mixture epoch's consumed positions; items of earlier epochs count as consumed)."""
    src, item = plan.epoch_draws(progress.epoch)
    consumed = progress.done.mask()
    first = plan.first_items(progress.epoch)
    in_flight = sorted(progress.partial.items())
    out = []
    for s, name in enumerate(names):
        mine = src == s
        have = item[mine & consumed]
        cursor, done = _normalise(first[s], have)
        partial = [[int(item[p]), n, sorted(c)] for p, (n, c) in in_flight if src[p] == s]
        out.append({"name": name, "cursor": cursor, "done": encode_positions(done, cursor), "partial": partial,
                    "tokens": int(tokens[s]), "tokens_new": int(tokens_new[s])})
    return out


def to_progress(sources: list[dict], plan: MixturePlan, epoch: int, order_key: dict, world_size: int) -> Progress:
    """The :class:`Progress` of mixture epoch ``epoch`` whose consumed positions are the sources'
    consumed items (``sources`` as from :func:`source_states`)."""
    src, item = plan.epoch_draws(epoch)
    p = Progress(epoch, order_key, len(src), world_size)
    cursor = np.array([s["cursor"] for s in sources], np.int64)
    consumed = item < cursor[src] if len(src) else np.zeros(0, bool)
    where = {}
    for s, st in enumerate(sources):
        mine = np.flatnonzero(src == s)
        consumed[mine[np.isin(item[mine], decode_positions(st["done"]))]] = True
        if st["partial"]:
            at = dict(zip(item[mine].tolist(), mine.tolist()))
            where.update({at[i]: (n, chunks) for i, n, chunks in st["partial"] if i in at})
    p.done.add(np.flatnonzero(consumed))
    for pos, (n, chunks) in where.items():
        for c in chunks:
            p.record(pos, int(c), int(n))
    return p


def read_sources(state: dict, names: list[str]) -> list[dict]:
    """The per-source states of a saved mixture state, their ``done`` items decoded (sorted ``int64``).

    Raises:
        ValueError: a missing or malformed field, other sources than ``names`` (in order), a negative
            cursor or item, or a partial item whose chunk is outside ``[0, n_chunks)`` with
            ``n_chunks >= 2`` (a hand-edited or corrupt state).
    """
    try:
        got = [s["name"] for s in state["sources"]]
        if got != names:
            raise ValueError(f"sources {got} are not this mixture's {names}")
        sources = [{**s, "cursor": int(s["cursor"]), "done": decode_positions(s["done"])} for s in state["sources"]]
        for s in sources:
            if s["cursor"] < 0 or (len(s["done"]) and s["done"][0] < 0):
                raise ValueError(f"source {s['name']!r}: a negative cursor or item")
            partial_rows(s["partial"])  # raises on a negative item or a chunk outside [0, n_chunks >= 2)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"mixture loader state is malformed ({type(e).__name__}: {e}); resume from the "
                         "checkpoint as saved, or from an earlier one") from e
    return sources


def merge_source_states(states: list[dict]) -> dict:
    """Union of all ranks' mixture states (same epoch and plan) into one saved state.

    Raises:
        ValueError: the states come from different epochs, plans or mixtures.
    """
    if not states:
        raise ValueError("merge_source_states: no states given")
    first = states[0]
    for st in states[1:]:
        if (st["epoch"], st["plan"], st["order_key"]) != (first["epoch"], first["plan"], first["order_key"]):
            raise ValueError(f"mixture states differ in epoch/plan ({st['epoch']} vs {first['epoch']}): "
                             "they come from different runs or steps")
    merged_sources = []
    for s, base in enumerate(first["sources"]):
        parts = [st["sources"][s] for st in states]
        done = np.concatenate([decode_positions(part["done"]) for part in parts])
        cursor, done = _normalise(max(part["cursor"] for part in parts), done)
        finished = set(done.tolist())
        chunks: dict[int, tuple[int, set[int]]] = {}
        for part in parts:
            for i, n, cs in part["partial"]:
                if i >= cursor and i not in finished:
                    chunks.setdefault(i, (n, set()))[1].update(cs)
        complete = {i for i, (n, cs) in chunks.items() if len(cs) >= n}
        if complete:
            cursor, done = _normalise(cursor, np.concatenate([done, np.fromiter(complete, np.int64)]))
        partial = [[i, n, sorted(cs)] for i, (n, cs) in sorted(chunks.items()) if i not in complete and i >= cursor]
        merged_sources.append({"name": base["name"], "cursor": cursor, "done": encode_positions(done, cursor),
                               "partial": partial,
                               "tokens": base["tokens"] + sum(part["tokens_new"] for part in parts),
                               "tokens_new": 0})
    return {**first, "sources": merged_sources,
            "world_size": max(st["world_size"] for st in states),
            "complete_ranks": sorted(set().union(*(st["complete_ranks"] for st in states))),
            "bad": first["bad"] + sum(st["bad_new"] for st in states), "bad_new": 0,
            "empty": first["empty"] + sum(st["empty_new"] for st in states), "empty_new": 0}
