"""The one registry of tokenizer kinds: which kind reads a path, building a tokenizer from its file,
and the files a shard folder carries for it."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import NamedTuple

# the modules, not the package: its __init__ imports this module
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
    """

    file_name: str
    settings_name: str | None
    suffixes: tuple[str, ...]
    build: Callable[[TokenizerFile], Tokenizer]
    read: Callable[[str, bytes, dict | None], TokenizerFile]


KINDS: dict[str, Kind] = {
    spm.KIND: Kind(spm.FILE_NAME, None, (".model",), spm.SentencePieceTokenizer, lambda p, d, _: spm.read(p, d)),
    hf.KIND: Kind(hf.FILE_NAME, hf.CONFIG_FILES[0], (".json",), hf.HFTokenizer, lambda p, d, _: hf.read(p, d)),
    tiktoken_ranks.KIND: Kind(tiktoken_ranks.FILE_NAME, tiktoken_ranks.FILE_NAME + ".json", (".tiktoken",), tiktoken_ranks.TiktokenTokenizer,
                              tiktoken_ranks.read),
}
AUTO = "auto"
# every file name a shard folder may carry for its tokenizer (what a rerun's --overwrite replaces)
FOLDER_FILE_NAMES = tuple(n for k in KINDS.values() for n in (k.file_name, k.settings_name) if n)
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
        for name, k in KINDS.items():
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
    if not os.path.exists(path):
        bundled = tiktoken_ranks.named(path) if kind in (AUTO, tiktoken_ranks.KIND) else None
        if bundled is not None:
            return bundled
        raise TokenizerError(f"{path}: no such file, folder or bundled encoding; give {_what_we_read()}")
    file_path, kinds, chosen = _candidates(path, kind)
    if not os.path.isfile(file_path):
        raise TokenizerError(f"{path}: holds no tokenizer file; give {_what_we_read()}")
    try:
        with open(file_path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TokenizerError(f"{file_path}: cannot read it ({e.strerror or e})") from None
    problems = []
    for name in kinds:
        try:
            return KINDS[name].read(file_path, data, _settings_beside(file_path))
        except TokenizerError as e:
            problems.append(str(e))
    if chosen:  # what the chosen kind says is more use than the list of kinds
        raise TokenizerError(f"{file_path}: {problems[0]}")
    raise TokenizerError(f"{file_path}: not a tokenizer colaflow reads; give {_what_we_read()}")


def folder_files(file: TokenizerFile) -> dict[str, bytes]:
    """File name -> bytes that a shard folder carries for ``file``: the tokenizer in its own format and
    its settings (an HF ``tokenizer_config.json``, which ``transformers.AutoTokenizer`` reads too, or
    tiktoken's ``tokenizer.tiktoken.json``)."""
    settings = KINDS[file.kind].settings_name
    return {file.name: file.data, **({settings: _json(file.extra)} if settings and file.extra else {})}


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


def of_shards(manifest_url: str, manifest) -> TokenizerFile | None:
    """The tokenizer a shard folder carries (local path or fsspec URL of its manifest or folder), checked
    against the fingerprint its manifest (a :class:`shards.format.manifest.Manifest`) recorded; ``None``
    when the manifest names no tokenizer.

    Raises:
        TokenizerError: the file is missing, or it changed since the manifest was written.
    """
    import fsspec

    from shards.format.urls import shard_url

    if not manifest.tokenizer:
        return None
    ident = manifest.tokenizer_identity
    base = manifest_url if "://" in manifest_url or not os.path.isdir(manifest_url) else os.path.join(
        manifest_url, "manifest.json")

    def read_file(name: str) -> bytes | None:
        try:
            with fsspec.open(shard_url(base, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    file = from_folder_files(ident.kind if ident else spm.KIND, manifest.tokenizer, read_file)
    if ident is not None and ident.sha256 and file.sha256 != ident.sha256:
        raise TokenizerError(f"{shard_url(base, manifest.tokenizer)} changed since the shards were written (sha256 "
                             f"{file.sha256[:12]}..., the manifest says {ident.sha256[:12]}...): its ids would not "
                             "mean what the shards' tokens mean; put back the tokenizer the shards were written with, "
                             "or preprocess again")
    return file
