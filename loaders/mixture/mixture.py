"""Training on a weighted mixture of prebuilt datasets (``data.mixture``): the :class:`Mixture` sources.

```yaml
data:
  mixture:
    - {name: shakespeare, manifest: https://host/shakespeare/manifest.json, weight: 0.7}
    - {name: kjv, manifest: s3://bucket/kjv, weight: 0.3}
```

The draw (which source's item comes at each position) is :class:`loaders.mixture.plan.MixturePlan`:
deterministic from the manifests, the shares and ``data.seed``, independent of world size and worker
count. Each source reads its own seeded order, exactly once per source epoch; a source that runs out
goes on into its next epoch (logged) while the others continue. Resume (:mod:`loaders.mixture.state`)
is per source item, so it works at another world size or worker count and with other weights.
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from loaders.config import DataConfig
from loaders.mixture.plan import MixturePlan
from loaders.mixture.sources import (
    LoadedSource,
    MixtureOrder,
    MixtureReader,
    combined_manifest,
    load_sources,
    parse_sources,
    source_shares,
)
from loaders.mixture.state import (
    STATE_KIND,
    STATE_VERSION,
    merge_source_states,
    read_sources,
    source_states,
    to_progress,
)
from loaders.order.progress import Progress
from loaders.protocols import ShardSource

log = logging.getLogger(__name__)


class Mixture:
    """The :class:`loaders.protocols.Sources` of a weighted mixture of datasets.

    Args:
        sources: the loaded sources, in ``data.mixture`` order.

    Attributes:
        plan: the draw (:class:`loaders.mixture.plan.MixturePlan`); a resume may change its shares.
        tokens_base, tokens_new: tokens delivered per source, restored totals and this rank's since.
        source_epochs: the source epoch each source reached on this rank.
    """

    def __init__(self, sources: list[LoadedSource]):
        self.sources = sources
        self.names = [s.spec.name for s in sources]
        shares, epoch_tokens = source_shares(sources)
        self.plan = MixturePlan([s.items for s in sources], [s.tokens for s in sources], shares, epoch_tokens)
        self.manifest = combined_manifest(sources)
        self.tokens_base, self.tokens_new = [0] * len(sources), [0] * len(sources)
        self.bad_base = self.empty_base = self.bad_new = self.empty_new = 0
        self.source_epochs = [0] * len(sources)

    @classmethod
    def from_config(cls, cfg: DataConfig) -> "Mixture":
        """The mixture ``cfg.mixture`` lists (manifests loaded through fsspec).

        Raises:
            colaflow.config.ConfigError: a bad ``data.mixture`` entry (names the entry and field).
            FileNotFoundError / ValueError: a source's manifest is missing or invalid (names the source).
        """
        return cls(load_sources(parse_sources(cfg.mixture)))

    # -- what the stream reads -----------------------------------------------------------------
    def order(self, epoch: int, seed: int, shuffle: bool, block: int, lanes: int = 1) -> MixtureOrder:
        """Mixture epoch ``epoch``'s order (each source's own seeded order, drawn by the plan)."""
        return MixtureOrder(self.plan, epoch, self.sources, seed, shuffle, block, lanes)

    def reader(self, cache: ShardSource, index_dir: str | None) -> MixtureReader:
        """Every source's shards through one shard source (:class:`loaders.mixture.sources.MixtureReader`)."""
        return MixtureReader(self.sources, cache, index_dir)

    # -- resume state ------------------------------------------------------------------------
    def new_progress(self, epoch: int, order_key: dict, world_size: int) -> Progress:
        """A fresh :class:`Progress` of mixture epoch ``epoch`` (its length comes from the plan)."""
        return Progress(epoch, order_key, self.plan.epoch_length(epoch), world_size)

    def state_dict(self, progress: Progress) -> dict:
        """The mixture state of ``progress`` (per source, :mod:`loaders.mixture.state`)."""
        return {"kind": STATE_KIND, "version": STATE_VERSION, "order_key": dict(progress.order_key),
                "epoch": progress.epoch, "plan": self.plan.state_dict(),
                "sources": source_states(progress, self.plan, self.names, self.tokens_base, self.tokens_new),
                "world_size": progress.world_size, "complete_ranks": sorted(progress.complete_ranks),
                "bad": self.bad_base, "bad_new": self.bad_new, "empty": self.empty_base, "empty_new": self.empty_new}

    def merge(self, states: list[dict]) -> dict:
        """All ranks' mixture states as one (:func:`loaders.mixture.state.merge_source_states`)."""
        return merge_source_states(states)

    def restore(self, state: dict, order_key: dict, world_size: int,
                nothing_left: Callable[[Progress], bool]) -> Progress:
        """Continue from a (merged) mixture state at any world size, worker count and weights.

        Weights (or budgets) that differ from the state's take effect from the resume point on;
        the consumed items of every source stay consumed.

        Raises:
            ValueError: not a mixture state, or one of other sources, seed, shuffle or ``seq_len``, or a
                malformed one (:func:`loaders.mixture.state.read_sources`).
        """
        if state.get("kind") != STATE_KIND or state.get("version") not in (1, STATE_VERSION):
            raise ValueError("loader state is not a mixture state of this version (was it written by a run on one "
                             "data.manifest?); resume with the data config the checkpoint was written with")
        if state["order_key"] != order_key:
            raise ValueError(f"loader state was written for {state['order_key']}, this mixture has {order_key};"
                             " resume with the same sources (names and manifests) and data.seed/shuffle/seq_len")
        plan = MixturePlan.from_state(self.plan.items, self.plan.tokens, state["plan"])
        epoch = int(state["epoch"])
        sources = read_sources(state, self.names)
        over = len(state["complete_ranks"]) >= int(state["world_size"]) or \
            nothing_left(to_progress(sources, plan, epoch, order_key, world_size))
        if over:  # also a state saved right after the epoch's last batch, before any rank's iterator ended
            epoch += 1
            for s, first in zip(sources, plan.first_items(epoch)):
                s.update(cursor=max(s["cursor"], first), done=s["done"][s["done"] > first], partial=[])
        shares = source_shares(self.sources)[0]
        highest = [max([s["cursor"] - 1, *s["done"][-1:].tolist(), *(p[0] for p in s["partial"])]) for s in sources]
        if plan.change_shares(shares, epoch, [s["cursor"] for s in sources], highest):
            log.info("mixture shares changed on resume to %s (from mixture epoch %d on; consumed items kept)",
                     dict(zip(self.names, np.round(plan.shares, 4).tolist())), epoch)
        self.plan = plan
        # an unmerged one-rank state still holds its own counts in *_new
        self.tokens_base = [int(s["tokens"]) + int(s["tokens_new"]) for s in sources]
        self.tokens_new = [0] * len(sources)
        self.bad_base = int(state["bad"]) + int(state["bad_new"])
        self.empty_base, self.bad_new, self.empty_new = int(state["empty"]) + int(state["empty_new"]), 0, 0
        self.source_epochs = [max(0, h) // src.items for h, src in zip(highest, self.sources)]
        return to_progress(sources, plan, epoch, order_key, world_size)

    # -- counts --------------------------------------------------------------------------------
    def delivered(self, epoch: int, consumed: np.ndarray, chunk_tokens: np.ndarray) -> None:
        """Tokens per source of a delivered batch, and a log line when a source starts an epoch."""
        src, item = self.plan.epoch_draws(epoch)
        chunks = consumed[consumed[:, 2] > 0, 0]
        if len(chunks):
            per = np.bincount(src[chunks], weights=chunk_tokens, minlength=len(self.sources))
            self.tokens_new = [t + int(x) for t, x in zip(self.tokens_new, per)]
        pos = consumed[:, 0]
        for s in np.unique(src[pos]).tolist():
            source_epoch = int(item[pos[src[pos] == s]].max()) // self.sources[s].items
            if source_epoch > self.source_epochs[s]:
                log.info("mixture source %r: epoch %d read, starting its epoch %d (the other sources continue)",
                         self.names[s], source_epoch - 1, source_epoch)
                self.source_epochs[s] = source_epoch

    def counted(self, bad: int, empty: int) -> None:
        """Bad and empty documents since the restored totals."""
        self.bad_new += bad
        self.empty_new += empty

    def source_tokens(self) -> list[int]:
        """Tokens delivered per source: restored totals plus this rank's since (``data.mixture`` order)."""
        return [b + n for b, n in zip(self.tokens_base, self.tokens_new)]

    def counts(self) -> dict:
        """Per source (``data.mixture`` order): ``names``, ``tokens_base`` (restored totals, the same on every
        rank), ``tokens_new`` (this rank's since), ``epochs`` (source epoch reached by this rank) and
        ``shares`` (token shares in force). Add ``tokens_new`` over ranks and ``tokens_base`` once."""
        return {"names": list(self.names), "tokens_base": list(self.tokens_base), "tokens_new": list(self.tokens_new),
                "epochs": list(self.source_epochs), "shares": list(self.plan.shares)}

    def origin(self, epoch: int, position: int) -> tuple[str, int]:
        """``(source name, source epoch)`` the plan draws at ``position`` of mixture epoch ``epoch``."""
        src, item = self.plan.epoch_draws(epoch)
        s = int(src[position])
        return self.names[s], int(item[position]) // self.sources[s].items

    def metrics(self, metrics: dict) -> dict:
        """``metrics`` with ``bad``/``empty`` over the whole run and ``sources``: name -> ``tokens`` (see
        :meth:`source_tokens`), ``share`` (of those tokens), ``weight`` (token share in force) and ``epoch``."""
        metrics.update(bad=self.bad_base + self.bad_new, empty=self.empty_base + self.empty_new)
        tokens = self.source_tokens()
        total = sum(tokens)
        metrics["sources"] = {name: {"tokens": t, "share": t / total if total else 0.0, "weight": w, "epoch": e}
                              for name, t, w, e in zip(self.names, tokens, self.plan.shares, self.source_epochs)}
        return metrics
