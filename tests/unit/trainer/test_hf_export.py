"""``python -m trainer export --format hf``: a tiny grouped-query model trained for a few steps is
exported once (module fixture) as a Hugging Face Llama folder; transformers loads it offline and
computes colaflow's logits and greedy continuation; its tokenizer loads; sharding, rejection, the
LayerNorm refusal and a dataset without tokenizer files behave as documented. The same checkpoint
still exports to ONNX, and its three colaflow forms (checkpoint, ``.pt``, hf) start a run alike."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from tests.support.data import write_dataset_with_val_split
from tests.support.paths import REPO
from trainer.__main__ import main
from trainer.checkpointing import load_full_state
from trainer.export.models import ort_runner
from trainer.export.pipeline import load_model
from trainer.model import greedy_decode
from trainer.pretrained import open_source

ROOT = str(REPO)
VOCAB = 64
EXPORT = ["--format", "hf", "--batch-sizes", "1", "rows=4", "latency_runs=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    data = write_dataset_with_val_split(str(tmp / "data"), VOCAB, tokenizer=True)
    run = str(tmp / "run")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", f"data.manifest={data}", f"cache.dir={tmp / 'cache'}", f"run_dir={run}",
         "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.max_seq_len=32",
         "model.rope_theta=50000", "data.seq_len=32", "data.micro_batch_size=4", "data.num_workers=0",
         "eval.enabled=false", "metrics.progress=false", "steps=8", "log_every=4", "optim.warmup_steps=2",
         "optim.lr=0.01"], cwd=str(tmp), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    with open(os.path.join(run, "train_summary.json")) as f:
        return tmp, data, json.load(f)["checkpoint"]


@pytest.fixture(scope="module")
def exported(trained):
    tmp, data, ckpt = trained
    out = str(tmp / "export" / "hf")
    rc = main(["export", ckpt, out, *EXPORT])
    with open(str(tmp / "export" / "hf.conversion_report.json")) as f:
        return rc, out, json.load(f), ckpt, data


def _single_document(rows: int, length: int, seed: int):
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, (rows, length)))
    return ids, torch.arange(length).expand(rows, length)


def test_the_folder_loads_with_transformers_and_computes_colaflows_logits(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    rc, out, report, ckpt, _ = exported
    assert rc == 0 and report["passed"] and report["format"] == "hf"
    assert sorted(os.listdir(out)) == ["colaflow_provenance.json", "config.json", "generation_config.json",
                                       "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"], config["max_position_embeddings"]) == (32, 2, 4, 2,
                                                                                                        VOCAB, 32)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 50000.0
    assert config["rms_norm_eps"] == 1e-5 and config["tie_word_embeddings"] is True
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (VOCAB - 2, VOCAB - 1, VOCAB - 1)
    with open(os.path.join(out, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == VOCAB - 1

    colaflow = load_model(ckpt)[0]
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32).eval()
    ids, pos = _single_document(3, 24, seed=5)
    with torch.no_grad():
        want = colaflow.logits(ids, pos, torch.zeros_like(ids))
        got = hf(input_ids=ids).logits
    assert (got - want).abs().max().item() <= 1e-5
    prompt = ids[0, :6].tolist()
    generated = hf.generate(ids[:1, :6], attention_mask=torch.ones(1, 6, dtype=torch.long), max_new_tokens=20,
                            do_sample=False)[0, 6:].tolist()
    assert generated == greedy_decode(colaflow, prompt, 20, eos_id=VOCAB - 1)

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.encode("t1 t2 t3", add_special_tokens=False) == [1, 2, 3]
    assert (tok.bos_token_id, tok.eos_token_id) == (VOCAB - 2, VOCAB - 1)


def test_the_report_checks_logits_perplexity_bf16_and_generation(exported):
    _, out, report, ckpt, _ = exported
    fp32, bf16 = report["variants"]
    assert fp32["name"] == "hf" and fp32["passed"] and fp32["path"] == out == bf16["path"]
    assert fp32["max_abs_diff"] <= 1e-4 and fp32["ppl_delta"] <= 1e-5 and fp32["argmax_agreement"] == 1.0
    assert bf16["precision"] == "bf16" and 0 < bf16["max_abs_diff"] < 0.1 and bf16["passed"]  # reported only
    generation = fp32["details"]["generation"]
    assert generation["match"] and len(generation["colaflow"]) >= 1
    words = {VOCAB - 2: "<s>", VOCAB - 1: "</s>"}
    ids = generation["prompt"] + generation["transformers"]
    assert generation["text"].split() == [words.get(i, f"t{i}") for i in ids]
    assert report["validation"]["held_out"] and report["validation"]["tokens"] > 0
    with open(os.path.join(out, "colaflow_provenance.json")) as f:
        prov = json.load(f)
    assert prov["checkpoint"] == ckpt and prov["step"] == 8 and prov["format"] == "hf" and prov["init_from"] is None
    assert {"transformers", "safetensors"} <= prov["versions"].keys()


def test_large_models_are_sharded_with_an_index(trained, tmp_path):
    from transformers import AutoModelForCausalLM
    _, _, ckpt = trained
    out = str(tmp_path / "sharded")
    assert main(["export", ckpt, out, *EXPORT, "max_shard_size=40KB"]) == 0
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) >= 2 and shards <= set(os.listdir(out)) and "model.safetensors" not in os.listdir(out)
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    ids, pos = _single_document(2, 16, seed=6)
    with torch.no_grad():
        diff = hf(input_ids=ids).logits - load_model(ckpt)[0].logits(ids, pos, torch.zeros_like(ids))
    assert diff.abs().max().item() <= 1e-5


def test_a_failed_check_leaves_only_the_rejected_folder(exported, trained, tmp_path, capsys):
    _, out, _, ckpt, _ = exported
    bad = str(tmp_path / "hf")
    shutil.copytree(out, bad)  # an earlier good export of that name must not survive a failed one
    assert main(["export", ckpt, bad, *EXPORT, "tolerance.hf.min_argmax_agreement=1.5"]) == 1
    assert not os.path.exists(bad) and os.path.exists(os.path.join(bad + ".rejected", "config.json"))
    with open(str(tmp_path / "hf.conversion_report.json")) as f:
        report = json.load(f)
    assert not report["passed"] and report["variants"][0]["path"] == bad + ".rejected"
    assert "REJECTED" in capsys.readouterr().out


def test_a_layernorm_model_is_refused_in_one_line(trained, tmp_path, capsys):
    _, _, ckpt = trained
    moved = str(tmp_path / "step_000008")
    shutil.copytree(ckpt, moved)
    with open(os.path.join(moved, "config.yaml")) as f:
        config = yaml.safe_load(f)
    config["model"]["norm"] = "layernorm"
    with open(os.path.join(moved, "config.yaml"), "w") as f:
        yaml.safe_dump(config, f)
    assert main(["export", moved, str(tmp_path / "hf"), *EXPORT]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.norm=layernorm" in err and "RMSNorm only" in err and "--format onnx" in err
    assert not os.path.exists(tmp_path / "hf")


def test_shards_without_tokenizer_files_export_without_a_tokenizer(trained, tmp_path, capsys):
    _, data, ckpt = trained
    bare = str(tmp_path / "data")
    shutil.copytree(data, bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(bare, name))
    out = str(tmp_path / "hf")
    assert main(["export", ckpt, out, *EXPORT, "--data", bare]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "no tokenizer.json" in notes[0] and "without a tokenizer" in notes[0]
    assert not {"tokenizer.json", "tokenizer_config.json"} & set(os.listdir(out))


def test_an_unrelated_existing_folder_is_not_replaced(trained, tmp_path, capsys):
    _, _, ckpt = trained
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["export", ckpt, str(tmp_path / "mine"), *EXPORT]) == 2
    assert "is not an earlier hf export" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_grouped_query_attention_exports_to_onnx(trained, tmp_path):
    _, _, ckpt = trained
    out = str(tmp_path / "onnx")
    assert main(["export", ckpt, out, "--format", "onnx", "--precision", "fp32", "--batch-sizes", "1", "rows=4",
                 "latency_runs=1"]) == 0
    ids, pos = _single_document(2, 20, seed=7)
    got = ort_runner(os.path.join(out, "model.fp32.onnx"))(ids.numpy(), pos.numpy().copy(), np.zeros((2, 20), np.int64))
    want = load_model(ckpt)[0].logits(ids, pos, torch.zeros_like(ids)).detach().numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_checkpoint_pt_and_hf_forms_give_init_from_the_same_weights(exported, tmp_path):
    _, out, _, ckpt, _ = exported
    pt = str(tmp_path / "model.pt")
    assert main(["export", ckpt, pt, "--batch-sizes", "1", "latency_runs=1"]) == 0
    want = load_full_state(ckpt)["model"]
    sources = {kind: open_source(path) for kind, path in (("checkpoint", ckpt), ("pt", pt), ("hf", out))}
    for kind, source in sources.items():
        assert source.kind == kind
        arch = source.architecture
        assert (arch["d_model"], arch["n_heads"], arch["n_kv_heads"], arch["rope_theta"]) == (32, 4, 2, 50000.0)
        got = source.weights(load_model(ckpt)[1].model)
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[k].float(), want[k].float()) for k in want), kind
        assert len(source.fingerprint()["sha256"]) == 64
    assert sources["hf"].architecture == {**sources["checkpoint"].architecture, "max_seq_len": 32}


@pytest.mark.parametrize("add_bos", [True, False], ids=["documents-began-with-bos", "documents-began-with-text"])
def test_the_exported_tokenizer_begins_a_prompt_as_the_training_documents_began(tmp_path, add_bos):
    """The shards' tokenizer.json adds BOS by its own post-processor when ``add_bos`` is false, and adds
    none when it is true (``tokenizer.add_bos`` overrode the convention either way)."""
    import dataclasses

    from tokenizers import Tokenizer, processors
    from transformers import AutoTokenizer

    from shards.format.manifest import Manifest
    from trainer.export.hf import tokenizer_files

    data = write_dataset_with_val_split(str(tmp_path / "data"), VOCAB, tokenizer=True)
    bos = VOCAB - 2
    if not add_bos:
        tok = Tokenizer.from_file(os.path.join(data, "tokenizer.json"))
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
        tok.save(os.path.join(data, "tokenizer.json"))
    manifest = Manifest.load(data)
    manifest.tokenizer_identity = dataclasses.replace(manifest.tokenizer_identity, add_bos=add_bos, add_eos=True)
    manifest.save(data)
    out = tmp_path / "tok"
    out.mkdir()
    for name, content in tokenizer_files(data).files.items():
        (out / name).write_bytes(content)
    auto = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert auto("t3 t4")["input_ids"] == ([bos] if add_bos else []) + [3, 4]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert (config["add_bos_token"], config["add_eos_token"]) == (add_bos, False)
