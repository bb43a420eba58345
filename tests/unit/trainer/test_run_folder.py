"""Re-running a training command into its run folder resumes, refuses or (when asked) overwrites;
it never restarts silently, never replaces a finished checkpoint, never logs a step twice. Plus the
command line's one-line errors and exit codes (2 config, 1 data, 130 Ctrl-C) and ``--dry-run``."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from trainer.config import TrainConfig
from trainer.run.announce import start_line
from trainer.run.folder import RunFolderError, RunPlan, plan_run, remove_earlier_run, truncate_metrics
from tests.support.data import write_counting_shards
from tests.support.faults import fault_hooks
from tests.support.paths import REPO

ROOT = str(REPO)
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)


def _fake_checkpoint(root: str, step: int, model: dict, kind: str = "full") -> str:
    path = os.path.join(root, f"{'step' if kind == 'full' else 'weights'}_{step:06d}")
    os.makedirs(path)
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"step": step, "kind": kind}, f)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        yaml.safe_dump({"model": model}, f)
    open(os.path.join(path, "COMPLETE"), "w").close()
    return path


def _cfg(tmp_path) -> TrainConfig:
    cfg = TrainConfig(run_dir=str(tmp_path / "run"))
    cfg.model.vocab_size = 64
    return cfg


def test_plan_resumes_compatible_refuses_otherwise(tmp_path):
    cfg = _cfg(tmp_path)
    assert plan_run(cfg).action == "fresh"
    root = os.path.join(cfg.run_dir, "checkpoints")
    model = {k: getattr(cfg.model, k) for k in cfg.model.__dataclass_fields__}
    _fake_checkpoint(root, 4, model)
    newest = _fake_checkpoint(root, 8, model)
    plan = plan_run(cfg)
    assert (plan.action, plan.checkpoint, plan.step) == ("resume", newest, 8)
    cfg.zero.stage, cfg.precision = 3, "bf16"  # DCP reshards: another stage/precision still resumes
    assert plan_run(cfg).step == 8
    cfg.model.d_model = 256
    with pytest.raises(RunFolderError, match=r"model.d_model=128 \(now 256\)"):
        plan_run(cfg)
    cfg.checkpoint.overwrite = True
    assert plan_run(cfg).action == "overwrite"


def test_earlier_output_without_checkpoint_is_refused_then_overwritten(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    os.makedirs(cfg.run_dir)
    for name in ("metrics.jsonl", "train_summary.json", "notes.txt"):
        open(os.path.join(cfg.run_dir, name), "w").close()
    _fake_checkpoint(os.path.join(cfg.run_dir, "checkpoints"), 2, {}, kind="weights")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.raises(RunFolderError, match="no finished checkpoint to resume from"):
        plan_run(cfg)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the same job restarted before its first save
    assert plan_run(cfg).action == "fresh"
    remove_earlier_run(cfg)
    assert sorted(os.listdir(cfg.run_dir)) == ["notes.txt"]


def test_truncate_metrics_drops_steps_after_the_checkpoint(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 3, 6, 9, 12))
    assert truncate_metrics(path, 6) == 2
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 3, 6]
    assert truncate_metrics(str(tmp_path / "absent.jsonl"), 0) == 0


def test_truncate_metrics_drops_a_record_cut_short(tmp_path):
    """Issue 37: a run killed or out of space while it wrote a record left half a line, and the resume
    ended in a JSONDecodeError; the cut record is dropped with the undone steps."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 3)) + '{"step": 6, "lo')
    assert truncate_metrics(str(path), 6) == 1
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 3]


def _train(args, tmp_path, **kw):
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=str(tmp_path), env=ENV,
                          capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture
def common(tmp_path):
    shards = str(tmp_path / "shards")
    write_counting_shards(shards, 60, max_samples=30, vocab=64, max_len=40, seed=0)
    return ["--config", os.path.join(ROOT, "configs", "demo.yaml"), f"data.manifest={shards}",
            f"cache.dir={tmp_path / 'cache'}", f"run_dir={tmp_path / 'run'}", "model.d_model=32",
            "model.n_layers=1", "model.n_heads=2", "data.seq_len=32", "data.micro_batch_size=2",
            "data.num_workers=0", "metrics.progress=false", "log_every=2", "checkpoint.every=2",
            "metrics.tensorboard_dir=''", "device=cpu", "eval.enabled=false"]  # these shards hold no val split


def _mark_tokenizer(shards: str, sha: str) -> None:
    from shards import Manifest
    from shards.format.manifest import TokenizerIdentity
    m = Manifest.load(shards)
    m.tokenizer_identity = TokenizerIdentity(kind="hf", sha256=sha, eos_id=0)
    m.save(shards)


def _steps(tmp_path) -> list[int]:
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        return [json.loads(line)["step"] for line in f]


def test_rerun_resumes_never_restarts_and_logs_each_step_once(tmp_path, common):
    _mark_tokenizer(str(tmp_path / "shards"), "a" * 64)
    first = _train(common + ["steps=4"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "data: 2 shards, 60 documents" in first.stdout and "world size 1, ZeRO stage 2; new run" in first.stdout
    final = tmp_path / "run" / "checkpoints" / "step_000004"
    assert json.loads((final / "meta.json").read_text())["tokenizer"] == {"kind": "hf", "sha256": "a" * 64}
    created = json.loads((final / "meta.json").read_text())["created_utc"]
    again = _train(common + ["steps=4"], tmp_path)  # up-arrow, Enter: the finished run stays as it is
    assert again.returncode == 0 and "resumed from step 4" in again.stdout and "nothing to train" in again.stdout
    assert json.loads((final / "meta.json").read_text())["created_utc"] == created
    assert _steps(tmp_path) == [1, 2, 4]
    # a crashed longer run logged steps 5..6 past its last checkpoint: the rerun drops and re-logs them
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5}) + "\n" + json.dumps({"step": 6}) + "\n")
    longer = _train(common + ["steps=6"], tmp_path)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "resumed from step 4" in longer.stdout
    assert _steps(tmp_path) == [1, 2, 4, 5, 6]
    dry = _train(common + ["steps=6", "--dry-run"], tmp_path)
    assert dry.returncode == 0 and "would resume from step 6" in dry.stdout and "nothing was trained" in dry.stdout
    ckpt6 = tmp_path / "run" / "checkpoints" / "step_000006"
    data = next(f for f in os.listdir(ckpt6) if f.endswith(".distcp"))
    os.rename(ckpt6 / data, tmp_path / "saved.distcp")
    (ckpt6 / data).write_bytes(b"damaged")
    damaged = _train(common + ["steps=6", "--dry-run"], tmp_path)
    assert damaged.returncode == 1 and "do not load" in damaged.stderr and data in damaged.stderr, damaged.stderr
    os.replace(tmp_path / "saved.distcp", ckpt6 / data)
    other = _train(common + ["steps=6", "model.d_model=64"], tmp_path)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert other.stderr.strip().count("\n") == 0 and "model.d_model=32 (now 64)" in other.stderr
    _mark_tokenizer(str(tmp_path / "shards"), "b" * 64)  # the same documents, re-tokenized by another tokenizer
    for extra in ([], ["--dry-run"]):
        retokenized = _train(common + ["steps=8", *extra], tmp_path)
        assert retokenized.returncode == 2 and retokenized.stderr.strip().count("\n") == 0, retokenized.stderr[-3000:]
        assert ("step_000006 was trained on data tokenized by a hf tokenizer (sha256 aaaaaaaaaaaa), but data.manifest's "
                "shards were tokenized by a hf tokenizer (sha256 bbbbbbbbbbbb)") in retokenized.stderr
    fresh = _train(common + ["steps=2", "model.d_model=64", "checkpoint.overwrite=true"], tmp_path)
    assert fresh.returncode == 0 and "new run (earlier run in run_dir removed" in fresh.stdout
    assert _steps(tmp_path) == [1, 2]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["step_000002"]


def test_cli_errors_are_one_line_with_the_exit_code_convention(tmp_path, common):
    bare = _train([], tmp_path)
    assert bare.returncode == 2 and "usage: python -m trainer" in bare.stderr and not os.path.exists(tmp_path / "runs")
    typo = _train(common + ["zero.stagee=2", "--nproc-per-node", "2"], tmp_path)
    assert typo.returncode == 2 and typo.stderr.strip().count("\n") == 0
    assert "did you mean 'zero.stage'?" in typo.stderr
    missing = _train(common + ["data.manifest=http://127.0.0.1:9/manifest.json"], tmp_path)
    assert missing.returncode == 1 and missing.stderr.strip().count("\n") == 0, missing.stderr
    loaders = subprocess.run([sys.executable, "-m", "loaders", "keys", "--shards", "http://127.0.0.1:9/x"],
                             cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert loaders.returncode == 1, loaders.stderr  # the same missing data exits 1 everywhere
    for cli in (["shards", "inspect", str(tmp_path / "absent.tar")],
                ["cache", "--dir", str(tmp_path / "c"), "warm", "http://127.0.0.1:9/manifest.json"]):
        p = subprocess.run([sys.executable, "-m", *cli], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, (cli, p.returncode, p.stderr)


def test_torchrun_ranks_report_a_refusal_once_with_exit_2(tmp_path, common):
    os.makedirs(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    p = _train(common + ["steps=2", "--nproc-per-node", "2"], tmp_path)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no finished checkpoint to resume from" in lines[0], p.stderr[-3000:]


def test_ctrl_c_ends_in_one_line_with_exit_130(tmp_path, common):
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *common, "steps=100000"], cwd=str(tmp_path),
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not os.path.exists(tmp_path / "run" / "metrics.jsonl") and time.time() < deadline:
        time.sleep(0.2)
    # stopped, the run is still live and holds its run-folder lock (a kernel lock of its process), but no
    # longer trains through the two launches below: it burnt a core for nothing while they started up
    proc.send_signal(signal.SIGSTOP)
    # issue 37: a second launch into the live run folder trained into it at once; now it is refused
    second = _train(common + ["steps=100000"], tmp_path)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 2 and len(lines) == 1, second.stderr[-3000:]
    assert f"is in use by a live run (pid {proc.pid})" in lines[0], lines
    dry = _train(common + ["--dry-run"], tmp_path)  # and a dry run says so (it said: use checkpoint.overwrite=true)
    lines = [line for line in dry.stderr.splitlines() if line.strip()]
    assert dry.returncode == 2 and len(lines) == 1 and f"is in use by a live run (pid {proc.pid})" in lines[0], lines
    proc.send_signal(signal.SIGCONT)  # training again when Ctrl-C comes
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert [line for line in err.splitlines() if line.strip()] == [line for line in err.splitlines()
                                                                    if "interrupted" in line], err[-3000:]
    from trainer.checkpointing.layout import latest_checkpoint
    if latest_checkpoint(str(tmp_path / "run" / "checkpoints")) is None:  # the advice matches what is on disk
        assert "nothing to resume; run again with checkpoint.overwrite=true" in err, err[-3000:]
    else:
        assert "run the same command again to resume" in err, err[-3000:]


def test_interrupt_advice_without_and_with_a_checkpoint(tmp_path):
    """Ctrl-C before the first checkpoint must not advise a resume that the next run refuses."""
    from trainer.run.cli import interrupt_advice
    cfg = TrainConfig(run_dir=str(tmp_path))
    assert "nothing to resume; run again with checkpoint.overwrite=true" in interrupt_advice(cfg)
    from trainer.checkpointing.layout import COMPLETE, step_dir
    from trainer.run.folder import checkpoint_root
    os.makedirs(step_dir(checkpoint_root(cfg), 4))
    open(os.path.join(step_dir(checkpoint_root(cfg), 4), COMPLETE), "w").close()
    assert "resume from the last checkpoint" in interrupt_advice(cfg)


@pytest.mark.parametrize("nproc", [[], ["--nproc-per-node", "2"]])
def test_bad_steps_without_a_checkpoint_end_in_one_line_exit_1(tmp_path, common, nproc):
    p = _train(common + ["steps=3", "checkpoint.every=0", fault_hooks(nan_at_steps=[1, 2]),
                         "anomaly.max_consecutive=2", *nproc], tmp_path)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 1, p.stderr[-3000:]
    assert len(lines) == 1 and "bad steps in a row at step 2 and no checkpoint to roll back to" in lines[0], lines
    assert lines[0].startswith("error: run: ")


def test_start_line_counts_documents_of_token_blocks_not_tar_samples(tmp_path):
    from shards.format.manifest import Manifest, ShardInfo
    from trainer.run.announce import data_summary
    shards = [ShardInfo(name=f"shard-{i:06d}.tar", samples=30, tokens=1000, bytes=4096 * (i + 1), sha256="0" * 64,
                        documents=d, blocks=30) for i, d in enumerate((31000, 31319))]
    Manifest(shards=shards, layout="token_blocks").save(str(tmp_path))
    cfg = _cfg(tmp_path)
    cfg.data.manifest = str(tmp_path)
    data = data_summary(cfg.data)
    assert (data.shards, data.documents, data.tokens, data.largest_shard_bytes) == (2, 62319, 2000, 8192)
    assert "data: 2 shards, 62,319 documents, 2,000 tokens" in start_line(cfg, data, 1, RunPlan("fresh"))
    one = dataclasses.replace(data, shards=1, documents=1, tokens=1)
    assert "data: 1 shard, 1 document, 1 token;" in start_line(cfg, one, 1, RunPlan("fresh"))  # said "1 shards"


def test_dry_run_fails_on_what_the_real_run_would_fail_on(tmp_path, common):
    tiny = _train(common + ["steps=2", "cache.max_bytes=100", "--dry-run"], tmp_path)
    assert tiny.returncode == 2 and tiny.stderr.strip().count("\n") == 0, tiny.stderr[-3000:]
    assert "cache.max_bytes=100" in tiny.stderr and "smaller than the largest shard" in tiny.stderr
    absent = str(tmp_path / "no-such-val")
    val = _train(common + ["steps=2", "eval.enabled=true", f"eval.manifest={absent}", "--dry-run"], tmp_path)
    assert val.returncode == 2 and val.stderr.strip().count("\n") == 0, val.stderr[-3000:]
    assert f"eval.manifest={absent}: no such manifest" in val.stderr
    assert not os.path.exists(tmp_path / "run")


def test_missing_config_file_is_a_usage_error(tmp_path):
    p = _train(["--config", str(tmp_path / "nope.yaml"), "steps=1"], tmp_path)
    assert p.returncode == 2 and p.stderr.strip() == f"error: config file not found: {tmp_path / 'nope.yaml'}"


def test_a_run_folder_of_an_older_trainer_resumes(tmp_path, common):
    """Runs written before step hooks hold ``anomaly.inject_*`` in config.json and config.yaml: a
    re-run resumes such a folder (only the checkpoint's model section is compared) and rewrites config.json."""
    first = _train(common + ["steps=2"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "run"
    inject = {"inject_nan_at_steps": [1], "inject_spike_at_steps": [], "inject_spike_factor": 1000.0,
              "inject_kill_at_step": 0, "inject_rank": -1, "inject_layer": ""}
    config = json.loads((run / "config.json").read_text())
    del config["hooks"]
    config["anomaly"].update(inject)
    (run / "config.json").write_text(json.dumps(config))
    saved_yaml = run / "checkpoints" / "step_000002" / "config.yaml"
    saved = yaml.safe_load(saved_yaml.read_text())
    del saved["hooks"]
    saved["anomaly"].update(inject)
    saved_yaml.write_text(yaml.safe_dump(saved, sort_keys=False))
    again = _train(common + ["steps=3"], tmp_path)
    assert again.returncode == 0 and "resumed from step 2" in again.stdout, again.stderr[-3000:]
    assert _steps(tmp_path) == [1, 2, 3]
    rewritten = json.loads((run / "config.json").read_text())
    assert rewritten["hooks"] == [] and not any(k.startswith("inject_") for k in rewritten["anomaly"])


def _file_size_limit(limit: int):
    """``preexec_fn`` capping the files the child writes at ``limit`` bytes (writes past it fail with
    EFBIG, as a full disk fails with ENOSPC; Python ignores the SIGXFSZ that would kill it)."""
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_checkpoint_that_cannot_be_written_ends_in_one_line_naming_the_folder(tmp_path, common):
    """Issue 37: a save that ran out of space ended in tracebacks whose only message was ``unexpected pos``."""
    p = _train(common + ["steps=2"], tmp_path, preexec_fn=_file_size_limit(150_000))  # shards 72 kB, checkpoint 280 kB
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
    assert f"checkpoint.dir={tmp_path / 'run' / 'checkpoints'}: saving step 2 failed:" in lines[0]
    assert ".step_000002.partial: File too large;" in lines[0] and "choose another folder" in lines[0]


def test_the_summary_line_counts_the_documents_of_skipped_shards(tmp_path, common):
    """Issue 37: a run that skipped a corrupt shard ended with a summary line that did not say so."""
    shard = tmp_path / "shards" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:5000])  # truncated: fails its size check in the cache
    p = _train(common + ["steps=2", "checkpoint.every=0", "cache.retries=0"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("trained 2 steps") and "skipped 30 unreadable document(s) of corrupt or missing shards" in last
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["skipped_documents"] == 30


def test_a_run_folder_that_cannot_be_written_ends_in_one_line_naming_the_file(tmp_path, common):
    """Issue 37: a write into the run folder that failed (here ``config.json``, the first file written)
    said ``error: data: ?: ...``: no file, and the wrong part blamed."""
    p = _train(common + ["steps=2"], tmp_path, preexec_fn=_file_size_limit(1000))
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith(f"error: run: {tmp_path / 'run' / 'config.json'}: File too large;"), lines
