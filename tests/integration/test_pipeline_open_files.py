"""Open file handles with many tiny shards: the preprocessing job writes more shards than its
process may hold open files (``RLIMIT_NOFILE`` lowered in a child process), so no stage (shard
writer, sha256, DALI index, commit) may keep one handle per shard. The loader reading them is
checked the same way: it keeps every shard of a shuffle block open, which must not cost a
descriptor per (tiny) shard."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.support.paths import REPO

ROOT = str(REPO)
NOFILE = 100  # soft limit of the child: well above what the job needs at once (8), below its shard count

_JOB = """
import json, resource, sys
from pipelines.job import run
from tests.support.pipeline import synthetic_config

resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
cfg = synthetic_config()
cfg.tokenizer.vocab_size = 300
cfg.shards.num_shards = 400  # about 250 buckets are filled by 400 documents
cfg.shards.write_index = True
stats = run(sys.argv[1], sys.argv[2], cfg, report=False)
print(json.dumps({"shards": stats["shards"], "kept": stats["total"]["kept"]}))
"""

_LOADER = """
import resource, sys
from loaders.rank.loader import build_text_loader
from loaders.config import DataConfig

resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
loader = build_text_loader(DataConfig(manifest=sys.argv[1], seq_len=16, micro_batch_size=4, num_workers=0),
                           in_process=True)
print(sum(1 for _ in loader))
"""


def _python(code: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    (d / "in.jsonl").write_text("".join(
        json.dumps({"id": f"d{i}", "text": f"document {i}: " + " ".join(words[(i + k) % 8] for k in range(6))}) + "\n"
        for i in range(400)))
    p = _python(_JOB, d / "in.jsonl", d / "out", NOFILE)
    return d / "out", p


def test_a_job_writes_more_shards_than_it_may_hold_open_files(tiny_shards):
    out, p = tiny_shards
    assert p.returncode == 0, p.stderr[-3000:]
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts["kept"] == 400 and counts["shards"] > 2 * NOFILE
    names = os.listdir(out)
    assert len([n for n in names if n.endswith(".tar")]) == counts["shards"]
    assert len([n for n in names if n.endswith(".idx")]) == counts["shards"]
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) == counts["shards"]


def test_the_loader_reads_more_shards_than_it_may_hold_open_files(tiny_shards):
    out, job = tiny_shards
    assert job.returncode == 0
    p = _python(_LOADER, out, NOFILE)
    assert p.returncode == 0 and "Too many open files" not in p.stderr, p.stderr[-3000:]
