"""A real Prometheus (Debian's ``prometheus``) scrapes a training run's endpoint on 127.0.0.1 and the
trainer, per-layer, hardware and cache series are read back from Prometheus's HTTP API with the
values the run wrote to metrics.jsonl, and every query of the shipped Grafana dashboard finds its
series. Skipped only when the ``prometheus`` binary is missing
(``.ci/run`` installs it)."""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from trainer.report.dashboard import PANELS, grafana_dashboard, promql
from trainer.distributed.parallel import free_port

from tests.unit.trainer.test_metrics import MODEL, ROOT, build_shards

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed "
                                     "(apt-get install prometheus; .ci/run installs it)")
STEPS = 6


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read().decode())


def _query(api: str, expr: str) -> list[dict]:
    body = _get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture
def prometheus(tmp_path):
    """A Prometheus scraping ``127.0.0.1:<target port>`` every 250 ms; yields ``(api url, target port)``."""
    target, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 250ms
  scrape_timeout: 200ms
scrape_configs:
  - job_name: colaflow
    static_configs:
      - targets: ["127.0.0.1:{target}"]
""")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    api = f"http://127.0.0.1:{web}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{api}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield api, target
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_prometheus
def test_prometheus_scrapes_trainer_series(tmp_path, prometheus):
    api, port = prometheus
    shards, run = str(tmp_path / "shards"), tmp_path / "run"
    build_shards(shards)
    overrides = [f"data.manifest={shards}", f"cache.dir={tmp_path / 'cache'}", f"run_dir={run}",
                 *(f"model.{k}={v}" for k, v in MODEL.items() if k != "vocab_size"), "model.n_layers=2",
                 "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0", "zero.stage=0",
                 "precision=fp32", "device=cpu", f"steps={STEPS}", "log_every=2", "metrics.progress=false",
                 "metrics.layer_stats=-1", f"metrics.prometheus_port={port}", "metrics.peak_flops=1e12",
                 "metrics.prometheus_linger_s=120", "checkpoint.save_at_end=false"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    trainer = subprocess.Popen([sys.executable, "-m", "trainer", "--config", os.path.join(ROOT, "configs", "demo.yaml"),
                                *overrides], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        # the run serves its final values for 120 s after the last step: wait until Prometheus has them
        deadline = time.monotonic() + 240
        while not [r for r in _query(api, "colaflow_train_step") if float(r["value"][1]) == STEPS]:
            assert trainer.poll() is None, trainer.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "prometheus never scraped the final step"
            time.sleep(0.5)
        with open(run / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
        last = records[-1]
        assert last["step"] == STEPS
        up = _query(api, 'up{job="colaflow"}')
        assert [float(r["value"][1]) for r in up] == [1.0]
        for field in ("loss", "grad_norm", "lr", "tokens_per_second", "comm_s", "forward_backward_s",
                      "data_wait_s", "optimizer_s", "data_queue_depth", "hw_rss_bytes"):
            got = _query(api, f"colaflow_train_{field}")
            assert len(got) == 1, field
            assert float(got[0]["value"][1]) == pytest.approx(last[field], rel=1e-9), field
        assert last["hw_rss_bytes"] > 10 * 2**20  # a Python process with torch loaded
        for stat in ("grad_norm", "update_ratio", "act_rms", "act_max"):
            got = {r["metric"]["layer"]: float(r["value"][1]) for r in _query(api, f"colaflow_train_layer_{stat}")}
            assert got == pytest.approx({name: v[stat] for name, v in last["layers"].items()}, rel=1e-9), stat
            assert set(got) == {"blocks.0", "blocks.1"} and all(v > 0 for v in got.values()), stat
        hits = _query(api, "colaflow_cache_hits_total + colaflow_cache_misses_total")
        assert hits and float(hits[0]["value"][1]) > 0
        # every query of the shipped Grafana dashboard finds its series in this real Prometheus
        for panel in PANELS:
            found = []
            for t in panel.targets:
                got = _query(api, promql(t, ".*"))
                logged = any((r.get("layers") if t.layer else r.get(t.field)) is not None for r in records)
                assert bool(got) == logged, (panel.title, t.expr)
                found += got
            assert found or panel.gpu_only, panel.title
        # the series has history, not just the last value: a range query over the run sees several steps
        steps = _get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": "count_over_time(colaflow_train_step[10m])"}))
        assert float(steps["data"]["result"][0]["value"][1]) >= 1
    finally:
        trainer.terminate()
        trainer.wait(timeout=30)


def test_shipped_dashboard_is_the_generated_one():
    with open(os.path.join(ROOT, "docs", "grafana", "colaflow-dashboard.json"), encoding="utf-8") as f:
        shipped = json.load(f)
    assert shipped == grafana_dashboard()  # regenerate: python -m trainer.report.dashboard grafana FILE
    exprs = [t["expr"] for p in shipped["panels"] for t in p["targets"]]
    assert len(exprs) == sum(len(p.targets) for p in PANELS) and all('job=~"$job"' in e for e in exprs)
