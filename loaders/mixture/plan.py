"""The draw of a data mixture: which source's next item comes at each global position.

Pure arithmetic (no I/O): a function of the sources' item and token counts (from their
manifests), their token shares and the plan's history of share changes — never of the world
size or the worker count. The loader (:mod:`loaders.mixture.mixture`) splits the drawn positions over
consumers exactly as it splits one dataset's positions (:func:`loaders.order.split.consumer_items`).

**Virtual time.** Source ``s`` has ``N_s`` items and ``T_s`` tokens, so ``m_s = T_s / N_s``
tokens per item on average. With token share ``w_s`` it advances at ``r_s = w_s / m_s`` items
per mixture token: its item ``n`` is *due* at virtual time ``(n + 0.5) / r_s`` (tokens of the
mixture). All sources' items are merged by due time (ties: lower source index first). This is
weighted fair queueing by virtual finish time (Demers, Keshav & Shenker, "Analysis and
simulation of a fair queueing algorithm", SIGCOMM 1989) with items as packets: after any prefix
of the draw, source ``s`` holds ``w_s`` of the drawn (expected) tokens up to one item per
source, so every window of draws has the shares up to ``max_item_tokens / window_tokens``.
Item ``n`` of a source is position ``n % N_s`` of the source's epoch ``n // N_s``
(:class:`loaders.order.sample_order.SampleOrder` of that epoch): a source that runs out simply goes on into
its next epoch while the others continue.

**Mixture epochs.** Mixture epoch ``k`` holds the items due in ``[k E, (k + 1) E)``, ``E`` =
``epoch_tokens`` (the sources' tokens, or their budgets, added up). Within a source, epoch
membership is monotone in the item index, so a source's items of epoch ``k`` are one index range.

**Share changes.** :meth:`MixturePlan.change_shares` starts a new *segment* at virtual time
``start`` where each source restarts its clock at item ``base_s``: item ``n >= base_s`` is then
due at ``start + (n - base_s + 0.5) / r'_s``. Items below ``base_s`` keep the due time of the
segment they belong to, so every item keeps exactly one due time and one epoch (exactly-once).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Segment:
    """Shares in force from virtual time ``start`` (mixture tokens) on.

    Attributes:
        start: virtual time where the segment begins.
        rates: items per mixture token, per source (``share / mean item tokens``).
        base: first item index per source that belongs to this segment.
        shares: the token shares (sum 1) the rates come from.
    """

    start: float
    rates: tuple[float, ...]
    base: tuple[int, ...]
    shares: tuple[float, ...]


def normalise(shares: list[float]) -> tuple[float, ...]:
    """Shares scaled to sum 1. Raises ``ValueError`` on a negative share or a zero sum."""
    if any(not math.isfinite(s) or s < 0 for s in shares) or sum(shares) <= 0:
        raise ValueError(f"mixture shares {shares}: need finite values >= 0 with a positive sum")
    total = float(sum(shares))
    return tuple(float(s) / total for s in shares)


class MixturePlan:
    """The draw of every mixture epoch (see the module docstring).

    Args:
        items: items per source epoch (``N_s`` > 0).
        tokens: tokens per source epoch (``T_s`` > 0).
        shares: token share per source (normalised here).
        epoch_tokens: mixture tokens per mixture epoch (``E`` > 0).
        segments: the segments of a saved plan (``shares`` is then the last segment's).
    Raises:
        ValueError: empty sources, a non-positive ``epoch_tokens`` or bad shares.
    """

    def __init__(self, items: list[int], tokens: list[int], shares: list[float], epoch_tokens: float,
                 segments: list[Segment] | None = None):
        if not items or min(items) < 1 or min(tokens) < 1 or len(items) != len(tokens):
            raise ValueError(f"mixture sources need at least one item and one token each: items={items}, tokens={tokens}")
        if not epoch_tokens > 0:
            raise ValueError(f"mixture epoch_tokens={epoch_tokens}: must be > 0")
        self.items, self.tokens, self.epoch_tokens = list(items), list(tokens), float(epoch_tokens)
        self.segments = list(segments) if segments else [self._segment(0.0, shares, [0] * len(items))]
        self._draw_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _segment(self, start: float, shares: list[float], base: list[int]) -> Segment:
        norm = normalise(shares)
        rates = tuple(w * n / t for w, n, t in zip(norm, self.items, self.tokens))
        return Segment(float(start), rates, tuple(int(b) for b in base), norm)

    @property
    def shares(self) -> tuple[float, ...]:
        """Token shares in force now (the last segment's)."""
        return self.segments[-1].shares

    # -- counting -----------------------------------------------------------------------
    def _count(self, j: int, s: int, v: float) -> int:
        """Items of source ``s`` in segment ``j`` due before virtual time ``v``."""
        seg, rate = self.segments[j], self.segments[j].rates[s]
        n = max(0, math.ceil((v - seg.start) * rate - 0.5)) if rate > 0 and v > seg.start else 0
        if j + 1 < len(self.segments):
            n = min(n, self.segments[j + 1].base[s] - seg.base[s])
        return n

    def first_items(self, epoch: int) -> list[int]:
        """Per source, the first item index of mixture epoch ``epoch`` (all lower ones are in earlier epochs)."""
        v = epoch * self.epoch_tokens
        return [sum(self._count(j, s, v) for j in range(len(self.segments))) for s in range(len(self.items))]

    def epoch_draws(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, item)`` of every position of mixture epoch ``epoch``, in draw order.

        Returns ``int32`` source indices and ``int64`` item indices (item ``n`` of source ``s`` is
        position ``n % N_s`` of that source's epoch ``n // N_s``), both of the epoch's length.
        """
        if epoch in self._draw_cache:
            return self._draw_cache[epoch]
        lo, hi = epoch * self.epoch_tokens, (epoch + 1) * self.epoch_tokens
        due, src, item = [], [], []
        for j, seg in enumerate(self.segments):
            for s, rate in enumerate(seg.rates):
                a, b = self._count(j, s, lo), self._count(j, s, hi)
                if b <= a:
                    continue
                k = np.arange(a, b, dtype=np.int64)
                due.append(seg.start + (k + 0.5) / rate)
                src.append(np.full(b - a, s, np.int32))
                item.append(seg.base[s] + k)
        if not due:
            out = (np.empty(0, np.int32), np.empty(0, np.int64))
        else:
            d, s_, i_ = np.concatenate(due), np.concatenate(src), np.concatenate(item)
            order = np.lexsort((i_, s_, d))
            out = (s_[order], i_[order])
        if len(self._draw_cache) >= 2:
            self._draw_cache.pop(next(iter(self._draw_cache)))
        self._draw_cache[epoch] = out
        return out

    def epoch_length(self, epoch: int) -> int:
        """Positions (items drawn) in mixture epoch ``epoch``."""
        return len(self.epoch_draws(epoch)[0])

    def due(self, s: int, n: int) -> float:
        """Virtual time at which item ``n`` of source ``s`` is due."""
        j = max(j for j, seg in enumerate(self.segments) if seg.base[s] <= n)
        seg = self.segments[j]
        rate = seg.rates[s]
        return seg.start + (n - seg.base[s] + 0.5) / rate if rate > 0 else math.inf

    # -- share changes ------------------------------------------------------------------
    def change_shares(self, shares: list[float], epoch: int, cursors: list[int], highest: list[int]) -> bool:
        """Use ``shares`` from now on, keeping every item's place (returns whether anything changed).

        Args:
            shares: the new token shares.
            epoch: the mixture epoch being read.
            cursors: per source, the first item not yet consumed.
            highest: per source, the highest item consumed or in flight (``-1`` if none).
        """
        new = normalise(shares)
        if np.allclose(new, self.shares, rtol=0, atol=1e-12):
            return False
        lo, hi = epoch * self.epoch_tokens, (epoch + 1) * self.epoch_tokens
        last = self.segments[-1]
        dues = [self.due(s, c) for s, c in enumerate(cursors)]
        now = min([d for d in dues if math.isfinite(d)], default=lo)
        start = min(max(now, lo, last.start), hi)
        base = [max(b, c, h + 1) for b, c, h in zip(last.base, cursors, highest)]
        self.segments.append(self._segment(start, list(new), base))
        self._draw_cache.clear()
        return True

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-able plan: ``epoch_tokens`` and the segments."""
        return {"epoch_tokens": self.epoch_tokens,
                "segments": [{"start": g.start, "base": list(g.base), "shares": list(g.shares)} for g in self.segments]}

    @classmethod
    def from_state(cls, items: list[int], tokens: list[int], state: dict) -> "MixturePlan":
        """Inverse of :meth:`state_dict` for sources of ``items``/``tokens``."""
        plan = cls(items, tokens, state["segments"][0]["shares"], state["epoch_tokens"])
        plan.segments = [plan._segment(g["start"], g["shares"], g["base"]) for g in state["segments"]]
        return plan
