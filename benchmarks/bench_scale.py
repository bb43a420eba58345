"""Benchmark: how the preprocessing job's cost grows with the corpus, on the DirectRunner
(the baseline) and on a Dask cluster (a scheduler and 2 worker processes on 127.0.0.1).

    python benchmarks/bench_scale.py [--scales 1,4,16] [--fraction 0.25] [--runners direct,dask]
        [--workers 2] [--out data/bench_scale]

Scale ``k`` is ``k`` copies of the demo corpus (``--fraction`` of it per copy; the default
quarter keeps 16x at 80 MB, about 20 minutes on 2 cores): copy 0 is the
original, copy ``c >= 1`` has every document's words shuffled with a seed of ``(c, id)`` and the
id suffixed ``~c``, so the documents are distinct and exact dedup does not shrink the input (the
word statistics, hence cleaning and quality outcomes, stay close to the original's). Each run is
``beam_runner.py`` in a fresh process with the default pipeline config; the Dask cluster is
started anew per run so each worker's peak RSS belongs to that run.

Printed per runner and scale: input MB, wall s, CPU s per input MB (driver plus workers, user +
system) and peak RSS per worker process (the DirectRunner's worker is its own process), then
the 1x→largest ratios of CPU/MB and RSS and the Dask/Direct wall ratio.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines.corpus import write_corpus  # noqa: E402
from pipelines.local_engines import child_env, peak_rss_bytes, start_dask  # noqa: E402


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def make_corpus(base: Path, out: Path, copies: int, fraction: float) -> int:
    """Write ``copies`` distinct copies of the demo corpus JSONL under ``out``; returns input bytes."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(base.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        lines = lines[:max(1, int(len(lines) * fraction))]
        for c in range(copies):
            with open(out / f"{path.stem}-{c:02d}.jsonl", "w", encoding="utf-8") as f:
                for line in lines:
                    rec = json.loads(line)
                    if c:
                        words = rec["text"].split(" ")
                        random.Random(f"{c}:{rec['id']}").shuffle(words)
                        rec["text"], rec["id"] = " ".join(words), f"{rec['id']}~{c}"
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return sum(p.stat().st_size for p in out.glob("*.jsonl"))


def run_job(corpus: Path, out: Path, beam_args: list[str], env: dict):
    """``beam_runner.py`` on ``corpus`` in a child process; returns (wall seconds, the child's
    ``resource.struct_rusage``: CPU times and peak RSS in KiB). Raises ``RuntimeError`` with the
    end of its stderr when it fails."""
    cmd = [sys.executable, str(ROOT / "beam_runner.py"), "--input", f"{corpus}/*.jsonl", "--output", str(out),
           "--overwrite"] + beam_args
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err.decode(errors='replace')[-2000:]}")
    return wall, usage


def measure(runner: str, corpus: Path, out: Path, workers: int, logs: Path) -> dict:
    """One run; returns wall_s, cpu_s (driver plus Dask workers) and peak RSS (MB) per worker
    process (the DirectRunner's worker is the driver process itself)."""
    env = child_env()
    if runner == "direct":
        wall, usage = run_job(corpus, out, [], env)
        return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": [usage.ru_maxrss / 1024]}
    engine = start_dask(logs, workers=workers, env=env)
    try:
        cpu0 = sum(_cpu_s(p) for p in engine.worker_pids())
        wall, usage = run_job(corpus, out, ["--runner=DaskRunner", f"--dask_client_address={engine.address}"], env)
        cpu = usage.ru_utime + usage.ru_stime + sum(_cpu_s(p) for p in engine.worker_pids()) - cpu0
        rss = [peak_rss_bytes(p) / 2**20 for p in engine.worker_pids()]
    finally:
        engine.stop()
    return {"wall_s": wall, "cpu_s": cpu, "rss_mb": rss}


def main(argv: list[str] | None = None) -> int:
    """Run the job at each scale and runner; print wall s, CPU s per MB and peak RSS per worker."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,4,16", help="comma-separated copies of the corpus")
    ap.add_argument("--fraction", type=float, default=0.25, help="fraction of the demo corpus per copy")
    ap.add_argument("--runners", default="direct,dask")
    ap.add_argument("--workers", type=int, default=2, help="dask worker processes")
    ap.add_argument("--out", default=str(ROOT / "data" / "bench_scale"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    base = out / "demo"
    if not glob.glob(f"{base}/*.jsonl"):
        write_corpus(str(base))
    rows = []
    for scale in [int(s) for s in args.scales.split(",")]:
        corpus = out / f"corpus-{scale}x"
        size = make_corpus(base, corpus, scale, args.fraction)
        for runner in args.runners.split(","):
            r = measure(runner, corpus, out / f"shards-{runner}-{scale}x", args.workers, out / f"logs-{scale}x")
            r.update(runner=runner, scale=scale, mb=size / 1e6, cpu_s_per_mb=r["cpu_s"] / (size / 1e6))
            rows.append(r)
            print(f"{runner:6s} {scale:3d}x {r['mb']:8.1f} MB  wall {r['wall_s']:8.1f} s  "
                  f"CPU {r['cpu_s_per_mb']:6.2f} s/MB  peak RSS/worker {max(r['rss_mb']):7.0f} MB", flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    for runner in args.runners.split(","):
        mine = [r for r in rows if r["runner"] == runner]
        if len(mine) > 1:
            lo, hi = mine[0], mine[-1]
            print(f"{runner}: {lo['scale']}x→{hi['scale']}x CPU/MB ratio {hi['cpu_s_per_mb'] / lo['cpu_s_per_mb']:.2f}, "
                  f"peak RSS/worker ratio {max(hi['rss_mb']) / max(lo['rss_mb']):.2f}")
    for scale in sorted({r["scale"] for r in rows}):
        pair = {r["runner"]: r for r in rows if r["scale"] == scale}
        if {"direct", "dask"} <= pair.keys():
            print(f"{scale}x: dask/direct wall ratio {pair['dask']['wall_s'] / pair['direct']['wall_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
