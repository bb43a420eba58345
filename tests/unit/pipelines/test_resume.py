"""Issue 36, part 2: ``--resume`` reuses the finished input splits of a run killed mid-job (kill -9 of
the DirectRunner's process, or of the one Dask worker), reads only the others, and writes an output
byte-identical to an uninterrupted run's; another config or a changed input file is refused in one
line (exit 2). Faults and the count of splits read come from :mod:`tests.support.split_faults`."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import beam_runner
from examples.demo.corpus import write_corpus
from pipelines.io.resume import JOB_FILE, RECORD_SUFFIX, WORK_DIR
from tests.support.local_engines import child_env, start_dask, start_dask_worker
from tests.support.paths import REPO
from tests.support.pipeline import SYNTHETIC
from tests.support.split_faults import KILL_AFTER, READS
from tests.unit.pipelines.test_engines import digests

SETTINGS = ["tokenizer.vocab_size=500", "shards.num_shards=3", "input.split_bytes=100000", *SYNTHETIC]  # 15 splits


def _job(corpus: Path, out: Path, *extra: str, reads: Path | None = None, kill_after: int = 0,
         wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    """``beam_runner.py`` over ``corpus`` into ``out`` with :mod:`tests.support.split_faults` installed."""
    env = child_env(**{READS: str(reads or ""), KILL_AFTER: str(kill_after)})
    cmd = [sys.executable, "-m", "tests.support.split_faults", "--input", f"{corpus}/*.jsonl", "--output", str(out),
           *SETTINGS, *extra]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _recorded(out: Path) -> set[str]:
    """Split ids of the finished splits kept in ``out/.work/``."""
    return {p.name.split(".")[0] for p in (out / WORK_DIR).glob(f"*{RECORD_SUFFIX}")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The corpus, an uninterrupted run's output and the ids of every split it read."""
    corpus = tmp_path_factory.mktemp("corpus")
    write_corpus(str(corpus), limit_per_source=300)
    base = tmp_path_factory.mktemp("reference")
    done = _job(corpus, base / "out", reads=base / "reads")
    assert done.returncode == 0, done.stderr
    splits = _lines(base / "reads")
    assert len(splits) == len(set(splits)) == 15
    return corpus, digests(base / "out"), set(splits)


def _resume_and_check(reference, out: Path, killed: set[str], reads: Path, *extra: str) -> None:
    """Resume into ``out``: byte-identical to the reference, each split not in ``killed`` read once."""
    corpus, expected, splits = reference
    resumed = _job(corpus, out, "--resume", *extra, reads=reads)
    assert resumed.returncode == 0, resumed.stderr
    assert f"reusing {len(killed)} finished input splits" in resumed.stderr
    read = _lines(reads)
    assert sorted(read) == sorted(splits - killed)  # the finished ones were not read again, the others once
    assert digests(out) == expected  # shards, manifest, stats.json, tokenizer, reports; no .work/ left


def test_a_run_killed_after_some_splits_resumes_byte_identical(reference, tmp_path):
    corpus, _, splits = reference
    out = tmp_path / "out"
    killed = _job(corpus, out, kill_after=4)
    assert killed.returncode == -signal.SIGKILL
    recorded = _recorded(out)
    assert len(recorded) == 4 and recorded <= splits and not (out / "manifest.json").exists()
    (out / "_tmp_buckets").mkdir()  # what a kill while the shards were written leaves, removed by --resume
    (out / "_tmp_buckets" / "bucket-000000").write_bytes(b"partial")
    _resume_and_check(reference, out, recorded, tmp_path / "reads")


def test_a_dask_job_whose_worker_was_killed_resumes_byte_identical(reference, tmp_path):
    pytest.importorskip("distributed")
    corpus, _, splits = reference
    out, logs = tmp_path / "out", tmp_path / "logs"
    engine = start_dask(logs, workers=1, preload="tests.support.split_faults",
                        env=child_env(**{KILL_AFTER: "3", READS: ""}))
    try:
        dask = ["--runner=DaskRunner", f"--dask_client_address={engine.address}"]
        job = _job(corpus, out, *dask, wait=False)
        assert engine.procs[1].wait(timeout=300) == -signal.SIGKILL  # the worker killed itself after 3 splits
        job.send_signal(signal.SIGTERM)  # the job waits for a worker that never comes: stopped, as Slurm would
        _, err = job.communicate(timeout=120)
        assert job.returncode == 143, err
        assert err.strip().splitlines()[-1].endswith("(its finished input splits are kept for --resume)"), err
        recorded = _recorded(out)
        assert len(recorded) == 3 and recorded <= splits and (out / WORK_DIR / JOB_FILE).exists()
        reads = tmp_path / "reads"
        env = child_env(**{KILL_AFTER: "0", READS: str(reads)})
        engine.procs.append(start_dask_worker(engine.address, logs / "worker-new.log", env,
                                              preload="tests.support.split_faults"))
        _resume_and_check(reference, out, recorded, reads, *dask)
    finally:
        engine.stop()


@pytest.fixture
def unfinished(tmp_path):
    """A small corpus and a run over it killed after its first finished split."""
    corpus = tmp_path / "corpus"
    write_corpus(str(corpus), limit_per_source=60)
    out = tmp_path / "out"
    assert _job(corpus, out, kill_after=1).returncode == -signal.SIGKILL
    return corpus, out


def _refused(corpus: Path, out: Path, capsys, *extra: str) -> str:
    """Run ``--resume`` in this process; assert exit 2, one error line and ``out`` untouched; return the line."""
    before = digests(out)
    rc = beam_runner.main(["--input", f"{corpus}/*.jsonl", "--output", str(out), "--resume", *SETTINGS, *extra])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, errors
    assert digests(out) == before
    return errors[0]


def test_resume_refuses_another_config_or_a_changed_input_file_in_one_line(unfinished, capsys):
    corpus, out = unfinished
    line = _refused(corpus, out, capsys, "tokenizer.vocab_size=400")
    assert "config tokenizer.vocab_size was 500, now 400" in line and "without --resume to start over" in line
    line = _refused(corpus, out, capsys, "clean.min_chars=5")
    assert "config clean.min_chars was 1, now 5" in line
    with open(corpus / "kjv.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "new", "text": "A record added after the run was killed."}\n')
    line = _refused(corpus, out, capsys)
    assert f"input file {corpus}/kjv.jsonl changed" in line and "shakespeare" not in line
    (corpus / "more.jsonl").write_text('{"id": "1", "text": "another file"}\n')
    assert f"input file {corpus}/more.jsonl is new" in _refused(corpus, out, capsys)


def test_a_plain_rerun_refuses_partial_output_else_starts_over_and_resume_alone_is_a_fresh_run(unfinished, tmp_path,
                                                                                               capsys):
    corpus, out = unfinished
    (out / "_tmp_buckets").mkdir()  # what a kill while the shards were written leaves
    (out / "_tmp_buckets" / "bucket-000000").write_bytes(b"partial")
    plain = ["--input", f"{corpus}/*.jsonl", "--output", str(out), *SETTINGS]
    assert beam_runner.main(plain) == 2
    assert "--overwrite to replace it, --resume to reuse its finished input splits" in capsys.readouterr().err
    (out / "_tmp_buckets" / "bucket-000000").unlink()
    (out / "_tmp_buckets").rmdir()
    assert beam_runner.main(plain) == 0
    assert "starting over: removed the 1 finished input split of the unfinished run" in capsys.readouterr().err
    assert not (out / WORK_DIR).exists()
    fresh = tmp_path / "fresh"
    assert beam_runner.main(["--input", f"{corpus}/*.jsonl", "--output", str(fresh), "--resume", *SETTINGS]) == 0
    assert f"note: --resume: {fresh} holds no unfinished run; starting a fresh run" in capsys.readouterr().err
    assert digests(fresh) == digests(out)
