"""Verified export: a tiny GPT trained for a few steps is exported once (module fixture) as ONNX
fp32/fp16/int8 through ``python -m trainer export``; every variant matches PyTorch on the held-out
split within its tolerance and carries its provenance; a broken model is rejected and never gets
the final name; the consolidated ``.pt`` is verified the same way."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from trainer.__main__ import main
from trainer.export.config import Tolerance
from trainer.export.models import ort_runner, read_provenance
from trainer.export.pipeline import commit_variant, load_model, resolve_validation
from trainer.export.provenance import file_sha256
from trainer.export.verify import VariantResult, compare, reference, validation_batches
from trainer.export.models import torch_runner
from tests.support.data import write_counting_shards, write_dataset_with_val_split
from tests.support.paths import REPO

ROOT = str(REPO)
VOCAB = 64


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    data = write_dataset_with_val_split(str(tmp / "data"), VOCAB)
    run = str(tmp / "run")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", os.path.join(ROOT, "configs", "demo.yaml"),
         f"data.manifest={data}", f"cache.dir={tmp / 'cache'}", f"run_dir={run}", "model.d_model=32",
         "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32", "data.seq_len=32", "data.micro_batch_size=4",
         "data.num_workers=0", "zero.stage=0", "precision=fp32", "metrics.progress=false", "steps=6", "log_every=3",
         "eval.every=3", "optim.warmup_steps=2", "optim.lr=0.01"],
        cwd=str(tmp), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    with open(os.path.join(run, "train_summary.json")) as f:
        summary = json.load(f)
    assert summary["evaluations"] == 2 and summary["val_loss_last"] is not None  # the split was found
    return tmp, data, summary["checkpoint"]


@pytest.fixture(scope="module")
def exported(trained):
    tmp, data, ckpt = trained
    out = str(tmp / "onnx")
    rc = main(["export", ckpt, out, "--format", "onnx", "--precision", "fp32,fp16,int8", "--batch-sizes", "1,2",
               "rows=4", "batches=2", "latency_runs=2"])
    with open(os.path.join(out, "conversion_report.json")) as f:
        return rc, out, json.load(f), ckpt, data


def test_onnx_variants_match_pytorch_on_the_validation_split(exported):
    rc, out, report, ckpt, data = exported
    assert rc == 0 and report["passed"]
    assert report["validation"]["held_out"] and report["validation"]["manifest"].endswith("val/manifest.json")
    assert report["validation"]["tokens"] > 0
    by = {v["precision"]: v for v in report["variants"]}
    assert set(by) == {"fp32", "fp16", "int8"}
    for precision, v in by.items():
        assert v["passed"] and v["path"] == os.path.join(out, f"model.{precision}.onnx") and os.path.exists(v["path"])
        assert sorted(v["latency_ms"]) == ["1", "2"] and all(ms > 0 for ms in v["latency_ms"].values())
    assert by["fp32"]["max_abs_diff"] <= 1e-4 and by["fp32"]["argmax_agreement"] == 1.0
    assert by["fp32"]["ppl_delta"] <= 1e-4
    assert 0 < by["int8"]["max_abs_diff"] and by["int8"]["ppl_delta"] <= 0.02
    assert by["int8"]["bytes"] < by["fp32"]["bytes"]
    assert not [n for n in os.listdir(out) if n.startswith(".") or n.endswith(".rejected")]
    assert "pytorch fp32 (ref)" in open(os.path.join(out, "conversion_report.txt")).read()

    # provenance travels inside the model
    prov = read_provenance(by["int8"]["path"])
    assert prov["precision"] == "int8" and prov["step"] == 6 and prov["checkpoint"] == ckpt
    assert prov["data_manifest_sha256"] == file_sha256(os.path.join(data, "manifest.json"))
    assert prov["config"]["model"]["d_model"] == 32 and prov["export_git_commit"]
    assert {"torch", "onnx", "onnxruntime", "onnxscript"} <= prov["versions"].keys()

    # dynamic axes: a batch and sequence length never seen at export time, documents inside rows
    model = load_model(ckpt)[0]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (3, 20), dtype=np.int64)
    pos = np.tile(np.r_[np.arange(12), np.arange(8)], (3, 1)).astype(np.int64)
    doc = np.tile(np.r_[np.zeros(12), np.ones(8)], (3, 1)).astype(np.int64)
    got = ort_runner(by["fp32"]["path"])(ids, pos, doc)
    want = model.logits(*(torch.from_numpy(a) for a in (ids, pos, doc))).detach().numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_a_broken_variant_is_rejected_and_never_takes_the_final_name(exported, tmp_path):
    _, out, _, ckpt, data = exported
    broken = onnx.load(os.path.join(out, "model.fp32.onnx"))
    weight = max(broken.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the embedding
    arr = numpy_helper.to_array(weight).copy()
    arr[: arr.shape[0] // 2] *= -1.0  # flip half the vocabulary: plausible file, wrong model
    weight.CopyFrom(numpy_helper.from_array(arr, weight.name))
    tmp, final = str(tmp_path / ".model.fp32.onnx.tmp"), str(tmp_path / "model.fp32.onnx")
    onnx.save(broken, tmp)
    with open(final, "w") as f:
        f.write("a stale file from an earlier export")

    model = load_model(ckpt)[0]
    val_url, held_out = resolve_validation(data)
    batches = validation_batches(val_url, 32, 4, 2)
    ref = reference(torch_runner(model), batches)
    result = VariantResult("model.fp32.onnx", "onnx", "fp32")
    compare(result, ort_runner(tmp), ref, batches, Tolerance())
    assert not result.passed and any(f.startswith("max_abs_diff") for f in result.failures)
    commit_variant(tmp, final, result)
    assert not os.path.exists(final) and not os.path.exists(tmp) and os.path.exists(final + ".rejected")


def test_consolidated_pt_is_verified_and_a_failing_tolerance_exits_nonzero(exported, tmp_path, capsys):
    _, _, _, ckpt, data = exported
    good = str(tmp_path / "good" / "model.pt")
    assert main(["export", ckpt, good, "--batch-sizes", "1", "latency_runs=1"]) == 0
    saved = torch.load(good, weights_only=False)
    assert saved["provenance"]["step"] == 6 and saved["provenance"]["format"] == "pt"
    assert not os.path.exists(tmp_path / "good" / "conversion_report.json")  # named after the file it checks
    with open(tmp_path / "good" / "model.pt.conversion_report.json") as f:
        report = json.load(f)
    assert report["passed"] and report["variants"][0]["max_abs_diff"] == 0.0

    bad_dir = str(tmp_path / "bad")
    shutil.copytree(tmp_path / "good", bad_dir)  # an earlier good export must not survive a failed one
    rc = main(["export", ckpt, bad_dir, "--format", "pt", "--batch-sizes", "1", "latency_runs=1",
               "tolerance.pt.min_argmax_agreement=1.5"])
    assert rc == 1
    assert not os.path.exists(os.path.join(bad_dir, "model.pt"))
    assert os.path.exists(os.path.join(bad_dir, "model.pt.rejected"))
    with open(os.path.join(bad_dir, "conversion_report.json")) as f:
        report = json.load(f)
    assert not report["passed"] and "argmax_agreement" in report["variants"][0]["failures"][0]
    assert "REJECTED" in capsys.readouterr().out


def test_validation_data_of_another_vocabulary_is_a_clear_error(exported, tmp_path, capsys):
    """Data tokenized for a larger vocabulary would index past the embedding: refused by name."""
    _, _, _, ckpt, _ = exported
    other = str(tmp_path / "other")
    write_counting_shards(other, 4, max_samples=4, vocab=1000, max_len=20, seed=0)
    rc = main(["export", ckpt, str(tmp_path / "out"), "--format", "pt", "--data", other])
    assert rc == 1 and f"{other}: vocabulary of 1000 tokens does not fit the model's {VOCAB}" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "model.pt")


def test_export_with_unreachable_recorded_data_warns_and_records_random_tokens(exported, tmp_path, capsys):
    import yaml
    _, _, _, ckpt, _ = exported
    moved = str(tmp_path / "ckpt")
    shutil.copytree(ckpt, moved)
    with open(os.path.join(moved, "config.yaml")) as f:
        config = yaml.safe_load(f)
    config["data"]["manifest"] = "http://127.0.0.1:9/manifest.json"  # the training data is gone
    with open(os.path.join(moved, "config.yaml"), "w") as f:
        yaml.safe_dump(config, f)
    out = str(tmp_path / "shared" / "model.pt")
    assert main(["export", moved, out, "--batch-sizes", "1", "latency_runs=1"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "NOT verified on validation data" in warnings[0] and "--data MANIFEST" in warnings[0]
    assert "127.0.0.1:9" in warnings[0]
    with open(tmp_path / "shared" / "model.pt.conversion_report.json") as f:
        assert json.load(f)["validation"]["validated_on"] == "random_tokens"
    assert sorted(os.listdir(tmp_path / "shared")) == ["model.pt", "model.pt.conversion_report.json",
                                                       "model.pt.conversion_report.txt"]


def test_export_of_a_missing_checkpoint_is_a_usage_error(tmp_path, capsys):
    absent = str(tmp_path / "step_000009")
    assert main(["export", absent, str(tmp_path / "model.pt")]) == 2
    assert capsys.readouterr().err.strip() == f"error: no checkpoint at {absent}"
