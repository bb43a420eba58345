"""Bad steps: non-finite loss/gradients and loss spikes are skipped, counted and logged; repeated
bad steps roll back to the last good checkpoint with a lower learning rate.

Each step, every rank puts its local loss sum, real-token count and a non-finite flag (loss or
gradient norm) into one 3-value all-reduce; the global gradient norm that clipping computed is
already identical on all ranks. One host read of those values per step decides on every rank
alike (the decision needs the host, since it decides whether ``optimizer.step()`` runs):

- non-finite global loss or gradient norm → skip the optimizer step (gradients dropped);
- loss above ``spike_ratio`` x an EMA of the good steps' losses (after ``spike_warmup`` good
  steps) → skip the batch (a common remedy, e.g. PaLM, Chowdhery et al. 2022, §5.1);
- ``max_consecutive`` bad steps in a row → roll back (the trainer reloads the newest finished
  checkpoint's model, optimizer and RNG, keeps the loader going forward so the bad data is not
  replayed, and multiplies the learning rate by ``rollback_lr_factor``).

Every event is appended to ``run_dir/events.jsonl`` by the rank it happened on, with ``step``,
``rank``, the batch keys of that rank (``TokenBatch.keys``) and the values that triggered it.
"""
from __future__ import annotations

import math
import time
from typing import Iterable

import torch
import torch.distributed as dist

from trainer.config import AnomalyConfig
from trainer.run.events import EventLog


class AnomalyGuard:
    """Decides, per optimizer step, whether the step is applied; keeps the counters.

    Attributes:
        skipped_nonfinite, skipped_spikes, rollbacks: event counts of this run (this process).
        consecutive: bad steps in a row now.
        lr_scale: learning-rate multiplier (product of the rollback factors so far).
        ema: EMA of good steps' losses (nats per real token), ``None`` before the first one.
    """

    def __init__(self, cfg: AnomalyConfig, run_dir: str, rank: int, device: torch.device):
        self.cfg, self.rank, self.device = cfg, rank, device
        self.events = EventLog.of_run(run_dir)
        self.skipped_nonfinite = self.skipped_spikes = self.rollbacks = 0
        self.consecutive, self.good_steps = 0, 0
        self.good_since_checkpoint = 0  # applied steps a rollback to the newest full checkpoint undoes
        self.good_steps_lost = self.good_micro_batches_lost = 0
        self.lr_scale, self.ema = 1.0, None
        self.applied = True  # whether the last checked step was applied

    # -- the check -----------------------------------------------------------------------
    def check(self, step: int, loss_sum: torch.Tensor, local_tokens: torch.Tensor, grad_norm: torch.Tensor,
              keys: Iterable[str]) -> bool:
        """``True`` when step ``step`` may be applied. Collective (one all-reduce of 3 values, one
        host read); logs and counts a skipped step. ``keys``: this rank's batch keys (iterated only
        when the step is reported)."""
        self.applied = self._check(step, loss_sum, local_tokens, grad_norm, keys)
        self.good_since_checkpoint += int(self.applied)
        return self.applied

    def checkpointed(self) -> None:
        """A full checkpoint now holds every applied step (saved, or resumed from)."""
        self.good_since_checkpoint = 0

    def _check(self, step, loss_sum, local_tokens, grad_norm, keys) -> bool:
        if not self.cfg.enabled:
            return True
        local_bad = (~torch.isfinite(loss_sum)).float() + (~torch.isfinite(grad_norm)).float()
        stats = torch.stack([loss_sum.float(), local_tokens.float(), local_bad.reshape(())])
        if dist.is_initialized():
            dist.all_reduce(stats)
        total, tokens, bad, norm = torch.cat([stats, grad_norm.detach().float().reshape(1)]).tolist()
        loss = total / max(tokens, 1.0)
        nonfinite = bad > 0 or not math.isfinite(loss) or not math.isfinite(norm)
        spike = (not nonfinite and self.cfg.spike_ratio > 0 and self.ema is not None
                 and self.good_steps >= self.cfg.spike_warmup and loss > self.cfg.spike_ratio * self.ema)
        if not (nonfinite or spike):
            self.consecutive = 0
            self.good_steps += 1
            b = self.cfg.ema_beta
            self.ema = loss if self.ema is None else b * self.ema + (1 - b) * loss
            return True
        self.consecutive += 1
        if nonfinite:
            self.skipped_nonfinite += 1
        else:
            self.skipped_spikes += 1
        self.events.write({"event": "nonfinite" if nonfinite else "loss_spike", "step": step, "rank": self.rank,
                           "keys": list(keys), "loss": loss, "grad_norm": norm, "ema": self.ema,
                           "local_loss_nonfinite": not bool(torch.isfinite(loss_sum)), "consecutive": self.consecutive,
                           "skipped_total": self.skipped_nonfinite + self.skipped_spikes, "time": time.time()})
        return False

    @property
    def needs_rollback(self) -> bool:
        """Whether ``anomaly.max_consecutive`` bad steps in a row call for a rollback."""
        return self.cfg.max_consecutive > 0 and self.consecutive >= self.cfg.max_consecutive

    def rolled_back(self, from_step: int, to_step: int, checkpoint: str, micro_batches_per_step: int) -> None:
        """Record a rollback: lower the learning rate, reset the bad-step run, log the event.

        The good steps applied since the checkpoint are undone and their micro-batches are not
        revisited (the loader keeps going forward); they are counted: ``good_steps_lost`` and
        ``good_micro_batches_lost`` (all ranks: ``micro_batches_per_step`` = grad_accum_steps x
        world size) in the event and in :meth:`summary`."""
        lost = self.good_since_checkpoint
        self.rollbacks += 1
        self.lr_scale *= self.cfg.rollback_lr_factor
        self.consecutive = self.good_since_checkpoint = 0
        self.good_steps_lost += lost
        self.good_micro_batches_lost += lost * micro_batches_per_step
        self.events.write({"event": "rollback", "step": from_step, "rank": self.rank, "to_step": to_step,
                           "checkpoint": checkpoint, "lr_scale": self.lr_scale, "good_steps_lost": lost,
                           "good_micro_batches_lost": lost * micro_batches_per_step, "time": time.time()})

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The guard's counters and learning-rate scale, saved in checkpoints under ``trainer``."""
        return {"lr_scale": self.lr_scale, "ema": self.ema, "good_steps": self.good_steps,
                "skipped_nonfinite": self.skipped_nonfinite, "skipped_spikes": self.skipped_spikes,
                "rollbacks": self.rollbacks, "good_steps_lost": self.good_steps_lost,
                "good_micro_batches_lost": self.good_micro_batches_lost}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore :meth:`state_dict` output (``None``: keep the fresh state)."""
        if state:
            for k, v in state.items():
                setattr(self, k, v)

    def summary(self) -> dict:
        """Counts for the run summary: skipped steps, rollbacks, lr scale, good steps/micro-batches lost."""
        return {"skipped_nonfinite": self.skipped_nonfinite, "skipped_spikes": self.skipped_spikes,
                "rollbacks": self.rollbacks, "lr_scale": self.lr_scale, "good_steps_lost": self.good_steps_lost,
                "good_micro_batches_lost": self.good_micro_batches_lost}
