"""Continued pretraining of a Hugging Face model: a randomly initialised grouped-query
``LlamaForCausalLM`` saved with ``save_pretrained`` trains 20 steps on 2 gloo ranks under ZeRO-3 with
``model.init_from``. Its first loss is the Hugging Face model's loss on the same batches, the loss
falls, the provenance names the folder's sha256, and the result exports back to Hugging Face."""
import hashlib
import json
import math
import os
import subprocess
import sys

import numpy as np

from tests.support.data import write_counting_shards
from tests.support.hf import save_random_llama
from tests.support.paths import REPO
from trainer.config import read_saved_config
from trainer.export.hf import document_runner
from trainer.export.verify import token_losses

ROOT = str(REPO)


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _hf_loss_on_the_first_step(hf, run: str) -> float:
    """Mean next-token loss (nats) of ``hf`` over the micro-batches ranks 0 and 1 of the run's loader
    start with (the batches of step 1), each document on its own."""
    from loaders import build_text_loader
    cfg = read_saved_config(os.path.join(run, "config.json"))
    nll = []
    for rank in (0, 1):
        loader = build_text_loader(cfg.data, None, rank, 2)
        loader.set_epoch(0)
        b = next(iter(loader))
        arrays = [t.numpy().astype(np.int64) for t in (b.input_ids, b.position_ids, b.document_ids, b.labels)]
        nll.append(token_losses(document_runner(hf)(*arrays[:3]), arrays[3])[0])
    return float(np.concatenate(nll).mean())


def test_train_twenty_steps_from_a_hugging_face_model_on_two_ranks_under_zero3(tmp_path):
    folder, data, run = str(tmp_path / "llama"), str(tmp_path / "data"), str(tmp_path / "run")
    hf = save_random_llama(folder, vocab=96, kv_heads=2)
    write_counting_shards(data, 80, max_samples=40, vocab=64, max_len=60, seed=0)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--nproc-per-node", "2", f"model.init_from={folder}", f"data.manifest={data}",
         f"cache.dir={tmp_path / 'cache'}", f"run_dir={run}", "data.seq_len=32", "data.micro_batch_size=2",
         "data.num_workers=0", "zero.stage=3", "precision=fp32", "steps=20", "log_every=1", "eval.enabled=false",
         "metrics.progress=false", "optim.lr=0.003", "optim.warmup_steps=2", "anomaly.spike_ratio=0"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"world size 2, ZeRO stage 3; new run from hf weights {folder}" in proc.stdout

    with open(os.path.join(run, "metrics.jsonl")) as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert len(losses) == 20
    want = _hf_loss_on_the_first_step(hf, run)
    assert abs(losses[0] - want) <= 1e-4 * want, (losses[0], want)
    assert abs(losses[0] - math.log(96)) < 0.5 and losses[-1] < losses[0] - 0.5  # random weights, then learning

    cfg = read_saved_config(os.path.join(run, "config.json"))
    assert (cfg.model.d_model, cfg.model.n_kv_heads, cfg.model.ffn_hidden, cfg.model.vocab_size) == (32, 2, 88, 96)
    digest = hashlib.sha256(f"config.json {_sha256(os.path.join(folder, 'config.json'))}\nmodel.safetensors "
                            f"{_sha256(os.path.join(folder, 'model.safetensors'))}\n".encode()).hexdigest()
    origin = {"path": folder, "kind": "hf", "sha256": digest}
    with open(os.path.join(run, "train_summary.json")) as f:
        summary = json.load(f)
    assert summary["init_from"] == origin and summary["final_step"] == 20
    with open(os.path.join(summary["checkpoint"], "meta.json")) as f:
        assert json.load(f)["init_from"] == origin

    # and back out: the continued model is a Hugging Face model again, its provenance names where it began
    out = str(tmp_path / "continued")
    proc = subprocess.run([sys.executable, "-m", "trainer", "export", summary["checkpoint"], out, "--format", "hf",
                           "--batch-sizes", "1", "rows=2", "batches=1", "latency_runs=1"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "colaflow_provenance.json")) as f:
        assert json.load(f)["init_from"] == origin
