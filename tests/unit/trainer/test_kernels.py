"""Parity tests for trainer.kernels: fused RMSNorm / LayerNorm / linear cross-entropy vs eager.

Without CUDA the Triton kernels run in the Triton interpreter (``TRITON_INTERPRET=1``, set here for
this module before any kernel module is imported, since ``triton.jit`` reads it at import); with
CUDA they run compiled on the GPU. Truth is the eager reference on float32 (float64 for gradcheck)
copies of the same inputs; bf16 results must be within bf16 rounding of it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.kernels import layer_norm, linear_cross_entropy, resolve_backend, rms_norm
from trainer.kernels import triton_available
from trainer.kernels.reference import (layer_norm_reference, linear_cross_entropy_reference,
                                       rms_norm_reference)
from tests.support.paths import REPO

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # max error relative to max |truth|


@pytest.fixture(scope="module", autouse=True)
def triton_interpreter():
    """Run the Triton kernels through the interpreter on CPU-only machines."""
    old = os.environ.get("TRITON_INTERPRET")
    if not HAS_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


def assert_close(got: torch.Tensor, truth: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    got, truth = got.detach().double().cpu(), truth.detach().double().cpu()
    scale = truth.abs().max().clamp(min=1e-6)
    err = ((got - truth).abs().max() / scale).item()
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


def leaves(*tensors: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    return [t.to(DEVICE, dtype).detach().clone().requires_grad_() for t in tensors]


def run_with_grads(fn, inputs, grad_out_seed: int = 1):
    """Forward + backward with a fixed random upstream gradient; returns [out, *grads]."""
    out = fn(*inputs)
    gen = torch.Generator().manual_seed(grad_out_seed)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
    out.backward(g)
    return [out] + [t.grad for t in inputs]


def norm_inputs(shape, bias: bool):
    gen = torch.Generator().manual_seed(0)
    d = shape[-1]
    x = torch.randn(shape, generator=gen) * 3 + 0.5
    w = 1 + 0.2 * torch.randn(d, generator=gen)
    b = 0.2 * torch.randn(d, generator=gen)
    return (x, w, b) if bias else (x, w)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_triton_matches_reference(dtype):
    base = norm_inputs((3, 7, 100), bias=False)  # D=100: not a power of two, 21 rows
    got = run_with_grads(lambda x, w: rms_norm(x, w, 1e-6, backend="triton"),
                         leaves(*base, dtype=dtype))
    truth = run_with_grads(lambda x, w: rms_norm_reference(x, w, 1e-6),
                           leaves(*base, dtype=torch.float32))
    for name, a, b in zip(("y", "dx", "dw"), got, truth):
        assert a.dtype == dtype
        assert_close(a, b, dtype, f"rms_norm {name}")


@needs_triton
@pytest.mark.parametrize("dtype,bias", [(torch.float32, True), (torch.bfloat16, True),
                                        (torch.float32, False)])
def test_layer_norm_triton_matches_reference(dtype, bias):
    base = norm_inputs((2, 9, 70), bias=bias)
    fused = (lambda x, w, b: layer_norm(x, w, b, 1e-5, backend="triton")) if bias else \
        (lambda x, w: layer_norm(x, w, None, 1e-5, backend="triton"))
    eager = (lambda x, w, b: layer_norm_reference(x, w, b, 1e-5)) if bias else \
        (lambda x, w: layer_norm_reference(x, w, None, 1e-5))
    got = run_with_grads(fused, leaves(*base, dtype=dtype))
    truth = run_with_grads(eager, leaves(*base, dtype=torch.float32))
    for name, a, b in zip(("y", "dx", "dw", "db"), got, truth):
        assert_close(a, b, dtype, f"layer_norm {name}")


def ce_inputs(n: int, d: int, v: int, seed: int = 0, ignore_every: int = 4):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) / d ** 0.5 * 3
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::ignore_every] = -100
    return hidden, weight, labels


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton), "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_linear_cross_entropy_matches_reference(backend, dtype, reduction):
    hidden, weight, labels = ce_inputs(n=37, d=48, v=300)  # N, V not multiples of chunk/block
    labels = labels.to(DEVICE)

    def fused(h, w):
        return linear_cross_entropy(h, w, labels, reduction=reduction, chunk_size=16,
                                    backend=backend)

    def eager(h, w):
        return linear_cross_entropy_reference(h, w, labels, reduction=reduction)

    got = run_with_grads(fused, leaves(hidden, weight, dtype=dtype))
    truth = run_with_grads(eager, leaves(hidden, weight, dtype=torch.float32))
    assert got[0].dtype == torch.float32
    assert got[1].dtype == dtype and got[2].dtype == dtype
    for name, a, b in zip(("loss", "d_hidden", "d_weight"), got, truth):
        assert_close(a, b, dtype, f"{backend} {reduction} {name}")
    if reduction == "none":
        assert torch.all(got[0][labels == -100] == 0)
    assert torch.all(got[1][labels == -100] == 0), "ignored rows must get no gradient"


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_chunked_torch_gradcheck_float64(reduction):
    hidden, weight, labels = ce_inputs(n=7, d=5, v=11, seed=3, ignore_every=3)
    h, w = hidden.double().requires_grad_(), weight.double().requires_grad_()

    def fn(h, w):
        return linear_cross_entropy(h, w, labels, reduction=reduction, chunk_size=3,
                                    backend="torch")

    assert torch.autograd.gradcheck(fn, (h, w))


@given(n=st.integers(1, 24), chunk=st.integers(1, 30), seed=st.integers(0, 2**16),
       reduction=st.sampled_from(["sum", "mean", "none"]))
@settings(max_examples=30, deadline=None)
def test_chunk_size_does_not_change_result(n, chunk, seed, reduction):
    hidden, weight, labels = ce_inputs(n=n, d=6, v=13, seed=seed, ignore_every=3)
    labels[-1] = 5  # at least one counted row, so "mean" is finite
    results = []
    for size in (chunk, n):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = linear_cross_entropy(h, w, labels, reduction=reduction, chunk_size=size,
                                    backend="torch")
        loss.sum().backward()
        results.append((loss.detach(), h.grad, w.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton), "torch"])
def test_no_grad_loss_only(backend):
    hidden, weight, labels = ce_inputs(n=19, d=8, v=70)
    with torch.no_grad():
        got = linear_cross_entropy(hidden.to(DEVICE), weight.to(DEVICE), labels.to(DEVICE),
                                   reduction="mean", chunk_size=8, backend=backend)
    truth = linear_cross_entropy_reference(hidden, weight, labels, reduction="mean")
    assert_close(got, truth, torch.float32, "no-grad mean loss")


def test_all_ignored_mean_is_nan_with_zero_grads():
    hidden, weight, labels = ce_inputs(n=5, d=4, v=9)
    labels[:] = -100
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    loss = linear_cross_entropy(h, w, labels, reduction="mean", backend="torch")
    loss.backward()
    assert torch.isnan(loss)
    assert torch.all(h.grad == 0) and torch.all(w.grad == 0)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton), "torch"])
@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_retain_graph_backward_twice_accumulates(backend, reduction):
    hidden, weight, labels = ce_inputs(n=5, d=4, v=9)
    w = weight.to(DEVICE).requires_grad_()
    loss = linear_cross_entropy(hidden.to(DEVICE), w, labels.to(DEVICE), reduction=reduction,
                                backend=backend).sum()  # "none": expanded (stride 0) grad_output
    loss.backward(retain_graph=True)
    once = w.grad.clone()
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * once)


def test_non_contiguous_hidden_and_frozen_weight():
    hidden, weight, labels = ce_inputs(n=10, d=6, v=9)
    h = hidden.T.contiguous().requires_grad_()  # [D, N]; the op sees the strided view h.T
    loss = linear_cross_entropy(h.T, weight, labels, chunk_size=4, backend="torch")
    loss.backward()
    h_ref = hidden.T.contiguous().requires_grad_()
    linear_cross_entropy_reference(h_ref.T, weight, labels).backward()
    torch.testing.assert_close(h.grad, h_ref.grad)
    assert weight.grad is None


def test_bad_inputs_raise_clear_errors():
    hidden, weight, labels = ce_inputs(n=6, d=4, v=9)
    labels[4] = 9
    with pytest.raises(ValueError, match="row 4: 9"):
        linear_cross_entropy(hidden, weight, labels)
    with pytest.raises(ValueError, match="int64"):
        linear_cross_entropy(hidden, weight, labels.int())
    with pytest.raises(ValueError, match="cast"):
        linear_cross_entropy(hidden, weight.double(), labels.clamp(max=8))
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(hidden, weight, labels.clamp(max=8), reduction="avg")
    with pytest.raises(ValueError, match="shape"):
        rms_norm(hidden, torch.ones(5))


def test_backend_selection(monkeypatch):
    x = torch.ones(2, 3)
    monkeypatch.delenv("COLAFLOW_KERNELS", raising=False)
    assert resolve_backend(None, x) == "torch"  # CPU tensors never auto-select Triton
    monkeypatch.setenv("COLAFLOW_KERNELS", "reference")
    assert resolve_backend(None, x) == "reference"
    assert resolve_backend("torch", x) == "torch"  # the argument beats the env var
    monkeypatch.setenv("COLAFLOW_KERNELS", "cuda")
    with pytest.raises(ValueError, match="COLAFLOW_KERNELS"):
        resolve_backend(None, x)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if triton_available():
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            resolve_backend("triton", x)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_env_var_forces_backend(monkeypatch, backend):
    monkeypatch.setenv("COLAFLOW_KERNELS", backend)
    hidden, weight, labels = ce_inputs(n=9, d=4, v=9)
    w = weight.requires_grad_()
    loss = linear_cross_entropy(hidden, w, labels)
    kind = "NllLoss" if backend == "reference" else "LinearCrossEntropy"
    assert kind in type(loss.grad_fn).__name__


@needs_triton
def test_kernels_compile_for_hopper_without_gpu(tmp_path):
    """The interpreter skips Triton's type checks; compile every kernel to an sm_90 cubin too."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "trainer.kernels.compile_check", "--arch", "90"],
                          cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled 20 kernel variants for sm_90" in proc.stdout


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_gpu_liger_size_parity_and_memory(dtype):
    """At a real LM-head size the fused path matches eager and peaks far lower in memory."""
    n, d, v = 4096, 1024, 32000
    hidden, weight, labels = ce_inputs(n=n, d=d, v=v, ignore_every=7)
    labels = labels.cuda()
    peaks, outs = {}, {}
    for backend in ("triton", "reference"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        h, w = leaves(hidden, weight, dtype=dtype)
        start = torch.cuda.memory_allocated()
        outs[backend] = run_with_grads(
            lambda a, b: linear_cross_entropy(a, b, labels, reduction="mean", chunk_size=1024,
                                        backend=backend),
            [h, w])
        peaks[backend] = torch.cuda.max_memory_allocated() - start
    for name, a, b in zip(("loss", "d_hidden", "d_weight"), outs["triton"], outs["reference"]):
        assert_close(a, b, dtype, f"gpu {name}")
    assert peaks["triton"] < 0.5 * peaks["reference"]
