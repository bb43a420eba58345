"""The run report and the preprocessing report as a browser shows them: headless Chromium renders the
HTML, every plot it references loads, the screenshot is not blank; the run report has lr and
grad-norm plots, validation loss, resume/rollback markers and per-layer/hardware plots; the
preprocessing report draws no empty panel and counts redactions per source."""
import json

from PIL import Image

from pipelines.accounting.report import report_panels, report_png, report_text, write_report as write_preprocess_report
from trainer.report.render import write_report

from tests.support.browser import ink_fraction, loaded_images, needs_chromium, screenshot
from tests.support.paths import REPO

RUN_PLOTS = ["loss.png", "lr.png", "grad_norm.png", "throughput.png", "step_time.png", "layers.png", "hardware.png"]


def _record(step: int) -> dict:
    return {"step": step, "steps": 5, "lr": 1e-3 * min(1, step / 10), "loss": 8.0 - step / 10, "grad_norm": 2.0 / step,
            "tokens": 5000, "interval_s": 2.0, "tokens_per_second": 2500.0, "data_wait_s": 0.1, "comm_s": 0.2,
            "forward_backward_s": 1.2, "optimizer_s": 0.3, "data_queue_depth": 1.5, "world_size": 2,
            "hw_rss_bytes": 2**30 + step * 2**20,
            "layers": {f"blocks.{i}": {"grad_norm": 0.5 / (i + 1), "update_ratio": 1e-3 * (i + 1),
                                       "act_rms": 1.0 + i, "act_max": 5.0} for i in (0, 3)}}


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(_record(s)) for s in range(5, 45, 5)]
    lines += [json.dumps({"step": s, "val_loss": 7.5 - s / 20}) for s in (20, 40)]  # issue 16's evaluation lines
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    events = [{"event": "resume", "step": 20, "rank": r} for r in (0, 1)] + \
             [{"event": "nonfinite", "step": 24, "rank": 0, "keys": ["a"]},
              {"event": "rollback", "step": 25, "to_step": 20, "rank": 0}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


@needs_chromium
def test_run_report_renders_in_chromium(tmp_path):
    run = _run(tmp_path)
    index = write_report(str(run))
    page = open(index).read()
    for row in ("<th>resumes</th><td>step 20</td>", "<th>rollbacks</th><td>step 25 → 20</td>",
                "<th>validation loss</th><td>5.5000 (step 40; best 5.5000)</td>",
                "<th>communication share</th><td>10.0%", "<th>data queue depth</th><td>1.50"):
        assert row in page, row
    images = loaded_images(index)
    assert [src for src, *_ in images] == RUN_PLOTS  # no cache plot: this run had no cache lookups
    for src, complete, width, height in images:
        with Image.open(run / "report" / src) as im:
            assert complete and (width, height) == im.size and width >= 700, src
        assert ink_fraction(str(run / "report" / src)) > 0.03, src  # a drawn plot, not a blank canvas
    shot = tmp_path / "report.png"
    screenshot(index, str(shot), 1400, 2400)
    with Image.open(shot) as im:
        assert im.size == (1400, 2400)
    assert ink_fraction(str(shot)) > 0.05


def _stats(removed: bool) -> dict:
    total = {"input_records": 10, "kept": 10, "filtered": {"too_short": 0}, "duplicates": 0, "dead_letter": 0,
             "dead_letter_reasons": {}, "redactions": {}, "tokens": 900, "text_bytes": 3000,
             "length_tokens": {"64": 6, "128": 4}, "balanced": True}
    stats = {"total": total, "sources": {}, "shards": 1, "vocab_size": 512}
    if removed:
        total.update(input_records=14, filtered={"too_short": 3}, duplicates=1)
        stats["pii"] = {"per_source": {"web.jsonl": {"email": 4, "phone": 1}, "books.jsonl": {"ipv4": 2},
                                       "clean.jsonl": {"email": 0}}}
    return stats


def test_preprocessing_report_draws_no_empty_panel():
    nothing = _stats(removed=False)
    assert report_panels(nothing) == ["lengths"]
    with Image.open(__import__("io").BytesIO(report_png(nothing))) as im:
        assert im.size == (550, 400)  # one panel, not an empty "removed" panel beside it
    some = _stats(removed=True)
    assert report_panels(some) == ["lengths", "removed", "redactions"]
    text = report_text(some)
    assert "PII redactions by source:" in text and "clean.jsonl" not in text
    assert [line.split()[:2] for line in text.splitlines() if "jsonl" in line] == [["books.jsonl", "2"],
                                                                                   ["web.jsonl", "5"]]


@needs_chromium
def test_preprocessing_report_renders_in_chromium(tmp_path):
    write_preprocess_report(str(tmp_path), _stats(removed=True))
    images = loaded_images(str(tmp_path / "report.html"))
    assert [(src, complete, w, h) for src, complete, w, h in images] == [("report.png", True, 1650, 400)]
    shot = tmp_path / "shot.png"
    screenshot(str(tmp_path / "report.html"), str(shot), 1200, 1400)
    assert ink_fraction(str(shot)) > 0.05
    assert ink_fraction(str(tmp_path / "report.png")) > 0.05


@needs_chromium
def test_dashboard_preview_renders_the_grafana_panels(tmp_path):
    """The docs picture is reproducible: the committed run's metrics draw every non-GPU panel."""
    import os

    from trainer.report.dashboard import PANELS, render_preview
    root = str(REPO)
    page = render_preview(os.path.join(root, "docs", "grafana", "preview-metrics.jsonl"), str(tmp_path))
    assert loaded_images(page) == [("dashboard-preview.png", True, 1400, 260 * ((len(PANELS) + 1) // 2))]
    assert ink_fraction(str(tmp_path / "dashboard-preview.png"), (17, 18, 23)) > 0.05
