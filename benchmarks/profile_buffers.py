"""Profile the preprocessing job's memory on the DirectRunner (in memory), stage by stage: runs
``beam_runner.py`` in this process and, after every bundle the FnApiRunner executes, prints the
RSS before and after it and the largest buffers the runner holds (queued ``ListBuffer`` s with
their bytes, ``GroupingBuffer`` s with their keys and values and one value), so what grows with
the corpus shows up as a buffer or a stage's RSS step. A thread samples the RSS every 50 ms
with the stage then running; at exit the stages are listed by their sampled peak.

    python benchmarks/profile_buffers.py --input 'CORPUS/*.jsonl' --output OUT --overwrite \\
        quality.enabled=false dedup.near=false 2> profile.log

``PROF_TRACE=1`` also starts ``tracemalloc`` and prints the top allocation sites at each new
high of the RSS (about ten times slower). Arguments are ``beam_runner.py`` 's.
"""
from __future__ import annotations

import atexit
import collections
import os
import runpy
import sys
import threading
import time
from pathlib import Path

from apache_beam.runners.portability.fn_api_runner import execution, fn_runner

ROOT = Path(__file__).resolve().parent.parent
TRACE = os.environ.get("PROF_TRACE") == "1"
SAMPLE_S = 0.05
SHOWN = 6  # buffers listed after each bundle


def _rss() -> dict[str, int]:
    """VmRSS and VmHWM of this process in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) // 1024
    return out


_stage = ["-"]
_stage_peak: dict[str, int] = collections.defaultdict(int)
_high = [0]


def _sample() -> None:
    while True:
        _stage_peak[_stage[0]] = max(_stage_peak[_stage[0]], _rss()["VmRSS"])
        time.sleep(SAMPLE_S)


def _buffers(ctx) -> list[tuple[int, str]]:
    """(weight, description) of each buffer the runner holds: stage outputs and queued inputs."""
    items = list(ctx.pcoll_buffers.items())
    for queue in (ctx.queues.ready_inputs, ctx.queues.watermark_pending_inputs):
        for key, data in queue._q:
            items += [(f"queued for {str(key[0])[-40:]} <- {pc[-30:]}", buf) for pc, buf in data.data.items()]
    out = []
    for name, buf in items:
        name = name.decode(errors="replace") if isinstance(name, bytes) else name
        if isinstance(buf, execution.ListBuffer) and not buf.cleared:
            n = sum(len(b) for b in buf._inputs)
            out.append((n, f"List {name[-90:]} {n / 1e6:.2f} MB in {len(buf._inputs)} chunks"))
        elif isinstance(buf, execution.GroupingBuffer):
            values = sum(len(v) for v in buf._table.values())
            sample = next(iter(buf._table.values()))[0] if buf._table else None
            out.append((values * 200, f"Group {name[-90:]} keys={len(buf._table)} values={values} "
                                      f"e.g. {str(sample)[:120]}"))
    return sorted(out, key=lambda t: -t[0])


_execute = fn_runner.FnApiRunner._execute_bundle


def _execute_bundle(self, ctx, bcm, bundle_input):
    name = bcm.stage.name
    _stage[0] = name[-80:]
    before = _rss()["VmRSS"]
    result = _execute(self, ctx, bcm, bundle_input)
    after = _rss()
    print(f"STAGE {name[-70:]} RSS {before}->{after['VmRSS']} HWM={after['VmHWM']}", file=sys.stderr)
    for _, line in _buffers(ctx)[:SHOWN]:
        print("    ", line, file=sys.stderr)
    if TRACE and after["VmHWM"] > _high[0] + 10:
        import tracemalloc

        _high[0] = after["VmHWM"]
        current, peak = tracemalloc.get_traced_memory()
        print(f"  TRACE current={current / 1e6:.1f} MB peak={peak / 1e6:.1f} MB", file=sys.stderr)
        for stat in tracemalloc.take_snapshot().statistics("traceback")[:8]:
            print(f"    {stat.size / 1e6:.1f} MB n={stat.count}", " | ".join(map(str, stat.traceback[-4:])),
                  file=sys.stderr)
    return result


def _report() -> None:
    print("STAGE PEAKS (sampled RSS while the stage ran):", file=sys.stderr)
    for stage, mb in sorted(_stage_peak.items(), key=lambda t: -t[1])[:25]:
        print(f"   {mb:6d} MB  {stage}", file=sys.stderr)


if __name__ == "__main__":
    if TRACE:
        import tracemalloc

        tracemalloc.start(8)
    fn_runner.FnApiRunner._execute_bundle = _execute_bundle
    threading.Thread(target=_sample, daemon=True).start()
    atexit.register(_report)
    sys.argv = [str(ROOT / "beam_runner.py")] + sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
