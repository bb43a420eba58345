"""Issue 15: ``--overwrite`` never loses the earlier run. A failed, interrupted (Ctrl-C) or killed
(``kill -9``) ``--overwrite`` run leaves the earlier, finished run byte for byte as it was (or, when
killed, in ``OUT/.previous-run/`` for the next run); it is replaced only when the new run succeeds.
Local folders, ``memory://`` and ``s3://`` (moto's server) outputs."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import fsspec
import pytest
from tests.unit.pipelines.test_loss import ROOT, WORDS, _jsonl, _tiny_config

from examples.demo.corpus import write_corpus
from pipelines.job import InputError, run
from pipelines.io.output import (BACKUP_DIR, BACKUP_DONE, OutputExistsError, abort_output, finish_output,
                              prepare_output)
from pipelines.io.resume import WORK_DIR
from shards import Manifest
from tests.support.pipeline import SYNTHETIC


def _snapshot(fs, root: str) -> dict[str, str]:
    """sha256 of every file under ``root`` (hidden ones too, but for the finished input splits a
    failed run keeps in ``.work/`` for ``--resume``), by path relative to it."""
    fs.invalidate_cache()
    found = {p[len(root.rstrip("/")) + 1:]: p for p in fs.find(root, withdirs=False)}
    return {name: hashlib.sha256(fs.cat_file(p)).hexdigest() for name, p in found.items()
            if not name.startswith(f"{WORK_DIR}/")}


def _local(out) -> dict[str, str]:
    return _snapshot(fsspec.filesystem("file"), str(out))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    _jsonl(d / "good.jsonl", [{"id": str(i), "text": f"good line {i} {WORDS[i % 14]} {WORDS[i * 3 % 14]}"}
                              for i in range(20)])
    _jsonl(d / "other.jsonl", [{"id": str(i), "text": f"other line {i} {WORDS[i * 5 % 14]}"} for i in range(7)])
    _jsonl(d / "notext.jsonl", [{"id": str(i), "body": "no text field"} for i in range(3)])
    (d / "blank.jsonl").write_text("  \n\n\t\n")
    return d


def _earlier_run(inputs, out):
    """A finished run into ``out`` plus a user's file there; returns the snapshot of ``out``."""
    run(str(inputs / "good.jsonl"), str(out), _tiny_config())
    (out / "notes.txt").write_text("the user's own notes\n")
    return _local(out)


@pytest.mark.parametrize("bad, error", [("notext.jsonl", "tokenizer sample is empty"),
                                        ("blank.jsonl", "no record was read")])
def test_a_failed_overwrite_run_leaves_the_earlier_run_byte_identical(inputs, tmp_path, bad, error):
    out = tmp_path / "out"
    before = _earlier_run(inputs, out)
    with pytest.raises((ValueError, InputError), match=error):
        run(str(inputs / bad), str(out), _tiny_config(), overwrite=True)
    assert _local(out) == before and not (out / BACKUP_DIR).exists()
    assert not (out / WORK_DIR).exists()  # a data error: --resume could not help, nothing is kept for it


def test_a_successful_overwrite_run_replaces_the_earlier_run_and_keeps_user_files(inputs, tmp_path):
    out = tmp_path / "out"
    _earlier_run(inputs, out)
    stats = run(str(inputs / "other.jsonl"), str(out), _tiny_config(), overwrite=True)
    assert stats["total"]["kept"] == 7 and Manifest.load(str(out)).total_documents == 7
    assert not (out / BACKUP_DIR).exists() and (out / "notes.txt").read_text() == "the user's own notes\n"


def test_a_killed_overwrite_run_leaves_the_earlier_run_for_the_next_run(inputs, tmp_path):
    out = tmp_path / "out"
    before = _earlier_run(inputs, out)
    prepare_output(str(out), "shard", overwrite=True)  # then killed (-9) while it wrote:
    (out / "_tmp_buckets").mkdir()
    (out / "_tmp_buckets" / "bucket-00000.tar").write_bytes(b"partial")
    (out / "stats.json").write_text("{}")
    assert Manifest.load(str(out / BACKUP_DIR)).total_documents == 20  # the earlier run, whole
    assert not (out / "manifest.json").exists()  # readers of OUT do not see it as OUT's dataset
    with pytest.raises(OutputExistsError, match=rf"kept in {out}/{BACKUP_DIR}/\. Pass --overwrite") as refused:
        run(str(inputs / "other.jsonl"), str(out), _tiny_config())
    assert "delete stats.json, _tmp_buckets from" in str(refused.value) and len(str(refused.value).splitlines()) == 1
    with pytest.raises(ValueError, match="tokenizer sample is empty"):  # fails too: the earlier run is back
        run(str(inputs / "notext.jsonl"), str(out), _tiny_config(), overwrite=True)
    assert _local(out) == before
    prepare_output(str(out), "shard", overwrite=True)  # killed again, before writing anything
    assert run(str(inputs / "other.jsonl"), str(out), _tiny_config(), overwrite=True)["total"]["kept"] == 7
    assert not (out / BACKUP_DIR).exists() and Manifest.load(str(out)).total_documents == 7


def test_a_move_aside_cut_short_is_moved_back_before_anything_else(inputs, tmp_path):
    out = tmp_path / "out"
    before = _earlier_run(inputs, out)
    (out / BACKUP_DIR).mkdir()  # killed part way through moving the earlier run aside: no mark yet
    for name in ("manifest.json", "shard-000000.tar"):
        os.rename(out / name, out / BACKUP_DIR / name)
    with pytest.raises(OutputExistsError, match="already holds a finished run"):
        prepare_output(str(out), "shard")
    assert _local(out) == before


def test_memory_output_keeps_the_earlier_run_until_finished():
    fs = fsspec.filesystem("memory")
    root, url = "/colaflow-overwrite", "memory://colaflow-overwrite"
    files = {"manifest.json": b"{}", "shard-000000.tar": b"tar", "dead_letter/part-00000.jsonl": b"{}\n",
             "notes.txt": b"mine"}
    for name, body in files.items():
        fs.pipe_file(f"{root}/{name}", body)
    before = _snapshot(fs, root)
    prepared = prepare_output(url, "shard", overwrite=True)
    assert prepared.backup and fs.exists(f"{root}/{BACKUP_DIR}/{BACKUP_DONE}")
    assert sorted(_snapshot(fs, root)) == sorted([f"{BACKUP_DIR}/{BACKUP_DONE}", "notes.txt"] + [
        f"{BACKUP_DIR}/{n}" for n in files if n != "notes.txt"])
    fs.pipe_file(f"{root}/shard-000000.tar", b"new, partial")
    abort_output(prepared)
    assert _snapshot(fs, root) == before
    prepared = prepare_output(url, "shard", overwrite=True)
    fs.pipe_file(f"{root}/manifest.json", b'{"new": 1}')
    finish_output(prepared)
    assert sorted(_snapshot(fs, root)) == ["manifest.json", "notes.txt"]
    fs.rm(root, recursive=True)


def test_s3_output_keeps_the_earlier_run_when_an_overwrite_run_fails(s3_server, inputs):
    import s3fs

    _, opts = s3_server
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("overwrite-bucket")
    url = "s3://overwrite-bucket/run"

    def cli(name: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "beam_runner.py", "--input", str(inputs / name), "--output", url,
                               "tokenizer.vocab_size=300", *SYNTHETIC, *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)

    assert cli("good.jsonl").returncode == 0
    fs.pipe_file("overwrite-bucket/run/notes.txt", b"mine")
    before = _snapshot(fs, "overwrite-bucket/run")
    failed = cli("notext.jsonl", "--overwrite")
    assert failed.returncode == 1 and "no document reached the tokenizer" in failed.stderr
    assert _snapshot(fs, "overwrite-bucket/run") == before
    replaced = cli("other.jsonl", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    after = _snapshot(fs, "overwrite-bucket/run")
    assert after["notes.txt"] == before["notes.txt"] and not any(p.startswith(BACKUP_DIR) for p in after)
    shards = json.loads(fs.cat_file("overwrite-bucket/run/manifest.json"))["shards"]
    assert sum(s["documents"] for s in shards) == 7


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "interrupted; "),
                                             (signal.SIGTERM, 143, "terminated; ")])
def test_a_signal_during_an_overwrite_run_puts_the_earlier_run_back(inputs, tmp_path, sig, code, line):
    """Ctrl-C, and SIGTERM (``timeout``, Slurm, ``docker stop``, Kubernetes) alike, while the new
    run writes: one line, exit 128 + signal, and the earlier run byte-identical."""
    out = tmp_path / "out"
    before = _earlier_run(inputs, out)
    write_corpus(str(tmp_path / "in"), limit_per_source=400)
    proc = subprocess.Popen([sys.executable, "beam_runner.py", "--input", str(tmp_path / "in" / "*.jsonl"),
                             "--output", str(out), "--overwrite", "tokenizer.vocab_size=500", "shards.num_shards=8",
                             *SYNTHETIC],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "_tmp_buckets").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert (out / BACKUP_DIR / "manifest.json").exists()  # set aside while the new run writes
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1].startswith(line), err
    assert _local(out) == before


@pytest.mark.parametrize("flag", ["--tokenizer", "--input"])
def test_overwrite_refuses_a_tokenizer_or_input_inside_the_earlier_run(inputs, tmp_path, capsys, flag):
    """--overwrite moves the earlier run aside before reading: a file inside it is refused up front."""
    import beam_runner

    out = tmp_path / "out"
    _earlier_run(inputs, out)
    (out / "dead_letter").mkdir(exist_ok=True)
    (out / "dead_letter" / "part-00000.jsonl").write_bytes((inputs / "good.jsonl").read_bytes())
    before = _local(out)
    args = {"--tokenizer": ["--input", str(inputs / "good.jsonl"), "--tokenizer", str(out / "tokenizer.model")],
            "--input": ["--input", str(out / "dead_letter" / "*.jsonl")]}[flag]
    assert beam_runner.main([*args, "--output", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {flag} "), err
    assert "--overwrite sets aside" in errors[0] and "copy the file" in errors[0], err
    assert _local(out) == before


def test_overwrite_with_another_prefix_removes_the_earlier_shards(inputs, tmp_path):
    """Issue 37: the earlier run's shards and indexes named with another shards.prefix went unseen."""
    from shards import ShardSequenceWriter, encode_text_sample
    from shards.io.index import build_shard_index, dali_index_path, write_dali_index
    import numpy as np

    out = tmp_path / "out"
    w = ShardSequenceWriter(str(out), prefix="old", max_samples=2)  # what a run with shards.prefix=old wrote
    for i in range(4):
        w.write(f"k{i}", encode_text_sample(np.arange(3, dtype=np.uint16), {"id": i}), tokens=3)
    shards = w.close()
    for info in shards:
        write_dali_index(build_shard_index(str(out / info.name)), dali_index_path(str(out / info.name)))
    Manifest(shards=shards).save(str(out))
    old = sorted(p.name for p in out.iterdir() if p.name.startswith("old-"))
    assert len(old) == 4 and any(n.endswith(".idx") for n in old)
    prepared = prepare_output(str(out), "shard", overwrite=True)
    assert not [p for p in out.iterdir() if p.name.startswith("old-")]
    finish_output(prepared)
    assert not (out / BACKUP_DIR).exists() and not list(out.iterdir())
