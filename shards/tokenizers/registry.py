"""The one registry of tokenizer kinds: which kind reads a path, building a tokenizer from its file,
and the files a shard folder carries for it."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import NamedTuple

# the modules, not the package: its __init__ imports this module
import shards.tokenizers.auto_form as auto_form  # noqa: PLR0402
import shards.tokenizers.hf as hf  # noqa: PLR0402
import shards.tokenizers.spm as spm  # noqa: PLR0402
import shards.tokenizers.tiktoken_ranks as tiktoken_ranks  # noqa: PLR0402
from shards.tokenizers.contract import Tokenizer, TokenizerError, TokenizerFile


class Kind(NamedTuple):
    """One tokenizer kind.

    Attributes:
        file_name: its file in a shard folder.
        settings_name: the file beside it holding :attr:`TokenizerFile.extra`, or ``None``.
        suffixes: file name endings that select it when ``tokenizer.kind`` is ``auto``.
        build: a :class:`~shards.tokenizers.contract.Tokenizer` from a :class:`TokenizerFile`.
        read: (path given, its bytes, its ``NAME.json`` settings or ``None``) -> :class:`TokenizerFile`.
        auto_files: file name -> bytes of the form ``transformers.AutoTokenizer`` loads
            (:mod:`shards.tokenizers.auto_form`).
    """

    file_name: str
    settings_name: str | None
    suffixes: tuple[str, ...]
    build: Callable[[TokenizerFile], Tokenizer]
    read: Callable[[str, bytes, dict | None], TokenizerFile]
    auto_files: Callable[[TokenizerFile], dict[str, bytes]]


KINDS: dict[str, Kind] = {
    spm.KIND: Kind(spm.FILE_NAME, None, (".model",), spm.SentencePieceTokenizer, lambda p, d, _: spm.read(p, d),
                   spm.auto_files),
    hf.KIND: Kind(hf.FILE_NAME, auto_form.CONFIG_NAME, (".json",), hf.HFTokenizer, lambda p, d, _: hf.read(p, d),
                  hf.auto_files),
    tiktoken_ranks.KIND: Kind(tiktoken_ranks.FILE_NAME, tiktoken_ranks.FILE_NAME + ".json", (".tiktoken",),
                              tiktoken_ranks.TiktokenTokenizer, tiktoken_ranks.read, tiktoken_ranks.auto_files),
}
AUTO = "auto"
# files of a Hugging Face folder that end like a tokenizer but hold none colaflow reads
SIDE_FILES = ("config.json", "generation_config.json", "added_tokens.json", "vocab.json", *hf.CONFIG_FILES)
SLOW_FILES = ("vocab.json", "merges.txt")  # a slow (GPT-2 style) BPE tokenizer, which has no tokenizer.json
# every file name a shard folder may carry for its tokenizer (what a rerun's --overwrite replaces)
FOLDER_FILE_NAMES = tuple(dict.fromkeys(n for k in KINDS.values() for n in (k.file_name, k.settings_name) if n))
WHAT_WE_READ = ("a sentencepiece .model, a Hugging Face tokenizer.json (or a folder holding one), or a tiktoken "
                "rank file (.tiktoken) or bundled encoding name ({names})")


def _what_we_read() -> str:
    return WHAT_WE_READ.format(names=", ".join(tiktoken_ranks.bundled_names()) or "none installed")


def build(file: TokenizerFile) -> Tokenizer:
    """The tokenizer of ``file`` (its ``kind`` picks the class).

    Raises:
        TokenizerError: an unknown kind, or the kind cannot read the bytes.
    """
    if file.kind not in KINDS:
        raise TokenizerError(f"tokenizer kind {file.kind!r} is not one of {', '.join(KINDS)}")
    return KINDS[file.kind].build(file)


def _settings_beside(path: str) -> dict | None:
    """``PATH.json`` beside a tokenizer file (tiktoken's pattern and special tokens), or ``None``."""
    side = path + ".json"
    if not os.path.isfile(side):
        return None
    try:
        with open(side, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{side}: not readable JSON ({e})") from None


def _candidates(path: str, kind: str) -> tuple[str, list[str], bool]:
    """The file to read for ``path``, the kinds to try on it in order, and whether the first was chosen
    (by ``kind``, the file's name or a folder's file) rather than guessed."""
    if kind != AUTO:
        if os.path.isdir(path):
            return os.path.join(path, KINDS[kind].file_name), [kind], True
        return path, [kind], True
    if os.path.isdir(path):
        # a kind's own file before tokenizer.json, which a shard folder carries for transformers beside it
        for name, k in sorted(KINDS.items(), key=lambda nk: nk[1].file_name == auto_form.JSON_NAME):
            if os.path.isfile(os.path.join(path, k.file_name)):
                return os.path.join(path, k.file_name), [name], True
        return path, [], False
    by_suffix = [name for name, k in KINDS.items() if path.endswith(k.suffixes)]
    return path, by_suffix + [name for name in KINDS if name not in by_suffix], bool(by_suffix)


def read(path: str, kind: str = AUTO) -> TokenizerFile:
    """The tokenizer at ``path``: a file, a folder (``tokenizer.json`` / ``tokenizer.model`` /
    ``tokenizer.tiktoken``), or a bundled tiktoken encoding name; ``kind`` (``auto`` or a registry
    name) says which kind reads it, ``auto`` trying the file's suffix first, then every kind.

    Raises:
        TokenizerError: one line naming the path and, when no kind reads it, the three kinds.
    """
    if kind != AUTO and kind not in KINDS:
        raise TokenizerError(f"tokenizer.kind={kind!r}: use one of {AUTO}, {', '.join(KINDS)}")
    if not path.strip():
        raise TokenizerError(f"an empty tokenizer name; give {_what_we_read()}, or none to train one")
    if not os.path.exists(path):
        bundled = tiktoken_ranks.named(path)
        if bundled is not None and kind in (AUTO, tiktoken_ranks.KIND):
            return bundled
        raise TokenizerError(_missing(path, kind, bundled is not None))
    if os.path.basename(path) == "manifest.json":
        raise TokenizerError(f"{path}: a shard folder's manifest, not a tokenizer; give its folder "
                             f"({os.path.dirname(path) or '.'}) to use the tokenizer the shards were written with")
    file_path, kinds, chosen = _candidates(path, kind)
    if not os.path.isfile(file_path):
        raise TokenizerError(f"{path}: holds no {kind + ' ' if kind != AUTO else ''}tokenizer file "
                             f"({', '.join(k.file_name for k in KINDS.values())}); {_folder_advice(path)}")
    try:
        with open(file_path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TokenizerError(f"{file_path}: cannot read it ({e.strerror or e})") from None
    if not data:
        raise TokenizerError(f"{file_path}: an empty file (0 bytes); give {_what_we_read()}")
    problems = []
    for name in kinds:
        try:
            return KINDS[name].read(file_path, data, _settings_beside(file_path))
        except TokenizerError as e:
            problems.append(str(e))
    if chosen:  # what the chosen kind says is more use than the list of kinds
        raise TokenizerError(f"{file_path}: {problems[0]}")
    raise TokenizerError(f"{file_path}: not a tokenizer colaflow reads; give {_what_we_read()}")


def _missing(path: str, kind: str, bundled: bool) -> str:
    """Why ``path``, which does not exist, names no tokenizer, and what to give instead."""
    if bundled:
        return (f"{path}: a bundled tiktoken encoding, but tokenizer.kind={kind}; set tokenizer.kind=tiktoken "
                "or auto")
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        return f"{path}: no such file, and no folder {parent}; check the path"
    if parent or path.endswith(tuple(s for k in KINDS.values() for s in k.suffixes)):
        return f"{path}: no such file; check the path"
    return f"{path}: no such file, folder or bundled encoding; give {_what_we_read()}"


def _folder_advice(folder: str) -> str:
    """What to give instead of ``folder``: a slow tokenizer saved as ``tokenizer.json``, the files in it that
    a kind's suffix matches (not a model folder's other JSON files), else the kinds."""
    names = os.listdir(folder)
    if set(SLOW_FILES) <= set(names):
        return (f"its {' and '.join(SLOW_FILES)} are a slow tokenizer: save it as tokenizer.json with transformers "
                f"(AutoTokenizer.from_pretrained({folder!r}).save_pretrained({folder!r})), then give the folder")
    suffixes = tuple(s for k in KINDS.values() for s in k.suffixes)
    files = sorted(n for n in names
                   if n.endswith(suffixes) and not n.endswith(".tiktoken.json") and n not in SIDE_FILES)
    if files:
        return "give the file itself: " + ", ".join(os.path.join(folder, n) for n in files[:5])
    return f"give {_what_we_read()}"


def folder_files(file: TokenizerFile, tok: Tokenizer | None = None) -> dict[str, bytes]:
    """File name -> bytes that a shard folder carries for ``file``: the tokenizer in its own format, its
    settings (tiktoken's ``tokenizer.tiktoken.json``), and ``tokenizer.json`` + ``tokenizer_config.json``,
    which ``transformers.AutoTokenizer.from_pretrained(folder)`` loads offline (checked to encode as
    colaflow's tokenizer does, :func:`shards.tokenizers.auto_form.check`); ``tok``: ``file`` built
    already (:func:`build`), else built here.

    Raises:
        TokenizerError: the transformers form cannot be made, or encodes differently.
    """
    kind = KINDS[file.kind]
    auto = kind.auto_files(file)
    auto_form.check(tok if tok is not None else build(file), auto)
    settings = kind.settings_name
    own = {file.name: file.data, **({settings: _json(file.extra)} if settings and file.extra else {})}
    return {**own, **auto}


def _json(d: dict) -> bytes:
    return (json.dumps(d, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def from_folder_files(kind: str, name: str, read_file: Callable[[str], bytes | None]) -> TokenizerFile:
    """The :class:`TokenizerFile` a shard folder carries (:func:`folder_files`), read back through
    ``read_file`` (file name -> bytes, ``None`` when absent).

    Raises:
        TokenizerError: the tokenizer file is missing, or its settings file is unreadable.
    """
    data = read_file(name)
    if data is None:
        raise TokenizerError(f"{name}: the manifest's tokenizer file is missing")
    if kind not in KINDS:
        raise TokenizerError(f"tokenizer kind {kind!r} is not one of {', '.join(KINDS)}; upgrade colaflow")
    settings = KINDS[kind].settings_name
    side = read_file(settings) if settings else None
    try:
        extra = json.loads(side) if side else {}
    except ValueError as e:
        raise TokenizerError(f"{settings}: not JSON ({e})") from None
    return TokenizerFile(kind, name, data, extra)


def _beside(manifest_url: str) -> tuple[str, Callable[[str], bytes | None]]:
    """The manifest's URL for a shard folder's manifest or folder (local or fsspec), and a reader of the
    files beside it (file name -> bytes, ``None`` when absent)."""
    import fsspec

    from shards.format.urls import shard_url

    base = manifest_url if "://" in manifest_url or not os.path.isdir(manifest_url) else os.path.join(
        manifest_url, "manifest.json")

    def read_file(name: str) -> bytes | None:
        try:
            with fsspec.open(shard_url(base, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    return base, read_file


def auto_files_of_shards(manifest_url: str) -> dict[str, bytes]:
    """The files of the form ``transformers.AutoTokenizer`` loads (:mod:`shards.tokenizers.auto_form`)
    that a shard folder carries, by name; empty for shards written before colaflow wrote them."""
    _, read_file = _beside(manifest_url)
    found = {name: read_file(name) for name in auto_form.FILE_NAMES}
    return {name: data for name, data in found.items() if data is not None}


def of_shards(manifest_url: str, manifest) -> TokenizerFile | None:
    """The tokenizer a shard folder carries (local path or fsspec URL of its manifest or folder), checked
    against the fingerprint its manifest (a :class:`shards.format.manifest.Manifest`) recorded; ``None``
    when the manifest names no tokenizer.

    Raises:
        TokenizerError: the file is missing, or it changed since the manifest was written.
    """
    from shards.format.urls import shard_url

    if not manifest.tokenizer:
        return None
    ident = manifest.tokenizer_identity
    base, read_file = _beside(manifest_url)
    file = from_folder_files(ident.kind if ident else spm.KIND, manifest.tokenizer, read_file)
    if ident is not None and ident.sha256 and file.sha256 != ident.sha256:
        raise TokenizerError(f"{shard_url(base, manifest.tokenizer)} changed since the shards were written (sha256 "
                             f"{file.sha256[:12]}..., the manifest says {ident.sha256[:12]}...): its ids would not "
                             "mean what the shards' tokens mean; put back the tokenizer the shards were written with, "
                             "or preprocess again")
    return file
