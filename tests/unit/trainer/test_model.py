"""GPT model: shapes, document masking, RoPE by document position, padding, loss, vision model."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from trainer import kernels
from trainer.kernels.reference import linear_cross_entropy_reference, rms_norm_reference
from trainer.config import ModelConfig
from trainer.attention import dense_document_mask
from trainer.model import GPT, count_parameters, greedy_decode
from trainer.evaluation.synthetic import synthetic_batch as make_batch
from trainer.vision.model import TinyCNN

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)


def run(model, b):
    return model(b.input_ids, b.position_ids, b.document_ids, b.labels)


def test_shapes_and_loss_near_uniform_at_init():
    torch.manual_seed(0)
    model = GPT(CFG)
    b = make_batch([[10, 20], [32]], 32)
    logits = model.logits(b.input_ids, b.position_ids, b.document_ids)
    assert logits.shape == (2, 32, 97)
    loss = run(model, b)
    n = b.num_real_tokens
    assert n == 9 + 19 + 31
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert abs(loss.item() / n - math.log(97)) < 0.3  # near-uniform predictions at init


def test_loss_is_sum_over_real_tokens():
    torch.manual_seed(0)
    model = GPT(CFG)
    b = make_batch([[7, 5], [12]], 16)
    logits = model.logits(b.input_ids, b.position_ids, b.document_ids)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), reduction="sum")
    torch.testing.assert_close(run(model, b), expected, rtol=1e-5, atol=1e-4)


def test_mask_is_block_diagonal_causal_and_padding_attends_itself():
    doc = torch.tensor([[0, 0, 1, 1, 1, -1, -1]])
    m = dense_document_mask(doc)[0, 0]
    assert m[1, 0] and not m[0, 1]  # causal inside doc 0
    assert not m[2, 1] and m[4, 2]  # doc 1 never sees doc 0
    assert m.diagonal().all()  # every query (padding too) has a key, so SDPA gives no NaN


@settings(max_examples=8, deadline=None)
@given(first=st.integers(1, 20), second=st.integers(1, 20), seed=st.integers(0, 1000))
def test_token_output_ignores_other_documents(first, second, seed):
    """Changing document 0 of a row leaves document 1's outputs unchanged and vice versa."""
    torch.manual_seed(0)
    model = GPT(CFG).eval()
    b = make_batch([[first, second]], 48, seed=seed)
    out = model.logits(b.input_ids, b.position_ids, b.document_ids)
    changed = b.input_ids.clone()
    changed[0, :first] = torch.randint(1, 97, (first,), generator=torch.Generator().manual_seed(seed + 1))
    out2 = model.logits(changed, b.position_ids, b.document_ids)
    torch.testing.assert_close(out[0, first:], out2[0, first:])  # doc 1 and padding untouched
    assert torch.isfinite(out).all()


def test_document_output_independent_of_placement_in_row():
    """RoPE uses position_ids, so a document gives the same outputs at the row start or after another."""
    torch.manual_seed(0)
    model = GPT(CFG).eval()
    b = make_batch([[9, 14]], 32, seed=3)
    doc1 = b.input_ids[0, 9:23]
    alone = make_batch([[14]], 32)
    alone.input_ids[0, :14] = doc1
    out = model.logits(b.input_ids, b.position_ids, b.document_ids)[0, 9:23]
    out_alone = model.logits(alone.input_ids, alone.position_ids, alone.document_ids)[0, :14]
    torch.testing.assert_close(out, out_alone, rtol=1e-4, atol=1e-5)


def test_all_padding_row_is_finite_and_carries_no_loss():
    torch.manual_seed(0)
    model = GPT(CFG)
    b = make_batch([[16], []], 16)
    loss = run(model, b)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("norm,tie", [("layernorm", False), ("rmsnorm", True)])
def test_config_variants_and_parameter_count(norm, tie):
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, norm=norm, tie_embeddings=tie)
    model = GPT(cfg)
    hidden = 8 * math.ceil(cfg.ffn_mult * 32 / 8)
    per_block = 4 * 32 * 32 + 3 * 32 * hidden + (4 if norm == "layernorm" else 2) * 32
    expected = 97 * 32 * (1 if tie else 2) + 2 * per_block + (2 if norm == "layernorm" else 1) * 32
    assert count_parameters(model) == expected


def test_activation_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    model = GPT(CFG)
    b = make_batch([[10, 6], [16]], 16)
    run(model, b).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_activation_checkpointing(True)
    run(model, b).backward()
    for r, p in zip(ref, model.parameters()):
        torch.testing.assert_close(p.grad, r)


@pytest.mark.parametrize("rms_norm,linear_ce", [(kernels.rms_norm, kernels.linear_cross_entropy),
                                                 (rms_norm_reference, linear_cross_entropy_reference)],
                         ids=["selected", "reference"])
def test_ops_match_torch(rms_norm, linear_ce):
    x, w = torch.randn(5, 8), torch.randn(8)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (8,), w, 1e-5))
    h, wt, y = torch.randn(6, 8), torch.randn(11, 8), torch.tensor([1, -100, 3, 4, -100, 0])
    ref = torch.nn.functional.cross_entropy(h @ wt.t(), y, reduction="sum")
    torch.testing.assert_close(linear_ce(h, wt, y, ignore_index=-100, reduction="sum"), ref)


def test_bf16_autocast_forward_close_to_fp32():
    torch.manual_seed(0)
    model = GPT(CFG)
    b = make_batch([[16], [8, 8]], 16)
    ref = run(model, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = run(model, b)
    assert abs(low.item() - ref.item()) / ref.item() < 0.02


def test_vision_classifier_shapes_and_loss():
    torch.manual_seed(0)
    model = TinyCNN(num_classes=10)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 9, 1])
    assert model.logits(images).shape == (4, 10)
    loss = model(images, labels)
    loss.backward()
    assert abs(loss.item() / 4 - math.log(10)) < 0.5


def test_grouped_query_attention_equals_multi_head_with_shared_key_value_heads():
    """n_kv_heads=2 of 4: the model computes what a 4-head model computes when heads 2i and 2i+1 use
    the same key and value projections (query head h reads key/value head h // 2); documents stay
    apart; greedy decoding reads the same logits."""
    torch.manual_seed(0)
    gqa = GPT(ModelConfig(**{**CFG.__dict__, "n_kv_heads": 2}))
    mha = GPT(CFG)
    hd, d = CFG.head_dim, CFG.d_model
    assert gqa.blocks[0].attn.qkv.weight.shape == ((4 + 2 * 2) * hd, d)
    state = dict(gqa.state_dict())
    for i in range(CFG.n_layers):
        key = f"blocks.{i}.attn.qkv.weight"
        q, k, v = state[key].split([4 * hd, 2 * hd, 2 * hd])
        k, v = (w.view(2, hd, d).repeat_interleave(2, dim=0).reshape(4 * hd, d) for w in (k, v))
        state[key] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    b = make_batch([[10, 6], [16]], 16)
    args = (b.input_ids, b.position_ids, b.document_ids)
    torch.testing.assert_close(gqa.logits(*args), mha.logits(*args), rtol=0, atol=1e-5)
    torch.testing.assert_close(run(gqa, b), run(mha, b), rtol=1e-6, atol=1e-4)
    assert greedy_decode(gqa, [1, 2, 3], 5) == greedy_decode(mha, [1, 2, 3], 5)
    per_block_attn = 32 * (4 + 2 * 2) * 8 + 32 * 32
    assert count_parameters(mha) - count_parameters(gqa) == CFG.n_layers * (4 * 32 * 32 - per_block_attn)


def test_greedy_decode_stops_at_eos_and_continues_the_argmax():
    torch.manual_seed(0)
    model = GPT(CFG)
    out = greedy_decode(model, [5, 6], 6)
    assert len(out) == 6
    ids = torch.tensor([[5, 6, *out[:3]]])
    logits = model.logits(ids, torch.arange(5)[None], torch.zeros_like(ids))
    assert int(logits[0, -1].argmax()) == out[3]
    assert greedy_decode(model, [5, 6], 6, eos_id=out[0]) == out[:1]


@pytest.mark.parametrize("override,field", [({"n_kv_heads": 3}, "model.n_kv_heads"),
                                            ({"n_kv_heads": -1}, "model.n_kv_heads"),
                                            ({"ffn_hidden": -8}, "model.ffn_hidden")])
def test_bad_head_and_width_settings_are_named(override, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**CFG.__dict__, **override}).validate()


def test_ffn_hidden_sets_the_swiglu_width():
    model = GPT(ModelConfig(**{**CFG.__dict__, "ffn_hidden": 50}))
    assert model.blocks[0].mlp.gate_up.weight.shape == (100, 32) and model.blocks[0].mlp.down.weight.shape == (32, 50)
