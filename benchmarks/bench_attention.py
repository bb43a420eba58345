"""Document-causal attention: FlexAttention's block mask vs the dense T x T mask, time and peak memory.

Each row packs ``D`` equal documents into ``T`` tokens (T = 1k..8k, D = 2..16); one measurement
is mask construction from ``document_ids`` plus attention (:mod:`trainer.attention`), with
``--batch`` rows, ``--heads`` heads of ``--head-dim``.

CPU (always): the forward only, since torch's FlexAttention has no CPU backward; ``flex`` compiles
the block-mask builder and the attention (``torch.compile``, CPU templates; as on CUDA;
compilation before the timed calls is not counted), ``dense`` is SDPA with the boolean mask. Each
(variant, T) runs in a fresh process whose C allocator returns every block of 1 MiB or more to
the system on free (``mallopt(M_MMAP_THRESHOLD)``), so peak memory is the resident-set high-water
mark (``VmHWM``, reset through ``/proc/self/clear_refs``) above the RSS before the call.

CUDA (when available): forward + backward in bf16, compiled flex vs dense SDPA, peak from
``torch.cuda.max_memory_allocated`` above the memory held before, time from CUDA events.

``--json PATH`` writes every measurement (``benchmarks/gpu_check.sh`` collects it).

Usage: ``python benchmarks/bench_attention.py [--lengths 1024,2048,4096,8192] [--docs 2,4,16]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_kernels import cuda_measure, rss_mib  # noqa: E402  (beside this script: one way to measure for both)
from trainer import attention  # noqa: E402

MIB = 2 ** 20
BUILDERS = {"flex": attention.FlexMask.build, "dense": attention.DenseMask.build}
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def return_freed_memory() -> None:
    """Make glibc serve (and on free, unmap) every allocation of 1 MiB or more by ``mmap``, so the
    resident set follows the live tensors and a high-water mark measures one call's peak."""
    import ctypes
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)


def document_ids(batch: int, t: int, docs: int, device: str) -> torch.Tensor:
    """int64 [batch, t]: ``docs`` documents of (nearly) equal length per row, no padding."""
    return (torch.arange(t, device=device) * docs // t).expand(batch, t).contiguous()


def inputs(args, t: int, device: str, dtype: torch.dtype, grad: bool):
    """Random ``q``, ``k``, ``v`` [batch, heads, t, head_dim]."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(args.batch, args.heads, t, args.head_dim, generator=gen).to(device, dtype).requires_grad_(grad)
            for _ in range(3)]


def cpu_worker(args) -> None:
    """One variant at one T, every document count, in this fresh process: a JSON line each."""
    torch.set_num_threads(args.threads)
    return_freed_memory()
    t, variant = args.t, args.worker
    q, k, v = inputs(args, t, "cpu", torch.float32, grad=False)
    if variant == "flex":
        from torch.nn.attention.flex_attention import flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        def call(ids):
            return flex(q, k, v, block_mask=attention.FlexMask.build(ids, compiled=True).block_mask)
    else:
        def call(ids):
            return attention.DenseMask.build(ids).attend(q, k, v)
    for docs in args.docs:
        ids = document_ids(args.batch, t, docs, "cpu")
        with torch.no_grad():
            call(ids)  # compile / warm-up, not counted
            times, peak = [], 0.0
            for _ in range(args.repeats):
                Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
                before = rss_mib("VmRSS")
                start = time.perf_counter()
                out = call(ids)
                times.append(time.perf_counter() - start)
                peak = max(peak, rss_mib("VmHWM") - before)
                del out
        print(json.dumps({"device": "cpu", "variant": variant, "pass": "forward", "T": t, "docs": docs,
                          "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                          "ms": 1e3 * statistics.median(times), "peak_mib": peak}), flush=True)


def run_cpu(args) -> list[dict]:
    """Every (variant, T) in a fresh process; prints a table with dense/flex ratios."""
    print(f"CPU forward (FlexAttention has no CPU backward): batch {args.batch}, {args.heads} heads x "
          f"{args.head_dim}, fp32, {args.threads} threads, median of {args.repeats}")
    rows = []
    for t in args.lengths:
        for variant in ("dense", "flex"):
            cmd = [sys.executable, __file__, "--worker", variant, f"--t={t}", f"--docs={','.join(map(str, args.docs))}"]
            cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}"
                    for k in ("batch", "heads", "head_dim", "repeats", "threads")]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    _table(rows)
    return rows


def run_cuda(args, done: list[dict]) -> list[dict]:
    """Forward + backward in bf16 on CUDA for every (T, docs, variant); after each T the records so
    far (``done`` first) go to ``--json``, so a run stopped by a time limit keeps what it measured."""
    print(f"CUDA {torch.cuda.get_device_name()}: forward + backward, batch {args.batch}, {args.heads} heads x "
          f"{args.head_dim}, bf16, median of {args.iters}")
    rows = []
    for t in args.lengths:
        q, k, v = inputs(args, t, "cuda", torch.bfloat16, grad=True)
        dy = torch.randn_like(q)
        for docs in args.docs:
            ids = document_ids(args.batch, t, docs, "cuda")
            for variant, build in BUILDERS.items():
                def step(build=build):
                    build(ids).attend(q, k, v).backward(dy)
                    q.grad = k.grad = v.grad = None
                peak, ms = cuda_measure(step, args.iters)
                rows.append({"device": "cuda", "variant": variant, "pass": "forward+backward", "T": t, "docs": docs,
                             "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "ms": ms,
                             "peak_mib": peak})
        del q, k, v, dy
        torch.cuda.empty_cache()
        if args.json:
            Path(args.json).write_text(json.dumps(done + rows, indent=1))
    _table(rows)
    return rows


def _table(rows: list[dict]) -> None:
    by = {(r["T"], r["docs"], r["variant"]): r for r in rows}
    print(f"  {'T':>5} {'docs':>4} | {'dense ms':>9} {'dense MiB':>9} | {'flex ms':>9} {'flex MiB':>9} | "
          f"{'time dense/flex':>15} {'memory dense/flex':>17}")
    for (t, docs, variant), r in sorted(by.items()):
        if variant != "dense" or (t, docs, "flex") not in by:
            continue
        f = by[t, docs, "flex"]
        print(f"  {t:>5} {docs:>4} | {r['ms']:>9.1f} {r['peak_mib']:>9.1f} | {f['ms']:>9.1f} {f['peak_mib']:>9.1f} | "
              f"{r['ms'] / f['ms']:>14.2f}x {r['peak_mib'] / max(f['peak_mib'], 1e-3):>16.2f}x")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    """Parse flags; run the CPU comparison unless ``--skip-cpu``, and the CUDA one when a GPU is present."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=_ints, default=[1024, 2048, 4096, 8192], help="T values, comma-separated")
    p.add_argument("--docs", type=_ints, default=[2, 4, 16], help="documents per row, comma-separated")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="CPU timed calls per point")
    p.add_argument("--iters", type=int, default=10, help="CUDA timed calls per point")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--json", default="", help="write every measurement to this file")
    p.add_argument("--worker", choices=sorted(BUILDERS), help=argparse.SUPPRESS)
    p.add_argument("--t", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        cpu_worker(args)
        return 0
    rows = [] if args.skip_cpu else run_cpu(args)
    if torch.cuda.is_available():
        rows += run_cuda(args, rows)
    else:
        print("no CUDA device: the GPU half (forward + backward, bf16) skipped")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
