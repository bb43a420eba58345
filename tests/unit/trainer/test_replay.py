"""``python -m trainer replay``: a 2-rank run with a NaN injected into ``blocks.1.mlp`` on rank 1 at
step 3 logs the bad step; replaying it from the step-2 checkpoint and the logged batch keys names
that module (forward, non-finite) on rank 1, finds rank 0's batch clean, and repeats bit for bit."""
import json
import os
import subprocess
import sys

import pytest

from trainer.debug.replay import replay_step

from tests.support.faults import fault_hooks

from tests.unit.trainer.test_metrics import MODEL, ROOT, build_shards

LAYER = "blocks.1.mlp"


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    shards, run = str(tmp / "shards"), tmp / "run"
    build_shards(shards)
    overrides = [f"data.manifest={shards}", f"cache.dir={tmp / 'cache'}", f"run_dir={run}",
                 *(f"model.{k}={v}" for k, v in MODEL.items() if k != "vocab_size"), "model.n_layers=2",
                 "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0", "zero.stage=2",
                 "precision=fp32", "device=cpu", "steps=4", "log_every=2", "metrics.progress=false",
                 "checkpoint.every=2", fault_hooks(nan_at_steps=[3], rank=1, layer=LAYER)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "trainer",
           "--config", os.path.join(ROOT, "configs", "demo.yaml"), *overrides]
    proc = subprocess.run(cmd, cwd=str(tmp), env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return run


def test_replay_names_the_injected_layer(bad_run):
    with open(bad_run / "events.jsonl") as f:
        events = {e["rank"]: e for e in map(json.loads, f) if e["event"] == "nonfinite"}
    assert sorted(events) == [0, 1] and all(e["step"] == 3 for e in events.values())
    rank1, = replay_step(str(bad_run), 3, rank=1)
    assert rank1.weights_step == 2 and rank1.checkpoint.endswith("step_000002") and not rank1.notes
    assert rank1.injected and LAYER in rank1.injected
    assert set(rank1.keys) == set(events[1]["keys"]) and rank1.tokens > 0
    f = rank1.forward
    assert (f.phase, f.module, f.module_type, f.kind) == ("forward", LAYER, "SwiGLU", "nonfinite")
    assert f.stats.nan == f.stats.numel > 0 and f.stats.shape[-1] == MODEL["d_model"]
    assert f.stats.input_rms > 0  # its input (the norm's output) was still finite
    # backward: the gradient is first non-finite where it leaves the last module the NaN flowed through
    assert rank1.backward is not None and rank1.backward.kind == "nonfinite"
    again, = replay_step(str(bad_run), 3, rank=1)
    assert json.dumps(again.to_json(), sort_keys=True) == json.dumps(rank1.to_json(), sort_keys=True)  # NaN-safe
    rank0, = replay_step(str(bad_run), 3, rank=0)  # the other rank's batch replays clean
    assert rank0.injected is None and rank0.forward is None and rank0.backward is None
    assert set(rank0.keys) == set(events[0]["keys"]) and 0 < rank0.loss < 10


def test_replay_cli(bad_run, tmp_path):
    out = tmp_path / "replay.json"
    proc = subprocess.run([sys.executable, "-m", "trainer", "replay", str(bad_run), "--step", "3", "--json",
                           str(out)], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"forward: first nonfinite output at {LAYER} (SwiGLU)" in proc.stdout
    assert "step 3, rank 0" in proc.stdout and "step 3, rank 1" in proc.stdout
    reports = json.loads(out.read_text())
    assert [r["forward"]["module"] if r["forward"] else None for r in reports] == [None, LAYER]
    bad = subprocess.run([sys.executable, "-m", "trainer", "replay", str(bad_run), "--step", "2"], env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "no bad-step event at step 2" in bad.stderr and "[3]" in bad.stderr


def test_watcher_names_a_spiking_module_and_the_loss():
    """Spikes (output RMS over ``spike_ratio`` x the input's) and a NaN loss are found in forward order."""
    import torch

    from tests.support.faults import injected
    from trainer.config import ModelConfig
    from trainer.model import GPT
    from trainer.debug.replay import _Watcher
    from trainer.evaluation.synthetic import synthetic_batch
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2))
    b = synthetic_batch([[20, 12]], 32, vocab=64)
    for layer, value, want in (("blocks.0.mlp.down", 1e6, ("blocks.0.mlp.down", "Linear", "spike")),
                               ("", float("nan"), ("", "GPT", "nonfinite"))):
        with injected(model, layer, value):
            watcher = _Watcher(model, spike_ratio=100.0)
            model(b.input_ids, b.position_ids, b.document_ids, b.labels)
            watcher.remove()
        f = watcher.found["forward"]
        assert (f.module, f.module_type, f.kind) == want
    clean = _Watcher(model, spike_ratio=100.0)
    model(b.input_ids, b.position_ids, b.document_ids, b.labels).backward()
    clean.remove()
    called = sum(1 for m in model.modules() if not isinstance(m, torch.nn.ModuleList))  # a ModuleList never runs
    assert clean.found == {} and clean.calls["forward"] == called and clean.calls["backward"] > 0


def _token_block_shards(directory: str) -> dict[str, list[int]]:
    """Counting documents stored as token blocks of ~120 tokens (several documents per tar sample),
    with ids holding dots and slashes (keys are escaped, as in the demo corpus); returns ``{key: tokens}``."""
    import numpy as np

    from shards import Manifest, TokenBlockWriter, escape_key
    rng = np.random.default_rng(3)
    w, docs = TokenBlockWriter(directory, max_samples=4, block_tokens=120), {}
    for i in range(60):
        n = int(rng.integers(8, 50))
        toks = ((int(rng.integers(0, MODEL["vocab_size"])) + np.arange(n)) % MODEL["vocab_size"]).astype(np.uint16)
        doc_id = f"counting.jsonl/book/{i // 10}/{i % 10}"
        w.add(doc_id, "counting.jsonl", toks)
        docs[escape_key(doc_id)] = toks.tolist()
    Manifest(shards=w.close(), vocab_size=MODEL["vocab_size"], layout="token_blocks").save(directory)
    return docs


def test_replay_finds_documents_inside_token_blocks(tmp_path):
    """Regression: replay scanned ``samples`` (blocks) per shard instead of documents, so the keys of a
    token-block dataset past the first few documents of each shard were reported missing."""
    shards, run = str(tmp_path / "shards"), tmp_path / "run"
    docs = _token_block_shards(shards)
    overrides = [f"data.manifest={shards}", f"cache.dir={tmp_path / 'cache'}", f"run_dir={run}",
                 *(f"model.{k}={v}" for k, v in MODEL.items() if k != "vocab_size"), "model.n_layers=2",
                 "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0", "zero.stage=0",
                 "precision=fp32", "device=cpu", "steps=3", "log_every=1", "metrics.progress=false",
                 "checkpoint.every=2", fault_hooks(nan_at_steps=[3], layer=LAYER)]
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", os.path.join(ROOT, "configs", "demo.yaml"),
                           *overrides], cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    with open(run / "events.jsonl") as f:
        event, = [e for e in map(json.loads, f) if e["event"] == "nonfinite"]
    assert event["step"] == 3 and set(event["keys"]) <= set(docs) and len(event["keys"]) > 1
    report, = replay_step(str(run), 3)
    assert set(report.keys) == set(event["keys"])
    # the logged documents' own tokens: each seq_len (32) chunk predicts all but its last token
    assert report.tokens == sum(len(docs[k]) - -(-len(docs[k]) // 32) for k in event["keys"])
    assert (report.forward.module, report.forward.kind) == (LAYER, "nonfinite")
    cli = subprocess.run([sys.executable, "-m", "trainer", "replay", str(run), "--step", "3"], env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and f"forward: first nonfinite output at {LAYER}" in cli.stdout, cli.stderr[-3000:]


def test_a_run_folder_of_an_older_trainer_replays_reports_and_verifies(bad_run, tmp_path):
    """A run written before step hooks holds ``anomaly.inject_*`` in config.json and the checkpoints'
    config.yaml: replay, report and verify read it, with one warning when the keys were set; the replay
    cannot re-apply the fault those keys injected, so rank 1's batch replays clean."""
    import shutil

    import yaml
    old = tmp_path / "old_run"
    shutil.copytree(bad_run, old)
    inject = {"inject_nan_at_steps": [3], "inject_spike_at_steps": [], "inject_spike_factor": 1000.0,
              "inject_kill_at_step": 0, "inject_rank": 1, "inject_layer": LAYER}
    config = json.loads((old / "config.json").read_text())
    del config["hooks"]
    config["anomaly"].update(inject)
    (old / "config.json").write_text(json.dumps(config))
    ckpt = old / "checkpoints" / "step_000002"
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    del saved["hooks"]
    saved["anomaly"].update(inject)
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))

    replay = subprocess.run([sys.executable, "-m", "trainer", "replay", str(old), "--step", "3", "--rank", "1"],
                            env=_env(), capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0 and "Traceback" not in replay.stderr, replay.stderr[-3000:]
    assert (f"anomaly.inject_nan_at_steps=[3], anomaly.inject_rank=1, anomaly.inject_layer='{LAYER}': test hooks "
            "of an older trainer, ignored") in replay.stderr
    assert "step 3, rank 1" in replay.stdout and "no step hook reported anything at this step" in replay.stdout
    assert "forward: every module output finite, no spike" in replay.stdout
    report = subprocess.run([sys.executable, "-m", "trainer", "report", str(old)], env=_env(), capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0 and (old / "report" / "index.html").exists(), report.stderr[-3000:]
    verify = subprocess.run([sys.executable, "-m", "trainer", "verify", str(ckpt)], env=_env(), capture_output=True,
                            text=True, timeout=120)
    assert verify.returncode == 0 and f"OK: {ckpt}" in verify.stdout, verify.stderr[-3000:]
    assert "test hooks of an older trainer, ignored" in verify.stderr
