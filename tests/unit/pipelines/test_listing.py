"""Issue 37: the one listing of ``--input`` follows links, names what it skips and takes an existing
path literally before it reads it as a glob (Beam's own match dropped linked folders and broken
links without a word, and read ``odd [v2]`` as a character class)."""
from __future__ import annotations

import json

import pytest

from pipelines.config import PipelineConfig
from pipelines.io.listing import list_inputs
from pipelines.job import InputError, match_input


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "e.jsonl").write_text(json.dumps({"text": "behind a linked folder"}) + "\n")
    inputs = tmp_path / "in"
    odd = inputs / "odd [v2] (x)"
    odd.mkdir(parents=True)
    (odd / "o (1).jsonl").write_text(json.dumps({"text": "in a folder named with glob characters"}) + "\n")
    (inputs / "a.jsonl").write_text(json.dumps({"text": "plain"}) + "\n")
    (inputs / "linked").symlink_to(tmp_path / "ext")
    (inputs / "loop").symlink_to(inputs)  # a cycle is walked once
    (inputs / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    return inputs


def test_links_are_followed_and_broken_ones_named(tree):
    listing = list_inputs(f"{tree}/**")
    assert [f.path for f in listing.files] == [f"{tree}/a.jsonl", f"{tree}/linked/e.jsonl",
                                               f"{tree}/odd [v2] (x)/o (1).jsonl"]
    assert listing.broken_links == (f"{tree}/gone.jsonl",) and listing.root == str(tree)
    assert [f.size_in_bytes for f in listing.files][1] == (tree / "linked" / "e.jsonl").stat().st_size


def test_an_existing_path_with_glob_characters_is_literal(tree):
    path = f"{tree}/odd [v2] (x)/o (1).jsonl"
    listing = list_inputs(path)
    assert [f.path for f in listing.files] == [path] and listing.root == f"{tree}/odd [v2] (x)"
    assert list_inputs(f"{tree}/odd [v2] (x)").folder
    assert [f.path for f in list_inputs(f"{tree}/[a]*.jsonl").files] == [f"{tree}/a.jsonl"]  # still a glob


def test_only_broken_links_is_one_clear_error(tree):
    with pytest.raises(InputError, match="only broken links: gone.jsonl"):
        match_input(f"{tree}/gone*", PipelineConfig())
    with pytest.raises(FileNotFoundError, match="no input file matches"):
        match_input(f"{tree}/none*", PipelineConfig())


def test_a_glob_inside_a_folder_named_with_glob_characters_globs_inside_it(tree):
    """``odd [v2] (x)/*.jsonl``: the folder exists as written, so only the file name is a glob
    (``[v2]`` used to be read as a character class and nothing matched)."""
    listing = list_inputs(f"{tree}/odd [v2] (x)/*.jsonl")
    assert [f.path for f in listing.files] == [f"{tree}/odd [v2] (x)/o (1).jsonl"]
    assert listing.root == f"{tree}/odd [v2] (x)"


def test_a_loop_of_links_is_a_skipped_link_not_a_failed_listing(tree):
    """A link to itself has no target either; it used to end the whole listing in ELOOP."""
    (tree / "self.jsonl").symlink_to(tree / "self.jsonl")
    listing = list_inputs(f"{tree}/**")
    assert listing.broken_links == (f"{tree}/gone.jsonl", f"{tree}/self.jsonl")
    assert f"{tree}/a.jsonl" in [f.path for f in listing.files]
    assert list_inputs(f"{tree}/self.jsonl").broken_links == (f"{tree}/self.jsonl",)
