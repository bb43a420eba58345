"""Memory per ZeRO stage and per activation mode (checkpointing, offload) against ZeRO's model-state formula.

For each mode (``--modes``; default: stages 0-3 plain, then stage 3 with selective and full
checkpointing, block activation offload, and ``zero.cpu_offload``) a fresh model is built and
trained as the trainer trains it (:func:`trainer.train.train_step`, synthetic packed rows of
``--docs`` documents), and this rank records:

- ``model_states``: parameter, gradient and AdamW bytes measured at the points ZeRO describes
  (:func:`trainer.distributed.parallel.measure_model_states`) beside ``formula``, the fp32 ZeRO
  figure (:func:`trainer.distributed.parallel.zero_formula_bytes`; wherever the bytes live:
  ``cpu_offload`` holds them in host memory);
- ``held_bytes``: device bytes allocated between steps (CUDA; model states left on the device);
- ``step_peak_bytes``: the peak of one step above what was held before it: activations,
  gradients and temporaries (CUDA: ``max_memory_allocated``; CPU: the resident-set high-water
  mark ``VmHWM``, reset through ``/proc/self/clear_refs``; every allocation counts).

Run it as one process (world size 1) or under ``torchrun --nproc-per-node N`` (the formula's N).
On the CPU at world size 1 each mode runs in a fresh process whose C allocator unmaps every
freed block of 1 MiB or more (memory it kept would hide the next peak), and the default size is
``small``. ``--json PATH``
writes the records.

Usage: ``python benchmarks/bench_memory.py [--size small|125m|1b] [--seq-len 2048] [--micro-batch 4]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainer import memory  # noqa: E402
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig  # noqa: E402
from trainer.distributed import parallel  # noqa: E402
from trainer.evaluation.synthetic import synthetic_batch  # noqa: E402
from trainer.model import count_parameters  # noqa: E402
from trainer.train import build_model, train_step  # noqa: E402

MIB = 2 ** 20
# --size: (d_model, n_layers, n_heads, n_kv_heads, ffn_hidden, vocab)
SIZES = {"small": (256, 4, 4, 0, 0, 4096), "125m": (768, 12, 12, 0, 0, 32000),
         "1b": (2048, 16, 32, 8, 8192, 128256)}
# name -> (zero.stage, zero.cpu_offload, activation_checkpointing, memory.offload_activations)
MODES = {"stage0": (0, False, "none", "none"), "stage1": (1, False, "none", "none"),
         "stage2": (2, False, "none", "none"), "stage3": (3, False, "none", "none"),
         "stage3+selective": (3, False, "selective", "none"), "stage3+full": (3, False, "full", "none"),
         "stage3+offload_blocks": (3, False, "none", "blocks"), "stage3+cpu_offload": (3, True, "none", "none")}


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status; this benchmark needs Linux")


def make_cfg(args, mode: str, device: str) -> TrainConfig:
    """The :class:`TrainConfig` of ``mode`` (see :data:`MODES`) at the benchmark's sizes."""
    stage, cpu_offload, ckpt, offload = MODES[mode]
    d, layers, heads, kv, ffn, vocab = SIZES[args.size]
    cfg = TrainConfig(model=ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                                        ffn_hidden=ffn, max_seq_len=args.seq_len),
                      zero=ZeroConfig(stage=stage, cpu_offload=cpu_offload), optim=OptimConfig(lr=1e-4),
                      precision="bf16" if device == "cuda" else "fp32", device=device, activation_checkpointing=ckpt)
    cfg.memory.offload_activations = offload
    cfg.validate()
    return cfg


def measure(args, mode: str, info: parallel.DistInfo) -> dict:
    """One mode's record (bytes; see the module docstring)."""
    cfg = make_cfg(args, mode, info.device.type)
    cuda = info.device.type == "cuda"
    model, wrapped, optimizer = build_model(cfg, info)
    lengths = [args.seq_len // args.docs] * (args.docs - 1)
    row = lengths + [args.seq_len - sum(lengths)]
    batch = synthetic_batch([row] * args.micro_batch, args.seq_len, vocab=cfg.model.vocab_size).to(info.device)

    def loss_fn(m):
        with parallel.autocast(info.device, cfg.precision, cfg.zero.stage):
            return m(batch.input_ids, batch.position_ids, batch.document_ids, batch.labels)

    states = parallel.measure_model_states(wrapped, optimizer, loss_fn, cfg.zero.stage)  # also the warm-up step
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the resident-set high-water mark
        held = _rss("VmRSS")
    train_step(wrapped, optimizer, [batch], info, cfg)
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - held
    else:
        peak = _rss("VmHWM") - held
    psi = count_parameters(model)
    record = {"mode": mode, "stage": cfg.zero.stage, "cpu_offload": cfg.zero.cpu_offload,
              "activation_checkpointing": cfg.activation_checkpointing,
              "offload_activations": cfg.memory.offload_activations, "params": psi,
              "model_states": states, "formula": parallel.zero_formula_bytes(cfg.zero.stage, psi, info.world_size),
              "held_bytes": held if cuda else None, "step_peak_bytes": peak}
    del model, wrapped, optimizer, batch
    if cuda:
        torch.cuda.empty_cache()
    return record


def _fresh_process(args, mode: str) -> dict:
    """:func:`measure` of ``mode`` in a new Python process (CPU, world size 1)."""
    import subprocess
    cmd = [sys.executable, __file__, "--worker", "--return-freed-memory", f"--modes={mode}", f"--size={args.size}",
           f"--seq-len={args.seq_len}", f"--micro-batch={args.micro_batch}", f"--docs={args.docs}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])[0]


def main() -> int:
    """Measure every mode on this rank, print a table (rank 0) and write ``--json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="")
    p.add_argument("--seq-len", type=int, default=0, help="tokens per row (0: 2048 on CUDA, 256 on CPU)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--docs", type=int, default=4, help="equal documents per packed row")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--json", default="")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--return-freed-memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.return_freed_memory:  # every block of 1 MiB or more mmapped, unmapped on free: RSS follows the tensors
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    cuda = torch.cuda.is_available()
    args.size = args.size or ("125m" if cuda else "small")
    args.seq_len = args.seq_len or (2048 if cuda else 256)
    modes = args.modes.split(",")
    if not cuda and "WORLD_SIZE" not in os.environ and not args.worker and len(modes) > 1:
        records = [_fresh_process(args, mode) for mode in modes]
        info = parallel.DistInfo(0, 1, 0, torch.device("cpu"))
    else:
        memory.configure_cuda_allocator(True)  # as training does (memory.expandable_segments)
        info = parallel.init_distributed("cuda" if cuda else "cpu")
        try:
            records = [measure(args, mode, info) for mode in modes]
        finally:
            dist.destroy_process_group()
        if args.worker:
            print(json.dumps(records))
            return 0
    if info.is_main:
        where = torch.cuda.get_device_name() if cuda else "CPU"
        print(f"{where}: size {args.size}, {records[0]['params'] / 1e6:.1f}M params, seq {args.seq_len}, "
              f"micro-batch {args.micro_batch}, {args.docs} documents per row, world size {info.world_size}; MiB")
        print(f"  {'mode':24s} {'model states':>12s} {'formula':>9s} {'held':>8s} {'step peak':>10s}")
        for r in records:
            states, formula = sum(r["model_states"].values()), sum(r["formula"].values())
            held = "-" if r["held_bytes"] is None else f"{r['held_bytes'] / MIB:.0f}"
            peak = r["step_peak_bytes"] / MIB
            print(f"  {r['mode']:24s} {states / MIB:12.1f} {formula / MIB:9.1f} {held:>8s} {peak:10.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"device": where, "size": args.size, "seq_len": args.seq_len,
                                                   "micro_batch": args.micro_batch, "world_size": info.world_size,
                                                   "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
