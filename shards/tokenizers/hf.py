"""The ``hf`` kind: a Hugging Face ``tokenizers`` ``tokenizer.json`` (Llama 3, Qwen, GPT-NeoX, Mistral...),
alone or in a folder with ``tokenizer_config.json`` / ``special_tokens_map.json``."""
from __future__ import annotations

import json
import os

import numpy as np

from shards.tokenizers.auto_form import CONFIG_NAME, TOKENIZER_CLASS, config_json
from shards.tokenizers.contract import SpecialIds, TokenizerError, TokenizerFile

KIND = "hf"
FILE_NAME = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # the first that names a key wins
# Names a bare tokenizer.json's special tokens go by, for a tokenizer.json without its config files
CONVENTIONAL = {
    "bos_token": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"),
    "eos_token": ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"),
    "pad_token": ("<pad>", "<|pad|>", "[PAD]", "<|padding|>"),
}


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` behind the :class:`~shards.tokenizers.contract.Tokenizer` contract.

    Args:
        file: ``tokenizer.json`` bytes; ``file.extra`` names the special tokens (``bos_token``,
            ``eos_token``, ``pad_token``: strings or ``None``) and ``add_bos_token`` (bool).

    Raises:
        TokenizerError: ``tokenizers`` cannot read the bytes, or a named special token is not in it.
    """

    kind = KIND

    def __init__(self, file: TokenizerFile):
        self.file = file
        self._tok = _parse(file.data)
        self._tok.encode_special_tokens = True  # "</s>" in a web page is text, not a document boundary
        # one past the largest id, not the count of tokens: a vocabulary may leave ids unused, and the
        # contract (and the embedding sized from it) needs every id below vocab_size
        self.vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        ids = []
        for key in ("bos_token", "eos_token", "pad_token"):
            name = _token_name(file.extra.get(key))
            token_id = None if name is None else self._tok.token_to_id(name)
            if name is not None and token_id is None:
                raise TokenizerError(f"its {key} {name!r} is not in the vocabulary")
            ids.append(token_id)
        self.special = SpecialIds(*ids)
        self.adds_bos = bool(file.extra.get("add_bos_token", False)) and self.special.bos is not None

    def special_hint(self, key: str) -> str:
        """How to name this tokenizer's ``key`` (``bos_token``, ``eos_token``) when none was found: the
        names a bare ``tokenizer.json``'s are looked for under, the config file that names another,
        and the special tokens it holds."""
        specials = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
        held = ", ".join(specials[:10]) + (", ..." if len(specials) > 10 else "") if specials else "none"
        return (f"a tokenizer.json alone has its {key} found only as {' or '.join(CONVENTIONAL[key])}; name another "
                f"in a {CONFIG_FILES[0]} beside it, {{\"{key}\": \"...\"}}, and give the folder; its special "
                f"tokens: {held}")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, no special token added (``encode_batch_fast``: Rust threads, no offsets)."""
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """The text of ``ids``, special tokens skipped."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _parse(data: bytes):
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` bytes.

    Raises:
        TokenizerError: the bytes are not a ``tokenizer.json`` that ``tokenizers`` reads.
    """
    from tokenizers import Tokenizer as RustTokenizer

    try:
        return RustTokenizer.from_str(data.decode("utf-8", errors="replace"))
    except Exception as e:  # noqa: BLE001  (tokenizers raises a bare Exception for what it cannot read)
        lines = str(e).splitlines() or [type(e).__name__]
        raise TokenizerError(f"not a Hugging Face tokenizer.json ({lines[0]})") from None


def _token_name(value) -> str | None:
    """A special token's text from a config entry (a string, or ``{"content": ...}``)."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _folder_config(folder: str | None) -> dict:
    """The folder's ``tokenizer_config.json``, with what its ``special_tokens_map.json`` adds (the first
    file that names a key wins); empty when there are none.

    Raises:
        TokenizerError: one of them is not readable JSON.
    """
    config: dict = {}
    for name in CONFIG_FILES if folder else ():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                found = json.load(f)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{path}: not readable JSON ({e})") from None
        if not isinstance(found, dict):
            raise TokenizerError(f"{path}: not a JSON object")
        for key, value in found.items():
            config.setdefault(key, value)
    return config


def _settings(folder: str | None, tok) -> dict:
    """The folder's config (:func:`_folder_config`), with the special tokens it does not name taken by
    their conventional names and ``add_bos_token`` from the tokenizer's post-processor when unset."""
    found = _folder_config(folder)
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    for key, names in CONVENTIONAL.items():
        if not _token_name(found.get(key)):
            found[key] = next((n for n in names if n in specials), None)
    if not isinstance(found.get("add_bos_token"), bool):  # the post-processor says whether it starts with BOS
        bos = None if found["bos_token"] is None else tok.token_to_id(_token_name(found["bos_token"]))
        found["add_bos_token"] = bos is not None and tok.encode("a", add_special_tokens=True).ids[:1] == [bos]
    return found


def read(path: str, data: bytes) -> TokenizerFile:
    """The :class:`TokenizerFile` of a ``tokenizer.json`` (``data``: its bytes) found at ``path`` (the
    file, or its folder, whose ``tokenizer_config.json`` / ``special_tokens_map.json`` name the special tokens).

    Raises:
        TokenizerError: not a ``tokenizer.json`` ``tokenizers`` reads, or a config file is unreadable.
    """
    tok = _parse(data)
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    # the settings double as the tokenizer_config.json transformers reads (auto_files), whose class is ours
    file = TokenizerFile(KIND, FILE_NAME, data, {**_settings(folder, tok), "tokenizer_class": TOKENIZER_CLASS})
    HFTokenizer(file)
    return file


def trained(data: bytes) -> TokenizerFile:
    """The :class:`TokenizerFile` of a ``tokenizer.json`` trained by the pipeline (no config files:
    its special tokens go by their conventional names).

    Raises:
        TokenizerError: ``tokenizers`` cannot read it.
    """
    file = TokenizerFile(KIND, FILE_NAME, data, {**_settings(None, _parse(data)), "tokenizer_class": TOKENIZER_CLASS})
    HFTokenizer(file)
    return file


def auto_files(file: TokenizerFile) -> dict[str, bytes]:
    """``tokenizer.json`` as given and its settings as ``tokenizer_config.json`` for
    ``transformers.AutoTokenizer``, with the class that loads ``tokenizer.json`` as it is (a
    model-specific class such as ``LlamaTokenizer`` may rebuild its normaliser and encode differently)."""
    return {FILE_NAME: file.data, CONFIG_NAME: config_json(file.extra)}
