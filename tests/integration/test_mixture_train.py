"""``torchrun -m trainer`` on 2 gloo ranks over the example mixture (configs/mixture.yaml, weights 0.7/0.3),
its sources replaced by two small real shard sets: tokens, share and epoch per source in metrics.jsonl and
in the run report; then a resume in one process with other weights continues both sources."""
import json
import os

import yaml

from loaders import DataConfig
from shards import Manifest
from tests.integration.test_trainer_e2e import ROOT, VOCAB, run_trainer
from trainer.run.announce import data_summary
from trainer.report.render import write_report
from tests.support.data import write_counting_shards


def test_two_gloo_ranks_over_the_example_mixture_then_resume_with_other_weights(tmp_path):
    with open(os.path.join(ROOT, "configs", "mixture.yaml")) as f:
        mixture = yaml.safe_load(f)["data"]["mixture"]
    assert [(s["name"], s["weight"]) for s in mixture] == [("shakespeare", 0.7), ("kjv", 0.3)]
    for i, (src, docs) in enumerate(zip(mixture, (120, 40))):
        src["manifest"] = str(tmp_path / src["name"])
        write_counting_shards(src["manifest"], docs, max_samples=30, vocab=VOCAB, max_len=60, seed=i)
    manifests = [Manifest.load(src["manifest"]) for src in mixture]
    summary = data_summary(DataConfig(mixture=mixture))  # the start line adds the sources up
    assert (summary.shards, summary.documents, summary.tokens) == (
        sum(len(m.shards) for m in manifests), 160, sum(m.total_tokens for m in manifests))
    run = str(tmp_path / "run")
    common = [f"cache.dir={tmp_path / 'cache'}", f"run_dir={run}", "model.d_model=32", "model.n_layers=1",
              "model.n_heads=2", "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0",
              "data.shuffle_block=16", "optim.warmup_steps=2", "precision=fp32", "metrics.progress=false",
              "log_every=5", "checkpoint.every=0"]
    config = os.path.join(ROOT, "configs", "mixture.yaml")
    run_trainer(common + [f"data.mixture={json.dumps(mixture)}", "steps=40"], nproc=2, cwd=str(tmp_path),
                config=config)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    last = records[-1]
    tokens = last["source_shakespeare_tokens"] + last["source_kjv_tokens"]
    assert tokens > 0 and last["source_shakespeare_weight"] == 0.7
    assert abs(last["source_shakespeare_share"] - 0.7) < 0.1  # 160 batches of 64 slots: a loose bound
    assert last["source_kjv_epoch"] >= 1  # the small source ran out and went on into its next epoch
    with open(os.path.join(run, "train_summary.json")) as f:
        summary = json.load(f)
    assert set(summary["loader"]["sources"]) == {"shakespeare", "kjv"}
    report = open(write_report(run), encoding="utf-8").read()
    assert "source shakespeare" in report and "source kjv" in report and "weight 70.00%" in report

    for src in mixture:
        src["weight"] = 0.5
    run_trainer(common + [f"data.mixture={json.dumps(mixture)}", "steps=50", "checkpoint.resume=latest"], nproc=1,
                cwd=str(tmp_path), config=config)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        resumed = [json.loads(line) for line in f][-1]
    assert resumed["step"] == 50 and resumed["source_kjv_weight"] == 0.5
    assert resumed["source_shakespeare_tokens"] > last["source_shakespeare_tokens"]
    assert resumed["source_kjv_tokens"] > last["source_kjv_tokens"]  # counts carried over the resume, then grew
