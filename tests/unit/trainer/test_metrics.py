"""Trainer metrics: a real 2-rank ``torchrun`` run (shards → cache → loader → ZeRO-2) writes
metrics.jsonl with every field and sane values, TensorBoard events, a profiler trace and a report;
the Prometheus endpoint serves trainer and cache metrics over real HTTP; the FLOPs formula matches
``torch.utils.flop_counter``."""
import json
import logging
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import torch
import torch.nn.functional as F
from prometheus_client.parser import text_string_to_metric_families
from torch.utils.flop_counter import FlopCounterMode

from cache import ShardCache
from cache.config import CacheConfig
from tests.support.data import write_counting_shards
from trainer.config import ModelConfig, OptimConfig, TrainConfig
from trainer.metrics.sinks import MetricsLogger
from trainer.metrics.mfu import flops_per_token, matmul_parameters, peak_flops
from trainer.model import GPT
from trainer.optim import lr_at
from trainer.distributed.parallel import free_port
from trainer.report.render import write_report
from trainer.evaluation.synthetic import synthetic_batch
from trainer.metrics.timing import StepTimer
from tests.support.paths import REPO

ROOT = str(REPO)
VOCAB = 64
MODEL = dict(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2, max_seq_len=32)


def build_shards(directory: str, docs: int = 80) -> int:
    """Counting documents mod VOCAB in shards of 20; returns the shard count."""
    return len(write_counting_shards(directory, docs, max_samples=20, vocab=VOCAB, max_len=50, seed=1))


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics_run")
    shards, run = str(tmp / "shards"), str(tmp / "run")
    build_shards(shards)
    overrides = [f"data.manifest={shards}", f"cache.dir={tmp / 'cache'}", f"run_dir={run}",
                 *(f"model.{k}={v}" for k, v in MODEL.items() if k != "vocab_size"),
                 "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0", "zero.stage=2",
                 "precision=fp32", "optim.warmup_steps=2", "optim.lr=0.01", "optim.min_lr=0.001", "steps=6", "log_every=2",
                 "metrics.progress=false", "metrics.peak_flops=1e12",
                 f"metrics.prometheus_port={free_port()}",
                 "profile.enabled=true", "profile.wait=1", "profile.warmup=1", "profile.active=2",
                 "checkpoint.save_at_end=false"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "trainer",
           "--config", os.path.join(ROOT, "configs", "demo.yaml"), *overrides]
    proc = subprocess.run(cmd, cwd=str(tmp), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    with open(os.path.join(run, "train_summary.json")) as f:
        summary = json.load(f)
    return run, records, summary


def test_jsonl_has_every_field_with_sane_values(two_rank_run):
    _, records, summary = two_rank_run
    assert [r["step"] for r in records] == [1, 2, 4, 6]
    assert [r["steps"] for r in records] == [1, 1, 2, 2]
    assert sum(r["tokens"] for r in records) == summary["tokens_seen"] > 0
    optim = OptimConfig(lr=0.01, min_lr=0.001, warmup_steps=2)
    expected_flops = flops_per_token(matmul_parameters(GPT(ModelConfig(**MODEL))), ModelConfig(**MODEL), 32)
    for r in records:
        assert r["world_size"] == 2 and r["epoch"] >= 0 and r["skipped_steps"] == 0
        assert 0.5 < r["loss"] < 6 and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, optim, 6))
        assert r["tokens_per_second"] == pytest.approx(r["tokens"] / r["interval_s"])
        assert r["step_time_s"] == pytest.approx(r["interval_s"] / r["steps"])
        assert r["flops_per_token"] == expected_flops
        assert r["model_flops_per_second"] == pytest.approx(r["tokens"] * expected_flops / r["interval_s"] / 2)
        assert r["mfu"] == pytest.approx(r["model_flops_per_second"] / 1e12)
        for phase in ("data_wait", "comm", "forward_backward", "optimizer"):
            assert 0 <= r[f"{phase}_s"] <= r[f"{phase}_max_s"]
        assert r["comm_s"] > 0 and 0 <= r["data_queue_depth"] <= 8  # the default data.prefetch_batches=8
        assert r["hw_rss_bytes"] > 2**26 and not any(k.startswith("hw_gpu") for k in r)
        assert set(r["layers"]) == {"blocks.0"}  # the default sample of a 1-block model
        stats = r["layers"]["blocks.0"]
        assert stats["grad_norm"] > 0 and 0 < stats["update_ratio"] < 1 and 0 < stats["act_rms"] <= stats["act_max"]
        assert r["forward_backward_s"] > 0 and r["optimizer_s"] > 0
        assert 0 <= r["data_wait_share"] <= 1
        assert r["memory_kind"] == "rss" and 2**26 < r["memory_bytes"] <= r["memory_max_bytes"] < 2**34
        assert 0 < r["padding_efficiency"] <= 1
        assert r["cache_hit_rate"] is None or 0 <= r["cache_hit_rate"] <= 1
        assert r["cache_stall_s"] >= 0
    lookups = sum(r["cache_hits"] + r["cache_misses"] for r in records)
    assert lookups >= 2  # each rank opened at least one shard through its cache
    assert sum(r["cache_misses"] for r in records) >= 1  # the cache started empty


def test_tensorboard_events_match_jsonl(two_rank_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run, records, _ = two_rank_run
    acc = EventAccumulator(os.path.join(run, "tensorboard"))
    acc.Reload()
    assert {"train/loss", "train/tokens_per_second", "train/mfu", "train/data_wait_share",
            "train/memory_bytes"} <= set(acc.Tags()["scalars"])
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [r["step"] for r in records]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in records], rel=1e-6)


def test_profiler_trace_per_rank_is_chrome_trace_json(two_rank_run):
    run, _, _ = two_rank_run
    traces = sorted(os.listdir(os.path.join(run, "profile")))
    assert [t.split(".")[0] for t in traces] == ["rank0", "rank1"] and all(t.endswith(".pt.trace.json") for t in traces)
    for name in traces:
        with open(os.path.join(run, "profile", name)) as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        # wait=1, warmup=1, active=2: the profiler's steps 2 and 3 are recorded, with the model's ops
        assert {"ProfilerStep#2", "ProfilerStep#3"} <= names and "ProfilerStep#1" not in names
        assert any(str(n).startswith("aten::") for n in names)


def test_report_renders_for_the_run(two_rank_run):
    run, records, _ = two_rank_run
    index = write_report(run)
    with open(index) as f:
        page = f.read()
    for png in ("loss.png", "throughput.png", "step_time.png", "cache.png"):
        assert f'src="{png}"' in page
        with open(os.path.join(run, "report", png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert f"{records[-1]['loss']:.4f}" in page and "<th>world size</th><td>2</td>" in page


def test_prometheus_endpoint_serves_trainer_and_cache_metrics(tmp_path, caplog):
    cache = ShardCache(CacheConfig(dir=str(tmp_path / "cache")))
    cache._metrics.hits.inc(3)  # the cache's own counters, as a training run would move them
    port = free_port()
    log = MetricsLogger(str(tmp_path), "metrics.jsonl", 10, enabled=True, progress=False, tensorboard_dir="",
                        prometheus_port=port, extra_registries=(cache.registry,))
    try:
        log.log({"step": 4, "loss": 2.5, "tokens_per_second": 1234.5, "lr": 1e-3, "data_wait_s": 0.25,
                 "mfu": None, "memory_kind": "rss", "cache_hit_rate": 0.75})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        values = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
        assert values["colaflow_train_step"] == 4 and values["colaflow_train_loss"] == 2.5
        assert values["colaflow_train_tokens_per_second"] == 1234.5
        assert values["colaflow_train_cache_hit_rate"] == 0.75
        assert "colaflow_train_mfu" not in values and "colaflow_train_memory_kind" not in values
        assert values["colaflow_cache_hits_total"] == 3
        with caplog.at_level(logging.WARNING, logger="trainer.metrics.sinks"):  # port taken: warn, go on
            other = MetricsLogger(str(tmp_path / "b"), "m.jsonl", 10, enabled=True, progress=False,
                                  tensorboard_dir="", prometheus_port=port)
        assert other.prometheus is None and f"metrics.prometheus_port={port}" in caplog.text
        other.log({"step": 1, "loss": 1.0, "tokens_per_second": 1.0, "lr": 0.1, "data_wait_s": 0.0})
        other.close()
    finally:
        log.close()
        cache.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_logger_off_rank_zero_writes_nothing(tmp_path):
    log = MetricsLogger(str(tmp_path / "r1"), "metrics.jsonl", 5, enabled=False, tensorboard_dir="tb",
                        prometheus_port=free_port())
    log.log({"step": 1, "loss": 1.0})
    log.close()
    assert not os.path.exists(tmp_path / "r1")


@pytest.mark.parametrize("tie", [True, False])
def test_matmul_flops_match_flop_counter(tie):
    """6 N tokens equals the matmul FLOPs torch counts for forward + backward of the plain logits
    path (the attention term 12 L H Q T is PaLM's count; the CPU SDPA kernel is not counted)."""
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=2, max_seq_len=64, tie_embeddings=tie)
    model = GPT(cfg)
    b = synthetic_batch([[20, 30], [64]], 64)
    with FlopCounterMode(display=False) as counter:
        logits = model.logits(b.input_ids, b.position_ids, b.document_ids)
        F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), ignore_index=-100, reduction="sum").backward()
    tokens = b.input_ids.numel()
    attention = 12 * cfg.n_layers * cfg.n_heads * (cfg.d_model // cfg.n_heads) * 64
    assert counter.get_total_flops() == (flops_per_token(matmul_parameters(model), cfg, 64) - attention) * tokens
    assert peak_flops(0, torch.device("cpu")) is None and peak_flops(2e12, torch.device("cpu")) == 2e12


def test_step_timer_sums_phases_and_resets():
    timer = StepTimer(torch.device("cpu"))
    for _ in range(3):
        timer.start()
        timer.mark("data_wait")
        sum(range(10000))
        timer.mark("forward_backward")
        timer.mark("optimizer")
    assert timer.steps == 3
    first = timer.collect()
    assert set(first) == {"data_wait", "forward_backward", "optimizer"} and all(v >= 0 for v in first.values())
    assert first["forward_backward"] > 0
    assert timer.collect() == {} and timer.steps == 0


def test_config_rejects_bad_profile_and_port():
    cfg = TrainConfig()
    cfg.profile.enabled, cfg.profile.active = True, 0
    with pytest.raises(ValueError, match="profile"):
        cfg.validate()
    cfg = TrainConfig()
    cfg.metrics.prometheus_port = 70000
    with pytest.raises(ValueError, match="prometheus_port"):
        cfg.validate()
