"""A tokenizer in the form ``transformers.AutoTokenizer.from_pretrained(folder)`` loads offline: a
``tokenizer.json`` and a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` (the class that
loads ``tokenizer.json`` as it is, in transformers 4 and 5), checked to encode as colaflow does.

Each kind makes its ``tokenizer.json`` with the library that owns the conversion: the hf kind has one
already, sentencepiece goes through transformers' converter of ``.model`` files, tiktoken through
``TikTokenConverter``.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

from shards.tokenizers.contract import Tokenizer, TokenizerError

JSON_NAME = "tokenizer.json"
CONFIG_NAME = "tokenizer_config.json"
FILE_NAMES = (JSON_NAME, CONFIG_NAME)
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
# What the check encodes: words, numbers, punctuation, runs of spaces and lines, accents, emoji, CJK
PROBE = "The river ran past 1,024 old walls;  into a quiet valley.\nNaïve café — 東京 🤖 x\n\n  end"


def config_json(config: dict) -> bytes:
    """``tokenizer_config.json`` bytes of ``config`` with :data:`TOKENIZER_CLASS` as its class."""
    return (json.dumps({**config, "tokenizer_class": TOKENIZER_CLASS}, indent=2, sort_keys=True,
                       ensure_ascii=False) + "\n").encode("utf-8")


def saved(make: Callable[[str], object]) -> dict[str, bytes]:
    """The :data:`FILE_NAMES` a transformers tokenizer writes with ``save_pretrained``.

    Args:
        make: given a scratch folder (to put source files in), the transformers tokenizer to save.

    Returns:
        file name -> bytes for ``tokenizer.json`` and ``tokenizer_config.json`` (class set to
        :data:`TOKENIZER_CLASS`).
    """
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryDirectory() as out:
        make(scratch).save_pretrained(out)
        with open(os.path.join(out, CONFIG_NAME), encoding="utf-8") as f:
            config = json.load(f)
        with open(os.path.join(out, JSON_NAME), "rb") as f:
            return {JSON_NAME: f.read(), CONFIG_NAME: config_json(config)}


def check(tok: Tokenizer, files: dict[str, bytes]) -> None:
    """Load ``files`` (offline) with the class their config names, which is what ``AutoTokenizer``
    gives (``AutoTokenizer`` itself imports torch: seconds per process), and compare it with ``tok``:
    vocabulary size, the ids of :data:`PROBE`, and the EOS id.

    Raises:
        TokenizerError: transformers cannot load the files, or they encode differently from ``tok``.
    """
    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as folder:
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        try:
            auto = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
        except Exception as e:  # noqa: BLE001  (transformers raises many types for what it cannot load)
            raise TokenizerError(f"transformers cannot load its {JSON_NAME} ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''})") from None
    ours = tok.encode_batch([PROBE])[0]
    theirs = auto(PROBE, add_special_tokens=False)["input_ids"]
    eos = None if tok.special.eos is None else auto.eos_token_id
    if len(auto) != tok.vocab_size or theirs != ours or eos != tok.special.eos:
        raise TokenizerError(f"its {JSON_NAME} for transformers does not encode as the {tok.kind} tokenizer does "
                             f"(vocabulary {len(auto)} vs {tok.vocab_size}, eos {eos} vs {tok.special.eos}, "
                             f"probe ids equal: {theirs == ours}); report this with the tokenizer file")
