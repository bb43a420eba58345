"""``python -m trainer.report.render RUN_DIR``: HTML + PNG plots from a metrics.jsonl, old and damaged files included."""
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.report.render import read_metrics, write_report
from tests.support.paths import REPO

ROOT = str(REPO)


def record(step: int, steps: int) -> dict:
    interval = 2.0 * steps
    return {"step": step, "steps": steps, "epoch": 0, "lr": 1e-3, "world_size": 2, "loss": 8.0 - step / 10,
            "grad_norm": 1.0, "tokens": 1000 * steps, "interval_s": interval, "step_time_s": 2.0,
            "tokens_per_second": 1000 * steps / interval, "flops_per_token": 1e6, "model_flops_per_second": 2.5e8,
            "mfu": 0.25, "data_wait_s": 0.1 * steps, "forward_backward_s": 1.5 * steps, "optimizer_s": 0.2 * steps,
            "data_wait_max_s": 0.2 * steps, "forward_backward_max_s": 1.6 * steps, "optimizer_max_s": 0.3 * steps,
            "data_wait_share": 0.05, "memory_bytes": 2**28, "memory_max_bytes": 2**29, "memory_kind": "rss",
            "cache_hits": 3 if step == 1 else 0, "cache_misses": 1 if step == 1 else 0,
            "cache_hit_rate": 0.75 if step == 1 else None, "cache_stall_s": 0.5 if step == 1 else 0.0,
            "padding_efficiency": 0.9, "skipped_steps": 0}


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs, self.open = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        self.open.append(tag)


def test_report_from_metrics_jsonl(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(record(s, n)) for s, n in ((1, 1), (10, 9), (20, 10), (30, 10))]
    lines.insert(2, '{"step": 10, "loss": "truncated')  # a torn line from a killed run
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "config.json").write_text(json.dumps({"model": {"d_model": 32, "n_layers": 1}, "zero": {"stage": 3},
                                                 "precision": "fp32", "metrics": {"jsonl": "metrics.jsonl"}}))
    (run / "train_summary.json").write_text(json.dumps({"final_step": 30, "train_steps": 30, "parameters": 12345}))
    index = write_report(str(run))
    assert index == str(run / "report" / "index.html")
    page = open(index).read()
    parser = _Images()
    parser.feed(page)
    assert parser.srcs == ["loss.png", "lr.png", "grad_norm.png", "throughput.png", "step_time.png", "cache.png"]
    for src in parser.srcs:
        assert (run / "report" / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.startswith("<!DOCTYPE html>") and parser.open[-1] == "html"
    for row in ("<th>steps</th><td>30 (30 in the last process run)</td>", "<th>final loss</th><td>5.0000</td>",
                "<th>tokens</th><td>30,000</td>", "<th>world size</th><td>2</td>",
                "<th>throughput</th><td>500 tokens/s", "<th>MFU</th><td>25.0%", "<th>data wait share</th><td>5.0%",
                "<th>cache hit rate</th><td>75.0% of 4 lookups", "<th>zero</th><td>stage 3</td>",
                "<th>parameters</th><td>12,345</td>"):
        assert row in page
    assert "1 unreadable lines" in page and "line 3: not JSON" in page


def test_report_of_an_old_metrics_file_has_the_plots_it_can_draw(tmp_path):
    old = [{"step": s, "loss": 5.0 - s / 10, "tokens": 100, "tokens_per_second": 50.0, "lr": 0.1,
            "grad_norm": 1.0, "data_wait_s": 0.1, "epoch": 0} for s in (1, 3, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    page = open(write_report(str(tmp_path), str(tmp_path / "out"))).read()
    assert sorted(os.listdir(tmp_path / "out")) == ["grad_norm.png", "index.html", "loss.png", "lr.png",
                                                    "throughput.png"]
    assert "<th>tokens</th><td>300</td>" in page and "<th>world size</th><td>unknown</td>" in page


def test_cli_writes_report_and_explains_a_missing_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record(1, 1)) + "\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run([sys.executable, "-m", "trainer.report.render", str(tmp_path)], env=env, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and "report written" in ok.stdout
    assert (tmp_path / "report" / "index.html").exists()
    missing = subprocess.run([sys.executable, "-m", "trainer.report.render", str(tmp_path / "nope")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no metrics file" in missing.stderr


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("rec"), st.integers(0, 20), st.floats(0, 10)),
                          st.tuples(st.just("junk"), st.sampled_from(["{", "[1]", '{"step": "x"}', "nan"]),
                                    st.just(0.0))), max_size=30))
def test_read_metrics_keeps_last_record_per_step_and_counts_bad_lines(tmp_path_factory, items):
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    lines = [json.dumps({"step": a, "loss": b}) if kind == "rec" else a for kind, a, b in items]
    path.write_text("".join(line + "\n" for line in lines))
    m = read_metrics(str(path))
    last = {a: b for kind, a, b in items if kind == "rec"}
    assert [r["step"] for r in m.records] == sorted(last)
    assert [r["loss"] for r in m.records] == [last[s] for s in sorted(last)]
    assert [n for n, _ in m.bad_lines] == [i + 1 for i, (kind, _, _) in enumerate(items) if kind == "junk"]
