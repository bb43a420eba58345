"""How the model uses the kernels: LayerNorm goes through the Triton kernel too, one epsilon default
everywhere, ``compile_check`` builds the warps the runtime launches, and ``torch.compile`` over the
model's blocks gives eager's loss and gradients.

On CPU the compile test uses the PyTorch kernels and the ``aot_eager`` backend (Dynamo + AOTAutograd
over the blocks, no code generation): Dynamo cannot trace into the Triton *interpreter*
(``TRITON_INTERPRET=1``; it fails on the interpreter's numpy pointer arithmetic), so compiling blocks
that call the Triton autograd Functions is covered by the gpu-marked test, with Inductor on CUDA.
"""
import inspect

import pytest
import torch

from trainer import kernels
from trainer.config import ModelConfig
from trainer.kernels import ce_triton, compile_check, norm_triton, reference
from trainer.model import GPT
from trainer.evaluation.synthetic import synthetic_batch

CFG = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, max_seq_len=16)


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(batch.input_ids, batch.position_ids, batch.document_ids, batch.labels)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_one_norm_epsilon_default():
    defaults = {f"{fn.__module__}.{fn.__name__}": inspect.signature(fn).parameters["eps"].default
                for fn in (kernels.rms_norm, kernels.layer_norm, reference.rms_norm_reference,
                           reference.layer_norm_reference, norm_triton.rms_norm_triton, norm_triton.layer_norm_triton)}
    assert set(defaults.values()) == {ModelConfig().norm_eps}, defaults


def test_compile_check_builds_the_runtime_warps():
    for dt in ("fp32", "bf16"):
        for fn, _, consts, warps in compile_check.variants(dt):
            runtime = (norm_triton.num_warps(consts["BLOCK_D"]) if "BLOCK_D" in consts
                       else ce_triton.num_warps(consts["BLOCK_V"]))
            assert warps == runtime, (fn.__name__, consts)
    assert norm_triton.num_warps(4096) == 16  # the case the old fixed 8 warps never compiled


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_model_norms_run_the_triton_kernels(monkeypatch, norm):
    """With the Triton backend forced (interpreter on CPU) the model's norms take the fused path:
    same loss and gradients as the PyTorch path; the LayerNorm kernel is really called."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**CFG.__dict__, "norm": norm}))
    batch = synthetic_batch([[10, 6]], 16, vocab=64, seed=0)
    monkeypatch.setenv("COLAFLOW_KERNELS", "torch")
    ref_loss, ref_grads = _loss_and_grads(model, batch)
    calls = []
    fused = norm_triton.layer_norm_triton if norm == "layernorm" else norm_triton.rms_norm_triton
    name = fused.__name__
    monkeypatch.setattr(norm_triton, name, lambda *a, **k: calls.append(1) or fused(*a, **k))
    monkeypatch.setenv("COLAFLOW_KERNELS", "triton")
    loss, grads = _loss_and_grads(model, batch)
    assert len(calls) == 2 * CFG.n_layers + 1  # two norms per block, one final
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def _inductor_importable() -> str:
    """'' when torch's compiler stack imports, else why not (a torch install mixed from two builds
    leaves modules that import names the other build lacks)."""
    try:
        import torch._inductor.lowering  # noqa: F401 - what every torch.compile backend imports
    except ImportError as e:
        return f"torch.compile cannot import its compiler in this torch install: {e}"
    return ""


@pytest.mark.parametrize("norm,kv_heads", [("layernorm", 0), ("rmsnorm", 0), ("rmsnorm", 1)])
def test_compiled_blocks_match_eager(monkeypatch, norm, kv_heads):
    """Also with grouped-query attention (one key/value head for both query heads)."""
    broken = _inductor_importable()
    if broken:
        pytest.skip(broken)
    monkeypatch.setenv("COLAFLOW_KERNELS", "torch")
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**CFG.__dict__, "norm": norm, "n_kv_heads": kv_heads}))
    batch = synthetic_batch([[10, 6], [16]], 16, vocab=64, seed=1)
    ref_loss, ref_grads = _loss_and_grads(model, batch)
    torch._dynamo.reset()
    for block in model.blocks:
        block.compile(backend="aot_eager")
    loss, grads = _loss_and_grads(model, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("norm,kv_heads", [("layernorm", 0), ("rmsnorm", 0), ("rmsnorm", 2)])
def test_gpu_inductor_compiled_blocks_with_triton_functions_match_eager(monkeypatch, norm, kv_heads):
    """configs/train_gpu.yaml: compile=true with the fused kernels, bf16; also with grouped-query attention."""
    monkeypatch.setenv("COLAFLOW_KERNELS", "triton")
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=kv_heads, max_seq_len=128,
                            norm=norm)).cuda()
    batch = synthetic_batch([[100, 28], [128]], 128, vocab=512, seed=1).to(torch.device("cuda"))
    ref_loss, ref_grads = _loss_and_grads(model, batch)
    torch._dynamo.reset()
    for block in model.blocks:
        block.compile()
    loss, grads = _loss_and_grads(model, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)
