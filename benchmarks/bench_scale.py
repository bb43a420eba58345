"""Benchmark: how the preprocessing job's cost grows with the corpus, on the DirectRunner
(the baseline; in memory, or ``multi`` for its multi_processing mode), on a Dask cluster (a
scheduler and 2 worker processes on 127.0.0.1), and for datatrove's equivalent steps
(``benchmarks/datatrove_baseline.py``: cleaning, PII, MinHash; run with ``--near``).

    python benchmarks/bench_scale.py [--scales 1,4,16] [--fraction 0.25] [--near]
        [--runners direct,multi,datatrove,dask[,dask-spill][,dask-weak]] [--workers 2] [--memory-limit 250MB]
        [--out data/bench_scale]

Scale ``k`` is ``k`` copies of the demo corpus (``--fraction`` of it per copy): copy 0 is the
original, copy ``c >= 1`` has every document's words shuffled with a seed of ``(c, id)`` and the
id suffixed ``~c``, so the documents are distinct and exact dedup does not shrink the input (the
word statistics, hence cleaning and quality outcomes, stay close to the original's). Each run is
``beam_runner.py`` in a fresh process with the default pipeline config but for ``SETTINGS``; the Dask cluster is
started anew per run so each worker's peak RSS belongs to that run. ``dask`` keeps ``--workers``
worker processes at every scale; ``dask-spill`` is the same with each worker's ``--memory-limit``
(default ``SPILL_LIMIT``) and colaflow's spill settings
(:func:`tests.support.local_engines.dask_spill_env`); ``dask-weak`` grows the cluster with the
corpus (``--workers`` times the scale), which shows whether memory per worker stays flat when
each worker's share of the corpus does. A first run on a tiny
corpus (``FIXED_FRACTION`` of the demo corpus, about 0.1 MB) measures each runner's fixed cost
(process start, imports, graph construction and submission, tokenizer training on a tiny sample).

``--near`` turns MinHash near-dedup on (``dedup.near=true``), the steps datatrove's baseline also
runs. ``multi`` is ``--direct_running_mode=multi_processing --direct_num_workers=W`` (``--workers``);
``datatrove`` runs :func:`datatrove_baseline.run_datatrove` in a child process. With ``datatrove``
among the runners, both sides tokenise with one tokenizer: a first, untimed colaflow run on the 1x
corpus trains it (sentencepiece, colaflow's default; ``OUT/tokenizer/``, kept between invocations),
every colaflow run is brought its ``tokenizer.model`` (``tokenizer.path``: no training) and
datatrove's last step is its ``DocumentTokenizer`` with the ``tokenizer.json`` colaflow exported
from the same model (the Hugging Face form, the only one datatrove reads; the run checked it gives
the same ids), so both do the equivalent steps: clean, redact, filter, MinHash near dedup, tokenise
into the same ids, write token files (colaflow also exact-dedups). The runners take
turns at each scale (interleaved), so a slower hour on the shared machine hits them alike.

Printed per runner and scale: input MB, wall s, CPU s per input MB and MB per CPU-s (driver plus
workers, user + system), marginal CPU s per MB (CPU above the fixed run's, per MB above its input),
peak RSS per worker process (the DirectRunner's worker is its own process; for ``multi`` and
``datatrove`` the largest process of the run's tree, ``ru_maxrss`` of the child), and for Dask the bag partitions,
the MB the workers spilled to disk, and the stages whose partitions the scheduler held in
memory at the run's peak (by dask's size estimate, both workers together). Then the 1x→largest ratios and the CPU slope between scales.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.demo.corpus import write_corpus  # noqa: E402
from tests.support.local_engines import SPILL_TARGET, child_env, peak_rss_bytes, start_dask  # noqa: E402
from colaflow.wording import help_text  # noqa: E402

FIXED_FRACTION = 0.005  # of the demo corpus: the fixed-cost run's input (about 0.1 MB)
# the settings BENCHMARKS.md's scaling table was measured with: the verse demo corpus fails the web-text
# quality rules (on by default), and near dedup (on by default) has its own benchmark
SETTINGS = ("quality.enabled=false", "dedup.near=false")
SPILL_LIMIT = "250MB"  # dask-spill's per-worker --memory-limit: 25 MB of results kept in memory (SPILL_TARGET)


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


def run_job(corpus: Path, out: Path, beam_args: list[str], env: dict, cmd: list[str] | None = None):
    """``beam_runner.py`` on ``corpus`` in a child process (with ``SETTINGS``, then ``beam_args``), or
    ``cmd``; returns (wall seconds, the child's ``resource.struct_rusage``: CPU times of it and its
    children, peak RSS of the largest in KiB). Raises ``RuntimeError`` with the end of its stderr
    when it fails."""
    cmd = cmd or [sys.executable, str(ROOT / "beam_runner.py"), "--input", f"{corpus}/*.jsonl", "--output", str(out),
                  "--overwrite", *SETTINGS] + beam_args
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err.decode(errors='replace')[-2000:]}")
    return wall, usage


def _held_by_stage(dask_scheduler) -> dict:
    """Scheduler-side: bytes (dask's estimate) of in-memory task results, by task-name prefix."""
    held: dict = {}
    for ts in dask_scheduler.tasks.values():
        if ts.state == "memory":
            held[ts.group_key] = held.get(ts.group_key, 0) + ts.nbytes
    return held


class HeldSampler(threading.Thread):
    """Polls the Dask scheduler every ``interval_s`` and keeps the sample with the most bytes held."""

    def __init__(self, address: str, interval_s: float = 0.5):
        super().__init__(daemon=True)
        from distributed import Client

        self.client, self.interval_s = Client(address), interval_s
        self.peak: dict = {}
        self.done = threading.Event()

    def run(self):
        """Sample until :meth:`stop`."""
        while not self.done.wait(self.interval_s):
            try:
                held = self.client.run_on_scheduler(_held_by_stage)
            except OSError:  # the scheduler is going away
                break
            if sum(held.values()) > sum(self.peak.values()):
                self.peak = held

    def stop(self) -> dict:
        """End sampling; returns the peak sample (task-name prefix → bytes)."""
        self.done.set()
        self.join()
        self.client.close()
        return self.peak


def _spilled_bytes(dask_worker) -> float:
    """Worker-side: bytes this worker has written to its spill directory so far."""
    metrics = getattr(dask_worker.data, "cumulative_metrics", {})
    return metrics.get(("disk-write", "bytes"), 0.0)


DATATROVE = ("import sys; sys.path.insert(0, sys.argv[3]); import datatrove_baseline as d; "
             "d.run_datatrove(sys.argv[1], '*.jsonl', sys.argv[2], sys.argv[4] if len(sys.argv) > 4 else None)")


TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json")


def shared_tokenizer(base: Path, out: Path, fraction: float, env: dict) -> Path:
    """The tokenizer colaflow trains on the 1x corpus (one untimed run, default settings but for
    ``SETTINGS``): its :data:`TOKENIZER_FILES` copied to ``out/tokenizer/``, reused when already
    there. Returns the folder."""
    keep = out / "tokenizer"
    if not all((keep / name).exists() for name in TOKENIZER_FILES):
        corpus, run = out / "corpus-1x", out / "tokenizer-run"
        make_corpus(base, corpus, 1, fraction)
        run_job(corpus, run, ["dedup.near=false"], env)
        keep.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            (keep / name).write_bytes((run / name).read_bytes())
    return keep


def measure(runner: str, corpus: Path, out: Path, workers: int, logs: Path, memory_limit: str = "0",
            settings: list[str] | None = None, tokenizer: Path | None = None) -> dict:
    """One run; returns wall_s, cpu_s (driver plus Dask workers), peak RSS (MB) per worker
    process (the DirectRunner's worker is the driver process itself) and, for Dask, ``held``:
    MB held in worker memory per stage at the peak (the 3 largest) and ``spilled_mb``: MB the
    workers wrote to disk (with a ``memory_limit``, e.g. ``"500MB"``, per worker). ``settings``:
    config overrides (``dedup.near=true``) of every colaflow run; ``tokenizer``: the ``tokenizer.json``
    datatrove tokenises with (colaflow's runs are brought the same model through ``settings``)."""
    env, settings = child_env(), settings or []
    if runner in ("direct", "multi", "datatrove"):
        if runner == "datatrove":
            subprocess.run(["rm", "-rf", str(out)], check=True)  # datatrove skips the tasks it finds done
            cmd = [sys.executable, "-c", DATATROVE, str(corpus), str(out), str(ROOT / "benchmarks")]
            cmd += [str(tokenizer)] if tokenizer else []
            wall, usage = run_job(corpus, out, [], env, cmd)
        else:
            multi = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
            wall, usage = run_job(corpus, out, settings + (multi if runner == "multi" else []), env)
        return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": [usage.ru_maxrss / 1024]}
    engine = start_dask(logs, workers=workers, env=env, timeout_s=60.0 + 5 * workers, memory_limit=memory_limit)
    try:
        cpu0 = sum(_cpu_s(p) for p in engine.worker_pids())
        sampler = HeldSampler(engine.address)
        sampler.start()
        dask = ["--runner=DaskRunner", f"--dask_client_address={engine.address}"]
        wall, usage = run_job(corpus, out, settings + dask, env)
        held = sampler.stop()
        from distributed import Client

        with Client(engine.address) as client:
            spilled = sum(client.run(_spilled_bytes).values())
        cpu = usage.ru_utime + usage.ru_stime + sum(_cpu_s(p) for p in engine.worker_pids()) - cpu0
        rss = [peak_rss_bytes(p) / 2**20 for p in engine.worker_pids()]
    finally:
        engine.stop()
    top = sorted(held.items(), key=lambda kv: -kv[1])[:3]
    return {"wall_s": wall, "cpu_s": cpu, "rss_mb": rss, "held_mb": sum(held.values()) / 2**20, "spilled_mb": spilled / 2**20,
            "held": {name.split("-")[0]: n / 2**20 for name, n in top}}


def _row(r: dict) -> str:
    held = ""
    if "held" in r:
        held = (f"  {r['workers']} workers, {r['partitions']} partitions, spilled {r['spilled_mb']:.0f} MB, "
                f"held {r['held_mb']:.0f} MB: ") + ", ".join(
            f"{name} {mb:.0f}" for name, mb in r["held"].items())
    marginal = f"{r['marginal_cpu_s_per_mb']:6.2f}" if "marginal_cpu_s_per_mb" in r else "     -"
    scale = "fixed" if r["scale"] == "fixed" else f"{r['scale']}x"
    return (f"{r['runner']:9s} {scale:>5s} {r['mb']:8.1f} MB  wall {r['wall_s']:7.1f} s  CPU {r['cpu_s']:7.1f} s  "
            f"{1 / r['cpu_s_per_mb']:5.2f} MB/CPU-s  CPU {r['cpu_s_per_mb']:6.2f} s/MB  marginal {marginal} s/MB  "
            f"peak RSS/worker {max(r['rss_mb']):6.0f} MB{held}")


def main(argv: list[str] | None = None) -> int:
    """Run the job on the fixed-cost corpus and at each scale and runner; print wall s, CPU s per
    MB (all and marginal), peak RSS per worker and the 1x→largest ratios."""
    from pipelines.runners.dask.runner import partition_count

    ap = argparse.ArgumentParser(description=help_text(" ".join(__doc__.split("\n\n")[0].split())),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--scales", default="1,4,16", help="comma-separated copies of the corpus")
    ap.add_argument("--fraction", type=float, default=0.25, help="fraction of the demo corpus per copy")
    ap.add_argument("--runners", default="direct,dask",
                    help="direct, multi (DirectRunner multi_processing, --workers processes), datatrove, dask, "
                         "dask-spill (dask with --memory-limit) and/or dask-weak (2 x scale workers: 32 processes "
                         "at 16x)")
    ap.add_argument("--near", action="store_true", help="MinHash near-dedup on in colaflow's runs (dedup.near=true)")
    ap.add_argument("--workers", type=int, default=2, help="dask worker processes")
    ap.add_argument("--memory-limit", default=SPILL_LIMIT,
                    help="each dask-spill worker's --memory-limit; results beyond "
                         f"{SPILL_TARGET * 100:.0f}%% of it go to local disk")  # argparse %-formats help
    ap.add_argument("--out", default=str(ROOT / "data" / "bench_scale"),
                    help="work folder: the demo corpus, its scaled copies, each run's shards and logs, and "
                         "results.json (the printed table as JSON)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    base = out / "demo"
    if not glob.glob(f"{base}/*.jsonl"):
        write_corpus(str(base))
    runners = args.runners.split(",")
    settings, tokenizer = ["dedup.near=true"] if args.near else [], None
    if "datatrove" in runners:  # both sides tokenise with the same tokenizer (see the module docstring)
        folder = shared_tokenizer(base, out, args.fraction, child_env())
        settings.append(f"tokenizer.path={folder / 'tokenizer.model'}")
        tokenizer = folder / "tokenizer.json"
        print(f"colaflow tokenises with {folder / 'tokenizer.model'} (sentencepiece; no training in these runs), "
              f"datatrove with {tokenizer} (the same model in Hugging Face's form)", flush=True)
    rows, fixed = [], {}
    for scale in ["fixed"] + [int(s) for s in args.scales.split(",")]:
        corpus = out / f"corpus-{scale}x"
        size = make_corpus(base, corpus, 1 if scale == "fixed" else scale,
                           FIXED_FRACTION if scale == "fixed" else args.fraction)
        for runner in runners:
            workers = args.workers * (scale if runner == "dask-weak" and scale != "fixed" else 1)
            r = measure(runner, corpus, out / f"shards-{runner}-{scale}x", workers, out / f"logs-{scale}x-{runner}",
                        args.memory_limit if runner == "dask-spill" else "0", settings, tokenizer)
            r.update(runner=runner, scale=scale, mb=size / 1e6, cpu_s_per_mb=r["cpu_s"] / (size / 1e6), workers=workers)
            if runner.startswith("dask"):
                r["partitions"] = partition_count(None, workers, size)
            if scale == "fixed":
                fixed[runner] = r
            else:
                r["marginal_cpu_s_per_mb"] = (r["cpu_s"] - fixed[runner]["cpu_s"]) / (r["mb"] - fixed[runner]["mb"])
            rows.append(r)
            print(_row(r), flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    for runner in runners:
        mine = [r for r in rows if r["runner"] == runner and r["scale"] != "fixed"]
        if len(mine) > 1:
            lo, hi = mine[0], mine[-1]
            slopes = ", ".join(f"{a['scale']}x→{b['scale']}x {(b['cpu_s'] - a['cpu_s']) / (b['mb'] - a['mb']):.2f}"
                               for a, b in zip(mine, mine[1:]))
            print(f"{runner}: {lo['scale']}x→{hi['scale']}x ratios: CPU/MB {hi['cpu_s_per_mb'] / lo['cpu_s_per_mb']:.2f}, "
                  f"marginal CPU/MB {hi['marginal_cpu_s_per_mb'] / lo['marginal_cpu_s_per_mb']:.2f}, "
                  f"peak RSS/worker {max(hi['rss_mb']) / max(lo['rss_mb']):.2f}; CPU s per added MB: {slopes}")
    for scale in sorted({r["scale"] for r in rows if r["scale"] != "fixed"}):
        pair = {r["runner"]: r for r in rows if r["scale"] == scale}
        for name in ("dask", "dask-spill", "dask-weak"):
            if {"direct", name} <= pair.keys():
                print(f"{scale}x: {name}/direct wall ratio {pair[name]['wall_s'] / pair['direct']['wall_s']:.2f}")
        for name in ("direct", "multi"):
            if {"datatrove", name} <= pair.keys():  # the same input, so the CPU ratio is the MB/CPU-s ratio
                ratio = pair["datatrove"]["cpu_s"] / pair[name]["cpu_s"]
                print(f"{scale}x: {name} MB/CPU-s over datatrove's {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
