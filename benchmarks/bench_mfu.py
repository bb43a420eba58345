"""MFU of a Llama-architecture GPT on one GPU: fused kernels vs eager PyTorch, FlexAttention vs the dense mask.

Models (``--size``): ``125m`` (GPT-2 small sizes: d_model 768, 12 layers, 12 heads, vocab 32000,
tied embeddings) and ``1b`` (Llama 3.2 1B sizes: d_model 2048, 16 layers, 32 heads over 8
key/value heads, SwiGLU width 8192, vocab 128256, tied); SwiGLU, RMSNorm; bf16 compute with fp32
master weights; wrapped as the trainer wraps it (``zero.stage``, default 3 = FSDP2 ``fully_shard``
at world size 1). Batches are synthetic packed rows
(:func:`trainer.evaluation.synthetic.synthetic_batch`, ``--docs`` equal documents per row). Each
variant runs ``--warmup`` steps, then ``--steps`` timed optimizer steps between two
``torch.cuda.synchronize``. Variants are the product of ``--kernels`` and ``--attention``
(``model.attention``); the first variant is the reference of the printed ratios.

MFU = real tokens/s x :func:`trainer.metrics.mfu.flops_per_token` (6N + 12 L H Q T, PaLM appendix B) /
the GPU's bf16 peak (:func:`trainer.metrics.mfu.peak_flops`, or ``--peak-flops``). Variants: ``fused``
(``COLAFLOW_KERNELS=auto``: Triton RMSNorm and chunked linear cross-entropy) and ``eager``
(``COLAFLOW_KERNELS=reference``: eager norms, full ``[N, V]`` logits); the ratio fused/eager is
printed. ``--compile`` adds ``torch.compile`` per block to every variant. ``--json PATH`` writes the
records.

Without CUDA it prints ``no CUDA: skipped`` and exits 0; ``--smoke`` then runs a tiny model on the
CPU for a few steps (code-path check only; no MFU without a known peak).

Usage: ``python benchmarks/bench_mfu.py [--size 125m|1b] [--seq-len 2048] [--attention flex,dense] [--kernels auto]
[--steps 20] [--micro-batch 8] [--stage 3] [--compile] [--smoke] [--json PATH]``
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainer import memory  # noqa: E402
from trainer.distributed import parallel  # noqa: E402
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig  # noqa: E402
from trainer.kernels import ENV_VAR, triton_available  # noqa: E402
from trainer.metrics.mfu import flops_per_token, matmul_parameters, peak_flops  # noqa: E402
from trainer.model import count_parameters  # noqa: E402
from trainer.evaluation.synthetic import synthetic_batch  # noqa: E402
from trainer.train import build_model, train_step  # noqa: E402

GiB = 2 ** 30
# --size: (d_model, n_layers, n_heads, n_kv_heads, ffn_hidden, vocab)
SIZES = {"125m": (768, 12, 12, 0, 0, 32000), "1b": (2048, 16, 32, 8, 8192, 128256)}


def make_cfg(args, device: str, attention: str = "auto") -> TrainConfig:
    """The benchmark's :class:`TrainConfig` (model size from ``args``) on ``device``."""
    model = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                        n_kv_heads=args.n_kv_heads, ffn_hidden=args.ffn_hidden, max_seq_len=args.seq_len,
                        attention=attention)
    return TrainConfig(model=model, zero=ZeroConfig(stage=args.stage), optim=OptimConfig(lr=3e-4),
                       precision="bf16" if device == "cuda" else "fp32", compile=args.compile, device=device)


def run_variant(args, kernels: str, attention: str, info: parallel.DistInfo) -> dict:
    """Train ``warmup + steps`` steps with ``$COLAFLOW_KERNELS=kernels`` and ``model.attention=attention``;
    returns tokens/s, MFU, memory."""
    os.environ[ENV_VAR] = kernels  # read at every kernel call, so it switches in-process
    cfg = make_cfg(args, info.device.type, attention)
    model, wrapped, optimizer = build_model(cfg, info)
    lengths = [args.seq_len // args.docs] * (args.docs - 1)
    row = lengths + [args.seq_len - sum(lengths)]
    batches = [synthetic_batch([row] * args.micro_batch, args.seq_len, vocab=args.vocab,
                               seed=i).to(info.device) for i in range(4)]
    real_tokens = int(sum((b.labels != -100).sum() for b in batches[:1]))
    cuda = info.device.type == "cuda"
    for i in range(args.warmup):
        train_step(wrapped, optimizer, [batches[i % 4]], info, cfg)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(args.steps):
        train_step(wrapped, optimizer, [batches[i % 4]], info, cfg)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_s = real_tokens * args.steps / seconds
    fpt = flops_per_token(matmul_parameters(model), cfg.model, args.seq_len)
    peak = peak_flops(args.peak_flops, info.device)
    out = {"kernels": kernels, "attention": attention, "params": count_parameters(model), "tokens_per_s": tokens_s,
           "step_s": seconds / args.steps, "tflops": tokens_s * fpt / 1e12,
           "mfu": tokens_s * fpt / peak if peak else None,
           "peak_mem_gib": torch.cuda.max_memory_allocated() / GiB if cuda else None}
    del model, wrapped, optimizer, batches
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> int:
    """Train with fused kernels and with eager PyTorch, print tokens/s, MFU and memory, and their ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="125m", help="model sizes (see the module docstring)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--docs", type=int, default=2, help="equal documents per packed row")
    p.add_argument("--kernels", default="auto,reference", help="COLAFLOW_KERNELS values, comma-separated")
    p.add_argument("--attention", default="auto", help="model.attention values, comma-separated")
    p.add_argument("--micro-batch", type=int, default=8, help="rows of seq_len tokens per step")
    p.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3), help="zero.stage at world size 1")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--peak-flops", type=float, default=0.0, help="FLOP/s per device (0 = data sheet)")
    p.add_argument("--smoke", action="store_true", help="without CUDA: run a tiny model on the CPU")
    p.add_argument("--json", default="", help="write the records to this file")
    args = p.parse_args()
    args.d_model, args.n_layers, args.n_heads, args.n_kv_heads, args.ffn_hidden, args.vocab = SIZES[args.size]
    if not torch.cuda.is_available():
        print("no CUDA: skipped")
        if not args.smoke:
            return 0
        args.d_model, args.n_layers, args.n_heads, args.n_kv_heads, args.ffn_hidden = 64, 2, 4, 2, 0
        args.seq_len, args.vocab, args.micro_batch, args.steps, args.warmup = 128, 512, 2, 2, 1
        if "flex" in args.attention.split(","):  # torch's FlexAttention trains on CUDA only
            print("smoke: attention=flex has no CPU backward, run as dense")
            args.attention = ",".join(dict.fromkeys(x.replace("flex", "dense") for x in args.attention.split(",")))
    memory.configure_cuda_allocator(True)  # as training does (memory.expandable_segments)
    info = parallel.init_distributed("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if info.device.type == "cuda" else "CPU (smoke)"
    print(f"{name}: GPT d_model={args.d_model} layers={args.n_layers} heads={args.n_heads}/"
          f"{args.n_kv_heads or args.n_heads} seq={args.seq_len} ({args.docs} documents per row) vocab={args.vocab}, "
          f"micro-batch {args.micro_batch}, zero.stage={args.stage}, compile={args.compile}, "
          f"triton={'yes' if triton_available() else 'no'}; {args.steps} timed steps after {args.warmup} warm-up")
    try:
        results = [run_variant(args, k, a, info)
                   for k, a in itertools.product(args.kernels.split(","), args.attention.split(","))]
    finally:
        dist.destroy_process_group()
    for r in results:
        label = f"kernels={r['kernels']} attention={r['attention']}"
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        mem = "" if r["peak_mem_gib"] is None else f", peak {r['peak_mem_gib']:.1f} GiB"
        print(f"  {label:32s} {r['params'] / 1e6:.1f}M params: {r['tokens_per_s']:,.0f} tokens/s, "
              f"{r['step_s'] * 1e3:.1f} ms/step, {r['tflops']:.1f} model TFLOP/s, MFU {mfu}{mem}")
    first = results[0]
    for r in results[1:]:
        print(f"  throughput kernels={first['kernels']} attention={first['attention']} / kernels={r['kernels']} "
              f"attention={r['attention']}: {first['tokens_per_s'] / r['tokens_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": name, "size": args.size, "seq_len": args.seq_len, "docs": args.docs,
                       "micro_batch": args.micro_batch, "stage": args.stage, "compile": args.compile,
                       "steps": args.steps, "variants": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
