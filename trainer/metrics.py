"""Run metrics: a tqdm bar on rank 0 and ``run_dir/metrics.jsonl`` (one JSON object per logged step)."""
from __future__ import annotations

import json
import os

from tqdm import tqdm


class MetricsLogger:
    """Writes logged steps as JSON lines and shows progress; does nothing on ranks other than 0.

    Each record holds at least ``step``, ``loss`` (nats per real token), ``tokens_per_second``
    (real tokens over all ranks per wall second), ``lr`` and ``data_wait_s`` (seconds rank 0 spent
    waiting for batches since the previous record).
    """

    def __init__(self, run_dir: str, jsonl: str, total_steps: int, enabled: bool, progress: bool = True,
                 initial: int = 0):
        self.enabled = enabled
        self._file = None
        self._bar = None
        if enabled:
            os.makedirs(run_dir, exist_ok=True)
            self.path = os.path.join(run_dir, jsonl)
            self._file = open(self.path, "a", encoding="utf-8")
            if progress:
                self._bar = tqdm(total=total_steps, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def step(self) -> None:
        """Advance the progress bar by one optimizer step (host only, no device sync)."""
        if self._bar is not None:
            self._bar.update(1)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}",
                                  lr=f"{record['lr']:.2e}", wait=f"{record['data_wait_s']:.2f}s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
