"""Usage and config errors of ``beam_runner``: one line naming the problem, exit code 2, and no
Beam traceback (a too-small vocabulary, a misspelled enum value, an out-of-range fraction, a
misspelled Beam option)."""
from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
import sys

import pytest

import beam_runner
from pipelines.config import PipelineConfig
from pipelines.runners.selection import beam_options
from colaflow.config import ConfigError, declared_checks
from tests.support.paths import REPO
from tests.support.pipeline import SYNTHETIC, synthetic_config

ROOT = str(REPO)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": f"Quick brown fox {i} jumps; zebra quartz {i * 7}!"})
                            + "\n" for i in range(30)))
    return path


def test_too_small_vocab_is_one_line_and_exit_2(corpus, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "beam_runner.py", "--input", str(corpus), "--output", str(tmp_path / "out"),
                        "tokenizer.vocab_size=20", *SYNTHETIC], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "ERROR" not in p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "needs tokenizer.vocab_size > " in errors[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("override, words", [
    ("input.unknown_files=eror", ["input.unknown_files", "'eror'", "skip, error, text"]),
    ("shards.layout=blocks", ["shards.layout", "'blocks'", "token_blocks, documents"]),
    ("split.val_fraction=1.5", ["split.val_fraction", "1.5", "[0.0, 1.0)"]),
    ("tokenizer.sample_fraction=0", ["tokenizer.sample_fraction", "(0.0, 1.0]"]),
    ("input.max_record_bytes=0", ["input.max_record_bytes=0", ">= 1"]),  # issue 37: ranges beside every field
    ("quality.gopher.max_words=10", ["quality.gopher.min_words=50", "max_words=10"]),  # and relations between fields
    ("shards.prefix=a/b", ["shards.prefix='a/b'", "matching [A-Za-z0-9][A-Za-z0-9._-]*"]),  # it names files: no folder
    ("shards.prefix=*", ["shards.prefix='*'"]),  # nor a glob (--overwrite sets aside {prefix}-*.tar)
])
def test_bad_config_values_are_refused_up_front(corpus, tmp_path, capsys, override, words):
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(corpus), "--output", str(out), override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert not out.exists()  # refused before the run touched the output


@pytest.mark.parametrize("overrides, words", [
    (["classifier.path=NOPE/q.bin"], ["classifier.path=", "q.bin: no such file", "give a fastText"]),
    (["quality.c4.bad_words=NOPE/w.txt"], ["quality.c4.bad_words=", "give a word list"]),
    (["quality.c4.bad_words=ldnoobw"], ["quality.c4.bad_words=ldnoobw: no such file and no named list",
                                        "one of better-profanity"]),
    (["decontam.eval_sets={mmlu: NOPE/*.jsonl}"], ["decontam evaluation set", "no file matches", "quoted glob"]),
])
def test_missing_curation_files_are_refused_up_front(corpus, tmp_path, capsys, overrides, words):
    out = tmp_path / "out"
    overrides = [o.replace("NOPE", str(tmp_path / "nope")) for o in overrides]
    assert beam_runner.main(["--input", str(corpus), "--output", str(out), *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and all(w in errors[0] for w in words) and "--input" not in errors[0], err
    assert not out.exists()  # refused before the run touched the output


def test_every_enum_knob_rejects_a_typo():
    choices = [key for key, check in declared_checks(PipelineConfig()).items() if check.choices]
    assert len(choices) == 13  # decontam.action, classifier.kind and input.warc's among them
    for key in choices:
        *sections, name = key.split(".")
        cfg = PipelineConfig()
        setattr(functools.reduce(getattr, sections, cfg), name, "typo")
        with pytest.raises(ConfigError, match=f"{key}='typo': use one of"):
            cfg.validate()
    PipelineConfig().validate()  # the defaults pass


@pytest.mark.parametrize("flag, named", [(["--runer=DataflowRunner"], "--runer"), (["--runnr", "DirectRunner"], "--runnr")])
def test_misspelled_beam_option_is_a_usage_error(corpus, tmp_path, capsys, flag, named):
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(corpus), "--output", str(out), *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"unknown option {named}:" in err and "did you mean --runner?" in err
    assert not out.exists()


def test_declared_beam_options_pass():
    options = beam_options(["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode",
                            "multi_processing"])
    assert options.get_all_options()["direct_num_workers"] == 2
    with pytest.raises(ConfigError, match="--no_such_flag"):
        beam_options(["--no_such_flag=1"])


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "beam_runner.py", *args, *SYNTHETIC], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr and "ERROR" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, p.stderr
    return errors[0]


def test_empty_input_files_are_one_line_and_exit_2(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(b"")
    p = _cli(["--input", str(tmp_path / "*.jsonl"), "--output", str(tmp_path / "out")])
    assert p.returncode == 2  # as for a glob that matches nothing: fix --input
    line = _one_error_line(p)
    assert "2 input files" in line and "empty" in line and "--input" in line
    assert not (tmp_path / "out").exists()


def test_input_with_no_usable_document_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"id": str(i), "body": "no text field"}) + "\n"
                                              for i in range(3)))
    p = _cli(["--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "out")])
    assert p.returncode == 1  # a data error: every record was dead-lettered
    assert "reading 1 file, " in p.stderr  # not "1 files"
    line = _one_error_line(p)
    assert "no document reached the tokenizer" in line
    assert "of 3 records read: 3 dead-lettered (missing_text: 3)" in line
    assert "while running" not in line and "Tokenizer/Train" not in line  # Beam's step name means nothing here
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_missing_tokenizer_file_is_a_usage_error_naming_the_flag(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "text": "some words here"}) + "\n")
    p = _cli(["--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "out"),
              "--tokenizer", str(tmp_path / "nope.model")])
    assert p.returncode == 2  # the command line names a file that is not there: fix the flag
    line = _one_error_line(p)
    assert "--tokenizer" in line and "nope.model" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("body, why", [(b"", "an empty file (0 bytes)"),
                                       (b"the river ran past old stone walls\n" * 3, "not a tokenizer colaflow reads")])
def test_a_tokenizer_file_that_is_no_sentencepiece_model_is_a_usage_error_naming_flag_and_file(tmp_path, capsys,
                                                                                                 body, why):
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "text": "some words here"}) + "\n")
    (tmp_path / "vocab.txt").write_bytes(body)
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(tmp_path / "c.jsonl"), "--output", str(out),
                             "--tokenizer", str(tmp_path / "vocab.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --tokenizer {tmp_path / 'vocab.txt'}: {why}; give a "
                          "sentencepiece .model, a Hugging Face tokenizer.json"), err
    assert "tiktoken rank file" in err, err
    assert not out.exists()


def test_an_unreachable_dask_scheduler_is_one_line_saying_what_to_start(tmp_path):
    from tests.support.local_engines import free_port

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "text": "some words here"}) + "\n")
    p = _cli(["--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "out"), "--runner=DaskRunner",
              f"--dask_client_address=127.0.0.1:{free_port()}", "--dask_connection_timeout=2"])
    assert p.returncode == 1
    line = _one_error_line(p)
    assert "no Dask scheduler answered" in line and "dask scheduler" in line and "--dask_client_address" in line


def test_input_files_with_no_record_are_one_line_naming_them_and_exit_2(tmp_path):
    """Whitespace-only JSONL and a gzip of nothing pass the 0-byte check but hold no record: the
    error says so and names the files, as for empty files (not 'every record was dead-lettered')."""
    (tmp_path / "blank.jsonl").write_text("\n\n  \n")
    with gzip.open(tmp_path / "none.jsonl.gz", "wb"):
        pass
    p = _cli(["--input", str(tmp_path / "*.j*"), "--output", str(tmp_path / "out")])
    assert p.returncode == 2
    line = _one_error_line(p)
    assert "no record was read from the 2 input files" in line and "dead-lettered" not in line
    assert "blank.jsonl" in line and "none.jsonl.gz" in line and "input.format" in line
    assert not (tmp_path / "out").exists()  # the run created it and removed it, empty, on failure


def _tokenizer_model(path):
    from pipelines.config import TokenizerConfig
    from pipelines.stages.tokenize import train_sentencepiece

    path.write_bytes(train_sentencepiece(["the river ran past old stone walls"] * 50, TokenizerConfig(vocab_size=300)))
    return path


def test_no_record_read_is_an_error_with_a_given_tokenizer_too(tmp_path):
    _tokenizer_model(tmp_path / "tok.model")
    (tmp_path / "blank.txt").write_text(" \n\t\n")
    p = _cli(["--input", str(tmp_path / "blank.txt"), "--output", str(tmp_path / "out"),
              "--tokenizer", str(tmp_path / "tok.model")])
    assert p.returncode == 2
    line = _one_error_line(p)
    assert "no record was read from its one input file (blank.txt): it holds only" in line
    assert "or decompresses to nothing" in line
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_given_tokenizer_and_no_document_kept_is_one_line_and_exit_1(tmp_path, corpus):
    """Issue 15: with --tokenizer, input whose records are all dead-lettered or filtered used to exit
    0 after "committed 0 shards"; it now fails as it does without --tokenizer, saying why."""
    tok = _tokenizer_model(tmp_path / "tok.model")
    (tmp_path / "notext.jsonl").write_text("".join(json.dumps({"id": str(i), "body": "no text field"}) + "\n"
                                              for i in range(3)))
    for args, why, check in [
            ([str(tmp_path / "notext.jsonl")], "of 3 records read: 3 dead-lettered (missing_text: 3)",
             "; check --input, input.format and input.text_field,"),
            ([str(corpus), "clean.min_chars=100000"], "of 30 records read: 30 filtered (too_short: 30)",
             "; check the settings of the steps that filtered them (the reasons name them: clean.*,")]:
        p = _cli(["--input", args[0], "--output", str(tmp_path / "out"), "--tokenizer", str(tok), *args[1:]])
        assert p.returncode == 1
        line = _one_error_line(p)
        assert line.startswith("error: no document was kept, so no shard was written; ") and why in line
        assert check in line and "committed" not in p.stderr
        assert ("input.text_field" in line) == ("dead-lettered" in why)  # filtered records: the input was read fine
        assert not (tmp_path / "out").exists()


def test_a_parquet_file_without_rows_is_said_to_hold_no_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.job import no_records_error

    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   tmp_path / "empty.parquet")
    p = _cli(["--input", str(tmp_path / "empty.parquet"), "--output", str(tmp_path / "out")])
    assert p.returncode == 2
    line = _one_error_line(p)
    assert "no record was read from its one input file (empty.parquet): it holds no rows, so" in line
    assert "blank lines" not in line and "decompress" not in line
    both = str(no_records_error("in/*", ["in/a.parquet", "in/b.jsonl.gz"], PipelineConfig()))
    assert "they hold no rows (Parquet) or only blank lines or whitespace, or decompress to nothing (JSONL, text)" in both


def test_jsonl_read_as_parquet_names_the_file_and_input_format(tmp_path, corpus):
    """A file that is not Parquet under input.format=parquet is one unreadable_file dead letter
    naming it (not pyarrow's bare message from the planning step); when no other file is readable
    the one-line error names it, the reader's error and input.format."""
    p = _cli(["--input", str(corpus), "--output", str(tmp_path / "out"), "input.format=parquet"])
    assert p.returncode == 1
    line = _one_error_line(p)
    assert f"cannot read {corpus} (reading stopped at row 0: ArrowInvalid: Parquet magic bytes" in line
    assert "input.format" in line and "unreadable_file: 1" in line


def test_a_file_that_is_not_parquet_among_parquet_files_is_dead_lettered_by_name(tmp_path, corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.job import run

    texts = [f"Quick brown fox {i} jumps; zebra quartz {i * 7}!" for i in range(30)]
    pq.write_table(pa.table({"id": [str(i) for i in range(30)], "text": texts}), tmp_path / "good.parquet")
    (tmp_path / "bad.parquet").write_bytes(corpus.read_bytes())  # JSONL under a .parquet name
    cfg = synthetic_config()
    cfg.tokenizer.vocab_size = 300
    stats = run(str(tmp_path / "*.parquet"), str(tmp_path / "out"), cfg, report=False)
    assert stats["total"]["kept"] == 30 and stats["total"]["dead_letter_reasons"] == {"unreadable_file": 1}
    letters = [json.loads(line) for part in sorted((tmp_path / "out" / "dead_letter").iterdir())
               for line in part.read_text().splitlines()]
    assert [(d["file"].rsplit("/", 1)[-1], d["reason"]) for d in letters] == [("bad.parquet", "unreadable_file")]
    assert "ArrowInvalid" in letters[0]["error"]


@pytest.mark.parametrize("runner, close", [("DaskRuner", "DaskRunner"), ("FlinkRuner", "FlinkRunner"), ("Nonesuch", None)])
def test_a_misspelled_runner_is_a_usage_error_listing_ours(corpus, tmp_path, capsys, runner, close):
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(corpus), "--output", str(out), f"--runner={runner}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"unknown runner --runner={runner}:" in err, err
    assert "DaskRunner, " in err and "DirectRunner" in err and "FlinkRunner" in err
    assert (f"did you mean --runner={close}?" in err) == (close is not None)
    assert not out.exists()


def test_supported_runner_names_pass_normalised_as_beam_reads_them():
    """Case-insensitive, ``Runner`` optional, for every supported runner alike; the normalised name is
    what the job's runner selection sees (``--runner=dask`` must pick colaflow's Dask runner)."""
    from apache_beam.options.pipeline_options import StandardOptions

    def runner(name):
        return beam_options([f"--runner={name}"]).view_as(StandardOptions).runner

    for name in ("DaskRunner", "daskrunner", "dask", "DASK", "apache_beam.runners.dask.dask_runner.DaskRunner",
                 "pipelines.runners.dask.runner.ColaflowDaskRunner"):
        assert runner(name) == "DaskRunner", name
    for name in ("DirectRunner", "directrunner", "direct", "apache_beam.runners.direct.direct_runner.DirectRunner"):
        assert runner(name) == "DirectRunner", name
    assert runner("portable") == "PortableRunner" and runner("flink") == "FlinkRunner"
    path = "apache_beam.runners.portability.portable_runner.PortableRunner"
    assert runner(path) == path and beam_options([]).view_as(StandardOptions).runner is None


@pytest.mark.parametrize("runner, says", [
    ("apache_beam.runners.nope.NopeRunner", "cannot import apache_beam.runners.nope"),
    ("pipelines.runners.dask.runner.Nope", "module pipelines.runners.dask.runner has no Nope"),
    ("os.path", "module path is not a PipelineRunner class"),
    ("BundleBasedDirectRunner", "a Beam runner colaflow does not support; use one of DirectRunner, DaskRunner"),
    ("interactive", "a Beam runner colaflow does not support"),
    ("apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner", "a Beam runner colaflow does not support"),
    ("apache_beam.runners.runner.PipelineRunner", "a Beam runner colaflow does not support"),
])
def test_a_runner_colaflow_cannot_use_is_refused_up_front_in_one_line(corpus, tmp_path, capsys, runner, says):
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(corpus), "--output", str(out), f"--runner={runner}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --runner={runner}: {says}"), err
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--dask_client_address=127.0.0.1:8786"],
                                   ["--runner=DirectRunner", "--dask_npartitions=4"]])
def test_a_dask_option_without_the_dask_runner_says_to_choose_it(corpus, tmp_path, capsys, flags):
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(corpus), "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    flag = flags[-1].split("=")[0]
    assert len(err.splitlines()) == 1 and f"{flag} is a DaskRunner option; add --runner=DaskRunner" in err, err
    assert not out.exists()


def test_a_failed_run_removes_the_output_folders_it_created_and_nothing_else(tmp_path):
    from pipelines.job import run
    from pipelines.stages.tokenize import EmptySampleError

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "body": "no text field"}) + "\n")
    new = tmp_path / "made" / "by" / "run"
    with pytest.raises(EmptySampleError):
        run(str(tmp_path / "c.jsonl"), str(new))
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl"]  # run/, by/ and made/ were all created by the run
    (tmp_path / "mine").mkdir()
    (tmp_path / "kept" / "notes.txt").parent.mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("user data")
    for existing in (tmp_path / "mine", tmp_path / "kept"):
        with pytest.raises(EmptySampleError):
            run(str(tmp_path / "c.jsonl"), str(existing))
    assert os.listdir(tmp_path / "mine") == [] and os.listdir(tmp_path / "kept") == ["notes.txt"]


def test_counts_read_right_for_one_and_many():
    from colaflow.wording import count, plural

    assert [count(n, "file") for n in (0, 1, 2, 1200)] == ["0 files", "1 file", "2 files", "1,200 files"]
    assert count(1, "match", "matches") == "1 match" and plural(3, "match", "matches") == "matches"


def test_file_lists_in_messages_are_sorted_and_one_file_reads_as_it(capsys):
    from pipelines.config import PipelineConfig
    from pipelines.job import _warn_skipped, no_records_error

    _warn_skipped(["/d/b.csv"])
    err = capsys.readouterr().err
    assert "skipping 1 input file of unknown format (b.csv)" in err and "read it as text" in err
    _warn_skipped(["/d/z.csv", "/d/a.csv", "/d/m.csv"])
    err = capsys.readouterr().err
    assert "skipping 3 input files of unknown format (a.csv, m.csv, z.csv)" in err and "read them as text" in err
    paths = [f"/d/{c}.jsonl" for c in "gfedcba"]
    assert "(a.jsonl, b.jsonl, c.jsonl, d.jsonl, e.jsonl and 2 more)" in str(no_records_error("/d/*.jsonl", paths, PipelineConfig()))


def test_an_empty_file_beside_a_good_one_is_named_and_counted(tmp_path, capsys):
    """A 0-byte input file next to real ones holds nothing to drop, but the user gave it: the job
    names it on stderr and counts it (``empty_files`` in stats.json and the report), and the good
    file's documents are all read."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "good.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"Quick brown fox {i} jumps over "
                                                           f"the lazy dog {i * 3}."}) + "\n" for i in range(40)))
    (folder / "empty.jsonl").write_bytes(b"")
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(folder / "*.jsonl"), "--output", str(out), "tokenizer.vocab_size=300",
                             *SYNTHETIC]) == 0
    assert "note: 1 input file is empty (0 bytes: empty.jsonl); nothing is read from it" in capsys.readouterr().err
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["total"]["empty_files"], stats["total"]["input_records"]) == (1, 40)
    assert stats["sources"]["empty"]["empty_files"] == 1 and stats["sources"]["good"]["empty_files"] == 0
    assert "empty files                 1" in (out / "report.txt").read_text()


def test_the_local_dask_cluster_keeps_its_info_lines_to_itself(tmp_path):
    """--runner=DaskRunner without --dask_client_address starts an in-process cluster: no ``INFO distributed``."""
    pytest.importorskip("distributed")
    lines = [json.dumps({"id": str(i), "text": f"the river ran past old stone walls {i}"}) for i in range(30)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    p = _cli(["--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "out"), "--runner=DaskRunner",
              "--tokenizer", str(_tokenizer_model(tmp_path / "t.model"))])
    assert p.returncode == 0, p.stderr
    assert "INFO distributed" not in p.stderr, p.stderr
    assert "type hint will be ignored" not in p.stderr, p.stderr  # Beam's warning about expand's return annotations
    assert (tmp_path / "out" / "manifest.json").exists()


def test_add_eos_with_a_tokenizer_that_has_no_eos_is_one_line_naming_tokenizer_and_flag(tmp_path, capsys):
    from tests.unit.shards.test_tokenizers import bpe

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "text": "some words here"}) + "\n")
    tok = bpe(tmp_path / "tok", specials=("<unk>",))
    out = tmp_path / "out"
    assert beam_runner.main(["--input", str(tmp_path / "c.jsonl"), "--output", str(out), "--tokenizer", tok]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --tokenizer {tok}: this hf tokenizer has no EOS token, so tokenizer.add_eos cannot mark "
                   "documents: give a tokenizer that has one (a tokenizer.json alone has its eos_token found only as "
                   "<|end_of_text|> or <|endoftext|> or </s> or <eos>; name another in a tokenizer_config.json beside "
                   'it, {"eos_token": "..."}, and give the folder; its special tokens: <unk>), '
                   "or set tokenizer.add_eos=false")
    assert not out.exists()
    assert beam_runner.main(["--input", str(tmp_path / "c.jsonl"), "--output", str(out), "--tokenizer", tok,
                             "tokenizer.add_eos=false", *SYNTHETIC]) == 0
    assert json.loads((out / "manifest.json").read_text())["tokenizer_identity"]["add_eos"] is False


@pytest.mark.parametrize("override, message", [
    ("tokenizer.kind=tiktoken", "tokenizer.kind=tiktoken needs tokenizer.path (or --tokenizer PATH, such as "
                                "cl100k_base): only sentencepiece and hf are trained here"),
    ("tokenizer.kind=hf tokenizer.model_type=unigram", "tokenizer.model_type=unigram with tokenizer.kind=hf: the "
     "tokenizer trained for hf is a byte-level BPE; set tokenizer.model_type=bpe, or tokenizer.kind=sentencepiece for "
     "a unigram model"),
    ("tokenizer.kind=bpe", "tokenizer.kind='bpe': use one of auto, sentencepiece, hf, tiktoken"),
    ("tokenizer.add_bos=maybe", "tokenizer.add_bos='maybe': use true, false or null (the tokenizer's own convention)"),
])
def test_tokenizer_kind_and_bos_settings_are_checked_up_front(corpus, tmp_path, capsys, override, message):
    assert beam_runner.main(["--input", str(corpus), "--output", str(tmp_path / "out"), *override.split()]) == 2
    assert capsys.readouterr().err.strip() == f"error: config: {message}"


def test_tokenizer_kind_applies_to_the_tokenizer_flag(tmp_path, capsys):
    from tests.unit.shards.test_tokenizers import bpe

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "text": "some words here"}) + "\n")
    tok = tmp_path / "mytok.bin"
    os.rename(bpe(tmp_path / "tok"), tok)
    assert beam_runner.main(["--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "out"),
                             "--tokenizer", str(tok), "tokenizer.kind=hf", *SYNTHETIC]) == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer_identity"]["kind"] == "hf"


@pytest.mark.parametrize("given, says", [
    (["--tokenizer", ""], "error: --tokenizer '': an empty tokenizer name; give a sentencepiece .model, "),
    (["--tokenizer", "cl100k_base", "tokenizer.kind=sentencepiece"],
     "error: --tokenizer cl100k_base: a bundled tiktoken encoding, but tokenizer.kind=sentencepiece; set "
     "tokenizer.kind=tiktoken or auto"),
])
def test_an_empty_or_mismatched_tokenizer_flag_is_refused_not_trained_around(corpus, tmp_path, capsys, given, says):
    assert beam_runner.main(["--input", str(corpus), "--output", str(tmp_path / "out"), *given]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(says) and "\n" not in err and not (tmp_path / "out").exists()


def test_an_output_that_cannot_be_written_is_one_line_without_beams_traceback(corpus, tmp_path):
    """Issue 37: a write that failed for lack of space inside a Beam step was said in one line, but
    after the traceback Beam logs for it (20 lines). Here a file size limit fails the writes, as a
    full disk does."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # Python ignores SIGXFSZ: writes fail with EFBIG
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "beam_runner.py", "--input", str(corpus), "--output", str(tmp_path / "out"),
                        "tokenizer.vocab_size=320", *SYNTHETIC], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                       preexec_fn=limit)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "ERROR" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ": File too large; " in errors[0] and str(tmp_path / "out") in errors[0], errors
