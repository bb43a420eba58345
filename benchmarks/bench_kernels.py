"""Benchmark the fused kernels against eager PyTorch, forward + backward, time and peak memory.

CPU (always): chunked linear cross-entropy (``backend="torch"``) vs eager
``F.cross_entropy(hidden @ weight.T)``. Each variant runs in its own subprocess; peak memory is the
resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) above the RSS before
the step, so it counts every allocation of the step, torch's included.

CUDA (when available): Triton linear cross-entropy, RMSNorm and LayerNorm vs the eager reference at a
Liger-like size (default N=8192 tokens, D=2048, V=32000, bf16); peak from
``torch.cuda.max_memory_allocated`` above the memory held before the step, time from CUDA events.

Usage: ``python benchmarks/bench_kernels.py [--n 2048 --d 512 --v 32000 --chunk 256]``
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

from trainer.kernels import layer_norm, linear_cross_entropy, rms_norm  # noqa: E402

MIB = 2 ** 20


def ce_inputs(n: int, d: int, v: int, dtype: torch.dtype, device: str):
    """Random ``[N, D]`` hidden, ``[V, D]`` weight (both requiring grad), ``[N]`` labels (1/8 ignored)."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=gen).to(device, dtype).requires_grad_()
    weight = (torch.randn(v, d, generator=gen) / d ** 0.5).to(device, dtype).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::8] = -100
    return hidden, weight, labels.to(device)


def ce_step(backend: str, hidden, weight, labels, chunk: int) -> None:
    """One forward + backward of the mean token loss; grads are dropped afterwards."""
    loss = linear_cross_entropy(hidden, weight, labels, reduction="mean", chunk_size=chunk,
                                backend=backend)
    loss.backward()
    hidden.grad = weight.grad = None


def rss_mib(field: str) -> float:
    """``field`` (``VmRSS``, ``VmHWM``) of ``/proc/self/status`` in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status; this benchmark needs Linux")


def cpu_worker(args) -> None:
    """Run one CPU variant in this (fresh) process and print a JSON line with its numbers."""
    torch.set_num_threads(args.threads)
    hidden, weight, labels = ce_inputs(args.n, args.d, args.v, getattr(torch, args.dtype), "cpu")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    before = rss_mib("VmRSS")
    start = time.perf_counter()
    ce_step(args.worker, hidden, weight, labels, args.chunk)
    times = [time.perf_counter() - start]
    peak = rss_mib("VmHWM") - before
    for _ in range(args.repeats - 1):
        start = time.perf_counter()
        ce_step(args.worker, hidden, weight, labels, args.chunk)
        times.append(time.perf_counter() - start)
    print(json.dumps({"peak_mib": peak, "seconds": statistics.median(times)}))


def run_cpu(args) -> None:
    """Run each CPU variant in a fresh process and print time and peak RSS with ratios."""
    print(f"CPU linear cross-entropy fwd+bwd: N={args.n} D={args.d} V={args.v} {args.dtype}, "
          f"chunk={args.chunk}, {args.threads} threads, median of {args.repeats}")
    results = {}
    for variant in ("reference", "torch"):
        cmd = [sys.executable, __file__, "--worker", variant] + [
            f"--{k}={getattr(args, k)}" for k in ("n", "d", "v", "chunk", "dtype", "repeats",
                                                   "threads")]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
        r = results[variant]
        name = "eager" if variant == "reference" else "chunked"
        print(f"  {name:8s} peak {r['peak_mib']:8.1f} MiB   time {r['seconds']:7.3f} s")
    eager, fused = results["reference"], results["torch"]
    print(f"  ratio eager/chunked: memory {eager['peak_mib'] / fused['peak_mib']:.2f}x, "
          f"time {eager['seconds'] / fused['seconds']:.2f}x (>1 = chunked better)")


def cuda_measure(step, iters: int) -> tuple[float, float]:
    """(peak MiB above the memory held before, median milliseconds) of ``step()`` on CUDA."""
    step()  # warm-up: Triton compilation, cuBLAS heuristics
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(iters):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return (torch.cuda.max_memory_allocated() - base) / MIB, statistics.median(times)


def _report(name: str, fused: tuple[float, float], eager: tuple[float, float], parity: float) -> dict:
    """Print one kernel's line; returns its record (ms, MiB, speed-up, parity max |diff|)."""
    print(f"  {name:22s} fused {fused[1]:8.2f} ms {fused[0]:9.1f} MiB | eager {eager[1]:8.2f} ms "
          f"{eager[0]:9.1f} MiB | speed-up {eager[1] / fused[1]:.2f}x, "
          f"memory {eager[0] / max(fused[0], 1e-9):.2f}x less, parity max |diff| {parity:.2e}")
    return {"kernel": name, "triton_ms": fused[1], "triton_mib": fused[0], "torch_ms": eager[1], "torch_mib": eager[0],
            "speedup": eager[1] / fused[1], "max_abs_diff": parity}


def parity(fn, tensors) -> float:
    """Max |diff| between the Triton and reference backends over ``fn(backend)``'s output and the
    gradients of ``tensors`` (sum of the output as the loss)."""
    results = []
    for backend in ("triton", "reference"):
        out = fn(backend)
        grads = torch.autograd.grad(out.float().sum(), tensors)
        results.append([out.detach().float(), *(g.float() for g in grads)])
    return max(float((a - b).abs().max()) for a, b in zip(*results))


def run_cuda(args) -> list[dict]:
    """Time fused vs eager kernels on CUDA, print speed and memory ratios and parity; returns the records."""
    n, d, v, dtype = args.gpu_n, args.gpu_d, args.gpu_v, torch.bfloat16
    print(f"CUDA {torch.cuda.get_device_name()}: fwd+bwd, N={n} D={d} V={v} bf16, "
          f"median of {args.iters}")
    hidden, weight, labels = ce_inputs(n, d, v, dtype, "cuda")
    res = {b: cuda_measure(lambda b=b: ce_step(b, hidden, weight, labels, args.gpu_chunk),
                           args.iters) for b in ("triton", "reference")}
    def ce(backend):
        return linear_cross_entropy(hidden, weight, labels, reduction="mean", chunk_size=args.gpu_chunk,
                                    backend=backend)
    records = [_report(f"linear_ce chunk={args.gpu_chunk}", res["triton"], res["reference"],
                       parity(ce, (hidden, weight)))]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=gen).to("cuda", dtype).requires_grad_()
    w = torch.ones(d, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.zeros(d, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(n, d, generator=gen).to("cuda", dtype)

    def norm_step(fn, backend):
        fn(backend).backward(dy)
        x.grad = w.grad = b.grad = None

    for name, fn in (("rms_norm", lambda be: rms_norm(x, w, backend=be)),
                     ("layer_norm", lambda be: layer_norm(x, w, b, backend=be))):
        res = {be: cuda_measure(lambda be=be: norm_step(fn, be), args.iters)
               for be in ("triton", "reference")}
        records.append(_report(name, res["triton"], res["reference"], parity(fn, (x, w))))
    return records


def main() -> None:
    """Parse flags; run the CPU comparison, and the CUDA one when a GPU is present."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048, help="CPU tokens")
    p.add_argument("--d", type=int, default=512, help="CPU hidden size")
    p.add_argument("--v", type=int, default=32000, help="CPU vocabulary size")
    p.add_argument("--chunk", type=int, default=256, help="CPU rows per chunk")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--gpu-n", type=int, default=8192)
    p.add_argument("--gpu-d", type=int, default=2048)
    p.add_argument("--gpu-v", type=int, default=32000)
    p.add_argument("--gpu-chunk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--json", default="", help="write the CUDA records (speed, memory, parity) to this file")
    p.add_argument("--worker", choices=["reference", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        cpu_worker(args)
        return
    if not args.skip_cpu:
        run_cpu(args)
    if torch.cuda.is_available():
        records = run_cuda(args)
        if args.json:
            record = {"device": torch.cuda.get_device_name(), "kernels": records}
            Path(args.json).write_text(json.dumps(record, indent=1))
    else:
        print("no CUDA device: Triton benchmark skipped")


if __name__ == "__main__":
    main()
