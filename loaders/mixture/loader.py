"""Training on a weighted mixture of prebuilt datasets (``data.mixture``).

```yaml
data:
  mixture:
    - {name: shakespeare, manifest: https://host/shakespeare/manifest.json, weight: 0.7}
    - {name: kjv, manifest: s3://bucket/kjv, weight: 0.3}
```

Each source is read through the node cache like a single manifest. The draw (which source's
item comes at each position) is :class:`loaders.mixture.plan.MixturePlan`: deterministic from
the manifests, the shares and ``data.seed``, independent of world size and worker count. Each
source reads its own seeded sample order (:class:`loaders.order.sample_order.SampleOrder`), exactly once
per source epoch; a source that runs out goes on into its next epoch (logged) while the others
continue. Positions are split over ranks x workers and packed exactly as for one dataset, through
small seams: :class:`loaders.mixture.sources.MixtureStream` overrides ``TextStream.order`` and
``TextStream.open_reader`` (torch-free: it runs in the loader's worker processes), and
:class:`MixtureLoader` overrides ``TextLoader._epoch_progress``, ``_record`` and ``_merge``.

Resume (:mod:`loaders.mixture.state`) is per source item, so it works at another world size or
worker count, and with other weights: every source continues where it stopped, consumed items
are never read again in that source epoch and none is skipped.

``metrics()["sources"]`` gives per source the tokens delivered (this rank since the restored
state, plus the restored totals), the realised share, the weight and the source epoch.
"""
from __future__ import annotations

import logging

import numpy as np

from loaders.rank.batch import TokenBatch
from loaders.config import DataConfig
from loaders.rank.loader import TextLoader
from loaders.mixture.plan import MixturePlan
from loaders.mixture.sources import (LoadedSource, MixtureStream, combined_manifest, load_sources, parse_sources,
                              source_shares)
from loaders.mixture.state import (STATE_KIND, STATE_VERSION, merge_source_states, read_sources, source_states,
                            to_progress)
from loaders.order.progress import Progress
from loaders.read.shard_reader import LocalShards
from loaders.rank.steps import StepSync

log = logging.getLogger(__name__)


def chunk_tokens(batch: TokenBatch) -> np.ndarray:
    """Tokens of each chunk entry (``n_chunks > 0``) of ``batch.consumed``, in that order (``int64``).

    Relies on the packers' layout (:func:`loaders.pack.object_packer.make_batch`, and
    :meth:`loaders.pack.packer.ArrayPacker._emit` via :meth:`TokenBatch.from_packed`): chunk
    entries are listed row by row, in row order (empty/bad documents, ``n_chunks == 0``, before
    them), and a chunk's tokens are the row's tokens with its ``document_ids`` value.

    Raises:
        RuntimeError: the batch's rows and its ``consumed`` list disagree.
    """
    if batch.packed is not None:  # chunk lengths in row order: no need to expand the batch
        return batch.packed.lens.astype(np.int64)
    docs = batch.document_ids.cpu().numpy()
    lengths = [np.bincount(row[row >= 0]) for row in docs]
    out = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
    expected = int(np.count_nonzero(batch.consumed[:, 2] > 0))
    if len(out) != expected:
        raise RuntimeError(f"batch lists {expected} chunks but its rows hold {len(out)}: cannot count tokens per source")
    return out.astype(np.int64)


class MixtureLoader(TextLoader):
    """Resumable loader of one rank over a mixture (iterate it for one mixture epoch).

    Args:
        cfg: ``data:`` settings (``cfg.mixture`` is already parsed into ``sources``).
        sources: the loaded sources, in ``data.mixture`` order.
        cache, rank, world_size, in_process, step_sync: as :class:`TextLoader`.
    """

    def __init__(self, cfg: DataConfig, sources: list[LoadedSource], cache, rank: int = 0, world_size: int = 1,
                 in_process: bool = False, step_sync: StepSync | None = None):
        self.sources = sources
        self.names = [s.spec.name for s in sources]
        shares, epoch_tokens = source_shares(sources)
        self.plan = MixturePlan([s.items for s in sources], [s.tokens for s in sources], shares, epoch_tokens)
        super().__init__(cfg, combined_manifest(sources), "", cache, rank, world_size, in_process, step_sync)
        self.dataset = MixtureStream(cfg, sources, self.plan, cache, rank, world_size)
        self.tokens_base, self.tokens_new = [0] * len(sources), [0] * len(sources)
        self.bad_base = self.empty_base = self.bad_new = self.empty_new = 0
        self.source_epochs = [0] * len(sources)

    def _epoch_progress(self, epoch: int) -> Progress:
        """A fresh :class:`Progress` of mixture epoch ``epoch`` (its length comes from the plan)."""
        return Progress(epoch, self.order_key, self.plan.epoch_length(epoch), self.world_size)

    def _apply_records(self) -> None:
        """Apply the delivered batches' resume records, counting the bad/empty documents they add."""
        if self._unrecorded:
            bad, empty = self._progress.bad, self._progress.empty
            super()._apply_records()
            self.bad_new += self._progress.bad - bad
            self.empty_new += self._progress.empty - empty

    def _record(self, batch: TokenBatch) -> None:
        """Resume state (applied in bulk, see :meth:`_apply_records`), tokens per source, and a log
        line when a source starts an epoch."""
        super()._record(batch)
        if not len(batch.consumed):
            return
        src, item = self.plan.epoch_draws(self.epoch)
        chunks = batch.consumed[batch.consumed[:, 2] > 0, 0]
        if len(chunks):
            per = np.bincount(src[chunks], weights=chunk_tokens(batch), minlength=len(self.sources))
            self.tokens_new = [t + int(x) for t, x in zip(self.tokens_new, per)]
        pos = batch.consumed[:, 0]
        for s in np.unique(src[pos]).tolist():
            epoch = int(item[pos[src[pos] == s]].max()) // self.sources[s].items
            if epoch > self.source_epochs[s]:
                log.info("mixture source %r: epoch %d read, starting its epoch %d (the other sources continue)",
                         self.names[s], epoch - 1, epoch)
                self.source_epochs[s] = epoch

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's mixture state (JSON-able, per source; see :mod:`loaders.mixture.state`).
        Merge all ranks' states (:meth:`global_state_dict`) before saving."""
        self._apply_records()  # before bad_new/empty_new are read
        return {"kind": STATE_KIND, "version": STATE_VERSION, "order_key": dict(self.order_key),
                "epoch": self.epoch, "plan": self.plan.state_dict(),
                "sources": source_states(self.progress, self.plan, self.names, self.tokens_base, self.tokens_new),
                "world_size": self.world_size, "complete_ranks": sorted(self.progress.complete_ranks),
                "bad": self.bad_base, "bad_new": self.bad_new, "empty": self.empty_base, "empty_new": self.empty_new}

    @staticmethod
    def _merge(states: list[dict]) -> dict:
        """All ranks' mixture states as one (:func:`loaders.mixture.state.merge_source_states`)."""
        return merge_source_states(states)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from a (merged) mixture state at any world size, worker count and weights.

        Weights (or budgets) that differ from the state's take effect from the resume point on;
        the consumed items of every source stay consumed.

        Raises:
            ValueError: not a mixture state, or one of other sources, seed, shuffle or ``seq_len``, or a
                malformed one (:func:`loaders.mixture.state.read_sources`).
        """
        if isinstance(state, list):
            state = self._merge(state)
        if state.get("kind") != STATE_KIND or state.get("version") not in (1, STATE_VERSION):
            raise ValueError("loader state is not a mixture state of this version (was it written by a run on one "
                             "data.manifest?); resume with the data config the checkpoint was written with")
        if state["order_key"] != self.order_key:
            raise ValueError(f"loader state was written for {state['order_key']}, this mixture has {self.order_key};"
                             " resume with the same sources (names and manifests) and data.seed/shuffle/seq_len")
        plan = MixturePlan.from_state(self.plan.items, self.plan.tokens, state["plan"])
        epoch = int(state["epoch"])
        sources = read_sources(state, self.names)
        over = len(state["complete_ranks"]) >= int(state["world_size"]) or \
            self._nothing_left(to_progress(sources, plan, epoch, self.order_key, self.world_size))
        if over:  # also a state saved right after the epoch's last batch, before any rank's iterator ended
            epoch += 1
            for s, first in zip(sources, plan.first_items(epoch)):
                s.update(cursor=max(s["cursor"], first), done=s["done"][s["done"] > first], partial=[])
        shares = source_shares(self.sources)[0]
        highest = [max([s["cursor"] - 1, *s["done"][-1:].tolist(), *(p[0] for p in s["partial"])]) for s in sources]
        if plan.change_shares(shares, epoch, [s["cursor"] for s in sources], highest):
            log.info("mixture shares changed on resume to %s (from mixture epoch %d on; consumed items kept)",
                     dict(zip(self.names, np.round(plan.shares, 4).tolist())), epoch)
        self.plan = self.dataset.plan = plan
        # an unmerged one-rank state still holds its own counts in *_new
        self.tokens_base = [int(s["tokens"]) + int(s["tokens_new"]) for s in sources]
        self.tokens_new = [0] * len(sources)
        self.bad_base = int(state["bad"]) + int(state["bad_new"])
        self.empty_base, self.bad_new, self.empty_new = int(state["empty"]) + int(state["empty_new"]), 0, 0
        self.source_epochs = [max(0, h) // src.items for h, src in zip(highest, self.sources)]
        self.progress = to_progress(sources, plan, epoch, self.order_key, self.world_size)

    # -- metrics ----------------------------------------------------------------------------
    def source_tokens(self) -> list[int]:
        """Tokens delivered per source: restored totals plus this rank's since (``data.mixture`` order)."""
        return [b + n for b, n in zip(self.tokens_base, self.tokens_new)]

    def source_counts(self) -> dict:
        """Per source (``data.mixture`` order): ``names``, ``tokens_base`` (restored totals, the same on every
        rank), ``tokens_new`` (this rank's since), ``epochs`` (source epoch reached by this rank) and
        ``shares`` (token shares in force). Add ``tokens_new`` over ranks and ``tokens_base`` once."""
        return {"names": list(self.names), "tokens_base": list(self.tokens_base), "tokens_new": list(self.tokens_new),
                "epochs": list(self.source_epochs), "shares": list(self.plan.shares)}

    def metrics(self) -> dict:
        """:meth:`TextLoader.metrics` plus ``sources``: name -> ``tokens`` (see :meth:`source_tokens`),
        ``share`` (of those tokens), ``weight`` (token share in force) and ``epoch`` (the source's)."""
        self._apply_records()  # before bad_new/empty_new are read
        m = super().metrics()
        m.update(bad=self.bad_base + self.bad_new, empty=self.empty_base + self.empty_new)
        tokens = self.source_tokens()
        total = sum(tokens)
        m["sources"] = {name: {"tokens": t, "share": t / total if total else 0.0, "weight": w, "epoch": e}
                        for name, t, w, e in zip(self.names, tokens, self.plan.shares, self.source_epochs)}
        return m


def build_mixture_loader(cfg: DataConfig, cache=None, rank: int = 0, world_size: int = 1, in_process: bool = False,
                         step_sync: StepSync | None = None) -> MixtureLoader:
    """The :class:`MixtureLoader` of ``rank`` over ``cfg.mixture`` (manifests loaded through fsspec).

    Raises:
        colaflow.config.ConfigError: a bad ``data.mixture`` entry (names the entry and field).
        FileNotFoundError / ValueError: a source's manifest is missing or invalid (names the source).
    """
    cfg.validate()
    sources = load_sources(parse_sources(cfg.mixture))
    return MixtureLoader(cfg, sources, cache if cache is not None else LocalShards(), rank, world_size,
                         in_process, step_sync)
