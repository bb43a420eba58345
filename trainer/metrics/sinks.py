"""Where logged metrics go, on rank 0 only: a tqdm bar, ``run_dir/metrics.jsonl``, TensorBoard and a
Prometheus endpoint (all optional except JSONL).

- JSONL: one JSON object per logged step, ``sort_keys``; the input of ``python -m trainer report``.
- TensorBoard: ``torch.utils.tensorboard.SummaryWriter`` under ``run_dir/<metrics.tensorboard_dir>``,
  every numeric field as scalar ``train/<field>`` at x = optimizer step.
- Prometheus: ``prometheus_client.start_http_server(port, addr, registry=...)`` on rank 0 when
  ``metrics.prometheus_port`` > 0, serving gauges ``colaflow_train_<field>``, the per-layer
  statistics as ``colaflow_train_layer_<stat>{layer="blocks.N"}`` plus the cache's own
  ``colaflow_cache_*`` counters. A busy port is reported as a warning and the run goes on without it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from tqdm import tqdm

log = logging.getLogger(__name__)


def _layer_values(record: dict) -> dict[tuple[str, str], float]:
    """``{(layer, stat): value}`` of the finite per-layer statistics in ``record["layers"]``."""
    layers = record.get("layers")
    if not isinstance(layers, dict):
        return {}
    return {(layer, stat): float(v) for layer, stats in layers.items() if isinstance(stats, dict)
            for stat, v in stats.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _numeric(record: dict) -> dict[str, float]:
    """Fields of ``record`` that are finite numbers (bools, strings, ``None`` and NaN left out)."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class _RegistryBridge:
    """A custom collector re-exposing another registry's metrics (the cache's) in ours."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        yield from self.registry.collect()


class PrometheusSink:
    """Gauges ``colaflow_train_<field>`` in a private registry, served over HTTP.

    Args:
        port: TCP port (> 0).
        addr: bind address (``127.0.0.1`` local only; ``0.0.0.0`` for a cluster scraper).
        extra_registries: other ``CollectorRegistry`` s to serve too (e.g. ``ShardCache.registry``).

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, port: int, addr: str = "127.0.0.1", extra_registries: tuple = ()):
        self.registry = CollectorRegistry()
        for other in extra_registries:
            self.registry.register(_RegistryBridge(other))
        self._gauges: dict[str, Gauge] = {}
        self._layer_gauges: dict[str, Gauge] = {}
        self.server, self._thread = start_http_server(port, addr, registry=self.registry)
        self.port = self.server.server_port

    def update(self, record: dict) -> None:
        """Set a gauge per numeric field of ``record`` (``colaflow_train_<key>``) and per-layer gauges
        labelled by layer."""
        for key, value in _numeric(record).items():
            if key not in self._gauges:
                self._gauges[key] = Gauge(key, f"colaflow trainer metric {key} (see trainer.metrics.meter)",
                                          namespace="colaflow_train", registry=self.registry)
            self._gauges[key].set(value)
        for (layer, stat), value in _layer_values(record).items():
            if stat not in self._layer_gauges:
                self._layer_gauges[stat] = Gauge(f"layer_{stat}", f"per-layer {stat} on logged steps (see "
                                                 "trainer.metrics.model_stats)", ["layer"],
                                                 namespace="colaflow_train", registry=self.registry)
            self._layer_gauges[stat].labels(layer=layer).set(value)

    def close(self) -> None:
        """Stop the HTTP endpoint."""
        self.server.shutdown()
        self.server.server_close()


class MetricsLogger:
    """Writes logged records to every enabled sink and shows progress; does nothing off rank 0.

    Each record holds at least ``step``, ``loss`` (nats per real token), ``tokens_per_second``
    (real tokens over all ranks per wall second), ``lr`` and ``data_wait_s`` (seconds rank 0 spent
    waiting for batches since the previous record); :meth:`trainer.metrics.meter.IntervalMeter.collect`
    lists the rest.

    Args:
        run_dir: the run folder (created).
        jsonl: metrics file name inside ``run_dir``.
        total_steps: steps of the whole run (progress bar length).
        enabled: ``True`` on rank 0.
        progress: show a tqdm bar.
        initial: step the run starts from (resume).
        tensorboard_dir: TensorBoard log folder inside ``run_dir`` (``""`` = off).
        prometheus_port: serve Prometheus metrics on this port (0 = off).
        prometheus_addr: bind address of the Prometheus endpoint.
        prometheus_linger_s: seconds :meth:`close` keeps serving the final values (for a last scrape).
        extra_registries: more prometheus registries to serve (the cache's).
    """

    def __init__(self, run_dir: str, jsonl: str, total_steps: int, enabled: bool, progress: bool = True,
                 initial: int = 0, tensorboard_dir: str = "", prometheus_port: int = 0,
                 prometheus_addr: str = "127.0.0.1", extra_registries: tuple = (), prometheus_linger_s: float = 0.0):
        self.enabled, self.linger_s = enabled, prometheus_linger_s
        self._file = self._bar = self._tb = self.prometheus = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, jsonl)
        self._file = open(self.path, "a", encoding="utf-8")
        if progress:
            # redrawn in place on a terminal; in a log file each redraw is a new chunk, so draw rarely
            self._bar = tqdm(total=total_steps, initial=initial, desc="train", unit="step", dynamic_ncols=True,
                             mininterval=0.1 if sys.stderr.isatty() else 30.0)
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for
                self._tb = SummaryWriter(log_dir=os.path.join(run_dir, tensorboard_dir))
            except ImportError as e:
                log.warning("metrics.tensorboard_dir=%r but TensorBoard is not importable (%s); going on without "
                            "it (pip install tensorboard, or set metrics.tensorboard_dir='')", tensorboard_dir, e)
        if prometheus_port:
            try:
                self.prometheus = PrometheusSink(prometheus_port, prometheus_addr, extra_registries)
            except OSError as e:
                log.warning("metrics.prometheus_port=%d on %s: %s; going on without the Prometheus endpoint "
                            "(pick a free port or set metrics.prometheus_port=0)", prometheus_port,
                            prometheus_addr, e)

    @classmethod
    def from_config(cls, cfg, run_dir: str, total_steps: int, enabled: bool, initial: int = 0,
                    extra_registries: tuple = ()) -> "MetricsLogger":
        """Build from a :class:`trainer.config.MetricsConfig`."""
        return cls(run_dir, cfg.jsonl, total_steps, enabled, cfg.progress, initial, cfg.tensorboard_dir,
                   cfg.prometheus_port, cfg.prometheus_addr, extra_registries, cfg.prometheus_linger_s)

    def step(self) -> None:
        """Advance the progress bar by one optimizer step (host only, no device sync)."""
        if self._bar is not None:
            self._bar.update(1)

    def log(self, record: dict) -> None:
        """Write ``record`` (a dict of JSON values with an int ``step``; nested only under ``layers``) to every sink."""
        if not self.enabled:
            return
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in _numeric(record).items():
                if key != "step":
                    self._tb.add_scalar(f"train/{key}", value, record["step"])
            for (layer, stat), value in _layer_values(record).items():
                self._tb.add_scalar(f"layers/{layer}/{stat}", value, record["step"])
            self._tb.flush()
        if self.prometheus is not None:
            self.prometheus.update(record)
        if self._bar is not None and "tokens_per_second" in record:  # training records, not validation ones
            loss = record.get("loss")
            post = {"loss": "skipped" if loss is None else f"{loss:.3f}", "tok_s": f"{record['tokens_per_second']:.0f}",
                    "lr": f"{record['lr']:.2e}", "wait": f"{record['data_wait_s']:.2f}s"}
            if record.get("mfu") is not None:
                post["mfu"] = f"{100 * record['mfu']:.1f}%"
            if record.get("skipped_steps"):
                post["skipped"] = record["skipped_steps"]
            self._bar.set_postfix(post)

    def rewind(self, step: int) -> None:
        """Forget the records after ``step`` (a rollback to a checkpoint of ``step`` undid them): they
        are dropped from the JSONL file, so each step keeps the one record of the steps that stand
        (TensorBoard shows the retrained values over the undone ones)."""
        if not self.enabled:
            return
        from trainer.run.folder import truncate_metrics
        self._file.close()
        truncate_metrics(self.path, step)
        self._file = open(self.path, "a", encoding="utf-8")
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()

    def close(self) -> None:
        """Flush and close every sink (stops the Prometheus server)."""
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self.prometheus is not None:
            if self.linger_s > 0:
                log.info("serving the final metrics on port %d for %.0f s (metrics.prometheus_linger_s)",
                         self.prometheus.port, self.linger_s)
                time.sleep(self.linger_s)
            self.prometheus.close()
