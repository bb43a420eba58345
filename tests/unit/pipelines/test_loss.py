"""Issue 12: preprocessing never loses or corrupts a document the user gave it.

One real run (``mixed``) over a folder holding every kind of input that used to lose or corrupt
documents silently, then one test per kind; the command-line cases (unquoted glob, folder,
unwritable output, Ctrl-C, failed run) and ``s3://`` output run the real ``beam_runner``.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_runner
from pipelines.config import PipelineConfig, TokenizerConfig
from examples.demo.corpus import write_corpus
from pipelines.io.resume import WORK_DIR
from pipelines.job import run
from pipelines.records import Doc, qualify_id
from pipelines.stages.tokenize import SmallestHashSample, TokenizeFn, train_sentencepiece, trained_file
from shards import Manifest, iter_documents
from tests.support.paths import REPO
from tests.support.pipeline import SYNTHETIC, synthetic_config

ROOT = str(REPO)
CODE = ["std::vector<int> v; v.push_back(1);", "use std::io::Read;", "For example::\n\n   x = a[1::2]",
        "fe80::1 is link-local; ::1 is loopback; print(x[::2])"]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron sigma tau".split()


def _jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _samples(out) -> dict[str, dict]:
    return {s["json"]["id"]: s for info in Manifest.load(str(out)).shards for s in iter_documents(str(out / info.name))}


def _balanced(stats) -> bool:
    return all(e["balanced"] for e in [stats["total"], *stats["sources"].values()])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed")
    for name in ("a.jsonl", "b.jsonl", "sub/a.jsonl"):  # ids "0".."29" in every file, distinct texts
        _jsonl(d / name, [{"id": str(i), "text": f"{name} record {i}: {WORDS[i % 14]} {WORDS[(i * 5) % 14]}"}
                          for i in range(30)] + [{"id": "dup", "text": "The very same text in every file."}])
    for folder in ("x", "y"):  # id-less files sharing a stem in two folders
        (d / folder).mkdir()
        (d / folder / "notes.txt").write_text(f"Note one from {folder}.\n\nNote two from {folder}.\n")
    _jsonl(d / "rep.jsonl", [{"id": "r", "text": "first text under r"}, {"id": "r", "text": "second text under r"}])
    (d / "README.md").write_text("# Read me\n\nNot a training document.\n")
    (d / "table.csv").write_text("a,b\n1,2\n")
    (d / "meta.json").write_text('{"name": "not json lines"}\n')
    (d / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"id": "b1", "text": "after the byte-order mark"}\n')
    (d / "bad.jsonl").write_text('{"id": "ok", "text": "fine"}\n{"id": "\\udc80", "text": "lone surrogate id"}\n'
                                 '{"id": "s", "text": "lone surrogate source", "source": "x\\udc80"}\n')
    _jsonl(d / "invisible.jsonl", [{"id": "z", "text": "\u200b\u2060\u00ad \ufeff\u200d"}])
    _jsonl(d / "code.jsonl", [{"id": f"c{i}", "text": t} for i, t in enumerate(CODE)]
           + [{"id": "pii", "text": "Mail jane.doe@example.com from 203.0.113.9 or 2001:db8:85a3::8a2e:370:7334."}])
    cut = zstandard.ZstdCompressor().compress(b"".join(
        b'{"id": "t%d", "text": "line %d of a zstd file cut short"}\n' % (i, i) for i in range(20000)))
    (d / "cut.jsonl.zst").write_bytes(cut[: len(cut) // 2])
    # issue 37: a linked folder, a broken link, a folder named with glob characters, lone-CR text
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    _jsonl(elsewhere / "far.jsonl", [{"id": "f", "text": "read through a linked folder"}])
    (d / "linked").symlink_to(elsewhere)
    (d / "gone.jsonl").symlink_to(elsewhere / "missing.jsonl")
    _jsonl(d / "odd [v2] (x)" / "o.jsonl", [{"id": "o", "text": "in a folder named like a glob"}])
    (d / "mac.txt").write_bytes(b"Old Mac text, one.\r\rOld Mac text, two.\r")
    out = tmp_path_factory.mktemp("out")
    rc = beam_runner.main(["--input", f"{d}/**", "--output", str(out), "tokenizer.vocab_size=400",
                           "shards.num_shards=2", "shards.store_text=true", *SYNTHETIC])
    assert rc == 0
    return d, out, json.loads((out / "stats.json").read_text())


def test_ids_colliding_across_files_and_within_a_file_are_all_kept(mixed):
    _, out, stats = mixed
    samples = _samples(out)
    for prefix in ("a.jsonl", "b.jsonl", "sub/a.jsonl"):
        assert {f"{prefix}/{i}" for i in range(30)} <= set(samples)
    assert {"x/notes.txt#00000001", "x/notes.txt#00000003", "y/notes.txt#00000001", "y/notes.txt#00000003"} <= set(samples)
    rep = sorted(samples[k]["txt"] for k in samples if k.startswith("rep.jsonl/r#"))
    assert rep == ["first text under r", "second text under r"]  # one id, two texts: both kept, ids disambiguated
    assert "duplicate_id" not in stats["total"]["filtered"]
    listed = [json.loads(line) for p in (out / "duplicates").iterdir() for line in p.read_text().splitlines()]
    assert sorted((r["id"], r["duplicate_of"]) for r in listed) == [
        ("b.jsonl/dup", "a.jsonl/dup"), ("sub/a.jsonl/dup", "a.jsonl/dup")]
    assert stats["total"]["duplicates"] == 2 and _balanced(stats)


def test_truncated_zstd_is_a_dead_letter_naming_file_and_position(mixed):
    _, out, stats = mixed
    cut = stats["sources"]["cut"]
    assert cut["dead_letter_reasons"] == {"unreadable_file": 1} and 0 < cut["kept"] < 20000
    letters = [json.loads(line) for p in (out / "dead_letter").iterdir() for line in p.read_text().splitlines()]
    dead = next(r for r in letters if r["reason"] == "unreadable_file")
    assert dead["file"].endswith("cut.jsonl.zst") and dead["offset"] > 0
    assert f"reading stopped at byte {dead['offset']}" in dead["error"] and "compressed bytes" in dead["error"]
    assert "EOFError" in dead["error"]


def test_stray_files_are_skipped_counted_and_warned(mixed, tmp_path, capsys):
    d, out, stats = mixed
    assert stats["total"]["skipped_files"] == 3
    assert not [k for k in _samples(out) if k.startswith(("README", "table", "meta"))]
    assert "skipped files" in (out / "report.txt").read_text()
    rc = beam_runner.main(["--input", f"{d}/*", "--output", str(tmp_path / "o"), "input.unknown_files=error"])
    err = capsys.readouterr().err
    assert rc == 2 and "3 input files have no known format" in err and "README.md" in err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_links_odd_names_and_lone_cr_are_read_or_counted(mixed):
    _, out, stats = mixed
    samples = _samples(out)
    assert samples["linked/far.jsonl/f"]["txt"] == "read through a linked folder"
    assert samples["odd [v2] (x)/o.jsonl/o"]["txt"] == "in a folder named like a glob"
    assert {"mac.txt#00000001", "mac.txt#00000003"} <= set(samples)  # two paragraphs, not one
    assert stats["total"]["skipped_links"] == 1 and "skipped links" in (out / "report.txt").read_text()


def test_invisible_only_document_is_filtered_not_kept(mixed):
    _, out, stats = mixed
    assert stats["sources"]["invisible"]["filtered"] == {"empty": 1} and stats["sources"]["invisible"]["kept"] == 0
    assert all(s["json"]["n_tokens"] > 0 for s in _samples(out).values())


def test_a_document_without_tokens_is_filtered_not_written():
    model = trained_file(["the river ran past old stone walls"] * 50, TokenizerConfig(vocab_size=300))
    fn = TokenizeFn(TokenizerConfig())
    fn.setup()
    fn.start_bundle()
    (batch,) = fn.process([Doc("a", "\u200b", "s"), Doc("b", "river", "s")], model)
    assert [d.id for d, _ in batch] == ["b"]  # the normaliser leaves nothing of "\u200b"
    assert [e.value.value for e in fn.finish_bundle()] == [(("s", "filtered:no_tokens"), 1)]


def test_tokenize_holds_token_lists_for_a_slice_of_the_batch_not_all_of_it():
    """A batch's token lists as Python ints are about 20x its arrays; they are made ENCODE_DOCS documents at a time."""
    import tracemalloc

    model = trained_file(["the river ran past old stone walls"] * 50, TokenizerConfig(vocab_size=300))
    docs = [Doc(f"d{i}", "the river ran past old stone walls " * 40 + str(i), "s") for i in range(1024)]
    fn = TokenizeFn(TokenizerConfig())
    fn.setup()
    fn.start_bundle()
    fn.process(docs[:1], model).__next__()  # the processor is built outside the measurement
    tracemalloc.start()
    (batch,) = fn.process(docs, model)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = sum(t.nbytes for _, t in batch)
    assert len(batch) == 1024 and kept > 200_000
    assert peak < 4 * kept, (peak, kept)  # all 1024 documents' lists at once: about 19x


def test_code_is_not_rewritten_and_redactions_are_reported_per_source(mixed):
    _, out, stats = mixed
    texts = sorted(s["txt"] for s in _samples(out).values() if s["json"]["source"] == "code")
    assert texts == sorted(CODE + ["Mail <EMAIL> from <IP> or <IP>."])
    assert stats["sources"]["code"]["redactions"] == {"email": 1, "ip": 2}
    report = (out / "report.txt").read_text()
    assert "PII redactions by source:" in report and "code" in report.split("PII redactions by source:")[1]


def test_the_report_names_the_folders_that_hold_dead_letters_and_duplicates(mixed):
    _, out, stats = mixed
    lines = {line.split()[0] + " " + line.split()[1]: line for line in (out / "report.txt").read_text().splitlines()
             if line.startswith(("dead letters", "exact duplicates"))}
    t = stats["total"]
    assert t["dead_letter"] > 0 and t["duplicates"] > 0
    assert lines["dead letters"].endswith("(the records: dead_letter/)")
    assert lines["exact duplicates"].endswith("(listed in duplicates/)")
    listed = sum(len(p.read_text().splitlines()) for p in (out / "duplicates").iterdir())
    assert listed == t["duplicates"]
    dead = sum(len(p.read_text().splitlines()) for p in (out / "dead_letter").iterdir())
    assert dead == t["dead_letter"]


def test_bom_and_lone_surrogates(mixed):
    _, out, stats = mixed
    assert stats["sources"]["bom"]["dead_letter"] == 0 and stats["sources"]["bom"]["kept"] == 1
    assert _samples(out)["bom.jsonl/b1"]["txt"] == "after the byte-order mark"
    assert stats["sources"]["bad"]["dead_letter_reasons"] == {"lone_surrogate": 2}
    assert stats["sources"]["bad"]["kept"] == 1 and _balanced(stats)


def test_long_one_line_documents_reach_tokenizer_training():
    long_doc = " ".join(f"{WORDS[i % 14]}{i % 97}" for i in range(3000))  # about 24 KB on one line
    model = train_sentencepiece([long_doc], TokenizerConfig(vocab_size=300))
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    assert sp.get_piece_size() == 300 and sp.decode(sp.encode(long_doc)) == long_doc


def test_tiny_corpus_sample_is_never_empty(tmp_path, capsys):
    fn = SmallestHashSample(1000, fraction=1e-12)  # no hash falls under the fraction
    acc = fn.add_input(fn.add_input(fn.create_accumulator(), ("ff" * 16, "b text")), ("ee" * 16, "a text"))
    assert fn.extract_output(acc) == ["a text", "b text"]
    _jsonl(tmp_path / "in.jsonl", [{"id": str(i), "text": f"tiny corpus line {i} {WORDS[i]}"} for i in range(5)])
    stats = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), _tiny_config(sample_fraction=1e-12))
    assert stats["total"]["kept"] == 5 and _balanced(stats)
    _jsonl(tmp_path / "bad.jsonl", [{"id": "1", "body": "no text field"}])
    rc = beam_runner.main(["--input", str(tmp_path / "bad.jsonl"), "--output", str(tmp_path / "out2")])
    err = capsys.readouterr().err
    assert rc == 1 and "no document reached the tokenizer" in err and "survived cleaning" not in err


def _tiny_config(**tokenizer) -> PipelineConfig:
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size = 300
    for k, v in tokenizer.items():
        setattr(cfg.tokenizer, k, v)
    return cfg


def test_unquoted_glob_and_folder_input_are_usage_errors(tmp_path, capsys):
    for name in ("a.jsonl", "b.jsonl"):
        _jsonl(tmp_path / name, [{"id": "1", "text": "x"}])
    with pytest.raises(SystemExit) as exit_info:  # what the shell makes of --input /dir/*.jsonl
        beam_runner.main(["--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "b.jsonl" in err and "quote the --input glob" in err
    rc = beam_runner.main(["--input", str(tmp_path), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "is a folder" in err and f"'{tmp_path}/*.jsonl'" in err and "Traceback" not in err


def test_unwritable_output_blames_output_not_input(tmp_path, capsys):
    _jsonl(tmp_path / "in.jsonl", [{"id": "1", "text": "x"}])
    (tmp_path / "file").write_text("a regular file where a folder should be")
    rc = beam_runner.main(["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "file" / "out")])
    err = capsys.readouterr().err
    assert rc == 1 and "--output" in err and "check --input" not in err and "Traceback" not in err


def test_failed_run_cleans_up_so_the_rerun_needs_no_overwrite(tmp_path):
    _jsonl(tmp_path / "bad.jsonl", [{"id": "1", "body": "no text field"}] * 3)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="tokenizer sample is empty"):
        run(str(tmp_path / "bad.jsonl"), str(out), _tiny_config())
    assert not out.exists()  # no beam-temp-*, dead_letter/, _tmp_buckets/, .work/, nor the empty folder left behind
    _jsonl(tmp_path / "good.jsonl", [{"id": str(i), "text": f"good line {i} {WORDS[i]}"} for i in range(5)])
    assert run(str(tmp_path / "good.jsonl"), str(out), _tiny_config())["total"]["kept"] == 5


def test_ctrl_c_exits_130_with_one_line_and_no_leftovers(tmp_path):
    write_corpus(str(tmp_path / "in"), limit_per_source=400)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "beam_runner.py", "--input", str(tmp_path / "in" / "*.jsonl"),
                             "--output", str(out), "tokenizer.vocab_size=500", "shards.num_shards=8", *SYNTHETIC],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "_tmp_buckets").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.rstrip().splitlines()[-1].startswith("interrupted; removed this run's partial output")
    assert [p.name for p in out.iterdir()] == [WORK_DIR]  # nothing but the finished input splits, for --resume


def test_output_to_s3(s3_server, tmp_path):
    import s3fs

    _, opts = s3_server
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("loss-bucket")
    _jsonl(tmp_path / "in.jsonl", [{"id": str(i), "text": f"clean record {i} {WORDS[i % 14]}"} for i in range(40)])
    rc = subprocess.run([sys.executable, "beam_runner.py", "--input", str(tmp_path / "in.jsonl"),
                         "--output", "s3://loss-bucket/run1", "tokenizer.vocab_size=300", *SYNTHETIC],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr
    fs.invalidate_cache()
    manifest = json.loads(fs.cat("loss-bucket/run1/manifest.json"))
    stats = json.loads(fs.cat("loss-bucket/run1/stats.json"))
    assert stats["total"]["kept"] == 40 and _balanced(stats) and not fs.exists("loss-bucket/run1/dead_letter")
    assert sum(s["documents"] for s in manifest["shards"]) == 40 and manifest["layout"] == "token_blocks"
    assert all(fs.exists(f"loss-bucket/run1/{s['name']}") for s in manifest["shards"])
    fs.put(str(tmp_path / "in.jsonl"), "loss-bucket/raw/in.jsonl")  # s3:// input too (Beam's S3 filesystem)
    rc = subprocess.run([sys.executable, "beam_runner.py", "--input", "s3://loss-bucket/raw/*.jsonl",
                         "--output", "s3://loss-bucket/run2", "tokenizer.vocab_size=300", *SYNTHETIC],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr
    fs.invalidate_cache()
    assert json.loads(fs.cat("loss-bucket/run2/stats.json"))["sources"]["in"]["kept"] == 40


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.text("ab/#%", min_size=1, max_size=3).filter(lambda s: "/" not in s),
                                   min_size=1, max_size=3),
                          st.one_of(st.none(), st.text("ab/#%0", min_size=1, max_size=4))), max_size=20))
def test_qualified_ids_are_unique_by_construction(entries):
    files = {"/".join(parts) for parts, _ in entries}
    # a valid file tree: no file is also a folder on another file's path
    files = {f for f in files if not any(g.startswith(f + "/") for g in files)}
    seen: dict[str, tuple] = {}
    for parts, doc_id in entries:
        name = "/".join(parts)
        if name not in files:
            continue
        for position in ("00000001", "@000000000007"):
            key = qualify_id(name, doc_id, position)
            origin = (name, doc_id, position if doc_id is None else "")
            assert seen.setdefault(key, origin) == origin


def test_an_override_without_a_value_is_named_as_such(tmp_path, capsys):
    """``tokenizer.vocab_size`` (no ``=VALUE``) used to get the unquoted-glob hint."""
    _jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "x"}])
    with pytest.raises(SystemExit) as exit_info:
        beam_runner.main(["--input", str(tmp_path / "*.jsonl"), "--output", str(tmp_path / "o"), "tokenizer.vocab_size"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "tokenizer.vocab_size: an override needs a value: tokenizer.vocab_size=VALUE" in err
    assert "quote the --input glob" not in err


def test_a_missing_config_file_is_exit_2_naming_the_flag(tmp_path, capsys):
    _jsonl(tmp_path / "a.jsonl", [{"id": "1", "text": "x"}])
    rc = beam_runner.main(["--input", str(tmp_path / "*.jsonl"), "--output", str(tmp_path / "o"),
                           "--config", str(tmp_path / "nonexist.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--config {tmp_path / 'nonexist.yaml'}: no such file" in err and "Errno" not in err
