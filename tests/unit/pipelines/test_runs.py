"""Run-level guarantees: a finished or killed output is refused or overwritten, never mixed;
a million-copy key stays bounded (100,000 here) and every copy names the key it duplicates;
the end-of-job report."""
from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import time

import pytest

from pipelines.config import TokenizerConfig
from examples.demo.corpus import write_corpus
from pipelines.job import run
from pipelines.io.output import OutputExistsError
from pipelines.stages.tokenize import train_sentencepiece
from pipelines.stages.exact_dedup import KeepSmallestId
from pipelines.stages.keys import DocKey
from tests.support.paths import REPO
from tests.support.pipeline import SYNTHETIC, synthetic_config

ROOT = str(REPO)


def _runner(inp, out, *extra):
    return subprocess.Popen([sys.executable, "beam_runner.py", "--input", inp, "--output", str(out),
                             "tokenizer.vocab_size=500", "shards.num_shards=8", *SYNTHETIC, *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_leaves_no_shard_and_rerun_refuses_or_overwrites(tmp_path):
    write_corpus(str(tmp_path / "in"), limit_per_source=400)
    inp, out = str(tmp_path / "in" / "*.jsonl"), tmp_path / "out"
    proc = _runner(inp, out)
    deadline = time.monotonic() + 120
    while not (out / "_tmp_buckets").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)  # kill -9 as soon as the first bucket is being written
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert (out / "_tmp_buckets").exists() and not (out / "manifest.json").exists()
    assert not [p for p in leftovers if p.endswith(".tar")], leftovers  # nothing that looks like a shard

    refused = _runner(inp, out)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and "unfinished run" in err and "--overwrite" in err

    again = _runner(inp, out, "--overwrite")
    stdout, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert "reading 2 files" in err and "bytes per token" in stdout  # progress while running, report at the end
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in out.glob("*.tar")) == [s["name"] for s in manifest["shards"]]
    assert not (out / "_tmp_buckets").exists()
    with pytest.raises(OutputExistsError, match="finished run .*--overwrite"):
        run(inp, str(out), synthetic_config())


def test_keeper_accumulator_is_bounded():
    fn = KeepSmallestId()
    acc = fn.create_accumulator()
    for i in range(100_000):
        acc = fn.add_input(acc, DocKey("h", f"d{i:06d}", f"s{i % 3}", "split", i, 0, 19))
    assert len(pickle.dumps(acc)) < 300  # one document and three counts, no member list
    assert fn.extract_output(acc)[0].id == "d000000" and fn.extract_output(acc)[2] is None


def test_20k_exact_duplicates_are_counted_and_listed(tmp_path):
    model = tmp_path / "t.model"
    model.write_bytes(train_sentencepiece(["the same small text and another one"] * 50, TokenizerConfig(vocab_size=300)))
    copies = 20_000  # a hot key (over 64 copies: listed by reading the split records again), 300x over
    lines = [json.dumps({"id": f"d{i:06d}", "text": "The same  small text." if i % 2 else "the same small TEXT.",
                         "source": "copies"}) for i in range(copies)]
    lines += [json.dumps({"id": f"u{i}", "text": f"unique text number {i}", "source": "unique"}) for i in range(3)]
    lines += [json.dumps({"id": f"z{i}", "text": "a pair of twins", "source": "unique"}) for i in range(2)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    cfg = synthetic_config()
    cfg.tokenizer.path = str(model)
    stats = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg)
    t = stats["total"]
    assert (t["input_records"], t["kept"], t["duplicates"], t["balanced"]) == (copies + 5, 5, copies - 1 + 1, True)
    assert stats["sources"]["copies"]["duplicates"] == copies - 1
    listed = [json.loads(line) for p in (tmp_path / "out" / "duplicates").iterdir() for line in open(p)]
    assert len(listed) == copies
    hot = [d for d in listed if d["source"] == "copies"]
    assert {d["duplicate_of"] for d in hot} == {"in.jsonl/d000000"} and len({d["id"] for d in hot}) == copies - 1
    assert [d for d in listed if d["source"] == "unique"] == [
        {"duplicate_of": "in.jsonl/z0", "id": "in.jsonl/z1", "kind": "exact", "source": "unique"}]
    report = (tmp_path / "out" / "report.txt").read_text()
    assert "duplicate rate" in report and "100.0%" in report.split("duplicate rate")[1].split("\n")[0]
    assert (tmp_path / "out" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_hot_lsh_bucket_drops_all_but_its_smallest_id(tmp_path):
    model = tmp_path / "t.model"
    model.write_bytes(train_sentencepiece(["the river ran past old stone walls"] * 50, TokenizerConfig(vocab_size=300)))
    words = "the river ran past old stone walls and into a quiet valley where farmers grew wheat".split()
    base = " ".join(words[i % len(words)] for i in range(300))
    lines = [json.dumps({"id": f"n{i:03d}", "text": f"{base} variant {i}"}) for i in range(100)]  # > 64 per bucket
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    cfg = synthetic_config()
    cfg.tokenizer.path, cfg.dedup.near = str(model), True
    stats = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), cfg)
    assert stats["total"]["filtered"] == {"near_duplicate": 99} and stats["total"]["kept"] == 1
    listed = [json.loads(line) for p in (tmp_path / "out" / "duplicates").iterdir() for line in open(p)]
    assert len(listed) == 99 and {d["kind"] for d in listed} == {"near"}
    assert all(d["duplicate_of"] < d["id"] for d in listed)  # always a smaller id, i.e. a bucket keeper
    assert sum(d["duplicate_of"] == "in.jsonl/n000" for d in listed) > 90  # most share a (hot) bucket with n000
