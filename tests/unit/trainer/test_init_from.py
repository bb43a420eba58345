"""``model.init_from``: a randomly initialised ``LlamaForCausalLM`` saved with ``save_pretrained``
(multi-head, grouped-query, untied) becomes a colaflow model that computes the same logits; sizes come
from its ``config.json`` unless set; ZeRO stages 0-3 on 2 gloo ranks receive rank 0's weights; bad
input is refused in one line (exit 2) before anything trains."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tests.support.data import write_counting_shards
from tests.support.hf import save_random_llama
from tests.support.launch import run_local_workers
from trainer.config import ModelConfig
from trainer.export.hf import document_runner
from trainer.model import GPT
from trainer.pretrained import fill_sizes, load_into, open_source
from trainer.run.cli import main as train_main


def _colaflow(folder: str, cfg: ModelConfig | None = None) -> GPT:
    cfg = cfg or ModelConfig()
    source = open_source(folder)
    fill_sizes(cfg, source)
    model = GPT(cfg)
    model.load_state_dict(source.weights(cfg))
    return model.eval()


@pytest.mark.parametrize("kv_heads,tie", [(4, True), (2, True), (1, False)], ids=["mha", "gqa", "mqa-untied"])
def test_colaflow_computes_the_logits_of_the_pretrained_model(tmp_path, kv_heads, tie):
    hf = save_random_llama(str(tmp_path), kv_heads=kv_heads, tie=tie)
    model = _colaflow(str(tmp_path))
    cfg = model.cfg
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.ffn_width) == (96, 32, 2, 4,
                                                                                                     kv_heads, 88)
    assert (cfg.rope_theta, cfg.norm_eps, cfg.tie_embeddings, cfg.max_seq_len) == (500000.0, 1e-5, tie, 64)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 96, (2, 40)))
    pos = torch.arange(40).expand(2, 40)
    with torch.no_grad():
        diff = model.logits(ids, pos, torch.zeros_like(ids)) - hf(input_ids=ids).logits
    assert diff.abs().max().item() <= 1e-5
    # packed rows: each document attends to itself only, positions restart, as in a row of its own
    doc = torch.tensor([[0] * 15 + [1] * 25, [0] * 40])
    pos = torch.cat([torch.arange(15), torch.arange(25)]).expand(2, 40).contiguous()
    with torch.no_grad():
        got = model.logits(ids, pos, doc).numpy()
    want = document_runner(hf)(ids.numpy(), pos.numpy(), doc.numpy())
    assert np.abs(got - want).max() <= 1e-5


def test_sizes_set_in_the_config_must_match_and_others_are_filled(tmp_path):
    save_random_llama(str(tmp_path))
    source = open_source(str(tmp_path))
    cfg = ModelConfig(d_model=32, n_heads=4, max_seq_len=32)  # matching sizes; a shorter context is a choice
    fill_sizes(cfg, source)
    assert (cfg.n_layers, cfg.n_kv_heads, cfg.ffn_hidden, cfg.vocab_size, cfg.max_seq_len) == (2, 2, 88, 96, 32)
    with pytest.raises(ValueError) as e:
        fill_sizes(ModelConfig(d_model=64, n_kv_heads=4, ffn_mult=4.0, norm="layernorm"), source)
    msg = str(e.value)
    for part in ("model.d_model=64 (the weights have 32)", "model.n_kv_heads=4 (the weights have 2)",
                 "model.ffn_hidden=256 (the weights have 88)", "model.norm='layernorm' (the weights have 'rmsnorm')"):
        assert part in msg
    assert "\n" not in msg


def test_weights_of_a_wrong_shape_are_named_before_any_collective(tmp_path):
    save_random_llama(str(tmp_path))
    with open(tmp_path / "config.json") as f:
        config = json.load(f)
    config["vocab_size"] = 128  # the embedding has 96 rows
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    source = open_source(str(tmp_path))
    cfg = ModelConfig()
    fill_sizes(cfg, source)
    model = GPT(cfg)
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight has shape \(96, 32\), config.json implies "
                                         r"\(128, 32\)"):
        load_into(model, source, cfg)


def _load_at_every_stage(folder: str) -> dict:
    """Worker: for ZeRO stages 0-3, a model with this rank's own random init, wrapped, then given the
    pretrained weights; returns the largest difference of the gathered full state from them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from trainer.config import ZeroConfig
    from trainer.distributed.parallel import init_distributed, wrap_model
    info = init_distributed("cpu")
    source = open_source(folder)
    cfg = ModelConfig()
    fill_sizes(cfg, source)
    if info.rank != 0:  # only rank 0 may read the weights
        source.weights = None
    want = open_source(folder).weights(cfg)
    out = {}
    for stage in (0, 1, 2, 3):
        torch.manual_seed(100 + info.rank)  # ranks start apart: equality below comes from rank 0's broadcast
        wrapped = wrap_model(GPT(cfg), ZeroConfig(stage=stage), info)
        load_into(wrapped, source, cfg)
        full = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True))
        out[stage] = max((full[k] - want[k]).abs().max().item() for k in want)
    return out


def test_every_zero_stage_receives_rank0s_weights_on_two_ranks(tmp_path):
    save_random_llama(str(tmp_path))
    for rank_result in run_local_workers(_load_at_every_stage, 2, str(tmp_path)):
        assert rank_result == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}


@pytest.fixture
def data(tmp_path):
    root = str(tmp_path / "data")
    write_counting_shards(root, 20, max_samples=10, vocab=64, max_len=30, seed=0)
    return root


def _dry_run(data: str, tmp_path, *overrides: str) -> int:
    return train_main(["--dry-run", f"data.manifest={data}", f"run_dir={tmp_path / 'run'}",
                       f"cache.dir={tmp_path / 'cache'}", "data.seq_len=32", *overrides])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_a_folder_without_config_json_is_refused(data, tmp_path, capsys):
    (tmp_path / "weights").mkdir()
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'weights'}") == 2
    assert "no config.json in this folder" in _one_error_line(capsys)


def test_a_non_llama_architecture_is_refused(data, tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainer.export.hf import quiet
    with quiet():
        GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                                   eos_token_id=0)).save_pretrained(str(tmp_path / "gpt2"))
    capsys.readouterr()  # what building the model said is not the command's output
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'gpt2'}") == 2
    err = _one_error_line(capsys)
    assert "model_type 'gpt2' (GPT2LMHeadModel) is not a Llama model" in err


def test_rope_scaling_colaflow_does_not_implement_is_refused(data, tmp_path, capsys):
    save_random_llama(str(tmp_path / "l3"), max_position_embeddings=64,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 32})
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'l3'}") == 2
    assert "RoPE scaling rope_type='llama3'" in _one_error_line(capsys)


def test_a_data_vocabulary_larger_than_the_embedding_is_refused(data, tmp_path, capsys):
    save_random_llama(str(tmp_path / "small"), vocab=48)
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'small'}") == 2
    err = _one_error_line(capsys)
    assert "the data's vocabulary (64" in err and "(48 rows)" in err and "tokenize the data with that model's" in err


def test_init_from_together_with_resume_is_refused(data, tmp_path, capsys):
    save_random_llama(str(tmp_path / "llama"))
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'llama'}",
                    f"checkpoint.resume={tmp_path / 'run' / 'checkpoints' / 'step_000004'}") == 2
    assert "set only one" in _one_error_line(capsys)


def test_a_folder_without_safetensors_is_refused(data, tmp_path, capsys):
    save_random_llama(str(tmp_path / "bin"))
    os.remove(tmp_path / "bin" / "model.safetensors")
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'bin'}") == 2
    assert "no model.safetensors or model.safetensors.index.json" in _one_error_line(capsys)


def test_a_dry_run_names_the_weights_it_would_start_from(data, tmp_path, capsys):
    save_random_llama(str(tmp_path / "llama"))
    assert _dry_run(data, tmp_path, f"model.init_from={tmp_path / 'llama'}") == 0
    assert f"new run from hf weights {tmp_path / 'llama'}" in capsys.readouterr().out


def test_a_dry_run_refuses_a_run_dir_that_cannot_be_written(data, capsys):
    """``--dry-run`` said "fine" for a run_dir on a read-only filesystem; the real run then failed at the lock.
    (/proc refuses new files even to root, as a read-only mount does.)"""
    assert train_main(["--dry-run", f"data.manifest={data}", "run_dir=/proc/self/colaflow-run",
                       "data.seq_len=32"]) == 2
    err = _one_error_line(capsys)
    assert "run_dir=/proc/self/colaflow-run cannot be written" in err and "in /proc/self failed" in err
