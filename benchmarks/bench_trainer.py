"""Trainer benchmarks on CPU: ZeRO stages 1-3 vs DDP (stage 0), torch.compile vs eager, bf16 vs fp32.

    .venv/bin/python benchmarks/bench_trainer.py [--steps 8] [--d-model 256] [--skip-compile]

Every variant trains the same GPT on the same synthetic packed batches (several documents per row,
padding at the end), so ratios compare the trainer alone. ZeRO stages run as 2 gloo processes with
one thread each; "model states" are the bytes of parameters + gradients + Adam state one rank holds
(measured as in tests/unit/trainer/test_zero.py), "peak RSS" is the process's maximum resident set (torch itself
takes a few hundred MiB of it). Step time is the MINIMUM over the timed steps after 2 warm-up steps (the
machine's other load only ever adds time, so the minimum is the least noisy estimate).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from trainer.distributed import parallel  # noqa: E402
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig  # noqa: E402
from tests.support.launch import run_local_workers  # noqa: E402
from trainer.model import GPT, count_parameters  # noqa: E402
from trainer.evaluation.synthetic import synthetic_batch  # noqa: E402
from trainer.train import build_model, train_step  # noqa: E402

MiB = 2 ** 20


def make_cfg(args, stage: int = 0, precision: str = "fp32", compile_: bool = False) -> TrainConfig:
    """The benchmark's :class:`TrainConfig` for ZeRO ``stage``, ``precision`` and ``torch.compile``."""
    model = ModelConfig(vocab_size=4096, d_model=args.d_model, n_layers=args.n_layers, n_heads=4,
                        max_seq_len=args.seq_len)
    return TrainConfig(model=model, zero=ZeroConfig(stage=stage), optim=OptimConfig(lr=1e-3),
                       precision=precision, compile=compile_)


def batches_for(rank: int, args) -> list:
    """One synthetic packed batch for ``rank`` (three documents per row)."""
    rows = [[args.seq_len // 2, args.seq_len // 3, args.seq_len // 8] for _ in range(args.batch)]
    return [synthetic_batch(rows, args.seq_len, vocab=4096, seed=rank)]


def time_steps(wrapped, opt, batches, info, cfg, steps: int) -> float:
    """Fastest seconds of one train step over ``steps`` steps (two warm-up steps first)."""
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        loss, _, _ = train_step(wrapped, opt, batches, info, cfg)
        loss.item()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return min(times)


def zero_worker(stage: int, args) -> dict:
    """One rank of a ZeRO ``stage`` run: step time (s), model-state bytes and peak RSS (bytes)."""
    info = parallel.init_distributed("cpu")
    cfg = make_cfg(args, stage)
    _, wrapped, opt = build_model(cfg, info)
    batches = batches_for(info.rank, args)
    b = batches[0]
    states = parallel.measure_model_states(
        wrapped, opt, lambda m: m(b.input_ids, b.position_ids, b.document_ids, b.labels), stage)
    step_s = time_steps(wrapped, opt, batches, info, cfg, args.steps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"step_s": step_s, "states": sum(states.values()), "rss": rss}


def single_process(args, precision: str, compile_: bool) -> float:
    """Fastest step seconds of one process at ``precision`` (optionally compiled)."""
    info = parallel.init_distributed("cpu")
    cfg = make_cfg(args, 0, precision, compile_)
    _, wrapped, opt = build_model(cfg, info)
    return time_steps(wrapped, opt, batches_for(0, args), info, cfg, args.steps)


def main() -> None:
    """Compare ZeRO stages, precisions and compile on CPU; print step times, memory and ratios."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--skip-zero", action="store_true", help="only the single-process comparisons")
    args = p.parse_args()
    n = count_parameters(GPT(make_cfg(args).model))
    tokens = 2 * args.batch * args.seq_len
    print(f"GPT {n / 1e6:.2f}M params, 2 gloo ranks x {args.batch} rows x {args.seq_len} tokens, {args.steps} steps")
    results = {} if args.skip_zero else {stage: run_local_workers(zero_worker, 2, stage, args) for stage in range(4)}
    base = results.get(0)
    if results:
        print(f"{'stage':<8}{'step s':>9}{'tok/s':>9}{'x DDP':>7}{'states MiB':>12}{'x DDP':>7}{'peak RSS MiB':>14}")
    for stage, res in results.items():
        step = max(r["step_s"] for r in res)
        states = max(r["states"] for r in res)
        rss = max(r["rss"] for r in res)
        print(f"{stage:<8}{step:>9.3f}{tokens / step:>9.0f}{step / max(r['step_s'] for r in base):>7.2f}"
              f"{states / MiB:>12.1f}{states / max(r['states'] for r in base):>7.2f}{rss / MiB:>14.0f}")
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    fp32 = single_process(args, "fp32", False)
    bf16 = single_process(args, "bf16", False)
    print(f"1 process, {torch.get_num_threads()} threads: fp32 eager {fp32:.3f} s/step, bf16 autocast {bf16:.3f} "
          f"s/step, bf16/fp32 time ratio {bf16 / fp32:.2f}")
    if not args.skip_compile:
        t0 = time.perf_counter()
        compiled = single_process(args, "fp32", True)
        took = time.perf_counter() - t0
        eager = min(fp32, single_process(args, "fp32", False))  # eager timed before and after: less noise
        print(f"torch.compile (per block, inductor CPU) {compiled:.3f} s/step vs eager {eager:.3f}: "
              f"speed-up x{eager / compiled:.2f} (compile + timing took {took:.0f} s)")


if __name__ == "__main__":
    main()
