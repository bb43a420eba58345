"""Document-causal attention: FlexAttention's block mask and SDPA's causal path against the dense
``[B, 1, T, T]`` reference, on outputs and gradients, padding rows included."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from trainer import attention
from trainer.config import ModelConfig
from trainer.evaluation.synthetic import synthetic_batch
from trainer.model import GPT

CUDA = torch.cuda.is_available()
TOL = 1e-5  # fp32 max |diff|, outputs and gradients
# every FlexAttention call of this file has one shape: eager flex_attention runs through Dynamo
# (backend "eager"), which traces again for each new shape
B, T, HEADS, KV_HEADS, HD = 5, 200, 4, 2, 8


def _qkv(b: int = B, t: int = T, heads: int = HEADS, kv_heads: int = KV_HEADS, hd: int = HD, seed: int = 0,
         device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, t, hd, generator=g)
    k, v = (torch.randn(b, kv_heads, t, hd, generator=g) for _ in range(2))
    return [z.to(device).requires_grad_() for z in (q, k, v)]


def _docs(rows: list[list[int]], t: int) -> torch.Tensor:
    """document_ids [B, t]: each row's documents of the given lengths, then padding (-1)."""
    out = torch.full((len(rows), t), -1, dtype=torch.long)
    for r, lengths in enumerate(rows):
        start = 0
        for d, n in enumerate(lengths):
            out[r, start:start + n] = d
            start += n
    return out


def _outputs_and_grads(mask, q, k, v, upstream):
    y = mask.attend(q, k, v)
    return [y.detach(), *torch.autograd.grad(y, (q, k, v), upstream)]


def _flex_with_math_backward(block_mask, q, k, v):
    """FlexAttention's own operator (mask_mod + the block mask's tiles) through its math backward:
    torch's public ``flex_attention`` refuses a backward on CPU, the operator underneath has one."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op
    group = q.shape[1] // k.shape[1]
    k, v = (z.repeat_interleave(group, dim=1) for z in (k, v))
    return flex_op(q, k, v, lambda score, b, h, i, j: score, block_mask.as_tuple(), q.shape[-1] ** -0.5, {})[0]


# documents across the 128-token tiles and ending on them, all padding, one document, many short ones
ROWS = [[150, 50], [], [200], [128, 1, 40], [3, 7, 90, 60, *[1] * 12]]


def test_flex_outputs_and_gradients_equal_the_dense_mask():
    """FlexAttention's outputs equal SDPA's with the dense mask, and so do its gradients (its math
    backward), within 1e-5 in fp32, padding positions included."""
    docs = _docs(ROWS, T)
    q, k, v = _qkv(seed=1)
    upstream = torch.randn(B, HEADS, T, HD, generator=torch.Generator().manual_seed(2))
    dense = _outputs_and_grads(attention.DenseMask.build(docs), q, k, v, upstream)
    flex = attention.FlexMask.build(docs)
    with torch.no_grad():
        assert (flex.attend(q, k, v) - dense[0]).abs().max() <= TOL  # the public path
    y = _flex_with_math_backward(flex.block_mask, q, k, v)
    grads = torch.autograd.grad(y, (q, k, v), upstream)
    assert (y.detach() - dense[0]).abs().max() <= TOL
    for got, want in zip(grads, dense[1:]):
        assert (got - want).abs().max() <= TOL


@settings(max_examples=2, deadline=None)  # about half a second each (eager FlexAttention)
@given(rows=st.lists(st.lists(st.integers(1, 90), min_size=0, max_size=6), min_size=B, max_size=B),
       seed=st.integers(0, 100))
def test_flex_block_mask_equals_the_dense_mask_on_random_packings(rows, seed):
    """Any packing (padding tails, empty rows): flex and dense outputs agree."""
    rows = [r if sum(r) <= T else r[:2] for r in rows]
    docs = _docs(rows, T)
    q, k, v = (z.detach() for z in _qkv(seed=seed))
    want = attention.DenseMask.build(docs).attend(q, k, v)
    assert (attention.FlexMask.build(docs).attend(q, k, v) - want).abs().max() <= TOL


def test_one_document_rows_take_the_causal_path_with_equal_outputs_and_gradients():
    """Rows of one document (or all padding) build no mask: SDPA's is_causal gives the dense
    mask's outputs and gradients; a row with a second document or a padding tail needs the mask."""
    docs = torch.stack([torch.zeros(64, dtype=torch.long), torch.full((64,), -1)])
    for backend in ("auto", "flex", "dense"):
        assert isinstance(attention.document_mask(docs, backend), attention.CausalMask)
    assert isinstance(attention.document_mask(_docs([[64], [40]], 64), "dense"), attention.DenseMask)
    # the host's word (TokenBatch.one_document_rows) replaces the check: no read of the tensor
    assert isinstance(attention.document_mask(docs, "dense", one_document=False), attention.DenseMask)
    assert isinstance(attention.document_mask(_docs([[30, 34]], 64), "flex"), attention.FlexMask)
    q, k, v = _qkv(2, 64, seed=3)
    upstream = torch.randn(2, HEADS, 64, HD)
    causal = _outputs_and_grads(attention.CausalMask(), q, k, v, upstream)
    dense = _outputs_and_grads(attention.DenseMask.build(docs), q, k, v, upstream)
    for got, want in zip(causal, dense):
        assert (got - want).abs().max() <= TOL


def test_model_logits_agree_across_backends_and_auto_resolves_per_device():
    """The whole GPT (grouped-query heads) gives the same logits under flex and dense, padding
    rows included; ``auto`` is flex on CUDA and dense on CPU; unknown names are refused."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, d_model=HEADS * HD, n_layers=1, n_heads=HEADS, n_kv_heads=KV_HEADS, max_seq_len=T)
    model = GPT(cfg).eval()
    b = synthetic_batch([[50, 70, 30], [T], [], [10, 100], [150, 50]], T, vocab=97)
    args = (b.input_ids, b.position_ids, b.document_ids)
    with torch.no_grad():
        model.set_attention("dense")
        dense = model.logits(*args)
        model.set_attention("flex")
        flex = model.logits(*args)
    assert (flex - dense).abs().max() <= TOL
    assert attention.resolve("auto", torch.device("cpu")) == "dense"
    assert attention.resolve("auto", torch.device("cuda")) == "flex"
    with pytest.raises(ValueError, match="model.attention='sparse'"):
        model.set_attention("sparse")
    with pytest.raises(ValueError, match="model.attention"):
        ModelConfig(attention="sparse").validate()


def test_flex_backward_on_cpu_is_refused_with_what_to_set():
    q, k, v = _qkv(1, 32)
    mask = attention.FlexMask.build(_docs([[10, 22]], 32))
    with pytest.raises(NotImplementedError, match="model.attention=auto or dense"):
        mask.attend(q, k, v)
    # the trainer refuses it before building anything (one error line, exit 2), and lets the others train
    with pytest.raises(ValueError, match="has no backward on CPU; train on CPU with model.attention=auto or dense"):
        attention.check_trainable("flex", torch.device("cpu"))
    for name in ("auto", "dense"):
        attention.check_trainable(name, torch.device("cpu"))
    attention.check_trainable("flex", torch.device("cuda"))


def test_export_traces_the_mask_for_every_input():
    """While ``torch.export`` traces, one-document rows still get the mask (no branch on data), so
    an exported graph also serves packed rows."""
    class Masked(torch.nn.Module):
        def forward(self, q, k, v, document_ids):
            return attention.document_mask(document_ids, "dense").attend(q, k, v)

    q, k, v = (z.detach() for z in _qkv(1, 16, kv_heads=HEADS))
    program = torch.export.export(Masked(), (q, k, v, torch.zeros(1, 16, dtype=torch.long)))
    packed = _docs([[6, 10]], 16)
    want = attention.DenseMask.build(packed).attend(q, k, v)
    assert (program.module()(q, k, v, packed) - want).abs().max() <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA (compiled FlexAttention)")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_compiled_flex_on_cuda_matches_dense_outputs_and_gradients(dtype, tol):
    docs = _docs([[300, 500, 224], [1024], [100]], 1024).cuda()
    q, k, v = (z.detach().to(dtype).requires_grad_() for z in _qkv(3, 1024, hd=64, device="cuda"))
    upstream = torch.randn(3, 4, 1024, 64, device="cuda", dtype=dtype)
    flex = _outputs_and_grads(attention.FlexMask.build(docs), q, k, v, upstream)
    dense = _outputs_and_grads(attention.DenseMask.build(docs), q, k, v, upstream)
    for got, want in zip(flex, dense):
        assert (got.float() - want.float()).abs().max() <= tol
